//! Just enough QMP: the greeting, which tells that QEMU is up (it arrives once machine
//! setup, kernel loading and vhost-user handshakes, is done and the main loop runs), and a
//! blocking session for the commands of device hotplug ([`super::hotplug`]), with a
//! descriptor passed along where a command takes one. QEMU is not trusted: what it sends
//! is bounded in size and waited for with a deadline.

use std::path::Path;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::UnixStream;

/// What reading the greeting found.
pub(crate) enum Greeting {
    /// QEMU answered: it is running the guest.
    Ready,
    /// Nothing to read yet (socket missing or refused); try again.
    NotYet,
    /// The connection closed without a greeting: QEMU is going away.
    Closed,
}

/// Connects to the QMP socket and reads one line. The caller bounds the wait with a
/// timeout and checks the QEMU pid between attempts.
pub(crate) async fn read_greeting(socket: &Path) -> Greeting {
    let Ok(stream) = UnixStream::connect(socket).await else {
        return Greeting::NotYet;
    };
    let mut line = String::new();
    match BufReader::new(stream).read_line(&mut line).await {
        Ok(n) if n > 0 && line.contains("\"QMP\"") => Greeting::Ready,
        _ => Greeting::Closed,
    }
}

/// The longest QMP message read: QEMU's answers to the commands sent here are a few
/// hundred bytes; a longer line means something is wrong, and QEMU is not trusted.
const MAX_MESSAGE: u64 = 64 * 1024;
/// Events read while waiting for one answer, at most (QEMU sends few unasked).
const MAX_EVENTS: usize = 256;

/// Why a QMP command failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum QmpError {
    #[error("talking to QEMU on {socket}: {source}")]
    Io {
        socket: String,
        #[source]
        source: std::io::Error,
    },
    #[error("QEMU sent {0}")]
    Protocol(String),
    /// QEMU refused the command: its class and description.
    #[error("QEMU refused {command}: {desc} ({class})")]
    Refused {
        command: String,
        class: String,
        desc: String,
    },
}

/// A blocking QMP session (greeting read, capabilities negotiated), for commands sent one
/// at a time. Run it off the async runtime (`spawn_blocking`).
///
/// Descriptors added with [`QmpSession::execute_with_fd`] stay in their fd set while a
/// device uses them, or while this session lasts: QEMU drops an unused set's descriptors
/// when no monitor is connected.
pub(crate) struct QmpSession {
    socket: String,
    stream: std::os::unix::net::UnixStream,
    reader: std::io::BufReader<std::os::unix::net::UnixStream>,
}

impl QmpSession {
    /// Connects to `socket` and negotiates capabilities; every read and write of the
    /// session waits at most `timeout`.
    pub(crate) fn connect(socket: &Path, timeout: std::time::Duration) -> Result<Self, QmpError> {
        let name = socket.display().to_string();
        let io = |source| QmpError::Io {
            socket: name.clone(),
            source,
        };
        let stream = connect_within(socket, timeout).map_err(io)?;
        stream.set_read_timeout(Some(timeout)).map_err(io)?;
        let reader = std::io::BufReader::new(stream.try_clone().map_err(io)?);
        let mut session = QmpSession {
            socket: name.clone(),
            stream,
            reader,
        };
        let greeting = session.read_message()?;
        if greeting.get("QMP").is_none() {
            return Err(QmpError::Protocol(format!(
                "no greeting on {name} but {}",
                short(&greeting)
            )));
        }
        session.execute(&serde_json::json!({ "execute": "qmp_capabilities" }))?;
        Ok(session)
    }

    /// Sends `command` and returns its `return` value.
    pub(crate) fn execute(
        &mut self,
        command: &serde_json::Value,
    ) -> Result<serde_json::Value, QmpError> {
        self.send(command, None)?;
        self.answer(command)
    }

    /// Sends `command` with `fd` attached (SCM_RIGHTS), as `getfd` and `add-fd` want it.
    pub(crate) fn execute_with_fd(
        &mut self,
        command: &serde_json::Value,
        fd: std::os::fd::BorrowedFd<'_>,
    ) -> Result<serde_json::Value, QmpError> {
        self.send(command, Some(fd))?;
        self.answer(command)
    }

