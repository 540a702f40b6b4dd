//! The debug console: a root shell in the guest for `kata-runtime exec SANDBOX-ID`.
//!
//! Off unless the kernel command line carries `agent.debug_console` (the host adds it,
//! with `agent.debug_console_vport=1026`, when `[agent.kata] debug_console_enabled =
//! true`; Kata's spelling). Then the agent listens on that vsock port, serves the host
//! only (see `host_only`: a container cannot reach it through the loopback transport),
//! and gives each connection a shell in the guest's root, as root, on a new terminal of
//! the agent's own devpts (`/dev/pts`) whose controlling terminal it is: bytes from the
//! host go to the terminal, the terminal's output goes back, until either side closes.
//! The host closing hangs the session up (SIGHUP), as a terminal does.
//!
//! The shell is `/bin/sh` (busybox, whose applets run without a `PATH`), shipped in the
//! initrd; `init::leave_initramfs` binds the initrd's `/bin` into the agent's root. With
//! the console off, [`remove_shell`] deletes it at boot, which gives back its memory
//! (initramfs files live in RAM), so a production guest holds no shell at all.
//!
//! Blocking threads (two per connection), like the bench sink: a debugging aid must not
//! share the agent API's runtime.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use nix::mount::{umount2, MntFlags};
use nix::sys::signal::{killpg, Signal};
use nix::sys::socket::{shutdown, Shutdown};
use nix::unistd::Pid;
use protocols::{DEBUG_CONSOLE_PARAM, DEBUG_CONSOLE_VPORT_PARAM, DEBUG_CONSOLE_VSOCK_PORT};
use slog::{info, warn, Logger};

use crate::host_only::{accept_from_host, blocking_listener};

/// Where the initrd's shell is (bound there by `init::leave_initramfs`).
pub const SHELL_DIR: &str = "/bin";
/// The shells tried, in order (Kata's order); the initrd ships the second.
const SHELLS: [&str; 2] = ["/bin/bash", "/bin/sh"];
/// What the initrd puts in [`SHELL_DIR`] for the console (guest/build-initrd.sh).
const SHELL_FILES: [&str; 2] = ["/bin/sh", "/bin/busybox"];
/// The terminal's size until the shell's user sets another (`stty rows R cols C`): the
/// host sends no size, and full-screen tools misbehave on the kernel's 0x0.
const DEFAULT_WINSIZE: (u16, u16) = (24, 80);
/// Bytes moved per read in either direction: a terminal carries keystrokes and screens.
const RELAY_BUF: usize = 16 * 1024;

/// The vsock port the console is asked for on the kernel command line `cmdline`, or
/// `None` when it is off. Kata's words: `agent.debug_console` turns it on;
/// `agent.debug_console_vport=N` (the last one wins) picks the port, 1026 when absent or
/// not a port number.
pub fn requested(cmdline: &str) -> Option<u32> {
    let words: Vec<&str> = cmdline.split_whitespace().collect();
    if !words.contains(&DEBUG_CONSOLE_PARAM) {
        return None;
    }
    let port = words
        .iter()
        .filter_map(|w| w.strip_prefix(DEBUG_CONSOLE_VPORT_PARAM)?.strip_prefix('='))
        .next_back()
        .and_then(|p| p.parse::<u32>().ok())
        .filter(|&p| p != 0 && p != protocols::AGENT_VSOCK_PORT)
        .unwrap_or(DEBUG_CONSOLE_VSOCK_PORT);
    Some(port)
}

/// Starts the console when `cmdline` asks for it; otherwise removes the initrd's shell.
/// Failures are logged: the agent's real work must never depend on the console.
pub fn start_or_remove_shell(log: &Logger, cmdline: &str) {
    match requested(cmdline) {
        Some(port) => start(log.clone(), port),
        None => remove_shell(log),
    }
}

/// Deletes the shell the initrd ships (freeing its RAM) and the `/bin` bind, so a guest
/// without the console holds no shell.
pub fn remove_shell(log: &Logger) {
    for file in SHELL_FILES {
        match std::fs::remove_file(file) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => warn!(log, "cannot remove the debug shell"; "path" => file, "error" => %e),
        }
    }
    // Not a mount point when the agent stayed on the initramfs root: nothing to undo.
    if umount2(SHELL_DIR, MntFlags::MNT_DETACH).is_ok() {
        let _ = std::fs::remove_dir(SHELL_DIR);
    }
}

