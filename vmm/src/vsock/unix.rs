//! The host side of hybrid vsock: unix sockets instead of AF_VSOCK on the host.
//!
//! The host dials `<uds>` and writes `CONNECT <port>\n` to reach guest port `<port>`; the
//! answer is `OK <host port>\n` once the guest accepted. A guest that connects to host port
//! `P` reaches whoever listens on `<uds>_P`.

use std::io::{self, Read};
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use thiserror::Error;

/// Longest `CONNECT` line accepted, newline included.
const MAX_LINE: usize = 64;

#[derive(Debug, Error)]
pub enum UnixError {
    #[error("could not listen on the hybrid vsock socket {path}: {source}")]
    Listen { path: PathBuf, source: io::Error },
    #[error("could not connect to {path} for a guest connection to host port {port}: {source}")]
    Connect {
        path: PathBuf,
        port: u32,
        source: io::Error,
    },
}

/// The hybrid vsock listening socket. Its file stays when it is dropped (removing it would be
/// unlink(2), which the seccomp filters of kata-vmm and kata-vsock forbid): the next bind
/// replaces it, and the sandbox's run directory goes with the sandbox.
#[derive(Debug)]
pub struct HybridListener {
    listener: UnixListener,
    path: PathBuf,
}

impl HybridListener {
    /// Listens on `path`, replacing a stale socket file left by an earlier run.
    pub fn bind(path: &Path) -> Result<Self, UnixError> {
        let err = |source| UnixError::Listen {
            path: path.to_path_buf(),
            source,
        };
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(err(e)),
            _ => {}
        }
        let listener = UnixListener::bind(path).map_err(err)?;
        listener.set_nonblocking(true).map_err(err)?;
        Ok(HybridListener {
            listener,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Accepts one pending host connection, if any.
    pub fn accept(&self) -> io::Result<Option<UnixStream>> {
        match self.listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(true)?;
                Ok(Some(stream))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Connects to `<uds>_<port>` for a guest connecting to host port `port`.
    pub fn connect_host_port(&self, port: u32) -> Result<UnixStream, UnixError> {
        let mut name = self.path.clone().into_os_string();
        name.push(format!("_{port}"));
        let path = PathBuf::from(name);
        let err = |source| UnixError::Connect {
            path: path.clone(),
            port,
            source,
        };
        let stream = UnixStream::connect(&path).map_err(err)?;
        stream.set_nonblocking(true).map_err(err)?;
        Ok(stream)
    }
}

impl AsRawFd for HybridListener {
    fn as_raw_fd(&self) -> RawFd {
        self.listener.as_raw_fd()
    }
}

/// Outcome of reading a host connection's first line.
#[derive(Debug, PartialEq, Eq)]
pub enum Handshake {
    /// More bytes are needed.
    Incomplete,
    /// `CONNECT <port>` was read; the stream is positioned at the first data byte.
    Connect(u32),
    /// The peer closed, sent garbage, or failed: drop the stream.
    Failed(String),
}

/// A host connection that has not yet said which guest port it wants.
#[derive(Debug)]
pub struct PendingHandshake {
    stream: UnixStream,
    line: Vec<u8>,
}

impl PendingHandshake {
    pub fn new(stream: UnixStream) -> Self {
        PendingHandshake {
            stream,
            line: Vec::new(),
        }
    }

    /// Reads what is available of the `CONNECT` line, one byte at a time so that data the
    /// host sends right behind it stays in the stream for the guest.
    pub fn advance(&mut self) -> Handshake {
        let mut byte = [0u8; 1];
        loop {
            match self.stream.read(&mut byte) {
                Ok(0) => return Handshake::Failed("the host closed before CONNECT".into()),
                Ok(_) if byte[0] == b'\n' => return parse_connect(&self.line),
                Ok(_) if self.line.len() + 1 >= MAX_LINE => {
                    return Handshake::Failed("the CONNECT line is too long".into())
                }
                Ok(_) => self.line.push(byte[0]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Handshake::Incomplete,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Handshake::Failed(format!("reading CONNECT failed: {e}")),
            }
        }
    }

    pub fn into_stream(self) -> UnixStream {
        self.stream
    }
}

impl AsRawFd for PendingHandshake {
    fn as_raw_fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }
}

/// Parses `CONNECT <port>` (any case, optional `\r`).
pub fn parse_connect(line: &[u8]) -> Handshake {
    let text = String::from_utf8_lossy(line);
    let text = text.trim_end_matches('\r');
    let mut words = text.split_ascii_whitespace();
    match (words.next(), words.next(), words.next()) {
        (Some(cmd), Some(port), None) if cmd.eq_ignore_ascii_case("connect") => {
            match port.parse::<u32>() {
                Ok(port) => Handshake::Connect(port),
                Err(_) => Handshake::Failed(format!("bad port in {text:?}")),
            }
        }
        _ => Handshake::Failed(format!("expected \"CONNECT <port>\", got {text:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn parses_connect_lines() {
        assert_eq!(parse_connect(b"CONNECT 1024"), Handshake::Connect(1024));
        assert_eq!(parse_connect(b"connect 5\r"), Handshake::Connect(5));
        assert!(matches!(parse_connect(b"CONNECT"), Handshake::Failed(_)));
        assert!(matches!(parse_connect(b"CONNECT x"), Handshake::Failed(_)));
        assert!(matches!(parse_connect(b"HELLO 1"), Handshake::Failed(_)));
        assert!(matches!(
            parse_connect(b"CONNECT 1 2"),
            Handshake::Failed(_)
        ));
    }

    #[test]
    fn handshake_leaves_following_data_in_the_stream() {
        let (a, mut b) = UnixStream::pair().expect("socketpair");
        a.set_nonblocking(true).expect("nonblocking");
        let mut hs = PendingHandshake::new(a);
        b.write_all(b"CONN").expect("write");
        assert_eq!(hs.advance(), Handshake::Incomplete);
        b.write_all(b"ECT 1024\nping").expect("write");
        assert_eq!(hs.advance(), Handshake::Connect(1024));
        let mut rest = [0u8; 4];
        hs.into_stream().read_exact(&mut rest).expect("rest");
        assert_eq!(&rest, b"ping");
    }

    #[test]
    fn listener_replaces_stale_socket_and_dials_port_sockets() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("kata.hvsock");
        std::fs::write(&path, b"stale").expect("stale file");
        let l = HybridListener::bind(&path).expect("bind");
        assert!(l.accept().expect("accept").is_none());
        let _c = UnixStream::connect(&path).expect("connect");
        assert!(l.accept().expect("accept").is_some());

        let err = l.connect_host_port(99).expect_err("nobody listens");
        assert!(err.to_string().contains("kata.hvsock_99"), "{err}");
        let _p = UnixListener::bind(dir.path().join("kata.hvsock_99")).expect("bind port");
        l.connect_host_port(99).expect("connect port");
    }
}
