//! `kata-runtime exec SANDBOX-ID`: a shell in a sandbox's guest, through the agent's
//! debug console (see kata-agent's `debug_console`), as Kata's `kata-runtime exec` gives.
//!
//! The console exists only when the sandbox was started with `[agent.kata]
//! debug_console_enabled = true`. The host reaches it like the shim reaches the agent:
//! the sandbox's hybrid vsock socket (`/run/vc/vm/<id>/kata.hvsock`), `CONNECT 1026\n`,
//! `OK ...\n`, then a byte stream to the guest's terminal. A guest that does not listen
//! on the port closes the connection instead of answering `OK`: the console is off.
//!
//! When stdin is a terminal it goes raw for the session (keys, ^C included, go to the
//! guest's shell, which echoes), and is restored on every way out. When stdin is not a
//! terminal (a pipe, in tests), its end is sent as ^D, the terminal's end-of-file.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::termios::{self, SetArg, Termios};

/// Where the shim persists each sandbox (shim's `persist::sandbox_state_root`).
pub use layout::SANDBOX_STATES as SANDBOX_STATE_ROOT;
/// Each sandbox VM's run directory (shim's `persist::vm_run_root`).
pub use layout::VM_RUN_DIRS as VM_RUN_ROOT;
/// How long the VMM side may take to answer `CONNECT`.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The terminal's end-of-file character, sent when a piped stdin ends.
const EOT: u8 = 0x04;
/// Bytes moved per read: keystrokes one way, screens the other.
const RELAY_BUF: usize = 16 * 1024;

/// What tells the user the console is off, and how to turn it on.
pub const CONSOLE_DISABLED: &str = "the debug console is not enabled: set \
     debug_console_enabled = true under [agent.kata] and restart the sandbox";

/// Opens a shell in sandbox `id` and relays the terminal until the shell ends.
pub fn run(id: &str) -> Result<(), String> {
    let socket = hybrid_vsock_socket(id, Path::new(SANDBOX_STATE_ROOT), Path::new(VM_RUN_ROOT))?;
    let stream = connect(&socket, protocols::DEBUG_CONSOLE_VSOCK_PORT)?;
    let raw = RawTerminal::enter()?;
    let result = relay(stream, raw.is_some());
    drop(raw);
    result
}

/// The hybrid vsock socket of sandbox `id`, with an error that says what is missing.
fn hybrid_vsock_socket(id: &str, state_root: &Path, vm_root: &Path) -> Result<PathBuf, String> {
    protocols::id::validate(id)
        .map_err(|e| format!("{e}: pass a sandbox id as `ctr task ls` shows it"))?;
    let state = state_root.join(id).join("persist.json");
    if !state.is_file() {
        return Err(format!(
            "no sandbox {id:?} on this host ({} does not exist): `ctr task ls` lists the \
             running containers; for a pod, pass its sandbox (pause) container's id",
            state.display()
        ));
    }
    // A sandbox started from the VM pool runs on a VM named by the pool's id.
    let vm_id = std::fs::read(&state)
        .ok()
        .and_then(|text| serde_json::from_slice::<serde_json::Value>(&text).ok())
        .and_then(|v| v.pointer("/pooled/vm_id")?.as_str().map(str::to_string))
        .filter(|vm| protocols::id::validate(vm).is_ok())
        .unwrap_or_else(|| id.to_string());
    let run_dir = vm_root.join(vm_id);
    let candidates = [
        hypervisor::qemu::layout::RunDirLayout::new(&run_dir).agent_socket,
        hypervisor::builtin::BuiltinLayout::new(&run_dir).agent_socket,
    ];
    candidates
        .iter()
        .find(|s| s.exists())
        .cloned()
        .ok_or_else(|| {
            format!(
                "sandbox {id:?} has no VM socket ({} does not exist): its VM is not running; \
                 `ctr task ls` shows its state",
                candidates[0].display()
            )
        })
}