/// Starts the listener thread on vsock `port`.
pub fn start(log: Logger, port: u32) {
    info!(log, "debug console enabled: a root shell for the host"; "port" => port,
        "by" => DEBUG_CONSOLE_PARAM);
    let thread_log = log.clone();
    let spawned = std::thread::Builder::new()
        .name("debug-console".into())
        .spawn(move || {
            if let Err(e) = serve(&thread_log, port) {
                warn!(thread_log, "debug console stopped"; "port" => port, "error" => %e);
            }
        });
    if let Err(e) = spawned {
        warn!(log, "cannot start the debug console thread"; "error" => %e);
    }
}

fn serve(log: &Logger, port: u32) -> nix::Result<()> {
    let listener = blocking_listener(port)?;
    loop {
        let conn = accept_from_host(log, &listener, port)?;
        let conn_log = log.clone();
        let spawned = std::thread::Builder::new()
            .name("debug-console-conn".into())
            .spawn(move || {
                if let Err(e) = session(&conn_log, conn, Path::new("/dev/pts")) {
                    warn!(conn_log, "debug console session failed"; "error" => %e);
                }
            });
        if let Err(e) = spawned {
            warn!(log, "cannot start a debug console session"; "error" => %e);
        }
    }
}

/// The first shell of [`SHELLS`] that exists.
fn find_shell() -> Option<&'static str> {
    SHELLS.into_iter().find(|s| Path::new(s).is_file())
}

/// One connection: a shell on a new terminal of the devpts instance at `devpts`, relayed
/// to `conn` until either side ends. Returns the shell's pid (for the caller to reap,
/// outside the guest where no reaper runs).
pub fn session(log: &Logger, conn: OwnedFd, devpts: &Path) -> io::Result<i32> {
    let mut conn = File::from(conn);
    let Some(shell) = find_shell() else {
        let _ = conn.write_all(
            b"kata-agent: the guest has no shell (/bin/sh): boot the sandbox with the debug \
              initrd (initrd = \"/usr/share/kata-containers/kata-initrd-debug.img\")\r\n",
        );
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "no shell in the guest",
        ));
    };
    let (master, slave) = crate::devpts::open_pty(devpts)?;
    set_winsize(&master, DEFAULT_WINSIZE)?;
    let pid = spawn_shell(shell, slave)?;
    info!(log, "debug console session started"; "shell" => shell, "pid" => pid);

    let shell_gone = Arc::new(AtomicBool::new(false));
    let mut from_tty = File::from(master.try_clone()?);
    let mut to_host = conn.try_clone()?;
    let gone = shell_gone.clone();
    let output = std::thread::Builder::new()
        .name("debug-console-out".into())
        .spawn(move || {
            // Ends with EIO once every holder of the terminal (the shell and whatever it
            // left behind) has closed it.
            let _ = copy(&mut from_tty, &mut to_host);
            gone.store(true, Ordering::SeqCst);
            // Ends the input side's read of the connection too.
            let _ = shutdown(to_host.as_raw_fd(), Shutdown::Both);
        })?;

    let mut to_tty = File::from(master);
    let _ = copy(&mut conn, &mut to_tty);
    if !shell_gone.load(Ordering::SeqCst) {
        // The host went away: hang the session up, as a terminal does.
        let _ = killpg(Pid::from_raw(pid), Signal::SIGHUP);
        let _ = killpg(Pid::from_raw(pid), Signal::SIGCONT);
    }
    drop(to_tty);
    let _ = output.join();
    info!(log, "debug console session ended"; "pid" => pid);
    Ok(pid)
}

/// Starts `shell` as the leader of a new session whose controlling terminal is `slave`,
/// in the guest's root, as root. The agent's reaper reaps it.
fn spawn_shell(shell: &str, slave: OwnedFd) -> io::Result<i32> {
    let mut cmd = Command::new(shell);
    cmd.env_clear()
        .env("PATH", "/bin:/sbin:/usr/bin:/usr/sbin")
        .env("HOME", "/")
        .env("TERM", "vt100")
        .env("SHELL", shell)
        .current_dir("/")
        .stdin(Stdio::from(slave.try_clone()?))
        .stdout(Stdio::from(slave.try_clone()?))
        .stderr(Stdio::from(slave));
    // SAFETY: the closure runs in the forked child before exec and only calls setsid and
    // ioctl, which are async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            // stdin is the terminal: make it the new session's controlling terminal.
            if libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    // The reaper owns all children: dropping `Child` does not wait for it. Dropping `cmd`
    // closes the agent's copies of the terminal, so the master reads EIO once the shell
    // side is gone.
    let pid = child.id() as i32;
    drop(child);
    drop(cmd);
    Ok(pid)
}

