//! Vsock listeners that serve the host only.
//!
//! Vsock is not namespaced: any process in the guest, a container's included, can connect
//! to a guest port through the loopback transport (CID 1, or the guest's own CID). Were
//! the agent to answer such a connection, a container could run anything as guest root.
//! So every vsock service of the agent accepts a connection only when its peer is the
//! host (CID 2, `VMADDR_CID_HOST`); any other is closed at once, before a byte is read,
//! and logged with the peer's address. The server keeps accepting.
//!
//! [`ttrpc_listener`] is the agent API's listener and [`spawn_service`] runs the other
//! async services (stdio streams, port-forward), both on [`host_connections`], a stream
//! of checked connections; [`check_peer`] is the rule;
//! [`blocking_listener`] and [`accept_from_host`] serve the blocking services (the bench
//! sink, the debug console) by the same rule.

use std::future::{ready, Future};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use futures::stream::{self, Stream, StreamExt};
use nix::sys::socket::{
    accept4, bind, getpeername, listen, socket, AddressFamily, Backlog, SockFlag, SockType,
    VsockAddr as NixVsockAddr,
};
use slog::{warn, Logger};
use tokio_vsock::{VsockAddr, VsockListener, VsockStream};
use ttrpc::r#async::transport::Listener;

/// The only peer CID the agent serves.
pub const VMADDR_CID_HOST: u32 = libc::VMADDR_CID_HOST;

/// A failed accept (EMFILE, ENOBUFS, ...) usually fails again at once; pausing keeps the
/// accept loop from spinning a vCPU until resources come back.
const ACCEPT_RETRY_PAUSE: Duration = Duration::from_millis(100);

/// The remote end of an accepted vsock connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    pub cid: u32,
    pub port: u32,
}

/// Why a connection was closed unanswered.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "refused a vsock connection to port {port} from CID {} port {}: only the host \
     (CID {VMADDR_CID_HOST}) may use it; a guest process reaches it only through the \
     loopback transport",
    peer.cid,
    peer.port
)]
pub struct Refused {
    pub port: u32,
    pub peer: Peer,
}

/// Accepts `peer` on local `port` only if it is the host.
pub fn check_peer(port: u32, peer: Peer) -> Result<(), Refused> {
    if peer.cid == VMADDR_CID_HOST {
        Ok(())
    } else {
        Err(Refused { port, peer })
    }
}

/// A blocking vsock listener on `port` of any local CID, for [`accept_from_host`].
pub fn blocking_listener(port: u32) -> nix::Result<OwnedFd> {
    let fd = socket(
        AddressFamily::Vsock,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    bind(
        fd.as_raw_fd(),
        &NixVsockAddr::new(libc::VMADDR_CID_ANY, port),
    )?;
    listen(&fd, Backlog::new(4)?)?;
    Ok(fd)
}

/// Blocks until a connection from the host arrives on `listener` (bound to `port`) and
/// returns it; every other connection is closed unanswered and logged on the way. Errors
/// only when accepting itself fails.
pub fn accept_from_host(log: &Logger, listener: &OwnedFd, port: u32) -> nix::Result<OwnedFd> {
    loop {
        let conn = match accept4(listener.as_raw_fd(), SockFlag::SOCK_CLOEXEC) {
            Ok(c) => c,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e),
        };
        // SAFETY: accept4 returned a new descriptor that nothing else owns.
        let conn = unsafe { OwnedFd::from_raw_fd(conn) };
        // An unknown peer is refused too: dropping `conn` ends the connection unanswered.
        let peer = match getpeername::<NixVsockAddr>(conn.as_raw_fd()) {
            Ok(addr) => Peer {
                cid: addr.cid(),
                port: addr.port(),
            },
            Err(e) => {
                warn!(log, "vsock peer without an address; closing"; "port" => port, "error" => %e);
                continue;
            }
        };
        match check_peer(port, peer) {
            Ok(()) => return Ok(conn),
            Err(refused) => warn!(log, "{refused}"; "port" => port, "peer_cid" => peer.cid,
                "peer_port" => peer.port),
        }
    }
}

/// Connects to the host's [`AGENT_READY_VSOCK_PORT`](protocols::AGENT_READY_VSOCK_PORT)
/// and hangs up: the host, dialing the API, dials again at once. Best effort: a host
/// that does not listen refuses the connection, and one that never answers is given
/// up on after a second; either way it finds the agent by retrying.
pub async fn tell_host_ready() {
    let addr = VsockAddr::new(VMADDR_CID_HOST, protocols::AGENT_READY_VSOCK_PORT);
    let _ = tokio::time::timeout(Duration::from_secs(1), VsockStream::connect(addr)).await;
}

/// A ttrpc listener on vsock `cid:port` (the agent binds any local CID) that hands the
/// server only connections from the host.
pub fn ttrpc_listener(log: Logger, cid: u32, port: u32) -> io::Result<Listener> {
    Ok(Listener::new(host_connections(log, cid, port)?))
}

/// Serves every connection from the host to vsock port `port` (any local CID) with
/// `serve`, each in a task of its own. When the port cannot be bound the service is
/// absent: that is logged (naming it as `service`) and nothing else changes.
pub fn spawn_service<F, Fut>(log: &Logger, service: &str, port: u32, serve: F)
where
    F: Fn(VsockStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let conns = match host_connections(log.clone(), libc::VMADDR_CID_ANY, port) {
        Ok(c) => c,
        Err(e) => {
            warn!(log, "no {service}: cannot listen on vsock"; "port" => port, "error" => %e);
            return;
        }
    };
    tokio::spawn(async move {
        let mut conns = Box::pin(conns);
        while let Some(next) = conns.next().await {
            // Accept errors were logged where they happened.
            if let Ok(conn) = next {
                tokio::spawn(serve(conn));
            }
        }
    });
}

