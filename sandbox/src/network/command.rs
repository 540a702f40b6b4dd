//! Short host commands the shim runs (`nft`, `iptables`), waited for by pid.
//!
//! The host process's reaper (the shim's SIGCHLD reaper) reaps every child, so
//! `Child::wait` may find its child gone. A command here is waited for as the watchdog
//! waits for the VMM: subscribed to the reaper's exit announcements ([`crate::exits`])
//! before it starts, and reaped directly when it is still ours (unit tests have no reaper).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// How long a command may run.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(10);

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// The exit code, or 128 + the signal that ended it.
    pub status: i32,
    pub stderr: String,
}

impl Finished {
    pub fn success(&self) -> bool {
        self.status == 0
    }
}

/// Runs `program args…` with `stdin`, in the network namespace `netns` if one is given,
/// and waits until it exits.
pub async fn run(
    program: &str,
    args: &[String],
    stdin: Vec<u8>,
    netns: Option<&Path>,
) -> std::io::Result<Finished> {
    let mut sub = crate::exits::subscribe();
    let program = program.to_string();
    let args = args.to_vec();
    let netns: Option<PathBuf> = netns.map(Path::to_path_buf);
    let spawned = tokio::task::spawn_blocking(move || -> std::io::Result<(i32, String)> {
        let start = move || -> std::io::Result<(i32, String)> {
            let mut child = Command::new(&program)
                .args(&args)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()?;
            if let Some(mut input) = child.stdin.take() {
                input.write_all(&stdin)?;
            }
            let mut stderr = String::new();
            if let Some(mut err) = child.stderr.take() {
                err.read_to_string(&mut stderr)?;
            }
            // Not waited for here: see the module doc.
            Ok((child.id() as i32, stderr))
        };
        match netns {
            Some(ns) => super::netns::run_in(&ns, move || {
                start().map_err(|e| crate::network::NetworkError::Thread(e.to_string()))
            })
            .map_err(std::io::Error::other),
            None => start(),
        }
    })
    .await
    .map_err(std::io::Error::other)?;
    let result = match spawned {
        Ok((pid, stderr)) => wait(pid, &mut sub)
            .await
            .map(|status| Finished { status, stderr }),
        Err(e) => Err(e),
    };
    drop(sub);
    result
}

/// Waits for `pid` to exit: reaped here, or announced by the reaper on `sub`.
async fn wait(pid: i32, sub: &mut crate::exits::Subscription) -> std::io::Result<i32> {
    let deadline = tokio::time::Instant::now() + COMMAND_TIMEOUT;
    loop {
        match waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, code)) => return Ok(code),
            Ok(WaitStatus::Signaled(_, sig, _)) => return Ok(128 + sig as i32),
            Ok(_) => {}
            Err(Errno::EINTR) => continue,
            // The reaper got it first: its announcement says how it ended.
            Err(Errno::ECHILD) => {}
            Err(e) => return Err(std::io::Error::from(e)),
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("pid {pid} did not exit within {COMMAND_TIMEOUT:?}"),
            ));
        }
        if let Ok(Some(ev)) = tokio::time::timeout(POLL, sub.rx.recv()).await {
            if ev.pid == pid {
                return Ok(ev.code);
            }
        }
    }
}
