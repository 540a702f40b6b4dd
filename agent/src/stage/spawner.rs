//! Container stages forked from a zygote.
//!
//! Every container and every exec'd process starts in a container stage (see `stage`):
//! a single-threaded process that may unshare, setns, mount and fork freely. The agent
//! is a multi-threaded tokio process, which may not fork and then run anything but
//! async-signal-safe code; re-executing itself (`/proc/self/exe __container-stage`)
//! costs a fork of the whole agent, an exec and a Rust start-up, about 20 ms of guest
//! CPU under TCG on the path of every create and every exec. So before it starts its
//! first thread the agent forks a zygote ([`StageSpawner::start`]): a small
//! single-threaded copy of itself that only waits on a socket. Each request hands it a
//! stage's config pipe and sync socket; it forks, and the child runs [`stage::main`] at
//! once, with nothing to load or initialise.
//!
//! The zygote is the stages' parent and lets the kernel reap them (SIGCHLD ignored);
//! the processes they start reparent to the agent, as before. It ends when the agent's
//! end of its socket closes, or by [`StageSpawner::shutdown`]. If it is gone or never
//! started, stages start by re-executing the agent, as they did before it existed.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::Mutex;

use nix::fcntl::OFlag;
use nix::sys::signal::{kill, signal, SigHandler, Signal};
use nix::sys::socket::{recv, send, socketpair, AddressFamily, MsgFlags, SockFlag, SockType};
use nix::unistd::{fork, pipe2, ForkResult, Pid};
use slog::{warn, Logger};

use crate::stage::protocol::{self, place_fds, recv_fds, send_fds, STAGE_ARG};

/// The zygote's name in `ps` (its command line is the agent's).
pub const ZYGOTE_NAME: &std::ffi::CStr = c"kata-zygote";

/// A started stage, waiting for its config.
pub struct Stage {
    pub pid: i32,
    /// Write end of its config pipe.
    pub config: OwnedFd,
    /// The agent's end of its sync socket.
    pub sync: OwnedFd,
}

/// The zygote: its pid and the agent's end of its request socket.
struct Zygote {
    pid: i32,
    sock: OwnedFd,
}

/// Starts container stages; shared by every launch.
pub struct StageSpawner {
    zygote: Mutex<Option<Zygote>>,
    log: Logger,
}

impl StageSpawner {
    /// Forks the zygote. If that fails, stages start by re-executing the agent (logged).
    ///
    /// # Safety
    /// The process must be single-threaded: the zygote, a forked child, goes on running
    /// ordinary Rust code (it allocates and forks), which is sound only when no other
    /// thread could have held a lock at the fork.
    pub unsafe fn start(log: Logger) -> StageSpawner {
        let zygote = match fork_zygote() {
            Ok(z) => Some(z),
            Err(e) => {
                warn!(log, "cannot start the stage zygote; container stages will start by \
                    re-executing the agent (slower)"; "error" => %e);
                None
            }
        };
        StageSpawner {
            zygote: Mutex::new(zygote),
            log,
        }
    }

    /// Starts a stage with only its config pipe and sync socket; its stdio is /dev/null
    /// until the agent hands it the process's. Blocks briefly (one round trip to the
    /// zygote, or a fork and exec without it).
    pub fn spawn(&self) -> std::io::Result<Stage> {
        let (config_r, config_w) = pipe2(OFlag::O_CLOEXEC)?;
        let (sync_agent, sync_stage) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )?;
        let mut slot = self
            .zygote
            .lock()
            .map_err(|_| std::io::Error::other("stage spawner lock poisoned"))?;
        let pid = match slot
            .as_ref()
            .map(|z| ask_zygote(z.sock.as_fd(), &config_r, &sync_stage))
        {
            Some(Ok(pid)) => pid,
            Some(Err(e)) => {
                warn!(self.log, "the stage zygote stopped answering; container stages \
                    start by re-executing the agent from now on"; "error" => %e);
                if let Some(z) = slot.take() {
                    let _ = kill(Pid::from_raw(z.pid), Signal::SIGKILL);
                }
                exec_stage(&config_r, &sync_stage)?
            }
            None => exec_stage(&config_r, &sync_stage)?,
        };
        Ok(Stage {
            pid,
            config: config_w,
            sync: sync_agent,
        })
    }

    /// Ends the zygote (the agent is going away).
    pub fn shutdown(&self) {
        if let Some(z) = self.zygote.lock().ok().and_then(|mut s| s.take()) {
            let _ = kill(Pid::from_raw(z.pid), Signal::SIGKILL);
        }
    }
}

