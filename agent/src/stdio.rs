//! A container process's stdio as the agent sees it: output streams read into a bounded
//! queue (so a process that writes faster than the shim reads is paused by the pipe, and
//! memory stays bounded), and a stdin writer.
//!
//! Works on pipes and on a pty master alike, through non-blocking fds in tokio's reactor.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, Mutex};

/// Bytes read from the fd at a time.
const CHUNK: usize = 64 * 1024;
/// Chunks queued before the reader stops reading (so at most 1 MiB per stream).
const QUEUE: usize = 16;

/// A non-blocking fd registered with tokio, shared by the reader and writer of a pty.
pub type SharedFd = Arc<AsyncFd<OwnedFd>>;

pub fn async_fd(fd: OwnedFd) -> io::Result<SharedFd> {
    let flags = fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL)?;
    let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(flags))?;
    // SAFETY: an OwnedFd is a valid open fd that stays open, and always returns the same
    // raw fd, for as long as the AsyncFd owns it.
    let afd = unsafe { AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)?;
    Ok(Arc::new(afd))
}

/// One output stream (stdout or stderr) of a process.
pub struct OutputStream {
    inner: Mutex<OutputInner>,
}

struct OutputInner {
    rx: mpsc::Receiver<Vec<u8>>,
    pending: VecDeque<u8>,
}

impl OutputStream {
    /// Starts copying `fd` into the queue until end of file.
    pub fn start(fd: SharedFd) -> OutputStream {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(async move {
            loop {
                let chunk = match read_chunk(&fd).await {
                    Ok(Some(chunk)) => chunk,
                    // EOF, or EIO from a pty master whose slave side is closed.
                    Ok(None) | Err(_) => return,
                };
                if tx.send(chunk).await.is_err() {
                    return; // the process was removed
                }
            }
        });
        OutputStream {
            inner: Mutex::new(OutputInner {
                rx,
                pending: VecDeque::new(),
            }),
        }
    }

    /// Waits for data and returns at most `len` bytes; empty at end of stream.
    pub async fn read(&self, len: usize) -> Vec<u8> {
        let len = len.max(1);
        let mut inner = self.inner.lock().await;
        if inner.pending.is_empty() {
            match inner.rx.recv().await {
                Some(chunk) => inner.pending.extend(chunk),
                None => return Vec::new(),
            }
        }
        let n = len.min(inner.pending.len());
        inner.pending.drain(..n).collect()
    }
}

async fn read_chunk(fd: &AsyncFd<OwnedFd>) -> io::Result<Option<Vec<u8>>> {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let mut guard = fd.readable().await?;
        match guard.try_io(|inner| {
            nix::unistd::read(inner.get_ref().as_raw_fd(), &mut buf).map_err(io::Error::from)
        }) {
            Ok(Ok(0)) => return Ok(None),
            Ok(Ok(n)) => {
                buf.truncate(n);
                return Ok(Some(buf));
            }
            Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
}

/// Writes all of `data` to `fd`, waiting while the pipe is full.
pub async fn write_all(fd: &AsyncFd<OwnedFd>, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        let mut guard = fd.writable().await?;
        match guard.try_io(|inner| {
            nix::unistd::write(inner.get_ref().as_fd(), data).map_err(io::Error::from)
        }) {
            Ok(Ok(n)) => data = &data[n..],
            Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
    Ok(())
}

/// Sets a pty's window size.
pub fn resize(master: &AsyncFd<OwnedFd>, rows: u16, cols: u16) -> io::Result<()> {
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one `winsize` from the pointer, which is valid for the call.
    let rc = unsafe { libc::ioctl(master.get_ref().as_raw_fd(), libc::TIOCSWINSZ, &size) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
