//! `/metrics` over HTTP on `/run/vc/sbs/<sandbox-id>/shim-monitor.sock`, where Kata's
//! kata-monitor looks (`curl --unix-socket ... http://localhost/metrics`).
//!
//! A minimal HTTP/1.1 server, bounded in everything a client can make it do: the request
//! head is read up to [`MAX_REQUEST`] bytes, at most [`MAX_CONNECTIONS`] scrapes run at
//! once (more are answered 503 at once), each connection has [`CONNECTION_DEADLINE`] in
//! all, and every answer closes the connection. It runs on tasks of its own and takes
//! the Task service's lock only to read which sandbox there is: a scrape never holds up
//! the Task API. The socket is root's alone (0600); it goes with the sandbox's state
//! directory at teardown.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::SandboxSource;

/// The longest request head read.
const MAX_REQUEST: usize = 8192;
/// Scrapes served at once.
const MAX_CONNECTIONS: usize = 4;
/// A connection's whole life: request, scrape and answer.
const CONNECTION_DEADLINE: Duration = Duration::from_secs(10);
/// How long a refusal (503) may take to write.
const REFUSAL_DEADLINE: Duration = Duration::from_secs(1);

/// The socket of sandbox `id`.
pub fn socket_path(id: &str) -> PathBuf {
    crate::persist::state_dir(id).join(layout::METRICS_SOCKET)
}

/// The running server; it stops when dropped (the socket file stays until the sandbox's
/// state directory is removed).
pub struct MetricsServer {
    task: JoinHandle<()>,
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Listens on `path` (its directory must exist): bound under a temporary name, made
/// 0600, then renamed into place, so that nobody but root ever finds it open.
pub fn start(path: &Path, source: SandboxSource) -> std::io::Result<MetricsServer> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    let tmp = dir.join(".shim-monitor.tmp");
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    std::fs::rename(&tmp, path)?;
    let task = tokio::spawn(serve(listener, source));
    Ok(MetricsServer { task })
}

async fn serve(listener: UnixListener, source: SandboxSource) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok((mut conn, _)) = listener.accept().await else {
            // EMFILE and the like: wait rather than spin.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        match slots.clone().try_acquire_owned() {
            Ok(permit) => {
                let source = source.clone();
                tokio::spawn(async move {
                    let _ =
                        tokio::time::timeout(CONNECTION_DEADLINE, handle(&mut conn, &source)).await;
                    drop(permit);
                });
            }
            Err(_) => {
                tokio::spawn(async move {
                    let answer = response(503, "text/plain", b"too many scrapes at once\n");
                    let _ = tokio::time::timeout(REFUSAL_DEADLINE, conn.write_all(&answer)).await;
                });
            }
        }
    }
}

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
enum Request {
    Metrics { head_only: bool },
    NotFound,
    BadMethod,
    Malformed,
}

/// Says what the request head (up to the blank line) asks for.
fn parse_request(head: &[u8]) -> Request {
    let Some(line) = head
        .split(|b| *b == b'\n')
        .next()
        .and_then(|l| std::str::from_utf8(l).ok())
    else {
        return Request::Malformed;
    };
    let mut words = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return Request::Malformed;
    };
    if !version.starts_with("HTTP/1.") {
        return Request::Malformed;
    }
    let path = target.split('?').next().unwrap_or("");
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ => return Request::BadMethod,
    };
    if path == "/metrics" {
        Request::Metrics { head_only }
    } else {
        Request::NotFound
    }
}

fn response(code: u16, content_type: &str, body: &[u8]) -> Vec<u8> {
    let reason = match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "Service Unavailable",
    };
    let mut out = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

