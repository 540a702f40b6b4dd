//! A host pid of its own for each container of a pod.
//!
//! containerd asks every task for its pid and builds host namespace paths from it: a pod
//! member's spec names the sandbox container's namespaces as `/proc/<its pid>/ns/<type>`,
//! and an ephemeral container started by `kubectl debug --target=<name>` names the
//! target's PID namespace as `/proc/<the target's pid>/ns/pid`. A VM sandbox has no host
//! process per container; if every task reported the VMM's pid, the shim could not tell
//! the target from the pod. So the sandbox container reports the VMM's pid and each other
//! container a thread of the shim that lives exactly as long as the container: a real id
//! the host kernel gave and will not give to anybody else meanwhile, so that whoever reads
//! `/proc/<pid>` (a monitoring agent, an NRI plugin) finds this shim, never a stranger.
//! The shim maps such a path back to the container (see `spec::name_peer_namespaces`).

use std::sync::mpsc;

/// The thread behind a container's pid; it ends when this is dropped.
#[derive(Debug)]
pub struct PidAnchor {
    tid: u32,
    /// Dropping it ends the thread's wait.
    _release: mpsc::Sender<()>,
}

/// The stack of an anchor thread: it only waits.
const STACK: usize = 64 * 1024;

impl PidAnchor {
    /// Starts the thread and returns once its id is known.
    pub fn new() -> std::io::Result<Self> {
        let (release, wait) = mpsc::channel::<()>();
        let (tid_tx, tid_rx) = mpsc::sync_channel::<u32>(1);
        std::thread::Builder::new()
            .name("container-pid".into())
            .stack_size(STACK)
            .spawn(move || {
                let _ = tid_tx.send(nix::unistd::gettid().as_raw() as u32);
                // Returns (with an error) once the sender is dropped.
                let _ = wait.recv();
            })?;
        let tid = tid_rx
            .recv()
            .map_err(|_| std::io::Error::other("the container's pid thread ended at once"))?;
        Ok(Self {
            tid,
            _release: release,
        })
    }

    pub fn pid(&self) -> u32 {
        self.tid
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_anchor_is_a_thread_of_this_process_while_it_lives() {
        let anchor = PidAnchor::new().unwrap();
        let other = PidAnchor::new().unwrap();
        assert_ne!(anchor.pid(), other.pid());
        let task = format!("/proc/self/task/{}", anchor.pid());
        assert!(std::path::Path::new(&task).exists(), "{task}");
        // Its namespace path, as containerd builds it, is this process's.
        assert_eq!(
            std::fs::read_link(format!("/proc/{}/ns/pid", anchor.pid())).unwrap(),
            std::fs::read_link("/proc/self/ns/pid").unwrap()
        );
        drop(anchor);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::path::Path::new(&task).exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "{task} outlived its anchor"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}
