//! Running code in the pod's network namespace.
//!
//! A network namespace is a property of a thread: the code runs on a thread of its own
//! that joins the namespace and ends with the work, so no other thread of the shim ever
//! changes namespace. Sockets, taps and child processes made there belong to the pod's
//! namespace for good, whichever thread uses them later.

use std::fs::File;
use std::future::Future;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use nix::sched::{setns, CloneFlags};
use rtnetlink::Handle;

use super::NetworkError;

/// Runs `work` on a thread inside the network namespace `netns` (a path such as
/// `/var/run/netns/cni-…`) and returns what it returned.
pub fn run_in<T, F>(netns: &Path, work: F) -> Result<T, NetworkError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, NetworkError> + Send + 'static,
{
    let file = File::open(netns).map_err(|source| NetworkError::Netns {
        path: netns.to_path_buf(),
        source,
    })?;
    let path: PathBuf = netns.to_path_buf();
    let thread = std::thread::Builder::new()
        .name("pod-netns".into())
        .spawn(move || {
            setns(file.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|e| NetworkError::Netns {
                path,
                source: e.into(),
            })?;
            work()
        })
        .map_err(|e| NetworkError::Thread(e.to_string()))?;
    thread.join().map_err(|_| {
        NetworkError::Thread("the thread in the pod's network namespace panicked".into())
    })?
}

/// Runs the async netlink `work` inside `netns`, on a runtime of that thread with a
/// netlink socket opened there.
pub fn with_netlink<T, F, Fut>(netns: &Path, work: F) -> Result<T, NetworkError>
where
    T: Send + 'static,
    F: FnOnce(Handle) -> Fut + Send + 'static,
    Fut: Future<Output = Result<T, NetworkError>>,
{
    run_in(netns, move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| NetworkError::Thread(format!("start a runtime: {e}")))?;
        rt.block_on(async move {
            let (conn, handle, _) = rtnetlink::new_connection().map_err(NetworkError::Socket)?;
            let conn = tokio::spawn(conn);
            let result = work(handle).await;
            conn.abort();
            result
        })
    })
}
