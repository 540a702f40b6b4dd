//! What the agent and the container stage say to each other.
//!
//! The agent starts the stage (forked from its zygote, or `kata-agent __container-stage`
//! without one; see `spawner`) with two fixed file descriptors: the config pipe
//! and a SOCK_SEQPACKET sync socket (one JSON message per packet). When a container or
//! process needs it, the agent writes the [`StageConfig`] into the pipe and sends the
//! process's stdio (and, for a new container, the start pipe) over the sync socket
//! ([`send_fds`]); the stage puts them at 0-2 and [`START_FD`]. The container process inherits the sync socket with
//! CLOEXEC set, so when the agent reads end-of-stream after `Pid` (and `Ready`), the
//! process has called execve successfully.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{
    recv, recvmsg, send, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags,
};
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
/// The most descriptors the agent hands the stage: stdin, stdout, stderr, start pipe.
pub const MAX_PASSED_FDS: usize = 4;
/// The one byte that carries them.
const FDS_MARK: &[u8] = b"F";

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

/// Hands `fds` (stdin, stdout, stderr and maybe the start pipe, in that order) to the
/// stage, in one packet.
pub fn send_fds(sync: BorrowedFd<'_>, fds: &[RawFd]) -> nix::Result<()> {
    let iov = [IoSlice::new(FDS_MARK)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    sendmsg::<()>(sync.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None).map(|_| ())
}

/// Receives the descriptors [`send_fds`] sent, in order.
pub fn recv_fds(sync: BorrowedFd<'_>) -> nix::Result<Vec<OwnedFd>> {
    let mut mark = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut mark)];
    let mut space = nix::cmsg_space!([RawFd; MAX_PASSED_FDS]);
    let msg = loop {
        match recvmsg::<()>(
            sync.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(nix::Error::EINTR) => continue,
            other => break other?,
        }
    };
    let mut fds = Vec::new();
    for cmsg in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(received) = cmsg {
            // SAFETY: SCM_RIGHTS installed these descriptors in this process just now;
            // nothing else owns them.
            fds.extend(
                received
                    .into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    if msg.bytes != FDS_MARK.len() || fds.is_empty() {
        return Err(nix::Error::EBADMSG);
    }
    Ok(fds)
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

/// Moves each source fd to its fixed number, without CLOEXEC. Sources are first copied
/// above every target so that no dup2 clobbers a source not yet moved. Only fcntl and
/// dup2: safe between fork and exec.
pub fn place_fds(fds: &[(RawFd, RawFd)]) -> std::io::Result<()> {
    let mut high = [0 as RawFd; MAX_PASSED_FDS];
    if fds.len() > high.len() {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    for (i, (src, _)) in fds.iter().enumerate() {
        // SAFETY: F_DUPFD_CLOEXEC on an fd we own creates a new fd; no memory involved.
        let fd = unsafe { libc::fcntl(*src, libc::F_DUPFD_CLOEXEC, 64) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        high[i] = fd;
    }
    for (i, (_, dst)) in fds.iter().enumerate() {
        // SAFETY: dup2 between two fds of this process; the new fd has CLOEXEC cleared.
        if unsafe { libc::dup2(high[i], *dst) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `high[i]` is the copy made above, which nothing else uses.
        unsafe { libc::close(high[i]) };
    }
    Ok(())
}
