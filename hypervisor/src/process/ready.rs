//! Readiness: waiting until a daemon listens on its sockets, by the kernel's socket
//! tables, or has died or run out of time trying.

use std::path::Path;
use std::time::{Duration, Instant};

use procinfo::pid::exit_description;

use super::{Daemon, POLL};
use crate::Error;

/// How long a helper daemon may take to create its socket.
pub(crate) const DAEMON_READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Why waiting for a process to be ready failed.
pub(crate) enum Wait {
    /// It exited first.
    Died(Error),
    /// It is still running but not ready.
    Timeout(Error),
}

impl Wait {
    pub fn into_error(self) -> Error {
        match self {
            Self::Died(e) | Self::Timeout(e) => e,
        }
    }
}

impl From<Wait> for Error {
    fn from(w: Wait) -> Self {
        w.into_error()
    }
}

/// Waits until something listens on every socket, the process dies, or the deadline
/// passes.
///
/// The socket's file is not enough: a daemon's bind(2) makes it, and only its listen(2),
/// a step later, makes a connection to it succeed. A VMM started in between fails with
/// ECONNREFUSED (a daemon preempted between the two on a loaded host did this: QEMU found
/// virtiofsd's socket and could not connect).
pub(crate) async fn wait_for_sockets(
    d: &Daemon<'_>,
    pid: i32,
    sockets: &[&Path],
) -> Result<(), Wait> {
    let deadline = Instant::now() + DAEMON_READY_TIMEOUT;
    let names = || {
        sockets
            .iter()
            .map(|s| s.display().to_string())
            .collect::<Vec<_>>()
            .join(" and ")
    };
    // A daemon makes its socket within a few tens of milliseconds, and the VM's start
    // waits on it: look often at first, then less often.
    let mut pause = Duration::from_millis(1);
    let made = || sockets.iter().all(|s| s.exists());
    loop {
        if made() && listening(pid, sockets) {
            return Ok(());
        }
        if let Some(how) = exit_description(pid) {
            return Err(Wait::Died(
                d.failed(format!("it {how} before listening on {}", names())),
            ));
        }
        if Instant::now() >= deadline {
            let what = if made() {
                "exist, but nothing listened on them"
            } else {
                "did not appear"
            };
            return Err(Wait::Timeout(d.failed(format!(
                "{} {what} within {} s",
                names(),
                DAEMON_READY_TIMEOUT.as_secs()
            ))));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(POLL);
    }
}

/// Whether a listening unix socket is bound at each of `paths`, by the kernel's socket
/// tables of this process's network namespace and of `pid`'s. Both: a daemon's socket
/// belongs to the namespace it was made in, which is ours when it binds before entering
/// a namespace of its own (virtiofsd) and its own when it was started in one (the
/// confined vsock backend). True when neither table can be read (no /proc): the file's
/// existence is then all there is to go by.
fn listening(pid: i32, paths: &[&Path]) -> bool {
    // A name that is not UTF-8 cannot be matched in a table: its file is all there is.
    let mut missing: Vec<&str> = paths.iter().filter_map(|p| p.to_str()).collect();
    let mut readable = false;
    for table in [
        "/proc/self/net/unix".to_string(),
        format!("/proc/{pid}/net/unix"),
    ] {
        // The daemon's table is read only when ours lacks a socket.
        if missing.is_empty() {
            break;
        }
        let Ok(text) = std::fs::read_to_string(&table) else {
            continue;
        };
        readable = true;
        missing.retain(|p| !listens_in(&text, p));
    }
    missing.is_empty() || !readable
}

/// Whether the table (the text of `/proc/net/unix`) has a listening socket bound at
/// `path`. Each line: address, refcount, protocol, flags, type, state, inode, then the
/// path after one space (it may hold spaces); a listening socket has __SO_ACCEPTCON
/// (0x10000) in its flags.
pub(super) fn listens_in(table: &str, path: &str) -> bool {
    const SO_ACCEPTCON: u32 = 1 << 16;
    table.lines().skip(1).any(|line| {
        let mut rest = line;
        let mut fields = [""; 7];
        for field in &mut fields {
            rest = rest.trim_start_matches(' ');
            let end = rest.find(' ').unwrap_or(rest.len());
            *field = &rest[..end];
            rest = &rest[end..];
        }
        rest.strip_prefix(' ') == Some(path)
            && u32::from_str_radix(fields[3], 16).is_ok_and(|flags| flags & SO_ACCEPTCON != 0)
    })
}
