//! Starting a daemon: its [`Place`] (cgroups, network namespace, passed descriptors,
//! jail), set up in the child between fork and exec, and its output in a capped log.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use super::log_tail;
use crate::Error;

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
