//! The agent's stdio streams server (`protocols::stdio`): each connection names one
//! stream of one process in its first line, is answered `OK` or `ERR <why>`, and then
//! carries that stream's bytes ([`crate::stdio::Attached::run`]).
//!
//! In the guest it listens on vsock port [`protocols::STDIO_VSOCK_PORT`], host only like
//! every agent service (a container must not read another's output or type into its
//! stdin). The agent on the host (tests) serves the same protocol on a unix socket.

use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use protocols::stdio::{
    err_line, process_name, StdioProtocolError, StdioRequest, StdioStream, MAX_REQUEST_LINE,
    OK_LINE,
};
use slog::{debug, info, warn, Logger};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;

use crate::host_only::spawn_service;
use crate::sandbox::Sandbox;

/// How long the host may take to name its stream.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The guest's receive buffer of an output stream's socket (`SO_VM_SOCKETS_BUFFER_SIZE`,
/// 256 KiB by default). Linux sends at most this much ahead of the host's last credit
/// update (it caps the peer's credit to its own buffer), so it is the window output
/// flows in; the host's side matches it (kata-vsock's `HOST_BUF_ALLOC`, which says what
/// it bought). Nothing is ever received on an output stream, so it costs no memory;
/// stdin keeps the default, which bounds what the host can queue in the guest.
const OUTPUT_WINDOW: u64 = 1 << 20;
/// `AF_VSOCK` socket options (linux/vm_sockets.h), which libc does not name.
const SO_VM_SOCKETS_BUFFER_SIZE: libc::c_int = 0;
const SO_VM_SOCKETS_BUFFER_MAX_SIZE: libc::c_int = 2;

/// Serves stdio streams on vsock; failures are logged (processes then have no stdio,
/// which the host reports).
pub fn start_vsock(log: Logger, sandbox: Arc<Sandbox>) {
    let port = protocols::STDIO_VSOCK_PORT;
    let conn_log = log.clone();
    spawn_service(&log, "stdio streams", port, move |conn| {
        let fd = conn.as_raw_fd();
        serve_logged(conn_log.clone(), sandbox.clone(), conn, move |stream| {
            if stream != StdioStream::Stdin {
                // Best effort: a narrower window still works, only slower.
                let _ = set_output_window(fd);
            }
        })
    });
}

/// Serves stdio streams on the unix socket `path` (the agent on the host, for tests).
pub fn start_unix(log: Logger, sandbox: Arc<Sandbox>, path: &Path) -> std::io::Result<()> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((conn, _)) => {
                    tokio::spawn(serve_logged(log.clone(), sandbox.clone(), conn, |_| {}));
                }
                Err(e) => {
                    warn!(log, "stdio accept failed"; "error" => %e);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    });
    Ok(())
}

/// [`serve`], its end logged.
async fn serve_logged<S>(
    log: Logger,
    sandbox: Arc<Sandbox>,
    conn: S,
    tune: impl FnOnce(StdioStream),
) where
    S: AsyncRead + AsyncWrite + AsRawFd + Unpin,
{
    if let Err(e) = serve(&log, &sandbox, conn, tune).await {
        debug!(log, "stdio connection ended"; "error" => %e);
    }
}

/// One connection: request line, answer, then the stream's bytes until it ends. `tune`
/// adjusts the connection's socket once the stream is known (on vsock: an output
/// stream's window).
pub async fn serve<S>(
    log: &Logger,
    sandbox: &Sandbox,
    conn: S,
    tune: impl FnOnce(StdioStream),
) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + AsRawFd + Unpin,
{
    let mut conn = BufReader::new(conn);
    let req = match tokio::time::timeout(REQUEST_TIMEOUT, read_request(&mut conn)).await {
        Ok(Ok(req)) => req,
        Ok(Err(why)) => return refuse(log, &mut conn, &why.to_string()).await,
        Err(_) => return refuse(log, &mut conn, "no stream named in time").await,
    };
    let (cid, exec_id, stream) = (&req.container_id, &req.exec_id, req.stream);
    // Only the stream is kept: holding the process would keep it from being dropped,
    // which is what ends the copy when the process is removed.
    let attached = match sandbox.process(cid, exec_id).await {
        Ok(process) => process.stdio.attach(stream),
        Err(e) => return refuse(log, &mut conn, &e.to_string()).await,
    };
    let attached = match attached {
        Ok(a) => a,
        Err(e) => {
            let why = format!("{}: {e}", process_name(cid, exec_id));
            return refuse(log, &mut conn, &why).await;
        }
    };
    tune(stream);
    conn.write_all(OK_LINE.as_bytes()).await?;
    conn.flush().await?;
    let sock = conn.get_ref().as_raw_fd();
    let moved = attached.run(conn, sock).await?;
    debug!(log, "stdio stream done"; "container_id" => cid, "exec_id" => exec_id,
        "stream" => stream.name(), "bytes" => moved);
    Ok(())
}

async fn refuse<S: AsyncWrite + Unpin>(
    log: &Logger,
    conn: &mut S,
    why: &str,
) -> std::io::Result<()> {
    info!(log, "stdio request refused"; "reason" => why);
    conn.write_all(err_line(why).as_bytes()).await?;
    conn.shutdown().await
}

/// Why a connection's first line did not name a stream.
#[derive(Debug, thiserror::Error)]
enum RequestError {
    #[error("reading the request failed: {0}")]
    Read(#[from] std::io::Error),
    #[error(
        "no request line: expected \"<stdin|stdout|stderr> <container-id> [<exec-id>]\\n\" \
         within {MAX_REQUEST_LINE} bytes"
    )]
    NoLine,
    #[error("the request is not UTF-8")]
    NotUtf8,
    #[error(transparent)]
    Protocol(#[from] StdioProtocolError),
}

async fn read_request<S: AsyncRead + Unpin>(
    conn: &mut BufReader<S>,
) -> Result<StdioRequest, RequestError> {
    let mut line = Vec::new();
    (&mut *conn)
        .take(MAX_REQUEST_LINE as u64)
        .read_until(b'\n', &mut line)
        .await?;
    if line.last() != Some(&b'\n') {
        return Err(RequestError::NoLine);
    }
    let text = std::str::from_utf8(&line).map_err(|_| RequestError::NotUtf8)?;
    Ok(StdioRequest::parse(text)?)
}

/// Gives the vsock socket `fd` (connected, or listening: accepted sockets inherit it) the
/// window of an output stream, [`OUTPUT_WINDOW`]. `fd` must be open for the call.
pub fn set_output_window(fd: RawFd) -> std::io::Result<()> {
    // The maximum first: the kernel clamps the size to it.
    for opt in [SO_VM_SOCKETS_BUFFER_MAX_SIZE, SO_VM_SOCKETS_BUFFER_SIZE] {
        // SAFETY: setsockopt reads one u64 from the pointer, which is valid for the call.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::AF_VSOCK,
                opt,
                (&OUTPUT_WINDOW as *const u64).cast(),
                std::mem::size_of::<u64>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