/// Connects to guest `port` through the hybrid vsock `socket`.
fn connect(socket: &Path, port: u32) -> Result<UnixStream, String> {
    let mut stream = UnixStream::connect(socket).map_err(|e| {
        let hint = if e.kind() == io::ErrorKind::PermissionDenied {
            ": run kata-runtime exec as root"
        } else {
            ": is the sandbox's VM still running?"
        };
        format!("cannot connect to {}: {e}{hint}", socket.display())
    })?;
    let setup = |e: io::Error| format!("cannot talk to {}: {e}", socket.display());
    stream
        .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(setup)?;
    stream
        .write_all(protocols::hybrid_vsock::connect_line(port).as_bytes())
        .map_err(setup)?;
    let reply = read_reply(&mut stream).map_err(|e| {
        format!(
            "no answer to CONNECT {port} from {} within {} s: {e}",
            socket.display(),
            HANDSHAKE_TIMEOUT.as_secs()
        )
    })?;
    check_reply(&reply, port)?;
    stream.set_read_timeout(None).map_err(setup)?;
    Ok(stream)
}

/// The handshake's reply line, read byte by byte: what follows belongs to the guest.
fn read_reply(stream: &mut UnixStream) -> io::Result<String> {
    let mut line = Vec::with_capacity(16);
    BufReader::with_capacity(1, stream).read_until(b'\n', &mut line)?;
    Ok(String::from_utf8_lossy(&line).into_owned())
}

/// Whether the guest accepted; the VMM side closes (an empty reply) or answers otherwise
/// when nothing listens on the port (see [`protocols::hybrid_vsock`]).
fn check_reply(reply: &str, port: u32) -> Result<(), String> {
    protocols::hybrid_vsock::check_reply(reply)
        .map_err(|refused| format!("{CONSOLE_DISABLED} (the guest {refused} to CONNECT {port})"))
}

/// Relays stdin to the guest and the guest to stdout until the guest closes.
fn relay(stream: UnixStream, stdin_is_tty: bool) -> Result<(), String> {
    let mut to_guest = stream
        .try_clone()
        .map_err(|e| format!("cannot share the console connection: {e}"))?;
    // Never joined: it blocks in a read of stdin, and ends with the process.
    std::thread::Builder::new()
        .name("stdin".into())
        .spawn(move || {
            let mut stdin = io::stdin().lock();
            if copy(&mut stdin, &mut to_guest).is_ok() && !stdin_is_tty {
                // A terminal has no half-close: end of input is ^D at the shell's prompt.
                let _ = to_guest.write_all(&[EOT]);
            }
        })
        .map_err(|e| format!("cannot start the stdin relay: {e}"))?;
    let mut from_guest = stream;
    let mut stdout = io::stdout().lock();
    match copy(&mut from_guest, &mut stdout) {
        Ok(()) => Ok(()),
        // The guest resetting the connection is its way of ending, too.
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => Ok(()),
        Err(e) => Err(format!("the console connection failed: {e}")),
    }
}

/// Copies until end of file, writing (and flushing) each read at once.
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
        to.flush()?;
    }
}

/// The local terminal in raw mode, restored when dropped.
struct RawTerminal {
    saved: Termios,
}

impl RawTerminal {
    /// Puts stdin's terminal in raw mode; `None` when stdin is not a terminal.
    fn enter() -> Result<Option<RawTerminal>, String> {
        let stdin = io::stdin();
        let saved = match termios::tcgetattr(stdin.as_fd()) {
            Ok(t) => t,
            // ENOTTY: a pipe or a file, relayed as it is.
            Err(_) => return Ok(None),
        };
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(stdin.as_fd(), SetArg::TCSANOW, &raw)
            .map_err(|e| format!("cannot put the terminal in raw mode: {e}"))?;
        Ok(Some(RawTerminal { saved }))
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(io::stdin().as_fd(), SetArg::TCSANOW, &self.saved);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn ids_that_are_paths_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        for id in ["", "..", "../etc", "a/b", ".hidden", "a b"] {
            let err = hybrid_vsock_socket(id, dir.path(), dir.path()).unwrap_err();
            assert!(err.contains("is not a valid id"), "{id}: {err}");
        }
    }

