//! One container: its init process, exec'd processes, cgroup, and the start handshake.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use slog::{warn, Logger};
use tokio::sync::Mutex;

use crate::cgroup::{self, freezer, oom::OomWatcher, resources::LinuxResources};
use crate::error::{AgentError, Result};
use crate::process::{self, Process};

/// What StartContainer needs: the start pipe and the sync socket that reports whether
/// the init process's exec succeeded.
pub struct PendingStart {
    pub start: OwnedFd,
    pub sync: OwnedFd,
}

pub struct Container {
    pub id: String,
    pub init: Arc<Process>,
    pub cgroup: Option<PathBuf>,
    /// `linux.seccomp` of the spec, which exec'd processes get too.
    pub seccomp: Option<crate::spec::Seccomp>,
    /// The container's own devpts instance (see `devpts`), where its terminals live.
    pub devpts: Option<PathBuf>,
    /// Whether the container shares another's PID namespace (a pod's, or the guest's).
    shared_pid_ns: bool,
    /// Then the mount namespace of its init process, if it has one of its own: with its
    /// cgroup, how [`Container::end_orphans`] finds what the init process leaves running.
    /// Held open until then, so that its identity cannot pass to another namespace; the
    /// lock makes a second caller wait until the first is done.
    own_mnt_ns: Mutex<Option<PinnedNs>>,
    execs: Mutex<HashMap<String, Arc<Process>>>,
    pending: Mutex<Option<PendingStart>>,
    /// The syncs of its watched volumes (see `volume`), stopped with it.
    volumes: std::sync::Mutex<crate::volume::ContainerVolumes>,
}

impl Container {
    pub fn new(
        id: &str,
        init: Process,
        cgroup: Option<PathBuf>,
        pending: Option<PendingStart>,
    ) -> Container {
        Container {
            id: id.to_string(),
            init: Arc::new(init),
            cgroup,
            seccomp: None,
            devpts: None,
            shared_pid_ns: false,
            own_mnt_ns: Mutex::new(None),
            execs: Mutex::new(HashMap::new()),
            pending: Mutex::new(pending),
            volumes: Default::default(),
        }
    }

    /// Gives the container its watched volumes' syncs, which end with it.
    pub fn with_volumes(mut self, volumes: crate::volume::ContainerVolumes) -> Container {
        self.volumes = std::sync::Mutex::new(volumes);
        self
    }

    /// Sets the seccomp profile that exec'd processes are started under.
    pub fn with_seccomp(mut self, seccomp: Option<crate::spec::Seccomp>) -> Container {
        self.seccomp = seccomp;
        self
    }

    /// Sets the devpts instance the container's terminals are opened in.
    pub fn with_devpts(mut self, devpts: Option<PathBuf>) -> Container {
        self.devpts = devpts;
        self
    }

    /// Marks the container as sharing another's PID namespace (`own_pid_ns` false): its
    /// init process's mount namespace is noted for [`Container::end_orphans`].
    pub fn with_pid_namespace(mut self, own_pid_ns: bool) -> Container {
        self.shared_pid_ns = !own_pid_ns;
        if !own_pid_ns {
            // The agent's own mount namespace is no container's.
            let mnt = PinnedNs::open(self.init.pid, "mnt")
                .filter(|ns| Some(ns.id) != NsId::of(std::process::id() as i32, "mnt"));
            self.own_mnt_ns = Mutex::new(mnt);
        }
        self
    }

