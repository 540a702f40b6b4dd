//! Reaps every child of the agent and hands exit statuses to whoever waits for them.
//!
//! As PID 1 (or a child subreaper in host mode) the agent inherits every container
//! process. One SIGCHLD-driven `waitpid(-1, WNOHANG)` loop reaps them all; a process
//! the agent cares about is registered before it can exit unseen (the stage waits for
//! the agent's ack before it exits and the process reparents to us).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use slog::{debug, error, Logger};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

/// The shell convention: exit code, or 128 + signal number.
pub type ExitStatus = i32;

/// Receives `Some(status)` once the process has been reaped.
pub type ExitReceiver = watch::Receiver<Option<ExitStatus>>;

#[derive(Default)]
pub struct Reaper {
    waiters: Mutex<HashMap<i32, watch::Sender<Option<ExitStatus>>>>,
}

impl Reaper {
    /// Installs the SIGCHLD handler and starts the reaping task.
    pub fn start(log: Logger) -> std::io::Result<Arc<Reaper>> {
        let mut sigchld = signal(SignalKind::child())?;
        let reaper = Arc::new(Reaper::default());
        let r = reaper.clone();
        tokio::spawn(async move {
            loop {
                r.reap_all(&log);
                if sigchld.recv().await.is_none() {
                    error!(log, "SIGCHLD stream ended; no more children will be reaped");
                    return;
                }
            }
        });
        Ok(reaper)
    }

    /// Registers interest in `pid`'s exit. Must happen before `pid` can be reaped.
    pub fn register(&self, pid: i32) -> ExitReceiver {
        let (tx, rx) = watch::channel(None);
        self.lock().insert(pid, tx);
        rx
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i32, watch::Sender<Option<ExitStatus>>>> {
        // A panic while holding this lock cannot leave the map inconsistent.
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn reap_all(&self, log: &Logger) {
        loop {
            let (pid, status) = match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => (pid, code),
                Ok(WaitStatus::Signaled(pid, sig, _)) => (pid, 128 + sig as i32),
                Ok(WaitStatus::StillAlive) | Err(nix::Error::ECHILD) => return,
                Ok(_) => continue,
                Err(nix::Error::EINTR) => continue,
                Err(e) => {
                    error!(log, "waitpid failed"; "error" => %e);
                    return;
                }
            };
            match self.lock().remove(&pid.as_raw()) {
                Some(tx) => {
                    debug!(log, "process exited"; "pid" => pid.as_raw(), "status" => status);
                    let _ = tx.send(Some(status));
                }
                None => {
                    debug!(log, "reaped untracked process"; "pid" => pid.as_raw(), "status" => status)
                }
            }
        }
    }
}