    fn send(
        &mut self,
        command: &serde_json::Value,
        fd: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<(), QmpError> {
        use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let mut bytes = command.to_string().into_bytes();
        bytes.push(b'\n');
        let io = |source| QmpError::Io {
            socket: self.socket.clone(),
            source,
        };
        match fd {
            None => self.stream.write_all(&bytes).map_err(io),
            Some(fd) => {
                // The descriptor rides on the first byte; the rest follows as usual.
                let fds = [fd.as_raw_fd()];
                let cmsg = [ControlMessage::ScmRights(&fds)];
                let iov = [std::io::IoSlice::new(&bytes)];
                let sent = sendmsg::<()>(
                    self.stream.as_raw_fd(),
                    &iov,
                    &cmsg,
                    MsgFlags::MSG_NOSIGNAL,
                    None,
                )
                .map_err(|e| io(e.into()))?;
                self.stream.write_all(&bytes[sent..]).map_err(io)
            }
        }
    }

    /// The answer to `command`, skipping the events that come before it.
    fn answer(&mut self, command: &serde_json::Value) -> Result<serde_json::Value, QmpError> {
        for _ in 0..MAX_EVENTS {
            let mut msg = self.read_message()?;
            if msg.get("event").is_some() {
                continue;
            }
            if let Some(ret) = msg.get_mut("return") {
                return Ok(ret.take());
            }
            if let Some(err) = msg.get("error") {
                let field = |k: &str| {
                    err.get(k)
                        .and_then(|v| v.as_str())
                        .unwrap_or("")
                        .chars()
                        .take(500)
                        .collect::<String>()
                };
                return Err(QmpError::Refused {
                    command: command
                        .get("execute")
                        .and_then(|v| v.as_str())
                        .unwrap_or("?")
                        .to_string(),
                    class: field("class"),
                    desc: field("desc"),
                });
            }
            return Err(QmpError::Protocol(format!("an unexpected {}", short(&msg))));
        }
        Err(QmpError::Protocol(format!(
            "more than {MAX_EVENTS} events and no answer"
        )))
    }

    fn read_message(&mut self) -> Result<serde_json::Value, QmpError> {
        use std::io::{BufRead, Read};
        let mut line = Vec::new();
        let n = (&mut self.reader)
            .take(MAX_MESSAGE)
            .read_until(b'\n', &mut line)
            .map_err(|source| QmpError::Io {
                socket: self.socket.clone(),
                source,
            })?;
        if n == 0 {
            return Err(QmpError::Protocol(
                "nothing: it closed the connection".into(),
            ));
        }
        if line.last() != Some(&b'\n') {
            return Err(QmpError::Protocol(format!(
                "a message longer than {MAX_MESSAGE} bytes"
            )));
        }
        serde_json::from_slice(&line)
            .map_err(|e| QmpError::Protocol(format!("a message that is not JSON ({e})")))
    }
}

/// A message, cut short for an error.
fn short(v: &serde_json::Value) -> String {
    v.to_string().chars().take(200).collect()
}

/// Connects to `socket`, waiting at most `timeout` for a place in its queue. A QEMU that
/// does not accept (its monitor busy with another client, or QEMU taken over by its
/// guest) leaves a plain blocking connect waiting for ever once the listen queue is full.
/// The socket's send timeout, set before the connect, bounds that wait too (Linux's
/// `unix_stream_connect` waits for room by it), and then every write of the session.
fn connect_within(
    socket: &Path,
    timeout: std::time::Duration,
) -> std::io::Result<std::os::unix::net::UnixStream> {
    use nix::sys::socket::{self as sock, AddressFamily, SockFlag, SockType, UnixAddr};
    use std::os::fd::AsRawFd;
    let fd = sock::socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    let stream = std::os::unix::net::UnixStream::from(fd);
    stream.set_write_timeout(Some(timeout))?;
    let addr = UnixAddr::new(socket)?;
    match sock::connect(stream.as_raw_fd(), &addr) {
        Ok(()) => Ok(stream),
        Err(nix::errno::Errno::EAGAIN) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("QEMU did not take the connection within {timeout:?}"),
        )),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_monitor_that_never_accepts_fails_the_connect_in_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qmp.sock");
        // Listening with the smallest queue and never accepting, as QEMU's monitor does
        // while another client holds it: the queue fills, then a connect has to wait.
        let listener = sock_listener(&path);
        // In a thread: a connect that waits for ever fails the test instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut queued = Vec::new();
            let err = loop {
                match connect_within(&path, Duration::from_millis(300)) {
                    Ok(s) => queued.push(s),
                    Err(e) => break e,
                }
                if queued.len() >= 64 {
                    break std::io::Error::other("the listen queue never filled");
                }
            };
            let _ = tx.send(err);
        });
        let err = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("a connect to a full queue returned");
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
        assert!(
            err.to_string().contains("did not take the connection"),
            "{err}"
        );
        drop(listener);
        // A monitor that accepts: the session is greeted as QEMU greets it.
        let listener = std::os::unix::net::UnixListener::bind(dir.path().join("ok.sock")).unwrap();
        let server = std::thread::spawn(move || {
            use std::io::{BufRead, Write};
            let (mut c, _) = listener.accept().unwrap();
            c.write_all(b"{\"QMP\": {\"version\": {}}}\n").unwrap();
            let mut line = String::new();
            std::io::BufReader::new(c.try_clone().unwrap())
                .read_line(&mut line)
                .unwrap();
            assert!(line.contains("qmp_capabilities"), "{line}");
            c.write_all(b"{\"return\": {}}\n").unwrap();
        });
        QmpSession::connect(&dir.path().join("ok.sock"), Duration::from_secs(5)).unwrap();
        server.join().unwrap();
    }

    /// A unix socket listening at `path` with a queue of one.
    fn sock_listener(path: &Path) -> std::os::fd::OwnedFd {
        use nix::sys::socket::{self as sock, AddressFamily, Backlog, SockFlag, SockType};
        use std::os::fd::AsRawFd;
        let fd = sock::socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        sock::bind(fd.as_raw_fd(), &sock::UnixAddr::new(path).unwrap()).unwrap();
        sock::listen(&fd, Backlog::new(1).unwrap()).unwrap();
        fd
    }
}
