//! A container process's stdio as the agent holds it: the agent's end of each stream
//! (a pipe end, or the terminal's master) waits in [`Stdio`] until the host attaches the
//! stream over a connection of its own (`stdio::streams`, `protocols::stdio`), which
//! starts the copy between the fd and that connection ([`Attached::run`]).
//!
//! Works on pipes and on a pty master alike, through non-blocking fds in tokio's reactor.

pub mod streams;

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use protocols::stdio::StdioStream;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

/// Pipe buffer asked for a container's stdout (the default is 64 KiB): a process that
/// writes in bursts blocks less often while the previous chunk crosses vsock, and each
/// read takes a whole burst (one read and one wake-up per pipe-full under TCG, where
/// every syscall is dear).
pub const PIPE_SIZE: i32 = 1 << 20;

/// Bytes moved per read when the fd does not say how much it holds (a terminal).
const DEFAULT_CHUNK: usize = 64 << 10;

/// The terminal's end-of-file character (^D): a terminal has no half-close, so this is
/// how the end of the host's stdin reaches a process reading its terminal.
const TERMINAL_EOF: u8 = 0x04;

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

/// Why a stream cannot be attached.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum AttachError {
    #[error("the process was started without stdin")]
    NoStdin,
    #[error("the process has a terminal, which merges stderr into stdout: attach stdout")]
    TerminalStderr,
    #[error("its {0} is already attached to another connection")]
    AlreadyAttached(StdioStream),
}

/// One stream of a process, from the agent's side.
enum Slot {
    /// The fd, until the host attaches the stream.
    Waiting(SharedFd),
    Attached,
    /// The process has no such stream (no stdin; stderr of a terminal).
    Absent,
}

impl Slot {
    fn of(fd: Option<SharedFd>) -> Mutex<Slot> {
        Mutex::new(fd.map_or(Slot::Absent, Slot::Waiting))
    }
}

/// The stdio of one process, each stream waiting for the host to attach it.
pub struct Stdio {
    stdin: Mutex<Slot>,
    stdout: Mutex<Slot>,
    stderr: Mutex<Slot>,
    terminal: bool,
    /// Dropped with the process: ends the copies of its attached streams.
    alive: watch::Sender<()>,
}

impl Stdio {
    /// `stdin` is None when the process reads /dev/null. A process with a terminal has
    /// its master as `stdout` (and `stdin`) and no `stderr`.
    pub fn new(stdin: Option<SharedFd>, stdout: SharedFd, stderr: Option<SharedFd>) -> Self {
        Stdio {
            stdin: Slot::of(stdin),
            stdout: Slot::of(Some(stdout)),
            terminal: stderr.is_none(),
            stderr: Slot::of(stderr),
            alive: watch::channel(()).0,
        }
    }

    /// Takes `stream` for one connection: a stream is attached at most once.
    pub fn attach(&self, stream: StdioStream) -> Result<Attached, AttachError> {
        let slot = match stream {
            StdioStream::Stdin => &self.stdin,
            StdioStream::Stdout => &self.stdout,
            StdioStream::Stderr => &self.stderr,
        };
        let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
        match std::mem::replace(&mut *slot, Slot::Attached) {
            Slot::Waiting(fd) => Ok(Attached {
                fd,
                stream,
                terminal: self.terminal,
                removed: self.alive.subscribe(),
            }),
            Slot::Attached => Err(AttachError::AlreadyAttached(stream)),
            Slot::Absent => {
                *slot = Slot::Absent;
                Err(match stream {
                    StdioStream::Stderr => AttachError::TerminalStderr,
                    _ => AttachError::NoStdin,
                })
            }
        }
    }
}

/// A stream taken for a connection; [`Attached::run`] moves its bytes.
pub struct Attached {
    fd: SharedFd,
    stream: StdioStream,
    terminal: bool,
    /// Ends (with an error) once the process is gone.
    removed: watch::Receiver<()>,
}

impl Attached {
    pub fn stream(&self) -> StdioStream {
        self.stream
    }

