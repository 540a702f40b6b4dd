//! Helper and VMM processes, handled by pid.
//!
//! The shim process has a global SIGCHLD reaper (`waitpid(-1)`), so a child may be
//! reaped by someone else at any time and `std::process::Child::wait` cannot be relied
//! on. Everything here works from the pid alone: `waitpid(pid, WNOHANG)` when the
//! process is still our child, `kill(pid, 0)` and `/proc/<pid>/stat` when it is not
//! (already reaped, or left behind by a crashed shim and now re-parented).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::Error;

/// How long processes get after SIGKILL before they are reported as survivors.
const KILL_TIMEOUT: Duration = Duration::from_secs(5);
/// Poll interval while waiting for a process to exit or a socket to appear.
pub(crate) const POLL: Duration = Duration::from_millis(10);
/// How much of a log file error messages quote.
const TAIL_BYTES: u64 = 2048;
const TAIL_LINES: usize = 15;

/// Passed descriptors' targets are below this; the child moves them through numbers from
/// it up (see `Place::pass_fds`).
pub const PASSED_FD_SCRATCH: RawFd = 100;
/// The most descriptors a daemon is passed.
pub const MAX_PASSED_FDS: usize = 32;

/// A program to run in the background with stdout and stderr going to a log file.
pub struct Daemon<'a> {
    /// Names the step in errors, e.g. `virtiofsd`.
    pub step: &'static str,
    pub program: &'a Path,
    pub args: Vec<String>,
    pub env: Vec<(&'static str, String)>,
    pub log: PathBuf,
    /// Where the process starts: host cgroup, network namespace.
    pub place: Place,
}

/// Where a daemon starts, set up in the child between fork and exec.
#[derive(Debug, Default, Clone)]
pub struct Place {
    /// The file of each hierarchy's cgroup that moves the writer in when "0" is written
    /// to it (see [`join_file`]).
    cgroup_joins: Vec<Arc<File>>,
    /// A network namespace to join.
    netns: Option<Arc<File>>,
    /// Descriptors the program inherits, each on the number given (see [`Place::pass_fd`]).
    fds: Vec<(Arc<OwnedFd>, RawFd)>,
    /// Who the process becomes (see [`crate::jail`]); None: it stays root.
    jail: Option<Arc<crate::jail::Jail>>,
}

impl Place {
    /// Opens what the child will need (it may not allocate or open files itself).
    pub fn new(cfg: &crate::VmConfig, with_netns: bool) -> Result<Place, Error> {
        let mut place = Place::default();
        for dir in &cfg.cgroup {
            let path = join_file(dir);
            let f = OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(|source| Error::Place {
                    what: "the sandbox's cgroup",
                    path: path.clone(),
                    source,
                })?;
            place.cgroup_joins.push(Arc::new(f));
        }
        if with_netns {
            if let Some(ns) = &cfg.netns {
                let f = File::open(ns).map_err(|source| Error::Place {
                    what: "the pod's network namespace",
                    path: ns.clone(),
                    source,
                })?;
                place.netns = Some(Arc::new(f));
            }
        }
        Ok(place)
    }

    /// The same, without the network namespace (for helpers that need no network).
    pub fn without_netns(&self) -> Place {
        Place {
            cgroup_joins: self.cgroup_joins.clone(),
            netns: None,
            fds: self.fds.clone(),
            jail: self.jail.clone(),
        }
    }

    /// The same, for a process confined by `jail` (None: unconfined).
    pub fn jailed(&self, jail: Option<crate::jail::Jail>) -> Place {
        Place {
            jail: jail.map(Arc::new),
            ..self.clone()
        }
    }

    /// Hands `fd` to the program as descriptor `target` (3 and up; every other descriptor
    /// of ours stays closed-on-exec). Used for the guest console's pipe.
    /// `target` must be below [`PASSED_FD_SCRATCH`]; at most [`MAX_PASSED_FDS`] are passed.
    pub fn pass_fd(&mut self, fd: Arc<OwnedFd>, target: RawFd) {
        self.fds.push((fd, target));
    }

    fn is_empty(&self) -> bool {
        self.cgroup_joins.is_empty()
            && self.netns.is_none()
            && self.fds.is_empty()
            && self.jail.is_none()
    }

