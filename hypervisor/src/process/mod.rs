//! Helper and VMM processes, handled by pid: `spawn` starts a daemon in its place
//! (cgroups, network namespace, passed descriptors, jail) with its output in a capped
//! log; `lifecycle` stops processes by pid with their process groups, stops what a
//! failed start started, and quotes a log's tail; `ready` waits until a daemon listens
//! on its sockets. Whether a pid still runs and how it ended is
//! [`procinfo::pid`]'s, shared with the shim.

mod lifecycle;
mod ready;
mod spawn;
#[cfg(test)]
mod tests;

use std::time::Duration;

pub use lifecycle::{kill_and_reap, log_tail};
pub(crate) use lifecycle::{
    kill_and_reap_async, live_helpers, remove_files, stop_started, RunningVm, STOP_GRACE,
};
#[cfg(any(test, feature = "test-utils"))]
pub use lifecycle::{spawn_grandchild, KilledOnDrop};
pub(crate) use procinfo::pid::exit_description;
pub(crate) use ready::{wait_for_sockets, Wait};
pub use spawn::{join_file, Daemon, Place, MAX_PASSED_FDS, PASSED_FD_SCRATCH};

/// Poll interval while waiting for a process to exit or a socket to appear.
pub(crate) const POLL: Duration = Duration::from_millis(10);
