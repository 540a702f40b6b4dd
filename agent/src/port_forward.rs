//! The guest end of port-forward (`kubectl port-forward`, CRI PortForward).
//!
//! containerd serves a pod's port-forward by dialing `localhost:PORT` in the pod's
//! network namespace on the host; the pod's network is inside the VM, so the shim catches
//! those connections there and brings each here over vsock
//! ([`protocols::PORT_FORWARD_VSOCK_PORT`], host only as every agent service): the first
//! line names the guest TCP port, the agent connects to `127.0.0.1:<port>` in the guest's
//! network namespace (the one the pod's containers share), answers `OK` or `ERR <why>`,
//! and then copies bytes both ways until either side closes.

use std::time::Duration;

use slog::{debug, Logger};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::host_only::spawn_service;

/// The longest request line: a port number and a newline.
const MAX_REQUEST: usize = 16;
/// How long the host may take to name the port.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a forward request was refused; the text goes back to the host after `ERR `.
#[derive(Debug, thiserror::Error)]
enum RequestError {
    #[error("reading the request: {0}")]
    Read(std::io::Error),
    #[error("{0:?} is not a TCP port (1-65535)")]
    NotAPort(String),
}

/// Starts the forwarder on its vsock port; failures are logged (pods then have no
/// port-forward, and nothing else changes).
pub fn start(log: Logger) {
    let port = protocols::PORT_FORWARD_VSOCK_PORT;
    let conn_log = log.clone();
    spawn_service(&log, "port-forward", port, move |conn| {
        let log = conn_log.clone();
        async move {
            if let Err(e) = serve(conn).await {
                debug!(log, "port-forward connection ended"; "error" => %e);
            }
        }
    });
}

/// One forwarded connection: request line, answer, then the bytes.
pub async fn serve<S>(conn: S) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut conn = BufReader::new(conn);
    let port = match tokio::time::timeout(REQUEST_TIMEOUT, read_port(&mut conn)).await {
        Ok(Ok(port)) => port,
        Ok(Err(why)) => return answer(&mut conn, &format!("ERR {why}\n")).await,
        Err(_) => return answer(&mut conn, "ERR no port named in time\n").await,
    };
    let mut target = match TcpStream::connect(("127.0.0.1", port)).await {
        Ok(t) => t,
        Err(e) => {
            return answer(
                &mut conn,
                &format!("ERR nothing in the pod accepts connections on port {port}: {e}\n"),
            )
            .await
        }
    };
    conn.write_all(b"OK\n").await?;
    conn.flush().await?;
    tokio::io::copy_bidirectional(&mut conn, &mut target).await?;
    Ok(())
}

async fn answer<S: AsyncWrite + Unpin>(conn: &mut S, line: &str) -> std::io::Result<()> {
    conn.write_all(line.as_bytes()).await?;
    conn.shutdown().await
}

async fn read_port<S: AsyncRead + Unpin>(conn: &mut BufReader<S>) -> Result<u16, RequestError> {
    let mut line = Vec::new();
    let mut limited = (&mut *conn).take(MAX_REQUEST as u64);
    limited
        .read_until(b'\n', &mut line)
        .await
        .map_err(RequestError::Read)?;
    let text = std::str::from_utf8(&line).unwrap_or("").trim();
    text.parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| RequestError::NotAPort(text.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn forwards_bytes_both_ways_after_ok() {
        let server = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = server.local_addr().expect("addr").port();
        tokio::spawn(async move {
            let (mut s, _) = server.accept().await.expect("accept");
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).await.expect("read");
            s.write_all(&buf.map(|b| b.to_ascii_uppercase()))
                .await
                .expect("write");
        });
        let (mut host, guest) = tokio::io::duplex(1024);
        let forward = tokio::spawn(serve(guest));
        host.write_all(format!("{port}\nping").as_bytes())
            .await
            .expect("write");
        let mut got = vec![0u8; 7];
        host.read_exact(&mut got).await.expect("read");
        assert_eq!(got, b"OK\nPING");
        drop(host);
        forward.await.expect("join").expect("serve");
    }

    #[tokio::test]
    async fn a_closed_port_or_a_bad_request_gets_err_with_the_reason() {
        // A port nothing listens on: bind one, learn it, close it.
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            l.local_addr().expect("addr").port()
        };
        for (request, expect) in [
            (format!("{port}\n"), format!("port {port}")),
            (
                "http\n".to_string(),
                "\"http\" is not a TCP port".to_string(),
            ),
            ("0\n".to_string(), "\"0\" is not a TCP port".to_string()),
        ] {
            let (mut host, guest) = tokio::io::duplex(1024);
            let forward = tokio::spawn(serve(guest));
            host.write_all(request.as_bytes()).await.expect("write");
            let mut got = String::new();
            host.read_to_string(&mut got).await.expect("read");
            assert!(got.starts_with("ERR "), "{got}");
            assert!(got.contains(&expect), "{request:?}: {got}");
            forward.await.expect("join").expect("serve");
        }
    }
}