/// The connections from the host to vsock `cid:port`, for the async services: every
/// other is closed and logged (see [`host_only`]). A failed accept is logged, paused for
/// and passed on; callers skip it.
pub fn host_connections(
    log: Logger,
    cid: u32,
    port: u32,
) -> io::Result<impl Stream<Item = io::Result<VsockStream>> + Send + 'static> {
    let listener = VsockListener::bind(VsockAddr::new(cid, port))?;
    let accept_log = log.clone();
    let accepted = stream::unfold(listener, move |listener| {
        let log = accept_log.clone();
        async move {
            let next = match listener.accept().await {
                Ok((conn, addr)) => Ok((
                    conn,
                    Peer {
                        cid: addr.cid(),
                        port: addr.port(),
                    },
                )),
                Err(e) => {
                    warn!(log, "vsock accept failed; retrying"; "port" => port, "error" => %e);
                    tokio::time::sleep(ACCEPT_RETRY_PAUSE).await;
                    Err(e)
                }
            };
            Some((next, listener))
        }
    });
    Ok(host_only(log, port, accepted))
}

/// Passes on the connections from the host and accept errors (the ttrpc server skips
/// those); drops, and so closes, every other connection after logging its peer.
pub fn host_only<C>(
    log: Logger,
    port: u32,
    accepted: impl Stream<Item = io::Result<(C, Peer)>>,
) -> impl Stream<Item = io::Result<C>> {
    accepted.filter_map(move |next| {
        let passed = match next {
            Ok((conn, peer)) => match check_peer(port, peer) {
                Ok(()) => Some(Ok(conn)),
                Err(refused) => {
                    drop(conn);
                    warn!(log, "{refused}"; "port" => port, "peer_cid" => peer.cid,
                        "peer_port" => peer.port);
                    None
                }
            },
            Err(e) => Some(Err(e)),
        };
        ready(passed)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    use std::sync::{Arc, Mutex};

    use slog::Drain;

    fn peer(cid: u32, port: u32) -> Peer {
        Peer { cid, port }
    }

    /// A logger whose JSON lines land in the returned buffer.
    fn captured_logger() -> (Logger, Arc<Mutex<Vec<u8>>>) {
        #[derive(Clone)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl io::Write for Buf {
            fn write(&mut self, data: &[u8]) -> io::Result<usize> {
                self.0
                    .lock()
                    .map_err(|_| io::Error::other("poisoned"))?
                    .extend_from_slice(data);
                Ok(data.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let buf = Arc::new(Mutex::new(Vec::new()));
        let drain = slog_json::Json::new(Buf(buf.clone()))
            .add_default_keys()
            .build();
        let log = Logger::root(Mutex::new(drain).fuse(), slog::o!());
        (log, buf)
    }

    #[test]
    fn only_the_host_cid_passes() {
        assert_eq!(check_peer(1024, peer(2, 5000)), Ok(()));
        for cid in [0, 1, 3, 4, libc::VMADDR_CID_ANY] {
            let err = check_peer(1024, peer(cid, 5000)).expect_err("a guest peer");
            let text = err.to_string();
            assert!(
                text.contains(&format!("from CID {cid} port 5000")),
                "{text}"
            );
            assert!(text.contains("port 1024"), "{text}");
        }
    }

    /// Host connections come through in order, others are closed (their far end reads
    /// EOF) and logged, and the stream goes on after a refusal and an accept error.
    #[tokio::test]
    async fn refused_connections_are_closed_and_the_stream_goes_on() {
        let (host1, host1_far) = UnixStream::pair().expect("socketpair");
        let (loopback, mut loopback_far) = UnixStream::pair().expect("socketpair");
        let (own_cid, mut own_cid_far) = UnixStream::pair().expect("socketpair");
        let (host2, host2_far) = UnixStream::pair().expect("socketpair");
        let accepted = stream::iter(vec![
            Ok((host1, peer(2, 1111))),
            Ok((loopback, peer(1, 2222))),
            Err(io::Error::from_raw_os_error(libc::EMFILE)),
            Ok((own_cid, peer(3, 3333))),
            Ok((host2, peer(2, 4444))),
        ]);
        let (log, buf) = captured_logger();
        let passed: Vec<io::Result<UnixStream>> = host_only(log, 1024, accepted).collect().await;

        assert_eq!(passed.len(), 3, "host, error, host");
        assert_eq!(
            passed[1].as_ref().err().and_then(io::Error::raw_os_error),
            Some(libc::EMFILE)
        );
        // The host connections arrive in order and open: each reads what its far end wrote.
        for (conn, mut far, mark) in [(&passed[0], host1_far, b'1'), (&passed[2], host2_far, b'2')]
        {
            far.write_all(&[mark]).expect("write");
            let mut got = [0u8; 1];
            let mut conn = conn.as_ref().expect("a host connection");
            conn.read_exact(&mut got).expect("read");
            assert_eq!(got[0], mark);
        }
        // The refused ones were closed: their far ends read EOF.
        for far in [&mut loopback_far, &mut own_cid_far] {
            assert_eq!(far.read(&mut [0u8; 1]).expect("read"), 0, "not closed");
        }

        let logged = String::from_utf8(buf.lock().expect("log buffer").clone()).expect("utf-8");
        let lines: Vec<&str> = logged.lines().collect();
        assert_eq!(lines.len(), 2, "{logged}");
        assert!(lines[0].contains("\"peer_cid\":1"), "{logged}");
        assert!(lines[0].contains("\"peer_port\":2222"), "{logged}");
        assert!(lines[1].contains("\"peer_cid\":3"), "{logged}");
        assert!(lines[1].contains("from CID 3 port 3333"), "{logged}");
    }
}