fn set_winsize(master: &OwnedFd, (rows, cols): (u16, u16)) -> io::Result<()> {
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize from the pointer, which outlives the call.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &size) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Copies until end of file or an error on either side (a pty master reads EIO once its
/// terminal is closed). Unlike `io::copy`, writes each read at once: a terminal is
/// interactive.
fn copy(from: &mut impl Read, to: &mut impl Write) -> io::Result<()> {
    let mut buf = vec![0u8; RELAY_BUF];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..n])?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_kata_words_turn_the_console_on() {
        assert_eq!(requested("console=ttyS0 quiet\n"), None);
        assert_eq!(requested("agent.debug_console_vport=1026"), None);
        assert_eq!(requested("xagent.debug_console agent.debug_consolex"), None);
        assert_eq!(requested("quiet agent.debug_console\n"), Some(1026));
        assert_eq!(
            requested("agent.debug_console agent.debug_console_vport=1026 quiet"),
            Some(1026)
        );
    }

    #[test]
    fn the_last_valid_vport_wins_else_1026() {
        let on = |rest: &str| requested(&format!("agent.debug_console {rest}"));
        assert_eq!(on("agent.debug_console_vport=2000"), Some(2000));
        assert_eq!(
            on("agent.debug_console_vport=1026 agent.debug_console_vport=2000"),
            Some(2000)
        );
        for bad in ["x", "", "0", "-1", "1024", "99999999999"] {
            assert_eq!(
                on(&format!("agent.debug_console_vport={bad}")),
                Some(1026),
                "{bad}"
            );
        }
    }

    /// A session on the host's devpts with the host's shell: what the host writes runs,
    /// its output comes back, and the session ends when the shell exits.
    #[test]
    fn a_session_runs_what_the_host_types_until_the_shell_exits() {
        let (conn, mut host) = host_session_pair();
        host.write_all(b"echo hello-$((6*7)); exit\n")
            .expect("write");
        let log = crate::logging::logger(false);
        let pid = session(&log, conn, Path::new("/dev/pts")).expect("session");
        let mut out = String::new();
        host.read_to_string(&mut out).expect("read");
        reap(pid);
        // Only the shell's output has the product; the terminal's echo has the formula.
        assert!(out.contains("hello-42\r\n"), "{out:?}");
    }

    /// The host closing hangs the session up: the shell gets SIGHUP and the session ends.
    #[test]
    fn the_host_closing_hangs_the_shell_up() {
        let (conn, mut host) = host_session_pair();
        host.write_all(b"sleep 600\n").expect("write");
        drop(host);
        let log = crate::logging::logger(false);
        let started = std::time::Instant::now();
        let pid = session(&log, conn, Path::new("/dev/pts")).expect("session");
        reap(pid);
        assert!(started.elapsed() < std::time::Duration::from_secs(60));
    }

    /// A connected pair standing in for the vsock connection. The session needs a
    /// terminal from the host's devpts, which every Linux host has: no devpts fails here,
    /// loudly.
    fn host_session_pair() -> (OwnedFd, std::os::unix::net::UnixStream) {
        if let Err(e) = crate::devpts::open_pty(Path::new("/dev/pts")) {
            panic!("the debug console's tests need a terminal from /dev/pts/ptmx: {e}");
        }
        let (conn, host) = std::os::unix::net::UnixStream::pair().expect("socketpair");
        (OwnedFd::from(conn), host)
    }

    fn reap(pid: i32) {
        let _ = nix::sys::wait::waitpid(Pid::from_raw(pid), None);
    }

    /// Bytes flow both ways and the copy ends at end of file.
    #[test]
    fn copy_relays_until_end_of_file() {
        let mut out = Vec::new();
        copy(&mut &b"echo hi\n"[..], &mut out).expect("copy");
        assert_eq!(out, b"echo hi\n");
    }
}