    #[test]
    fn a_missing_sandbox_and_a_missing_vm_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let (state, vm) = (dir.path().join("sbs"), dir.path().join("vm"));
        let err = hybrid_vsock_socket("sb1", &state, &vm).unwrap_err();
        assert!(err.contains("no sandbox \"sb1\""), "{err}");
        assert!(err.contains("sbs/sb1/persist.json"), "{err}");

        std::fs::create_dir_all(state.join("sb1")).unwrap();
        std::fs::write(state.join("sb1/persist.json"), "{}").unwrap();
        let err = hybrid_vsock_socket("sb1", &state, &vm).unwrap_err();
        assert!(err.contains("has no VM socket"), "{err}");
        assert!(err.contains("vm/sb1/kata.hvsock"), "{err}");

        std::fs::create_dir_all(vm.join("sb1")).unwrap();
        let _listener = UnixListener::bind(vm.join("sb1/kata.hvsock")).unwrap();
        assert_eq!(
            hybrid_vsock_socket("sb1", &state, &vm).unwrap(),
            vm.join("sb1/kata.hvsock")
        );

        // A sandbox on a pooled VM: the socket is in the VM's run directory.
        std::fs::write(
            state.join("sb1/persist.json"),
            r#"{"pooled":{"vm_id":"pool-0123456789abcdef"}}"#,
        )
        .unwrap();
        let err = hybrid_vsock_socket("sb1", &state, &vm).unwrap_err();
        assert!(
            err.contains("vm/pool-0123456789abcdef/kata.hvsock"),
            "{err}"
        );
        std::fs::create_dir_all(vm.join("pool-0123456789abcdef")).unwrap();
        let _pooled = UnixListener::bind(vm.join("pool-0123456789abcdef/kata.hvsock")).unwrap();
        assert_eq!(
            hybrid_vsock_socket("sb1", &state, &vm).unwrap(),
            vm.join("pool-0123456789abcdef/kata.hvsock")
        );
    }

    #[test]
    fn only_ok_opens_the_console() {
        assert!(check_reply("OK 1073741824\n", 1026).is_ok());
        assert!(check_reply("ok 5\n", 1026).is_ok());
        for reply in ["", "\n", "ERR no listener\n"] {
            let err = check_reply(reply, 1026).unwrap_err();
            assert!(err.starts_with(CONSOLE_DISABLED), "{err}");
            assert!(err.contains("CONNECT 1026"), "{err}");
        }
    }

    /// Against a fake VMM side: the handshake, then bytes both ways until it closes.
    #[test]
    fn connects_and_relays_through_a_hybrid_vsock_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kata.hvsock");
        let listener = UnixListener::bind(&path).unwrap();
        let vmm = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut line = String::new();
            BufReader::with_capacity(1, &mut conn)
                .read_line(&mut line)
                .unwrap();
            conn.write_all(b"OK 1073741824\nhello from the guest")
                .unwrap();
            line
        });
        let mut stream = connect(&path, 1026).unwrap();
        let mut got = String::new();
        stream.read_to_string(&mut got).unwrap();
        assert_eq!(vmm.join().unwrap(), "CONNECT 1026\n");
        assert_eq!(got, "hello from the guest");
    }

    #[test]
    fn a_closed_handshake_says_the_console_is_off() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kata.hvsock");
        let listener = UnixListener::bind(&path).unwrap();
        let vmm = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut line = String::new();
            BufReader::with_capacity(1, &mut conn)
                .read_line(&mut line)
                .unwrap();
            // dropped: closed without an answer, as for a port nothing listens on
        });
        let err = connect(&path, 1026).unwrap_err();
        vmm.join().unwrap();
        assert!(err.starts_with(CONSOLE_DISABLED), "{err}");
    }
}
