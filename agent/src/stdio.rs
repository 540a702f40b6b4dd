//! A container process's stdio as the agent sees it: output streams read into a bounded
//! queue (so a process that writes faster than the shim reads is paused by the pipe, and
//! memory stays bounded), and a stdin writer.
//!
//! Works on pipes and on a pty master alike, through non-blocking fds in tokio's reactor.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, Mutex};

/// Bytes read from the fd at a time: as much as the pipe holds, so that a fast writer
/// costs one read (and one wake-up) per pipe-full under TCG, where every syscall is dear.
const CHUNK: usize = protocols::STDIO_CHUNK;
/// Chunks queued before the reader stops reading (so at most 2 MiB per stream).
const QUEUE: usize = 2;
/// Pipe buffer asked for a container's output (the default is 64 KiB): a process that
/// writes in bursts blocks less often while the shim's read is in flight.
pub const PIPE_SIZE: i32 = 1 << 20;

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
    /// A chunk partly handed out, and how much of it was.
    pending: Option<(Vec<u8>, usize)>,
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
            inner: Mutex::new(OutputInner { rx, pending: None }),
        }
    }

    /// Waits for data and returns at most `len` bytes; empty at end of stream.
    ///
    /// Everything already queued goes out in one reply, up to `len`: every request is a
    /// round trip over vsock, so one per pipe read would cap throughput far below what
    /// the channel carries.
    pub async fn read(&self, len: usize) -> Vec<u8> {
        let len = len.max(1);
        let mut inner = self.inner.lock().await;
        let mut out = Vec::new();
        while out.len() < len {
            let (chunk, offset) = match inner.pending.take() {
                Some(p) => p,
                None if out.is_empty() => match inner.rx.recv().await {
                    Some(chunk) => (chunk, 0),
                    None => break, // end of stream
                },
                None => match inner.rx.try_recv() {
                    Ok(chunk) => (chunk, 0),
                    Err(_) => break, // nothing more right now
                },
            };
            let n = (len - out.len()).min(chunk.len() - offset);
            if out.is_empty() && offset == 0 && n == chunk.len() {
                out = chunk; // the common case: hand the buffer over without copying
            } else {
                out.extend_from_slice(&chunk[offset..offset + n]);
                if offset + n < chunk.len() {
                    inner.pending = Some((chunk, offset + n));
                }
            }
        }
        out
    }
}

async fn read_chunk(fd: &AsyncFd<OwnedFd>) -> io::Result<Option<Vec<u8>>> {
    // Not zeroed: read(2) fills what it returns, and only that becomes the length. Zeroing
    // a large buffer for every read would cost a small write as much as a full one.
    let mut buf: Vec<u8> = Vec::with_capacity(CHUNK);
    loop {
        let mut guard = fd.readable().await?;
        match guard.try_io(|inner| {
            // SAFETY: the pointer and length describe `buf`'s unused capacity, which read(2)
            // may write; the fd is open for as long as `inner` is borrowed.
            let n =
                unsafe { libc::read(inner.get_ref().as_raw_fd(), buf.as_mut_ptr().cast(), CHUNK) };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        }) {
            Ok(Ok(0)) => return Ok(None),
            Ok(Ok(n)) => {
                // SAFETY: read(2) initialised the first `n <= CHUNK` bytes.
                unsafe { buf.set_len(n) };
                if n < CHUNK / 2 {
                    buf.shrink_to_fit(); // a line of output does not pin a whole chunk
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An output stream over a pipe holding `data`, already closed for writing.
    async fn stream_of(data: &[u8]) -> OutputStream {
        let (r, w) = nix::unistd::pipe().unwrap();
        let _ = nix::fcntl::fcntl(r.as_raw_fd(), FcntlArg::F_SETPIPE_SZ(PIPE_SIZE));
        let data = data.to_vec();
        let writer = std::thread::spawn(move || {
            let mut f = std::fs::File::from(w);
            io::Write::write_all(&mut f, &data).unwrap();
        });
        let s = OutputStream::start(async_fd(r).unwrap());
        writer.join().unwrap();
        s
    }

    #[tokio::test]
    async fn queued_chunks_go_out_together_and_in_order() {
        let data: Vec<u8> = (0..(CHUNK + 300_000) as u32)
            .map(|i| (i % 251) as u8)
            .collect();
        let (r, w) = nix::unistd::pipe().unwrap();
        let _ = nix::fcntl::fcntl(r.as_raw_fd(), FcntlArg::F_SETPIPE_SZ(PIPE_SIZE));
        let mut w = std::fs::File::from(w);
        // A full chunk waits in the pipe before the reader starts, so its first read is
        // a whole chunk; the rest becomes a second chunk behind it.
        io::Write::write_all(&mut w, &data[..CHUNK]).unwrap();
        let s = OutputStream::start(async_fd(r).unwrap());
        let rest = data[CHUNK..].to_vec();
        // On a blocking thread: the reader task needs this (single-threaded) runtime to
        // drain the pipe meanwhile.
        tokio::task::spawn_blocking(move || io::Write::write_all(&mut w, &rest).unwrap())
            .await
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let first = s.read(4 * CHUNK).await;
        assert!(
            first.len() > CHUNK,
            "one reply carried only {} bytes",
            first.len()
        );
        let mut all = first;
        loop {
            let more = s.read(4 * CHUNK).await;
            if more.is_empty() {
                break;
            }
            all.extend(more);
        }
        assert_eq!(all, data);
    }

    #[tokio::test]
    async fn small_reads_split_a_chunk_without_losing_bytes() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 13) as u8).collect();
        let s = stream_of(&data).await;
        let mut all = Vec::new();
        loop {
            let part = s.read(777).await;
            assert!(part.len() <= 777);
            if part.is_empty() {
                break;
            }
            all.extend(part);
        }
        assert_eq!(all, data);
    }
}
