//! What the agent and the container stage say to each other.
//!
//! The agent starts the stage (`kata-agent __container-stage`) with fixed file
//! descriptors: the config pipe, a SOCK_SEQPACKET sync socket (one JSON message per
//! packet) and, for a new container, the start pipe. The container process inherits the
//! sync socket with CLOEXEC set, so when the agent reads end-of-stream after `Pid`
//! (and `Ready`), the process has called execve successfully.

use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

use nix::sys::socket::{recv, send, MsgFlags};
use serde::{Deserialize, Serialize};

use super::error::StageError;
use crate::spec::{Process, Seccomp, Spec};

/// argv[1] that makes kata-agent run as the container stage.
pub const STAGE_ARG: &str = "__container-stage";
/// Read end of the pipe that carries the [`StageConfig`] JSON.
pub const CONFIG_FD: RawFd = 3;
/// The stage's end of the sync socket.
pub const SYNC_FD: RawFd = 4;
/// Read end of the start pipe (create mode only): one byte means "exec now".
pub const START_FD: RawFd = 5;

/// The largest message that crosses the sync socket.
const MAX_MESSAGE: usize = 64 * 1024;

/// What the stage must do.
#[derive(Debug, Serialize, Deserialize)]
pub struct StageConfig {
    pub mode: StageMode,
    /// The cgroup v2 directory to join before forking, if cgroups are in use.
    pub cgroup: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum StageMode {
    /// A new container: namespaces, rootfs, then the init process waits for start.
    Create { spec: Box<Spec> },
    /// An extra process in the namespaces of the running init process `init_pid`,
    /// under the container's seccomp profile (`linux.seccomp`), as runc does.
    Exec {
        process: Box<Process>,
        init_pid: i32,
        #[serde(default)]
        seccomp: Option<Seccomp>,
    },
}

/// Messages from the stage (and the container process it forks) to the agent.
#[derive(Debug, Serialize, Deserialize)]
pub enum StageMessage {
    /// The container process's pid, in the agent's pid namespace. The stage waits for
    /// an ack before exiting so the agent registers the pid before it can be reaped.
    Pid(i32),
    /// The container is set up and waits on the start pipe.
    Ready,
    /// Something failed; the text is for the user.
    Error(String),
    /// The spec asks for what the container's rootfs does not have (a command, cwd or
    /// user); the caller must change the spec or the image. The text is for the user.
    InvalidSpec(String),
    /// A line for the agent's log (the stage's own stderr belongs to the container).
    Log(String),
}

impl From<StageError> for StageMessage {
    fn from(e: StageError) -> StageMessage {
        if e.is_invalid_spec() {
            StageMessage::InvalidSpec(e.to_string())
        } else {
            StageMessage::Error(e.to_string())
        }
    }
}

/// Sends one message as one packet.
pub fn send_message(fd: BorrowedFd<'_>, msg: &StageMessage) -> nix::Result<()> {
    let bytes = serde_json::to_vec(msg).map_err(|_| nix::Error::EINVAL)?;
    send(fd.as_raw_fd(), &bytes, MsgFlags::MSG_NOSIGNAL).map(|_| ())
}

/// Receives one message; `Ok(None)` at end of stream.
pub fn recv_message(fd: BorrowedFd<'_>) -> nix::Result<Option<StageMessage>> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    loop {
        match recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()) {
            Ok(0) => return Ok(None),
            Ok(n) => {
                return serde_json::from_slice(&buf[..n])
                    .map(Some)
                    .map_err(|_| nix::Error::EBADMSG)
            }
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(e),
        }
    }
}