    /// Puts each passed descriptor on its number, inheritable, in the child: the last step
    /// of the child's set-up, as it may replace a descriptor that set-up used.
    /// Only async-signal-safe calls (dup2, fcntl). In two passes, so that no descriptor
    /// is replaced before it is moved: each first to a number of [`PASSED_FD_SCRATCH`] or
    /// more (above every target), then onto its target.
    fn pass_fds(fds: &[(RawFd, RawFd)]) -> std::io::Result<()> {
        let mut scratch = [-1 as RawFd; MAX_PASSED_FDS];
        if fds.len() > MAX_PASSED_FDS {
            return Err(std::io::Error::from_raw_os_error(libc::EMFILE));
        }
        for (i, &(fd, _)) in fds.iter().enumerate() {
            // SAFETY: `fd` is open (the parent keeps it alive across the fork); fcntl
            // only changes this process's descriptor table.
            scratch[i] = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, PASSED_FD_SCRATCH) };
            if scratch[i] < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        for (i, &(_, target)) in fds.iter().enumerate() {
            // SAFETY: `scratch[i]` is the copy made above; dup2 only changes this
            // process's descriptor table (the copy on `target` is inheritable).
            if unsafe { libc::dup2(scratch[i], target) } < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }

    /// Applies the place in the child. Only async-signal-safe calls (write, setns, and
    /// the jail's: see [`crate::jail::Jail::enter`]).
    fn enter(
        cgroup_joins: &[RawFd],
        netns: Option<RawFd>,
        jail: Option<&crate::jail::Jail>,
    ) -> std::io::Result<()> {
        for fd in cgroup_joins {
            // SAFETY: `fd` is an open descriptor the parent keeps alive across the fork;
            // the buffer is a static byte string.
            if unsafe { libc::write(*fd, b"0".as_ptr().cast(), 1) } != 1 {
                return Err(std::io::Error::last_os_error());
            }
        }
        if let Some(fd) = netns {
            // SAFETY: `fd` is an open namespace descriptor the parent keeps alive.
            if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        if let Some(jail) = jail {
            jail.enter()?;
        }
        Ok(())
    }
}

/// The file through which a freshly forked child joins the cgroup `dir`: on a cgroup v1
/// hierarchy its `tasks`, on cgroup v2 (which has no `tasks`) its `cgroup.procs`; there
/// `dir` must be a leaf, with no controller enabled for children of its own.
///
/// Both move the writer when "0" is written; the forked child has one thread, so moving
/// that thread moves the process. The difference is the cost: a write to v1's
/// `cgroup.procs` takes the kernel's global threadgroup lock for writing, and taking it
/// waits for an RCU grace period whenever no other migration ran just before (4 to 12 ms
/// per write on this project's 9-hierarchy test host, paid by every helper and QEMU
/// start), while moving the current thread through `tasks` needs no such lock (0.07 ms).
/// cgroup v2 has no `tasks`; there the host's `favordynmods` mount option or
/// `CLONE_INTO_CGROUP` would avoid the wait.
pub fn join_file(dir: &Path) -> PathBuf {
    let tasks = dir.join("tasks");
    if tasks.exists() {
        tasks
    } else {
        dir.join("cgroup.procs")
    }
}

impl Daemon<'_> {
    /// Spawns the program and returns its pid. The `Child` handle is dropped on purpose:
    /// the pid is what gets recorded, signalled and reaped. Its stdout and stderr go to
    /// its log, capped at [`LOG_CAP`](crate::bounded_log::LOG_CAP) (see
    /// [`crate::bounded_log`]); `logger` hears when the log cannot be written.
    pub fn spawn(&self, logger: &slog::Logger) -> Result<i32, Error> {
        self.spawn_capped(crate::bounded_log::LOG_CAP, logger)
    }