/// Reads the request head: the bytes up to the blank line; None when the client closed
/// first or sent more than [`MAX_REQUEST`] without one.
async fn read_head(conn: &mut UnixStream) -> std::io::Result<Option<Vec<u8>>> {
    let mut head = Vec::with_capacity(256);
    let mut buf = [0u8; 1024];
    loop {
        let n = conn.read(&mut buf).await?;
        if n == 0 {
            return Ok(None);
        }
        head.extend_from_slice(&buf[..n]);
        if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
            return Ok(Some(head));
        }
        if head.len() > MAX_REQUEST {
            return Ok(None);
        }
    }
}

async fn handle(conn: &mut UnixStream, source: &SandboxSource) -> std::io::Result<()> {
    let answer = match read_head(conn).await? {
        None => response(431, "text/plain", b"request head too large or incomplete\n"),
        Some(head) => match parse_request(&head) {
            Request::Metrics { head_only } => {
                let body = super::scrape(source).await;
                let mut r = response(200, promtext::CONTENT_TYPE, body.as_bytes());
                if head_only {
                    r.truncate(r.len() - body.len());
                }
                r
            }
            Request::NotFound => response(404, "text/plain", b"only /metrics is served here\n"),
            Request::BadMethod => response(405, "text/plain", b"only GET is served here\n"),
            Request::Malformed => response(400, "text/plain", b"malformed request\n"),
        },
    };
    conn.write_all(&answer).await?;
    conn.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_read_strictly() {
        assert_eq!(
            parse_request(b"GET /metrics HTTP/1.1\r\nHost: shim\r\n\r\n"),
            Request::Metrics { head_only: false }
        );
        assert_eq!(
            parse_request(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n"),
            Request::Metrics { head_only: false }
        );
        assert_eq!(
            parse_request(b"HEAD /metrics HTTP/1.1\r\n\r\n"),
            Request::Metrics { head_only: true }
        );
        assert_eq!(parse_request(b"GET / HTTP/1.1\r\n\r\n"), Request::NotFound);
        assert_eq!(
            parse_request(b"POST /metrics HTTP/1.1\r\n\r\n"),
            Request::BadMethod
        );
        assert_eq!(parse_request(b"GET /metrics\r\n\r\n"), Request::Malformed);
        assert_eq!(parse_request(b"\xff\xfe\r\n\r\n"), Request::Malformed);
    }

    /// The answer to `request`, as far as it came: a server that answers before it has
    /// read the whole request (a refusal) may reset the connection after its answer.
    async fn get(path: &Path, request: &[u8]) -> String {
        let mut c = UnixStream::connect(path).await.unwrap();
        let _ = c.write_all(request).await;
        let mut answer = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = c.read(&mut buf).await {
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&answer).into_owned()
    }

    #[tokio::test]
    async fn serves_metrics_root_only_and_bounds_its_clients() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(layout::METRICS_SOCKET);
        let server = start(&path, Arc::new(|| None)).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);

        let answer = get(&path, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(head.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8"));
        assert!(
            head.contains(&format!("Content-Length: {}", body.len())),
            "{head}"
        );
        assert!(body.contains("# TYPE kata_shim_threads gauge\n"), "{body}");
        assert!(
            body.contains("kata_shim_process_resident_memory_bytes "),
            "{body}"
        );

        assert!(get(&path, b"GET /x HTTP/1.1\r\n\r\n")
            .await
            .starts_with("HTTP/1.1 404"));
        // A head without end, past the limit: refused, not read forever.
        let flood = vec![b'a'; MAX_REQUEST * 2];
        assert!(get(&path, &flood).await.starts_with("HTTP/1.1 431"));

        // Clients that never send their request hold every slot: the next is turned
        // away at once instead of waiting.
        let mut idle = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            idle.push(UnixStream::connect(&path).await.unwrap());
        }
        // (Until the server has accepted them all, a request may still get a slot.)
        let mut refused = false;
        for _ in 0..100 {
            if get(&path, b"GET /metrics HTTP/1.1\r\n\r\n")
                .await
                .starts_with("HTTP/1.1 503")
            {
                refused = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            refused,
            "a fifth client was served while four held every slot"
        );
        drop(idle);
        drop(server);
    }
}
