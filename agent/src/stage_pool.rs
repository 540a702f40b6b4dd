//! Container stages started ahead of need.
//!
//! Every container and every exec'd process starts in a container stage: the agent
//! re-executed as `kata-agent __container-stage` (see `stage`). Starting one costs an
//! exec and the start-up of a Rust program, tens of milliseconds of guest CPU under
//! emulation, on the path of every create and every exec. So the agent keeps one stage
//! started and waiting on its config pipe; a launch takes it and, in the background,
//! starts the next one. A stage whose agent goes away reads end-of-file on its config
//! pipe and exits; [`StagePool::shutdown`] ends the waiting one at once.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use nix::fcntl::OFlag;
use nix::sys::signal::{kill, Signal};
use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use nix::unistd::{pipe2, Pid};
use slog::{debug, warn, Logger};

use crate::stage::protocol::{self, place_fds, STAGE_ARG};

/// A started stage, waiting for its config.
pub struct IdleStage {
    pub pid: i32,
    /// Write end of its config pipe.
    pub config: OwnedFd,
    /// The agent's end of its sync socket.
    pub sync: OwnedFd,
}

impl IdleStage {
    /// Starts a stage with only its config pipe and sync socket; its stdio is /dev/null
    /// until the agent hands it the process's.
    pub fn spawn() -> std::io::Result<IdleStage> {
        let (config_r, config_w) = pipe2(OFlag::O_CLOEXEC)?;
        let (sync_agent, sync_stage) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )?;
        let fds: Vec<(RawFd, RawFd)> = vec![
            (config_r.as_raw_fd(), protocol::CONFIG_FD),
            (sync_stage.as_raw_fd(), protocol::SYNC_FD),
        ];
        let mut cmd = Command::new("/proc/self/exe");
        cmd.arg(STAGE_ARG)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: the closure runs in the forked child before exec and only calls fcntl
        // and dup2, which are async-signal-safe; `fds` is moved in and not reallocated.
        unsafe {
            cmd.pre_exec(move || place_fds(&fds));
        }
        let child = cmd.spawn()?;
        // Pids fit in i32 on Linux. The reaper owns all children: dropping `Child` does
        // not wait for it.
        let pid = child.id() as i32;
        drop(child);
        Ok(IdleStage {
            pid,
            config: config_w,
            sync: sync_agent,
        })
    }
}

/// At most one stage waiting; shared by every launch.
#[derive(Clone)]
pub struct StagePool {
    idle: Arc<Mutex<Option<IdleStage>>>,
    log: Logger,
}

impl StagePool {
    /// A pool with its first stage starting in the background.
    pub fn start(log: Logger) -> StagePool {
        let pool = StagePool {
            idle: Arc::new(Mutex::new(None)),
            log,
        };
        pool.refill();
        pool
    }

    /// The waiting stage, or a new one if there is none (the next is started behind).
    pub fn take(&self) -> std::io::Result<IdleStage> {
        let idle = self.idle.lock().ok().and_then(|mut s| s.take());
        let stage = match idle {
            Some(s) => s,
            None => IdleStage::spawn()?,
        };
        self.refill();
        Ok(stage)
    }

    /// Starts a stage in the background unless one waits already.
    fn refill(&self) {
        let pool = self.clone();
        tokio::task::spawn_blocking(move || {
            if pool.idle.lock().map(|s| s.is_some()).unwrap_or(true) {
                return;
            }
            match IdleStage::spawn() {
                Ok(stage) => {
                    debug!(pool.log, "container stage started ahead"; "stage_pid" => stage.pid);
                    let spare = pool
                        .idle
                        .lock()
                        .ok()
                        .and_then(|mut slot| slot.replace(stage));
                    // Two refills raced: end the extra stage.
                    if let Some(extra) = spare {
                        let _ = kill(Pid::from_raw(extra.pid), Signal::SIGKILL);
                    }
                }
                Err(e) => warn!(pool.log, "cannot start a container stage ahead"; "error" => %e),
            }
        });
    }

    /// Ends the waiting stage (the agent is going away).
    pub fn shutdown(&self) {
        if let Some(stage) = self.idle.lock().ok().and_then(|mut s| s.take()) {
            let _ = kill(Pid::from_raw(stage.pid), Signal::SIGKILL);
        }
    }
}