    /// Copies between the process and `conn` as `protocols::stdio` says, until the
    /// stream ends or the process is removed. Returns the bytes moved. `sock` is the
    /// socket under `conn`: a pipe's output goes into it with `splice(2)`, and our guest
    /// kernel hands the pipe's pages to the vsock device by reference
    /// (`guest/patches/`), so output crosses to the host without a guest copy (under
    /// emulation, where every guest copy is dear, a copy was most of the stream's cost).
    /// On another kernel splice still saves the agent's read and write.
    pub async fn run<S>(self, conn: S, sock: RawFd) -> io::Result<u64>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let Attached {
            fd,
            stream,
            terminal,
            mut removed,
        } = self;
        let copy = async {
            match stream {
                StdioStream::Stdin => copy_input(conn, &fd, terminal).await,
                _ if !terminal => splice_output(&fd, sock).await,
                _ => copy_output(&fd, conn).await,
            }
        };
        tokio::select! {
            r = copy => r,
            // Nothing is ever sent: this ends only when the process is gone. Dropping the
            // connection then closes it.
            _ = removed.changed() => Ok(0),
        }
    }
}

/// A pipe's output into the socket `sock` with `splice(2)` until end of file; the caller
/// holds the socket's connection open throughout and closes it afterwards (as
/// [`copy_output`] says). The socket is waited on through a duplicate of its fd,
/// registered for the copy's duration.
async fn splice_output(pipe: &AsyncFd<OwnedFd>, sock: RawFd) -> io::Result<u64> {
    // Close-on-exec: a stage started meanwhile must not inherit it, or the connection
    // would outlive the stream.
    let dup = fcntl(sock, FcntlArg::F_DUPFD_CLOEXEC(0))?;
    // SAFETY: fcntl returned a new fd that nothing else owns.
    let sock = async_fd(unsafe { OwnedFd::from_raw_fd(dup) })?;
    let len = chunk_size(pipe);
    let mut total = 0u64;
    loop {
        let mut readable = pipe.readable().await?;
        let moved = nix::fcntl::splice(
            pipe.get_ref().as_fd(),
            None,
            sock.get_ref().as_fd(),
            None,
            len,
            nix::fcntl::SpliceFFlags::SPLICE_F_NONBLOCK | nix::fcntl::SpliceFFlags::SPLICE_F_MOVE,
        );
        match moved {
            // End of file: every writer closed the pipe and it is empty.
            Ok(0) => return Ok(total),
            Ok(n) => total += n as u64,
            Err(nix::errno::Errno::EINTR) => {}
            // The pipe is empty, or the socket is full: wait for whichever it is.
            Err(nix::errno::Errno::EAGAIN) => {
                if !poll_now(pipe.get_ref(), libc::POLLIN) {
                    readable.clear_ready();
                } else if !poll_now(sock.get_ref(), libc::POLLOUT) {
                    drop(readable);
                    sock.writable().await?.clear_ready();
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Whether `fd` has any of `events` (or an error or hang-up) right now.
fn poll_now(fd: &OwnedFd, events: libc::c_short) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    };
    // SAFETY: poll reads and writes one pollfd, valid for the call; timeout 0 never blocks.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents != 0
}

/// Process output to the host, until end of file on `fd`; the caller then closes the
/// connection. A close, not a half-close: vsock backends pass a guest's full close on as
/// the end of the host's stream, while some (vhost-device-vsock) ignore a half-close.
/// Every byte written has been queued with the host's credit by then, ahead of the close.
async fn copy_output<S: AsyncRead + AsyncWrite + Unpin>(
    fd: &AsyncFd<OwnedFd>,
    mut conn: S,
) -> io::Result<u64> {
    let chunk = chunk_size(fd);
    // Zeroed by calloc, which maps fresh pages: a quiet process never touches most.
    let mut buf = vec![0u8; chunk];
    let mut total = 0u64;
    loop {
        let n = read_fd(fd, &mut buf).await?;
        if n == 0 {
            break;
        }
        conn.write_all(&buf[..n]).await?;
        total += n as u64;
    }
    conn.flush().await?;
    Ok(total)
}

/// The host's bytes to the process's stdin, until the host's half-close (or close, or
/// reset: the host is done either way); then the process's stdin ends (its pipe closes,
/// or its terminal reads ^D).
async fn copy_input<S: AsyncRead + AsyncWrite + Unpin>(
    mut conn: S,
    fd: &AsyncFd<OwnedFd>,
    terminal: bool,
) -> io::Result<u64> {
    let mut buf = vec![0u8; DEFAULT_CHUNK];
    let mut total = 0u64;
    loop {
        let n = conn.read(&mut buf).await.unwrap_or(0);
        if n == 0 {
            break;
        }
        write_all(fd, &buf[..n]).await?;
        total += n as u64;
    }
    if terminal {
        write_all(fd, &[TERMINAL_EOF]).await?;
    }
    // A pipe's write end closes when the last holder of `fd` drops it.
    Ok(total)
}

/// How much one read takes: a pipe-full, else [`DEFAULT_CHUNK`].
fn chunk_size(fd: &AsyncFd<OwnedFd>) -> usize {
    fcntl(fd.as_raw_fd(), FcntlArg::F_GETPIPE_SZ)
        .ok()
        .and_then(|n| usize::try_from(n).ok())
        .filter(|n| *n > 0)
        .unwrap_or(DEFAULT_CHUNK)
}

/// Reads what `fd` has, waiting for it; 0 at end of file, which for a pty master is EIO
/// once the terminal's last holder has closed it.
async fn read_fd(fd: &AsyncFd<OwnedFd>, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        let mut guard = fd.readable().await?;
        match guard.try_io(|inner| {
            nix::unistd::read(inner.get_ref().as_raw_fd(), buf).map_err(io::Error::from)
        }) {
            Ok(Ok(n)) => return Ok(n),
            Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
            Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
}

/// Writes all of `data` to `fd`, waiting while the pipe is full.
async fn write_all(fd: &AsyncFd<OwnedFd>, mut data: &[u8]) -> io::Result<()> {
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
    use std::time::Duration;
    use tokio::net::UnixStream;

    fn pipe() -> (SharedFd, std::fs::File) {
        let (r, w) = nix::unistd::pipe().unwrap();
        let _ = fcntl(r.as_raw_fd(), FcntlArg::F_SETPIPE_SZ(PIPE_SIZE));
        (async_fd(r).unwrap(), std::fs::File::from(w))
    }

    async fn run(attached: Attached, conn: UnixStream) -> io::Result<u64> {
        let sock = conn.as_raw_fd();
        attached.run(conn, sock).await
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len as u32).map(|i| (i % 251) as u8).collect()
    }

    /// Sends more than a pipe-full through the stdout of a process (with a terminal when
    /// `terminal`), read by the host slowly when `slow`; checks it arrives whole and in
    /// order, then the end of stream.
    async fn output_arrives_whole(terminal: bool, slow: bool) {
        let (r, mut w) = pipe();
        let stderr = (!terminal).then(|| pipe().0);
        let stdio = Stdio::new(None, r, stderr);
        let attached = stdio.attach(StdioStream::Stdout).unwrap();
        let (guest, mut host) = UnixStream::pair().unwrap();
        let copy = tokio::spawn(run(attached, guest));
        let data = pattern(3 * PIPE_SIZE as usize + 12345);
        let sent = data.clone();
        let writer = std::thread::spawn(move || io::Write::write_all(&mut w, &sent).unwrap());
        let mut got = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            if slow {
                // Slower than the writer: the socket fills and the copy must wait for it.
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let n = host.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        writer.join().unwrap();
        assert_eq!(got.len(), data.len());
        assert!(got == data, "the bytes differ");
        assert_eq!(copy.await.unwrap().unwrap(), data.len() as u64);
    }

    /// A pipe's output is spliced into the socket, which fills while the host is slow.
    #[tokio::test]
    async fn spliced_output_arrives_whole_to_a_slow_reader_then_the_stream_ends() {
        output_arrives_whole(false, true).await;
    }

    /// A terminal's output is copied (a pty cannot splice).
    #[tokio::test]
    async fn terminal_output_arrives_whole_then_the_stream_ends() {
        output_arrives_whole(true, false).await;
    }

    #[tokio::test]
    async fn stdin_flows_until_the_hosts_half_close_then_the_pipe_closes() {
        let (r, w) = nix::unistd::pipe().unwrap();
        let stdio = Stdio::new(Some(async_fd(w).unwrap()), pipe().0, Some(pipe().0));
        let attached = stdio.attach(StdioStream::Stdin).unwrap();
        let (guest, mut host) = UnixStream::pair().unwrap();
        let copy = tokio::spawn(run(attached, guest));
        let data = pattern(300_000);
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            io::Read::read_to_end(&mut std::fs::File::from(r), &mut got).unwrap();
            got
        });
        host.write_all(&data).await.unwrap();
        host.shutdown().await.unwrap();
        assert_eq!(copy.await.unwrap().unwrap(), data.len() as u64);
        drop(stdio); // the process goes: nothing else holds the pipe's write end
        assert!(reader.join().unwrap() == data, "stdin differs");
    }

    #[tokio::test]
    async fn a_terminal_gets_eof_as_ctrl_d_and_has_no_stderr() {
        let (r, w) = nix::unistd::pipe().unwrap();
        let master = async_fd(w).unwrap();
        let stdio = Stdio::new(Some(master.clone()), master, None);
        assert_eq!(
            stdio.attach(StdioStream::Stderr).err(),
            Some(AttachError::TerminalStderr)
        );
        let (guest, mut host) = UnixStream::pair().unwrap();
        let copy = tokio::spawn(run(stdio.attach(StdioStream::Stdin).unwrap(), guest));
        host.write_all(b"ls\n").await.unwrap();
        host.shutdown().await.unwrap();
        copy.await.unwrap().unwrap();
        let mut got = [0u8; 4];
        io::Read::read_exact(&mut std::fs::File::from(r), &mut got).unwrap();
        assert_eq!(&got, b"ls\n\x04");
    }

    #[tokio::test]
    async fn each_stream_is_attached_once_and_stdin_only_if_given() {
        let stdio = Stdio::new(None, pipe().0, Some(pipe().0));
        assert_eq!(
            stdio.attach(StdioStream::Stdin).err(),
            Some(AttachError::NoStdin)
        );
        assert_eq!(
            stdio.attach(StdioStream::Stdin).err(),
            Some(AttachError::NoStdin)
        );
        for s in [StdioStream::Stdout, StdioStream::Stderr] {
            assert!(stdio.attach(s).is_ok());
            assert_eq!(stdio.attach(s).err(), Some(AttachError::AlreadyAttached(s)));
        }
        let msg = AttachError::AlreadyAttached(StdioStream::Stdout).to_string();
        assert_eq!(msg, "its stdout is already attached to another connection");
    }

    /// Removing the process ends an attached copy at once, even while a descendant
    /// keeps the pipe open and the host keeps reading.
    #[tokio::test]
    async fn removing_the_process_closes_its_connections() {
        let (r, mut w) = pipe();
        let stdio = Stdio::new(None, r, None);
        let (guest, mut host) = UnixStream::pair().unwrap();
        let copy = tokio::spawn(run(stdio.attach(StdioStream::Stdout).unwrap(), guest));
        io::Write::write_all(&mut w, b"partial").unwrap();
        let mut got = [0u8; 7];
        host.read_exact(&mut got).await.unwrap();
        drop(stdio);
        let ended = tokio::time::timeout(Duration::from_secs(5), copy).await;
        assert!(ended.is_ok(), "the copy outlived its process");
        let mut rest = Vec::new();
        host.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
        drop(w);
    }
}
