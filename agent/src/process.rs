//! A process inside a container (the init process or an exec'd one): how the agent
//! launches it through the container stage, its stdio, and its exit status.

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::Arc;

use nix::fcntl::OFlag;
use nix::unistd::pipe2;
use slog::{info, Logger};

use crate::error::{AgentError, Result};
use crate::reaper::{ExitReceiver, ExitStatus, Reaper};
use crate::stage::protocol::{self, recv_message, StageConfig, StageMessage, StageMode};
use crate::stage::spawner::StageSpawner;
use crate::stdio::{self, SharedFd};

/// A launched container process.
pub struct Process {
    pub exec_id: String,
    pub pid: i32,
    exit: ExitReceiver,
    /// Each stream waits for the host to attach it (`stdio::streams`).
    pub stdio: stdio::Stdio,
    /// The pty master, when the process has a terminal.
    pub tty: Option<SharedFd>,
}

/// What [`launch`] hands back besides the process: the sync socket (to learn whether
/// exec succeeded) and, for a new container, the start pipe.
pub struct Launched {
    pub process: Process,
    pub sync: OwnedFd,
    pub start: Option<OwnedFd>,
}

impl Process {
    /// Waits until the process has been reaped.
    pub async fn wait(&self) -> ExitStatus {
        let mut rx = self.exit.clone();
        let status = rx.wait_for(|s| s.is_some()).await.map(|s| *s);
        match status {
            Ok(s) => s.unwrap_or(-1),
            Err(_) => -1, // the reaper is gone; cannot happen while the agent runs
        }
    }

    pub fn exit_status(&self) -> Option<ExitStatus> {
        *self.exit.borrow()
    }
}

/// Launches the stage with `config`; returns once the container process exists (its pid
/// known and registered with the reaper) and, in create mode, is ready to start.
/// `terminal` is the devpts instance to open the process's terminal in, if it has one.
pub async fn launch(
    log: &Logger,
    reaper: &Reaper,
    stages: &Arc<StageSpawner>,
    exec_id: &str,
    config: StageConfig,
    terminal: Option<&Path>,
    with_stdin: bool,
) -> Result<Launched> {
    // A new container waits on its start pipe; an exec'd process runs at once.
    let with_start = matches!(config.mode, StageMode::Create { .. });
    let io_err =
        |what: &str, e: &dyn std::fmt::Display| AgentError::Internal(format!("{what}: {e}"));
    let start = if with_start {
        Some(pipe2(OFlag::O_CLOEXEC).map_err(|e| io_err("start pipe", &e))?)
    } else {
        None
    };

    // The process's ends of its stdio, handed to the stage; the agent keeps the others.
    let child_stdio: [OwnedFd; 3];
    let (stdout, stderr, stdin_w, tty);
    if let Some(devpts) = terminal {
        let (master, slave) = crate::devpts::open_pty(devpts)
            .map_err(|e| io_err(&format!("open a terminal in {}", devpts.display()), &e))?;
        let dup = |fd: &OwnedFd| fd.try_clone().map_err(|e| io_err("dup pty", &e));
        child_stdio = [dup(&slave)?, dup(&slave)?, slave];
        let master = stdio::async_fd(master).map_err(|e| io_err("pty master", &e))?;
        stdout = master.clone();
        stderr = None;
        stdin_w = with_stdin.then(|| master.clone());
        tty = Some(master);
    } else {
        let (out_r, out_w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| io_err("stdout pipe", &e))?;
        let (err_r, err_w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| io_err("stderr pipe", &e))?;
        // Best effort: a smaller pipe still works.
        let _ = nix::fcntl::fcntl(
            out_r.as_raw_fd(),
            nix::fcntl::FcntlArg::F_SETPIPE_SZ(stdio::PIPE_SIZE),
        );
        let child_stdin = if with_stdin {
            let (in_r, in_w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| io_err("stdin pipe", &e))?;
            stdin_w = Some(stdio::async_fd(in_w).map_err(|e| io_err("stdin pipe", &e))?);
            in_r
        } else {
            stdin_w = None;
            OwnedFd::from(
                std::fs::File::open("/dev/null").map_err(|e| io_err("open /dev/null", &e))?,
            )
        };
        child_stdio = [child_stdin, out_w, err_w];
        stdout = stdio::async_fd(out_r).map_err(|e| io_err("stdout pipe", &e))?;
        stderr = Some(stdio::async_fd(err_r).map_err(|e| io_err("stderr pipe", &e))?);
        tty = None;
    }

    let spawner = stages.clone();
    let stage = tokio::task::spawn_blocking(move || spawner.spawn())
        .await
        .map_err(|e| io_err("start container stage", &e))?
        .map_err(|e| io_err("start container stage", &e))?;
    info!(log, "container stage taken"; "exec_id" => exec_id, "stage_pid" => stage.pid);
    let mut passed: Vec<RawFd> = child_stdio.iter().map(|fd| fd.as_raw_fd()).collect();
    let start_w = start.map(|(r, w)| {
        passed.push(r.as_raw_fd());
        (r, w)
    });
    protocol::send_fds(stage.sync.as_fd(), &passed)
        .map_err(|e| io_err("hand the process its stdio", &e))?;
    // The stage holds its own copies now.
    drop(child_stdio);
    let start_w = start_w.map(|(r, w)| {
        drop(r);
        w
    });

    let bytes = serde_json::to_vec(&config).map_err(|e| io_err("encode stage config", &e))?;
    let config_w = stage.config;
    tokio::task::spawn_blocking(move || std::fs::File::from(config_w).write_all(&bytes))
        .await
        .map_err(|e| io_err("send stage config", &e))?
        .map_err(|e| io_err("send stage config", &e))?;

    let (sync, pid, exit) = handshake(log.clone(), reaper, stage.sync, with_start).await?;
    let process = Process {
        exec_id: exec_id.to_string(),
        pid,
        exit,
        stdio: stdio::Stdio::new(stdin_w, stdout, stderr),
        tty,
    };
    Ok(Launched {
        process,
        sync,
        start: start_w,
    })
}