    /// Ends the container with its init process, as runc's shim does for a container
    /// without a PID namespace of its own: SIGKILL to every process left in its cgroup or
    /// its mount namespace. (With its own PID namespace the kernel does that when the
    /// init process dies.) Without it, what the init process left running would keep the
    /// container's output open and the container alive in all but its init process.
    ///
    /// The first call lets go of the mount namespace's pin when it is done: once the
    /// namespace is gone, the kernel may give its inode to a namespace another
    /// container's stage is making right now, whose processes are not this container's.
    /// Later calls (WaitProcess may come again, or twice at once) wait for the first and
    /// look at the cgroup alone.
    pub async fn end_orphans(&self, log: &Logger) {
        if !self.shared_pid_ns {
            return;
        }
        let mut mnt = self.own_mnt_ns.lock().await;
        // A few rounds: a process may fork while we look.
        for _ in 0..10 {
            let mut pids: Vec<i32> = self
                .cgroup
                .as_deref()
                .and_then(|dir| cgroup::pids(dir).ok())
                .unwrap_or_default();
            if let Some(mnt) = mnt.as_ref() {
                pids.extend(mnt.id.members());
            }
            pids.retain(|&p| p != self.init.pid && p != std::process::id() as i32);
            pids.sort_unstable();
            pids.dedup();
            if pids.is_empty() {
                break;
            }
            warn!(log, "the container's init process exited; killing what it left running";
                "container_id" => &self.id, "pids" => ?pids);
            for pid in pids {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        mnt.take();
    }

    /// Where a terminal for a process of this container is opened.
    pub fn terminal_dir(&self) -> &std::path::Path {
        self.devpts
            .as_deref()
            .unwrap_or(std::path::Path::new("/dev/pts"))
    }

    /// Lets the init process exec; fails with the init process's own error if exec fails.
    pub async fn start(&self, log: &Logger) -> Result<()> {
        let pending = self.pending.lock().await.take().ok_or_else(|| {
            AgentError::FailedPrecondition(format!("container {} was already started", self.id))
        })?;
        match nix::unistd::write(&pending.start, b"s") {
            Ok(_) => {}
            Err(nix::Error::EPIPE) => return Err(self.ended_before_start().await),
            Err(e) => {
                return Err(AgentError::Internal(format!(
                    "start container {}: {e}",
                    self.id
                )))
            }
        }
        drop(pending.start);
        process::wait_exec(log, pending.sync).await
    }

    /// Why a container whose init process closed its start pipe cannot start: it was
    /// killed (or died) while it waited. Its exit status is on its way from the reaper.
    async fn ended_before_start(&self) -> AgentError {
        let wait = tokio::time::timeout(std::time::Duration::from_secs(1), self.init.wait());
        let status = match wait.await {
            Ok(status) if status > 128 => format!(" (killed by signal {})", status - 128),
            Ok(status) => format!(" (exit status {status})"),
            Err(_) => String::new(),
        };
        AgentError::FailedPrecondition(format!(
            "container {}: its init process ended before it was started{status}; \
             remove the container and create it again",
            self.id
        ))
    }

    pub async fn is_started(&self) -> bool {
        self.pending.lock().await.is_none()
    }

    /// The process with `exec_id` ("" = init).
    pub async fn process(&self, exec_id: &str) -> Result<Arc<Process>> {
        if exec_id.is_empty() {
            return Ok(self.init.clone());
        }
        self.execs
            .lock()
            .await
            .get(exec_id)
            .cloned()
            .ok_or_else(|| {
                AgentError::NotFound(format!("container {} has no process {exec_id}", self.id))
            })
    }

    pub async fn has_exec(&self, exec_id: &str) -> bool {
        self.execs.lock().await.contains_key(exec_id)
    }

    /// Records an exec'd process; fails if the id was taken meanwhile.
    pub async fn add_exec(&self, process: Arc<Process>) -> Result<()> {
        let mut execs = self.execs.lock().await;
        if execs.contains_key(&process.exec_id) {
            return Err(AgentError::AlreadyExists(format!(
                "container {} already has a process {}",
                self.id, process.exec_id
            )));
        }
        execs.insert(process.exec_id.clone(), process);
        Ok(())
    }

    /// Forgets an exec'd process that failed to start.
    pub async fn remove_exec(&self, exec_id: &str) {
        self.execs.lock().await.remove(exec_id);
    }

    /// The container's cgroup, for operations that need one.
    fn cgroup_dir(&self) -> Result<&Path> {
        self.cgroup.as_deref().ok_or_else(|| {
            AgentError::FailedPrecondition(format!(
                "container {} has no cgroup (no cgroup v2 hierarchy in the guest)",
                self.id
            ))
        })
    }

    /// Freezes every process of the container.
    pub async fn pause(&self) -> Result<()> {
        freezer::set_frozen(self.cgroup_dir()?, true)
            .await
            .map_err(|e| e.in_context(&format!("pause container {}", self.id)))
    }

    /// Thaws the container's processes.
    pub async fn resume(&self) -> Result<()> {
        freezer::set_frozen(self.cgroup_dir()?, false)
            .await
            .map_err(|e| e.in_context(&format!("resume container {}", self.id)))
    }

    /// The container's cgroup figures.
    pub fn stats(&self) -> Result<protocols::agent::StatsContainerResponse> {
        cgroup::stats::read(self.cgroup_dir()?)
            .map_err(|e| e.in_context(&format!("stats of container {}", self.id)))
    }

    /// Applies new resource limits to the running container.
    pub fn update(&self, resources: &LinuxResources) -> Result<()> {
        cgroup::resources::apply(self.cgroup_dir()?, resources)
            .map_err(|e| e.in_context(&format!("update container {}", self.id)))
    }

    /// Guest pids of every process in the container.
    pub async fn pids(&self) -> Vec<i32> {
        if let Some(dir) = &self.cgroup {
            if let Ok(pids) = cgroup::pids(dir) {
                return pids;
            }
        }
        let mut pids = Vec::new();
        let execs = self.execs.lock().await;
        for p in std::iter::once(&self.init).chain(execs.values()) {
            if p.exit_status().is_none() {
                pids.push(p.pid);
            }
        }
        pids
    }

    /// Sends `signal` to one process, or to all of the container's processes.
    pub async fn signal(&self, exec_id: &str, signal: Signal, all: bool) -> Result<()> {
        let targets = if all {
            self.pids().await
        } else {
            vec![self.process(exec_id).await?.pid]
        };
        let process = self.process(exec_id).await?;
        if !all && process.exit_status().is_some() {
            return Ok(()); // containerd signals exited processes; that is not an error
        }
        for pid in targets {
            match kill(Pid::from_raw(pid), signal) {
                Ok(()) | Err(nix::Error::ESRCH) => {}
                Err(e) => {
                    return Err(AgentError::Internal(format!(
                        "signal {signal} to pid {pid}: {e}"
                    )))
                }
            }
        }
        Ok(())
    }

    /// Kills every process of the container, waits for the init process, takes a last
    /// look for OOM kills, and removes the cgroup (which kills anything left in it).
    /// The mounts live in the container's mount namespace and go with it.
    pub async fn destroy(&self, log: &Logger, oom: &OomWatcher) {
        self.pending.lock().await.take();
        if self.init.exit_status().is_none() {
            // Killing the pid namespace's init kills everything else in it.
            let _ = kill(Pid::from_raw(self.init.pid), Signal::SIGKILL);
        }
        for pid in self.pids().await {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        let timeout = std::time::Duration::from_secs(10);
        if tokio::time::timeout(timeout, self.init.wait())
            .await
            .is_err()
        {
            warn!(log, "container init did not exit after SIGKILL"; "container_id" => &self.id);
        }
        let execs: Vec<_> = self.execs.lock().await.values().cloned().collect();
        for p in execs {
            let _ = tokio::time::timeout(timeout, p.wait()).await;
        }
        oom.unwatch(&self.id);
        self.own_mnt_ns.lock().await.take();
        if let Ok(mut v) = self.volumes.lock() {
            v.stop(log);
        }
        if let Some(dir) = &self.devpts {
            crate::devpts::unmount_instance(dir);
        }
        if let Some(dir) = &self.cgroup {
            if let Err(e) = cgroup::remove(dir).await {
                warn!(log, "cannot remove cgroup"; "path" => %dir.display(), "error" => %e);
            }
        }
    }
}

/// A namespace's identity: the device and inode of its `/proc/PID/ns/KIND` link. It is
/// the namespace's only while the namespace lives: the inode of one that is gone can be
/// given to the next one made (see [`PinnedNs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct NsId {
    dev: u64,
    ino: u64,
}

impl NsId {
    fn of(pid: i32, kind: &str) -> Option<NsId> {
        let st = nix::sys::stat::stat(format!("/proc/{pid}/ns/{kind}").as_str()).ok()?;
        Some(NsId::from(st))
    }

    /// The live processes in this mount namespace (zombies have none).
    fn members(self) -> Vec<i32> {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        dir.flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|&pid| NsId::of(pid, "mnt") == Some(self))
            .collect()
    }
}

impl From<nix::sys::stat::FileStat> for NsId {
    fn from(st: nix::sys::stat::FileStat) -> NsId {
        NsId {
            dev: st.st_dev,
            ino: st.st_ino,
        }
    }
}

/// A namespace held open: it lives, and its identity stays its own, until this is dropped.
struct PinnedNs {
    id: NsId,
    _file: std::fs::File,
}

impl PinnedNs {
    fn open(pid: i32, kind: &str) -> Option<PinnedNs> {
        let file = std::fs::File::open(format!("/proc/{pid}/ns/{kind}")).ok()?;
        let id = NsId::from(nix::sys::stat::fstat(file.as_raw_fd()).ok()?);
        Some(PinnedNs { id, _file: file })
    }
}