/// Hands the zygote a stage's two descriptors and reads back the stage's pid.
fn ask_zygote(sock: BorrowedFd<'_>, config: &OwnedFd, sync: &OwnedFd) -> std::io::Result<i32> {
    send_fds(sock, &[config.as_raw_fd(), sync.as_raw_fd()])?;
    let mut reply = [0u8; 4];
    let n = loop {
        match recv(sock.as_raw_fd(), &mut reply, MsgFlags::empty()) {
            Err(nix::Error::EINTR) => continue,
            other => break other?,
        }
    };
    if n != reply.len() {
        return Err(std::io::Error::other("the zygote closed its socket"));
    }
    match i32::from_ne_bytes(reply) {
        pid if pid > 0 => Ok(pid),
        errno => Err(std::io::Error::from_raw_os_error(-errno)),
    }
}

/// The way without a zygote: fork and exec `/proc/self/exe __container-stage`.
fn exec_stage(config: &OwnedFd, sync: &OwnedFd) -> std::io::Result<i32> {
    let fds: Vec<(RawFd, RawFd)> = vec![
        (config.as_raw_fd(), protocol::CONFIG_FD),
        (sync.as_raw_fd(), protocol::SYNC_FD),
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
    // Pids fit in i32 on Linux. The reaper owns all children: dropping `Child` does not
    // wait for it.
    Ok(child.id() as i32)
}

/// Forks the zygote; the parent gets its pid and socket.
///
/// # Safety
/// As [`StageSpawner::start`]: the process must be single-threaded.
unsafe fn fork_zygote() -> std::io::Result<Zygote> {
    let (agent_end, zygote_end) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )?;
    // SAFETY: the caller guarantees no other thread exists, so the child may run any code.
    match unsafe { fork() }? {
        ForkResult::Child => {
            drop(agent_end);
            zygote_main(zygote_end)
        }
        ForkResult::Parent { child } => Ok(Zygote {
            pid: child.as_raw(),
            sock: agent_end,
        }),
    }
}

/// The zygote's loop: one stage per request, until the agent's end closes.
fn zygote_main(sock: OwnedFd) -> ! {
    let _ = nix::sys::prctl::set_name(ZYGOTE_NAME);
    // Stages start with /dev/null as stdio, as an exec'd stage did.
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        let raw = null.as_raw_fd();
        let _ = place_fds(&[(raw, 0), (raw, 1), (raw, 2)]);
        if raw <= 2 {
            // It was opened on a free stdio slot and now is that slot: keep it open.
            std::mem::forget(null);
        }
    }
    // The kernel reaps the stages; each puts SIGCHLD back before anything else.
    // SAFETY: SIG_IGN installs no handler of ours.
    let _ = unsafe { signal(Signal::SIGCHLD, SigHandler::SigIgn) };
    loop {
        let fds = match recv_fds(sock.as_fd()) {
            Ok(fds) if fds.len() == 2 => fds,
            // End of stream (the agent is gone) or a request it never sends.
            _ => std::process::exit(0),
        };
        // SAFETY: the zygote is single-threaded (forked from a single-threaded agent,
        // it starts no threads), so the child may run any code.
        let reply = match unsafe { fork() } {
            Ok(ForkResult::Child) => {
                drop(sock);
                stage_child(&fds)
            }
            Ok(ForkResult::Parent { child }) => child.as_raw(),
            Err(e) => -(e as i32),
        };
        drop(fds);
        if send(
            sock.as_raw_fd(),
            &reply.to_ne_bytes(),
            MsgFlags::MSG_NOSIGNAL,
        )
        .is_err()
        {
            std::process::exit(0);
        }
    }
}

/// A stage forked by the zygote: its descriptors in place, everything else closed, then
/// the stage itself.
fn stage_child(fds: &[OwnedFd]) -> ! {
    // SAFETY: SIG_DFL installs no handler of ours.
    let _ = unsafe { signal(Signal::SIGCHLD, SigHandler::SigDfl) };
    let moves = [
        (fds[0].as_raw_fd(), protocol::CONFIG_FD),
        (fds[1].as_raw_fd(), protocol::SYNC_FD),
    ];
    if place_fds(&moves).is_err() {
        std::process::exit(127);
    }
    // Nothing else of the zygote's is the stage's business (an exec'd stage had only
    // these, everything else being close-on-exec).
    let first_free = protocol::SYNC_FD as u32 + 1;
    // SAFETY: close_range only closes descriptors; the received copies above SYNC_FD are
    // not used again (the process exits or becomes the stage, which never returns).
    unsafe { libc::close_range(first_free, u32::MAX, 0) };
    crate::stage::main()
}