    /// [`Daemon::spawn`] with a log of at most `cap` bytes.
    pub fn spawn_capped(&self, cap: u64, logger: &slog::Logger) -> Result<i32, Error> {
        // Made anew, never through a link: the run directory may belong to a confined
        // helper's uid (kata-vsock starts before QEMU), which must not point a log of the
        // shim's at a host file.
        let write = crate::bounded_log::start(&self.log, cap, self.step, logger)?;
        let clone = |w: &OwnedFd| {
            w.try_clone().map_err(|source| Error::RunDir {
                path: self.log.clone(),
                source,
            })
        };
        let (log, log_err) = (clone(&write)?, clone(&write)?);
        drop(write);
        // Its own process group, so that stopping it also stops what it forked (virtiofsd
        // runs its sandboxed worker as a child): see `kill_and_reap`.
        let mut command = Command::new(self.program);
        if !self.place.is_empty() {
            let cgroup_joins: Vec<RawFd> = self
                .place
                .cgroup_joins
                .iter()
                .map(|f| f.as_raw_fd())
                .collect();
            let netns = self.place.netns.as_ref().map(|f| f.as_raw_fd());
            let fds: Vec<(RawFd, RawFd)> = self
                .place
                .fds
                .iter()
                .map(|(f, target)| (f.as_raw_fd(), *target))
                .collect();
            let jail = self.place.jail.clone();
            // SAFETY: the closure only makes async-signal-safe system calls (write,
            // setns, dup2, fcntl, the jail's) on descriptors and strings prepared before
            // the fork, and allocates nothing.
            unsafe {
                command.pre_exec(move || {
                    Place::enter(&cgroup_joins, netns, jail.as_deref())?;
                    Place::pass_fds(&fds)
                });
            }
        }
        let child = command
            .process_group(0)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .map_err(|e| Error::Step {
                step: self.step,
                reason: format!("cannot execute {}: {e}", self.program.display()),
                log: self.log.clone(),
                tail: String::new(),
            })?;
        // Pids fit in i32 on Linux (pid_max is at most 2^22).
        Ok(child.id() as i32)
    }

    /// An error for this step with the tail of its log.
    pub fn failed(&self, reason: String) -> Error {
        crate::bounded_log::settle(&self.log);
        Error::Step {
            step: self.step,
            reason,
            tail: log_tail(&self.log),
            log: self.log.clone(),
        }
    }
}

/// Whether a process is gone and, when we reaped it ourselves, how it ended.
pub fn exit_description(pid: i32) -> Option<String> {
    if pid <= 0 {
        return Some("has no valid pid".into());
    }
    loop {
        match waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => return None,
            Ok(WaitStatus::Exited(_, code)) => return Some(format!("exited with status {code}")),
            Ok(WaitStatus::Signaled(_, sig, _)) => return Some(format!("was killed by {sig}")),
            // Stopped/continued are only reported with WUNTRACED/WCONTINUED; treat as alive.
            Ok(_) => return None,
            Err(Errno::EINTR) => continue,
            Err(_) => {
                return if is_gone(pid) {
                    Some("exited".into())
                } else {
                    None
                };
            }
        }
    }
}

/// Whether the process still runs (reaps it if it is our exited child).
pub fn is_running(pid: i32) -> bool {
    exit_description(pid).is_none()
}

/// For a process that is not (or no longer) our child: gone, or a zombie whose parent
/// has not reaped it yet (it runs nothing any more).
fn is_gone(pid: i32) -> bool {
    match kill(Pid::from_raw(pid), None) {
        Err(Errno::ESRCH) => true,
        _ => is_zombie(pid),
    }
}

fn is_zombie(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    // The state follows the parenthesised command name, which may itself hold ')'.
    stat.rfind(')')
        .and_then(|i| stat[i + 1..].trim_start().chars().next())
        .is_some_and(|state| state == 'Z' || state == 'X')
}

/// Sends SIGTERM to every pid, SIGKILL after `grace` to those still running, and waits
/// until all are gone (reaping those that are our children). Pids `<= 0` are ignored.
/// A pid that leads a process group (every [`Daemon`] does) is signalled with its whole
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

/// Whether process group `pid` still has members (the leader itself may be gone).
fn group_alive(pid: i32) -> bool {
    !matches!(kill(Pid::from_raw(-pid), None), Err(Errno::ESRCH))
}

