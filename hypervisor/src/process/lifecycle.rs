//! Ending processes: by pid with their process groups ([`kill_and_reap`]), what a
//! failed start started ([`stop_started`]), a running VM ([`RunningVm`]), and the tail
//! of a log that says why something ended ([`log_tail`]).

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use procinfo::pid::{exit_description, group_alive, group_runs};

use super::POLL;
use crate::Error;

/// How long processes get after SIGKILL before they are reported as survivors.
const KILL_TIMEOUT: Duration = Duration::from_secs(5);
/// How much of a log file error messages quote.
const TAIL_BYTES: u64 = 2048;
pub(super) const TAIL_LINES: usize = 15;

/// Sends SIGTERM to every pid, SIGKILL after `grace` to those still running, and waits
/// until all are gone (reaping those that are our children). Pids `<= 0` are ignored.
/// A pid that leads a process group (every [`Daemon`](super::Daemon) does) is signalled with its whole
/// group, and is gone only once nothing of the group is left: a helper's children
/// (virtiofsd's sandboxed worker) never outlive the stop.
/// Returns the pids still running after SIGKILL and a further 5 s (normally none).
///
/// Used by `stop_vm`, by `start_vm` when a step fails, and by the shim's `delete` after a
/// crashed shim, with the pids it persisted.
pub fn kill_and_reap(pids: &[i32], grace: Duration) -> Vec<i32> {
    let mut alive: Vec<i32> = pids.iter().copied().filter(|&p| p > 0).collect();
    alive.sort_unstable();
    alive.dedup();
    for &pid in &alive {
        signal_with_group(pid, Signal::SIGTERM);
    }
    alive = wait_gone(alive, grace);
    if alive.is_empty() {
        return alive;
    }
    for &pid in &alive {
        signal_with_group(pid, Signal::SIGKILL);
    }
    wait_gone(alive, KILL_TIMEOUT)
}

/// Signals `pid` and, when it leads a process group, the rest of its group.
fn signal_with_group(pid: i32, sig: Signal) {
    if leads_group(pid) {
        let _ = kill(Pid::from_raw(-pid), sig);
    }
    let _ = kill(Pid::from_raw(pid), sig);
}
/// For tests: a child that is killed and reaped when this is dropped, also when the test
/// fails.
#[cfg(any(test, feature = "test-utils"))]
pub struct KilledOnDrop(pub std::process::Child);

#[cfg(any(test, feature = "test-utils"))]
impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// For tests: runs shell command `cmd` in the background of a `sh` that reaps it, so
/// that it is not the caller's child (as a pooled VM's processes are not the shim's);
/// the `sh` (to wait for) and the pid `cmd` got.
#[cfg(any(test, feature = "test-utils"))]
pub fn spawn_grandchild(cmd: &str) -> (std::process::Child, i32) {
    use std::io::BufRead;
    let mut sh = std::process::Command::new("sh")
        .args(["-c", &format!("{cmd} & echo $!; wait")])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("starting sh");
    let mut line = String::new();
    std::io::BufReader::new(sh.stdout.take().expect("sh's stdout"))
        .read_line(&mut line)
        .expect("reading the pid sh printed");
    (sh, line.trim().parse().expect("a pid"))
}
/// Whether `pid` is (or, gone, was) a group leader: its group exists. A pid that never
/// led a group has none, so an unrelated process is never signalled this way.
fn leads_group(pid: i32) -> bool {
    group_alive(pid)
}

/// Polls until every pid is gone or `timeout` passes; returns those still running.
fn wait_gone(mut alive: Vec<i32>, timeout: Duration) -> Vec<i32> {
    let deadline = Instant::now() + timeout;
    // A killed process is usually gone within a millisecond or two: look again soon,
    // then less often.
    let mut pause = Duration::from_millis(1);
    loop {
        alive.retain(|&pid| exit_description(pid).is_none() || group_runs(pid));
        if alive.is_empty() || Instant::now() >= deadline {
            return alive;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(POLL);
    }
}

/// [`kill_and_reap`] on a blocking thread, for async callers.
pub(crate) async fn kill_and_reap_async(pids: Vec<i32>, grace: Duration) -> Vec<i32> {
    let fallback = pids.clone();
    tokio::task::spawn_blocking(move || kill_and_reap(&pids, grace))
        .await
        .unwrap_or(fallback)
}
/// The last lines of a log file, for error messages; empty if it cannot be read.
/// A link there is not followed: the run directory may belong to the VMM's uid, which
/// must not have the shim quote a host file of its choosing.
pub fn log_tail(path: &Path) -> String {
    crate::bounded_log::settle(path);
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path);
    let Ok(mut file) = opened else {
        return String::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if file
        .seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)))
        .is_err()
    {
        return String::new();
    }
    let mut buf = Vec::new();
    if file.read_to_end(&mut buf).is_err() {
        return String::new();
    }
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n")
}
/// How long a VMM and its helpers get between SIGTERM and SIGKILL. None: nothing of a
/// sandbox needs a clean exit once the shim stops it. The guest has synced its file
/// systems already (DestroySandbox), or is dead; virtio-fs writes reach the host as they
/// are made; virtiofsd and the vsock backend hold no state. Stopping at once spares every
/// teardown the wait for three processes to wind down.
pub(crate) const STOP_GRACE: Duration = Duration::ZERO;

/// Removes files a previous run may have left behind (a missing one is fine).
pub(crate) fn remove_files(paths: Vec<PathBuf>) -> Result<(), Error> {
    for path in paths {
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::RunDir { path, source: e });
            }
            _ => {}
        }
    }
    Ok(())
}

/// After a failed start: stops, by pid, everything that start had started, and removes
/// the files it may have made.
pub(crate) async fn stop_started(
    logger: &slog::Logger,
    error: &Error,
    started: Vec<i32>,
    files: Vec<PathBuf>,
) {
    slog::warn!(logger, "VM start failed; stopping what was started";
        "error" => error.to_string(), "pids" => format!("{started:?}"));
    let survivors = kill_and_reap_async(started, STOP_GRACE).await;
    if !survivors.is_empty() {
        slog::warn!(logger, "processes survived SIGKILL"; "pids" => format!("{survivors:?}"));
    }
    let _ = remove_files(files);
}

/// What a started VM consists of: its processes, VMM first, and the files its stop
/// removes. Both backends keep one while the VM runs.
pub(crate) struct RunningVm {
    pub vmm_pid: i32,
    pub helper_pids: Vec<i32>,
    pub files: Vec<PathBuf>,
}

impl RunningVm {
    /// Every process, VMM first.
    pub fn pids(&self) -> Vec<i32> {
        let mut pids = vec![self.vmm_pid];
        pids.extend(&self.helper_pids);
        pids
    }

    /// Stops every process by pid and removes the files.
    pub async fn stop(self, logger: &slog::Logger) -> Result<(), Error> {
        let pids = self.pids();
        slog::info!(logger, "stopping VM"; "pids" => format!("{pids:?}"));
        let survivors = kill_and_reap_async(pids, STOP_GRACE).await;
        if let Err(e) = remove_files(self.files) {
            slog::warn!(logger, "cannot remove the VM's sockets"; "error" => e.to_string());
        }
        if survivors.is_empty() {
            Ok(())
        } else {
            Err(Error::Survivors { pids: survivors })
        }
    }
}

/// After a successful start: the helpers among `started` (all but the VMM) still alive.
pub(crate) fn live_helpers(started: Vec<i32>, vmm_pid: i32) -> Vec<i32> {
    started
        .into_iter()
        .filter(|&p| p != vmm_pid && exit_description(p).is_none())
        .collect()
}