/// Reads the stage's messages until the pid is known and, if `want_ready`, the
/// container is set up. Registers the pid with the reaper before acknowledging it.
async fn handshake(
    log: Logger,
    reaper: &Reaper,
    sync: OwnedFd,
    want_ready: bool,
) -> Result<(OwnedFd, i32, ExitReceiver)> {
    let mut pid = None;
    let mut ready = !want_ready;
    let mut sync = sync;
    while pid.is_none() || !ready {
        let (fd, msg) = next_message(sync).await?;
        sync = fd;
        match msg {
            Some(StageMessage::Pid(p)) => {
                let rx = reaper.register(p);
                pid = Some((p, rx));
                nix::sys::socket::send(
                    sync.as_raw_fd(),
                    b"ack",
                    nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
                )
                .map_err(|e| AgentError::Internal(format!("acknowledge container pid: {e}")))?;
            }
            Some(StageMessage::Ready) => ready = true,
            Some(StageMessage::Log(line)) => info!(log, "stage: {}", line),
            Some(StageMessage::Error(e)) => return Err(AgentError::FailedPrecondition(e)),
            Some(StageMessage::InvalidSpec(e)) => return Err(AgentError::InvalidArgument(e)),
            None => {
                return Err(AgentError::FailedPrecondition(
                    "container stage exited without reporting a process".into(),
                ))
            }
        }
    }
    let (pid, rx) =
        pid.ok_or_else(|| AgentError::Internal("container stage reported no pid".into()))?;
    Ok((sync, pid, rx))
}

/// Waits until the container process has called execve (end of stream on the sync
/// socket) or reports why it could not.
pub async fn wait_exec(log: &Logger, sync: OwnedFd) -> Result<()> {
    let mut sync = sync;
    loop {
        let (fd, msg) = next_message(sync).await?;
        sync = fd;
        match msg {
            None => return Ok(()),
            Some(StageMessage::Error(e)) => return Err(AgentError::FailedPrecondition(e)),
            Some(StageMessage::InvalidSpec(e)) => return Err(AgentError::InvalidArgument(e)),
            Some(StageMessage::Log(line)) => info!(log, "stage: {}", line),
            Some(other) => info!(log, "unexpected stage message"; "message" => ?other),
        }
    }
}

async fn next_message(sync: OwnedFd) -> Result<(OwnedFd, Option<StageMessage>)> {
    tokio::task::spawn_blocking(move || {
        let msg = recv_message(sync.as_fd());
        (sync, msg)
    })
    .await
    .map_err(|e| AgentError::Internal(format!("read from container stage: {e}")))
    .and_then(|(fd, msg)| {
        msg.map(|m| (fd, m))
            .map_err(|e| AgentError::Internal(format!("read from container stage: {e}")))
    })
}