/// Whether process group `pid` has a member that has not exited. Zombies do not count:
/// after a crashed shim its helpers are orphans whose reaper (init, or whoever adopted
/// them) may take its time, and waiting for that held up clean-up by seconds.
fn group_runs(pid: i32) -> bool {
    if !group_alive(pid) {
        return false;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .any(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|stat| live_group_of(&stat))
                == Some(pid)
        })
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

/// The state letter and the process group of a `/proc/<pid>/stat` line.
pub fn state_and_group(stat: &str) -> Option<(&str, i32)> {
    // The fields after the parenthesised command name (which may itself hold ')'):
    // state, ppid, pgrp, ...
    let mut fields = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
    let state = fields.next()?;
    Some((state, fields.nth(1)?.parse().ok()?))
}

/// The process group of a `/proc/<pid>/stat` line, if the process has not exited.
fn live_group_of(stat: &str) -> Option<i32> {
    match state_and_group(stat)? {
        ("Z" | "X", _) => None,
        (_, group) => Some(group),
    }
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

/// Processes, other than this one, whose command line mentions `needle`. A sandbox's
/// VMM and helpers all name its run directory in their arguments: this finds them after
/// a shim that died before it could record their pids.
pub fn pids_mentioning(needle: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|raw| {
                    raw.split(|&b| b == 0)
                        .any(|arg| String::from_utf8_lossy(arg).contains(needle))
                })
                .unwrap_or(false)
        })
        .collect()
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
fn listens_in(table: &str, path: &str) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn spawn(cmd: &str) -> i32 {
        Command::new("sh")
            .args(["-c", cmd])
            .spawn()
            .map(|c| c.id() as i32)
            .unwrap()
    }

    #[test]
    fn a_socket_listens_by_its_flags_in_the_table() {
        let table = "Num       RefCount Protocol Flags    Type St Inode Path\n\
            0000000000000000: 00000002 00000000 00010000 0001 01  1234 /run/vc/vm/a/fs.sock\n\
            0000000000000000: 00000002 00000000 00000000 0001 01 56789 /run/vc/vm/b/fs.sock\n\
            0000000000000000: 00000003 00000000 00000000 0001 03 99999 \n\
            0000000000000000: 00000002 00000000 00010000 0001 01 77777 /run/a dir/x.sock\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 88888 @abstract\n";
        assert!(listens_in(table, "/run/vc/vm/a/fs.sock"));
        // Bound, not yet listening: connect(2) would be refused.
        assert!(!listens_in(table, "/run/vc/vm/b/fs.sock"));
        assert!(listens_in(table, "/run/a dir/x.sock"));
        assert!(!listens_in(table, "/run/a"));
        assert!(!listens_in(table, "/run/vc/vm/a/fs.sock.pid"));
        assert!(!listens_in("", "/run/vc/vm/a/fs.sock"));
    }

    /// A daemon that has bound its socket but not yet listened on it is not ready: the
    /// wait returns only once a connection would succeed.
    #[tokio::test]
    async fn the_wait_for_a_socket_ends_when_it_listens_not_when_it_exists() {
        use nix::sys::socket::{
            bind, connect, listen, socket, AddressFamily, Backlog, SockFlag, SockType, UnixAddr,
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("daemon.sock");
        let sock = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        bind(sock.as_raw_fd(), &UnixAddr::new(&path).unwrap()).unwrap();
        assert!(path.exists());
        let stand_in = spawn("exec sleep 30");
        let daemon = Daemon {
            step: "a daemon",
            program: Path::new("sleep"),
            args: Vec::new(),
            env: Vec::new(),
            log: dir.path().join("daemon.log"),
            place: Place::default(),
        };
        let listens_at = Instant::now() + Duration::from_millis(300);
        let listener = std::thread::spawn(move || {
            std::thread::sleep(listens_at.saturating_duration_since(Instant::now()));
            listen(&sock, Backlog::new(8).unwrap()).unwrap();
            sock
        });
        let waited = wait_for_sockets(&daemon, stand_in, &[&path]).await;
        assert!(waited.is_ok(), "the wait failed");
        assert!(Instant::now() >= listens_at, "ready before it listened");
        let client = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        connect(client.as_raw_fd(), &UnixAddr::new(&path).unwrap()).unwrap();
        drop(listener.join().unwrap());
        assert!(kill_and_reap(&[stand_in], Duration::from_secs(2)).is_empty());
    }

    #[test]
    fn a_group_leaders_children_do_not_outlive_it() {
        // Like virtiofsd: the parent forks a worker that ignores SIGTERM, and waits.
        let pid = Command::new("sh")
            .args([
                "-c",
                "sh -c 'trap \"\" TERM; while :; do sleep 0.05; done' & wait",
            ])
            .process_group(0)
            .spawn()
            .map(|c| c.id() as i32)
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert!(group_alive(pid));
        assert!(kill_and_reap(&[pid], Duration::from_millis(300)).is_empty());
        assert!(!group_runs(pid), "the worker was stopped with its parent");
    }

    #[test]
    fn a_group_of_zombies_no_longer_runs() {
        // Exited but not reaped (as a crashed shim's orphaned helpers wait for init).
        let pid = Command::new("true")
            .process_group(0)
            .spawn()
            .map(|c| c.id() as i32)
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert!(group_alive(pid), "the unreaped group is still there");
        assert!(!group_runs(pid));
        assert!(kill_and_reap(&[pid], Duration::from_secs(5)).is_empty());
    }

    #[test]
    fn the_group_of_a_stat_line() {
        let stat = "42 (a) b) c) S 1 977 977 0 -1 4194560 100";
        assert_eq!(live_group_of(stat), Some(977));
        assert_eq!(live_group_of("42 (x) Z 1 977 977 0"), None);
        assert_eq!(live_group_of("garbage"), None);
        assert_eq!(state_and_group("42 (a) b) S 1 977 977 0"), Some(("S", 977)));
    }

    #[test]
    fn processes_are_found_by_what_their_arguments_name() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("sandbox-run-dir/");
        let arg = format!("{}sock", marker.display());
        // The marker as argv[0], which sleep ignores.
        let pid = Command::new("sleep")
            .arg0(&arg)
            .arg("100")
            .spawn()
            .map(|c| c.id() as i32)
            .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let found = pids_mentioning(&marker.display().to_string());
        assert_eq!(found, vec![pid]);
        assert!(kill_and_reap(&found, Duration::from_secs(2)).is_empty());
        assert!(pids_mentioning(&marker.display().to_string()).is_empty());
    }

    #[test]
    fn sigterm_stops_a_cooperative_process() {
        let pid = spawn("exec sleep 100");
        assert_eq!(exit_description(pid), None);
        assert!(kill_and_reap(&[pid], Duration::from_secs(5)).is_empty());
        assert!(kill(Pid::from_raw(pid), None).is_err());
    }

    #[test]
    fn sigkill_after_grace_for_a_process_ignoring_sigterm() {
        let pid = spawn("trap '' TERM; while :; do sleep 0.05; done");
        std::thread::sleep(Duration::from_millis(100));
        assert!(kill_and_reap(&[pid], Duration::from_millis(200)).is_empty());
        assert!(kill(Pid::from_raw(pid), None).is_err());
    }

    #[test]
    fn already_reaped_and_invalid_pids_are_fine() {
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        assert!(kill_and_reap(&[pid, 0, -1], Duration::from_millis(100)).is_empty());
    }

    #[test]
    fn exit_status_is_described() {
        let pid = spawn("exit 3");
        let deadline = Instant::now() + Duration::from_secs(10);
        let desc = loop {
            if let Some(d) = exit_description(pid) {
                break d;
            }
            assert!(Instant::now() < deadline);
            std::thread::sleep(POLL);
        };
        assert_eq!(desc, "exited with status 3");
    }

    /// The test's own cgroup in each hierarchy that can take a process without set-up
    /// (cpuset's cpus and mems start empty in v1), removed again on drop.
    struct TestCgroups(Vec<PathBuf>);

    impl Drop for TestCgroups {
        fn drop(&mut self) {
            for dir in &self.0 {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }

    fn test_cgroups(name: &str) -> Option<TestCgroups> {
        let root = Path::new("/sys/fs/cgroup");
        let mut made = TestCgroups(Vec::new());
        let v2 = root.join("cgroup.controllers").exists();
        let parents: Vec<PathBuf> = if v2 {
            vec![root.to_path_buf()]
        } else {
            ["pids", "memory", "cpu", "systemd"]
                .iter()
                .map(|h| root.join(h))
                .filter(|p| p.join("tasks").exists())
                .collect()
        };
        for parent in parents {
            let dir = parent.join(name);
            std::fs::create_dir(&dir).ok()?;
            made.0.push(dir);
        }
        (!made.0.is_empty()).then_some(made)
    }

    #[test]
    fn a_daemon_starts_in_the_sandbox_cgroup_of_every_hierarchy() {
        let name = format!("kata-hv-test-{}", std::process::id());
        let Some(cgroups) = test_cgroups(&name) else {
            crate::test_skip::skipped("needs root and a writable /sys/fs/cgroup");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let cfg = crate::VmConfig {
            cgroup: cgroups.0.clone(),
            ..Default::default()
        };
        let daemon = Daemon {
            step: "sleep",
            program: Path::new("sleep"),
            args: vec!["30".into()],
            env: Vec::new(),
            log: dir.path().join("sleep.log"),
            place: Place::new(&cfg, false).unwrap(),
        };
        let pid = daemon.spawn(&crate::discard_logger()).unwrap();
        let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup"));
        assert!(kill_and_reap(&[pid], Duration::from_millis(300)).is_empty());
        let own = own.unwrap();
        for cg in &cgroups.0 {
            let procs = std::fs::read_to_string(cg.join("cgroup.procs")).unwrap();
            assert!(procs.trim().is_empty(), "{}: {procs}", cg.display());
        }
        let lines: Vec<&str> = own
            .lines()
            .filter(|l| l.ends_with(&format!(":/{name}")))
            .collect();
        assert_eq!(lines.len(), cgroups.0.len(), "/proc/{pid}/cgroup:\n{own}");
    }

    #[test]
    fn children_join_through_tasks_on_v1_and_cgroup_procs_on_v2() {
        let tree = tempfile::tempdir().unwrap();
        let v1 = tree.path().join("v1/pod");
        let v2 = tree.path().join("v2/pod");
        for (dir, files) in [
            (&v1, &["tasks", "cgroup.procs", "notify_on_release"][..]),
            (
                &v2,
                &["cgroup.procs", "cgroup.controllers", "cgroup.threads"][..],
            ),
        ] {
            std::fs::create_dir_all(dir).unwrap();
            for f in files {
                std::fs::write(dir.join(f), "").unwrap();
            }
        }
        assert_eq!(join_file(&v1), v1.join("tasks"));
        assert_eq!(join_file(&v2), v2.join("cgroup.procs"));
    }

    #[test]
    fn a_daemon_log_planted_as_a_link_is_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "host file\n").unwrap();
        let log = dir.path().join("qemu.log");
        std::os::unix::fs::symlink(&secret, &log).unwrap();
        let d = Daemon {
            step: "qemu",
            program: Path::new("/bin/echo"),
            args: vec!["written through the link".into()],
            env: Vec::new(),
            log,
            place: Place::default(),
        };
        let pid = d.spawn(&crate::discard_logger()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while exit_description(pid).is_none() {
            assert!(Instant::now() < deadline, "echo hangs");
            std::thread::sleep(POLL);
        }
        assert_eq!(log_tail(&d.log), "written through the link");
        assert!(!std::fs::symlink_metadata(&d.log).unwrap().is_symlink());
        assert_eq!(std::fs::read_to_string(&secret).unwrap(), "host file\n");
    }

    #[test]
    fn log_tail_does_not_follow_links() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "host secret\n").unwrap();
        let log = dir.path().join("qemu.log");
        std::os::unix::fs::symlink(&secret, &log).unwrap();
        assert_eq!(log_tail(&log), "");
    }

    #[test]
    fn log_tail_keeps_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("x.log");
        let text: String = (0..100).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&log, text).unwrap();
        let tail = log_tail(&log);
        assert!(tail.ends_with("line 99"), "{tail}");
        assert_eq!(tail.lines().count(), TAIL_LINES);
        assert_eq!(log_tail(&dir.path().join("missing")), "");
    }
}
