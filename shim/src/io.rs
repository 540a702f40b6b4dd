//! Relays a process's stdio between containerd's fifos on the host and the agent, one
//! connection per stream ([`Agent::open_stdio`], `protocols::stdio`):
//!
//! - output: the guest's bytes go from the connection into the fifo with `splice(2)`,
//!   kernel to kernel; the relay finishes only at the guest's end of stream, so the shim
//!   reports an exit after every byte has been delivered (waiting a few seconds at most:
//!   a stream a background child still holds goes on until the process is deleted,
//!   without holding back the exit; see `task::watch`). A stream nobody wants (no
//!   fifo, or its reader went away) is still read to its end, so the guest's pipe never
//!   fills up and blocks the process.
//! - stdin: the fifo's bytes go to the connection; end of file there (or CloseIO)
//!   half-closes it, which ends the process's stdin in the guest.
//!
//! Every relay ends at once when the VM is gone ([`Agent::vm_gone`]).

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use protocols::stdio::StdioStream;
use slog::{debug, info, warn, Logger};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::net::UnixStream;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use agent_client::Agent;

/// The agent a relay talks to.
type AgentRef = Arc<dyn Agent>;

/// Bytes asked of one `splice(2)`: more than a fifo holds, so that each call moves
/// whatever fits.
const SPLICE_MAX: usize = 1 << 20;
/// Buffer of the copies that cannot splice (stdin, output nobody reads).
const COPY_CHUNK: usize = 128 << 10;
/// Pipe buffer asked for an output fifo (Linux's default is 64 KiB): containerd reads a
/// fuller fifo in fewer reads, and the guest's bursts wait less for it.
const FIFO_SIZE: i32 = 1 << 20;

/// The fifo paths containerd gave for one process (empty = not wanted).
#[derive(Debug, Clone, Default)]
pub struct StdioPaths {
    pub stdin: String,
    pub stdout: String,
    pub stderr: String,
    pub terminal: bool,
}

/// The running relays of one process.
pub struct Relays {
    outputs: Vec<JoinHandle<()>>,
    stdin: Option<StdinRelay>,
}

struct StdinRelay {
    close: Arc<Notify>,
    task: JoinHandle<()>,
}

/// Who one relay serves, for its log lines.
#[derive(Clone)]
struct Target {
    agent: AgentRef,
    cid: String,
    exec_id: String,
    log: Logger,
}

impl Target {
    /// Runs the relay of `stream` until it ends, or at once when the VM is gone, and logs
    /// how it ended and the bytes it moved.
    async fn run(
        &self,
        stream: StdioStream,
        relay: impl std::future::Future<Output = io::Result<u64>>,
    ) {
        let (log, cid, exec_id) = (&self.log, &self.cid, &self.exec_id);
        let mut gone = self.agent.vm_gone();
        tokio::select! {
            r = relay => match r {
                Ok(bytes) => debug!(log, "{stream} relay done"; "container" => cid,
                    "exec" => exec_id, "bytes" => bytes),
                Err(e) => warn!(log, "{stream} relay failed"; "container" => cid,
                    "exec" => exec_id, "error" => %e),
            },
            cause = gone.wait() => debug!(log, "{stream} relay ended: the VM is gone";
                "container" => cid, "exec" => exec_id, "cause" => cause),
        }
    }
}

impl Relays {
    /// Starts the relays for process `exec_id` of container `cid`.
    pub fn start(
        agent: &AgentRef,
        cid: &str,
        exec_id: &str,
        paths: &StdioPaths,
        log: &Logger,
    ) -> Self {
        let target = Target {
            agent: agent.clone(),
            cid: cid.to_string(),
            exec_id: exec_id.to_string(),
            log: log.clone(),
        };
        let fifo = |p: &String| (!p.is_empty()).then(|| p.clone());
        let mut outputs = vec![spawn_output(
            &target,
            StdioStream::Stdout,
            fifo(&paths.stdout),
        )];
        // A terminal merges stderr into stdout.
        if !paths.terminal {
            outputs.push(spawn_output(
                &target,
                StdioStream::Stderr,
                fifo(&paths.stderr),
            ));
        }
        let stdin = (!paths.stdin.is_empty()).then(|| {
            let close = Arc::new(Notify::new());
            let task = spawn_input(&target, &paths.stdin, close.clone());
            StdinRelay { close, task }
        });
        Relays { outputs, stdin }
    }

    /// Waits until every output stream has reached its end.
    /// Cancelled, it keeps the relays not yet ended (dropping [`Relays`] stops them).
    pub async fn wait_outputs(&mut self) {
        while let Some(task) = self.outputs.last_mut() {
            let _ = task.await;
            self.outputs.pop();
        }
    }

    /// CloseIO: stop forwarding stdin and close it in the guest.
    pub fn close_stdin(&mut self) {
        if let Some(s) = &self.stdin {
            s.close.notify_one();
        }
    }

    /// Stops the stdin relay of a process that has exited.
    pub fn stop_stdin(&mut self) {
        if let Some(s) = self.stdin.take() {
            s.close.notify_one();
            s.task.abort();
        }
    }
}

impl Drop for Relays {
    fn drop(&mut self) {
        self.stop_stdin();
        for t in &self.outputs {
            t.abort();
        }
    }
}

/// Copies one output stream of the process to the fifo at `path` (None: not wanted).
fn spawn_output(target: &Target, stream: StdioStream, path: Option<String>) -> JoinHandle<()> {
    let t = target.clone();
    tokio::spawn(async move {
        let relay = async {
            let (conn, fifo) =
                tokio::join!(t.agent.open_stdio(&t.cid, &t.exec_id, stream), async {
                    match &path {
                        Some(p) => open_output_fifo(p, stream, &t.log).await,
                        None => None,
                    }
                });
            match conn {
                Ok(conn) => relay_output(conn, fifo, path.as_deref(), stream, &t.log).await,
                Err(e) => {
                    warn!(t.log, "{stream} of the process is lost"; "container" => &t.cid,
                        "exec" => &t.exec_id, "error" => %e);
                    Ok(0)
                }
            }
        };
        t.run(stream, relay).await;
    })
}

/// How often a relay whose fifo lost its reader looks for a new one.
const REATTACH_EVERY: Duration = Duration::from_millis(500);

/// Moves the guest's bytes from `conn` into `fifo` until the guest's end of stream.
/// While nobody reads the fifo (its reader went away), reads on and discards, so the
/// guest's pipe never fills; when a reader opens the fifo at `path` again (containerd
/// restarted: it reattaches to the fifos of the tasks it finds), the bytes go there
/// again. Returns the bytes received.
async fn relay_output(
    conn: UnixStream,
    fifo: Option<OwnedFd>,
    path: Option<&str>,
    stream: StdioStream,
    log: &Logger,
) -> io::Result<u64> {
    let conn = register(OwnedFd::from(conn.into_std()?))?;
    let mut total = 0u64;
    let Some(fifo) = fifo else {
        discard(&conn, &mut total, None).await?;
        return Ok(total);
    };
    let mut fifo = register(fifo)?;
    loop {
        match splice_all(&conn, &fifo, &mut total).await? {
            Spliced::End => return Ok(total),
            Spliced::ReaderGone => {
                warn!(
                    log,
                    "{stream} reader went away, discarding until one comes back"
                )
            }
        }
        let Some(path) = path else {
            discard(&conn, &mut total, None).await?;
            return Ok(total);
        };
        match discard(&conn, &mut total, Some(path)).await? {
            Some(back) => {
                info!(log, "{stream} reader came back, relaying again");
                fifo = register(back)?;
            }
            None => return Ok(total),
        }
    }
}

/// Reads `conn` and drops the bytes until its end (None) or, with `reattach`, until the
/// fifo at that path has a reader again (its fd, opened for writing).
async fn discard(
    conn: &AsyncFd<OwnedFd>,
    total: &mut u64,
    reattach: Option<&str>,
) -> io::Result<Option<OwnedFd>> {
    let mut buf = vec![0u8; COPY_CHUNK];
    let mut tick = tokio::time::interval(REATTACH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            n = read_fd(conn, &mut buf) => match n? {
                0 => return Ok(None),
                n => *total += n as u64,
            },
            _ = tick.tick(), if reattach.is_some() => {
                if let Some(fd) = reattach.and_then(open_fifo_with_reader) {
                    return Ok(Some(fd));
                }
            }
        }
    }
}

/// The fifo at `path` opened for writing, when it is a fifo that has a reader now.
fn open_fifo_with_reader(path: &str) -> Option<OwnedFd> {
    use nix::fcntl::{open, OFlag};
    use nix::sys::stat::Mode;
    let flags = OFlag::O_WRONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    let fd = open(path, flags, Mode::empty()).ok()?;
    // SAFETY: open returned a new descriptor that nothing else owns.
    let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    is_fifo(&fd).then_some(fd)
}

/// Hands a non-blocking fd to tokio's reactor.
fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd is a valid open fd that stays open, and always returns the same
    // raw fd, for as long as the AsyncFd owns it.
    unsafe { AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)
}

/// How [`splice_all`] ended.
#[derive(Debug, PartialEq, Eq)]
enum Spliced {
    /// The source reached its end of stream.
    End,
    /// Nobody reads the fifo any more (EPIPE).
    ReaderGone,
}

/// Moves everything `src` (a stream socket) delivers into `dst` (a pipe) with
/// `splice(2)`, counting it in `total`. Both fds are non-blocking: splice's EAGAIN says
/// that one side is not ready without saying which, so a zero-timeout poll tells, and
/// only that side's readiness is cleared (tokio keeps the other's).
async fn splice_all(
    src: &AsyncFd<OwnedFd>,
    dst: &AsyncFd<OwnedFd>,
    total: &mut u64,
) -> io::Result<Spliced> {
    use nix::fcntl::{splice, SpliceFFlags};
    loop {
        let mut readable = src.readable().await?;
        let mut writable = dst.writable().await?;
        let flags = SpliceFFlags::SPLICE_F_NONBLOCK | SpliceFFlags::SPLICE_F_MOVE;
        match splice(src.get_ref(), None, dst.get_ref(), None, SPLICE_MAX, flags) {
            Ok(0) => return Ok(Spliced::End),
            Ok(n) => *total += n as u64,
            Err(nix::errno::Errno::EAGAIN) => {
                let (can_read, can_write) = ready_now(src.get_ref(), dst.get_ref())?;
                if !can_read {
                    readable.clear_ready();
                }
                if !can_write {
                    writable.clear_ready();
                }
            }
            Err(nix::errno::Errno::EINTR) => {}
            Err(nix::errno::Errno::EPIPE) => return Ok(Spliced::ReaderGone),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Whether `src` has data (or its end) to read, and `dst` room to write, right now.
fn ready_now(src: &OwnedFd, dst: &OwnedFd) -> io::Result<(bool, bool)> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [
        PollFd::new(src.as_fd(), PollFlags::POLLIN),
        PollFd::new(dst.as_fd(), PollFlags::POLLOUT),
    ];
    poll(&mut fds, PollTimeout::ZERO)?;
    let has = |fd: &PollFd, flag: PollFlags| {
        // An error or hang-up is "ready" too: the next splice reports it.
        let done = PollFlags::POLLERR | PollFlags::POLLHUP;
        fd.revents().is_some_and(|r| r.intersects(flag | done))
    };
    Ok((
        has(&fds[0], PollFlags::POLLIN),
        has(&fds[1], PollFlags::POLLOUT),
    ))
}

/// Reads what `fd` has, waiting for it; 0 at end of stream.
async fn read_fd(fd: &AsyncFd<OwnedFd>, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        let mut guard = fd.readable().await?;
        match guard.try_io(|inner| {
            nix::unistd::read(inner.get_ref().as_raw_fd(), buf).map_err(io::Error::from)
        }) {
            Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
            Ok(r) => return r,
            Err(_would_block) => continue,
        }
    }
}

/// How long an output relay waits for containerd's reader of a fifo to appear. containerd
/// (and ctr) open their read ends before they create the task, so this only matters when
/// the reader went away, say a `ctr` that died after create.
const READER_WAIT: Duration = Duration::from_millis(500);

/// Opens an output fifo for writing, without blocking: a blocking open whose reader went
/// away would hold a thread forever and keep the shim from exiting. None (logged) when
/// it cannot be used, or nobody reads it: the output is then discarded.
async fn open_output_fifo(path: &str, stream: StdioStream, log: &Logger) -> Option<OwnedFd> {
    use nix::fcntl::{open, OFlag};
    use nix::sys::stat::Mode;
    let deadline = tokio::time::Instant::now() + READER_WAIT;
    let flags = OFlag::O_WRONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    loop {
        match open(path, flags, Mode::empty()) {
            Ok(fd) => {
                // SAFETY: open returned a new descriptor that nothing else owns.
                let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
                if !is_fifo(&fd) {
                    warn!(log, "the {stream} path is not a fifo, output is discarded"; "path" => path);
                    return None;
                }
                // Best effort: a smaller fifo still works.
                let _ = nix::fcntl::fcntl(
                    fd.as_raw_fd(),
                    nix::fcntl::FcntlArg::F_SETPIPE_SZ(FIFO_SIZE),
                );
                return Some(fd);
            }
            // ENXIO: no reader (yet).
            Err(nix::errno::Errno::ENXIO) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => {
                warn!(log, "cannot open {stream} fifo, output is discarded"; "path" => path, "error" => %e);
                return None;
            }
        }
    }
}

fn is_fifo(fd: &OwnedFd) -> bool {
    nix::sys::stat::fstat(fd.as_raw_fd())
        .map(|st| st.st_mode & libc::S_IFMT == libc::S_IFIFO)
        .unwrap_or(false)
}

/// Copies the stdin fifo at `path` to the process's stdin until end of file or CloseIO,
/// then half-closes the connection, which closes stdin in the guest.
fn spawn_input(target: &Target, path: &str, close: Arc<Notify>) -> JoinHandle<()> {
    let (t, path) = (target.clone(), path.to_string());
    tokio::spawn(async move {
        let relay = async {
            let mut conn = t
                .agent
                .open_stdio(&t.cid, &t.exec_id, StdioStream::Stdin)
                .await
                .map_err(io::Error::other)?;
            // Opened without blocking: reads wait (in the reactor, not on a thread) until
            // a writer comes, and end once it has gone. A blocking open whose writer never
            // comes (a `ctr` that died, its fifo already removed) would hold a thread
            // forever and keep the shim from exiting.
            let copied = match pipe::OpenOptions::new().open_receiver(&path) {
                Ok(fifo) => copy_stdin(fifo, &mut conn, &close).await,
                Err(e) => {
                    warn!(t.log, "cannot open stdin fifo; the process's stdin is closed";
                        "path" => &path, "error" => %e);
                    Ok(0)
                }
            };
            conn.shutdown().await?;
            copied
        };
        t.run(StdioStream::Stdin, relay).await;
    })
}

async fn copy_stdin(
    mut fifo: pipe::Receiver,
    conn: &mut UnixStream,
    close: &Notify,
) -> io::Result<u64> {
    let mut buf = vec![0u8; COPY_CHUNK];
    let mut total = 0u64;
    let mut closing = false;
    loop {
        let n = if closing {
            drain_now(&fifo, &mut buf)
        } else {
            tokio::select! {
                r = fifo.read(&mut buf) => r.unwrap_or(0),
                _ = close.notified() => {
                    closing = true;
                    drain_now(&fifo, &mut buf)
                }
            }
        };
        if n == 0 {
            return Ok(total);
        }
        conn.write_all(&buf[..n]).await?;
        total += n as u64;
    }
}

/// After CloseIO: what the fifo holds right now, 0 once it is empty. A client sends
/// CloseIO when its own input has ended, after writing the last bytes into the fifo but
/// before the shim has necessarily read them (`ctr` does, from the read that saw end of
/// file), so those bytes are still the process's. Read from the fd itself, not through
/// the reactor, whose readiness may not yet know of them.
fn drain_now(fifo: &pipe::Receiver, buf: &mut [u8]) -> usize {
    loop {
        match nix::unistd::read(fifo.as_raw_fd(), buf) {
            Ok(n) => return n,
            Err(nix::errno::Errno::EINTR) => continue,
            // EAGAIN: empty, with a writer still there; anything else ends it too.
            Err(_) => return 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize) -> Vec<u8> {
        (0..len as u32).map(|i| (i % 253) as u8).collect()
    }

    fn logger() -> Logger {
        Logger::root(slog::Discard, slog::o!())
    }

    /// A fifo in a temp dir, opened for reading the way containerd does (before the
    /// shim opens it for writing).
    fn fifo() -> (tempfile::TempDir, String, std::fs::File) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let reader = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .unwrap();
        (dir, path.display().to_string(), reader)
    }

    use std::os::unix::fs::OpenOptionsExt;

    /// Reads a non-blocking fifo on a thread until every writer has closed it.
    fn drain(reader: std::fs::File) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut out = Vec::new();
            let mut buf = vec![0u8; 1 << 16];
            loop {
                match io::Read::read(&mut &reader, &mut buf) {
                    Ok(0) => return out,
                    Ok(n) => out.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(1))
                    }
                    Err(e) => panic!("read fifo: {e}"),
                }
            }
        })
    }

    /// Output much larger than the socket and fifo buffers reaches the fifo whole and in
    /// order through splice, with the writer and reader at their own pace.
    #[tokio::test]
    async fn output_is_spliced_into_the_fifo_whole() {
        let (_dir, path, reader) = fifo();
        let (mut guest, shim) = UnixStream::pair().unwrap();
        let data = pattern(5 << 20);
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            for chunk in sent.chunks(100_000) {
                guest.write_all(chunk).await.unwrap();
            }
        });
        let fifo = open_output_fifo(&path, StdioStream::Stdout, &logger()).await;
        assert!(fifo.is_some());
        // Only now: a fifo without a writer reads as end of file.
        let got = drain(reader);
        let n = relay_output(shim, fifo, Some(&path), StdioStream::Stdout, &logger())
            .await
            .unwrap();
        writer.await.unwrap();
        assert_eq!(n, data.len() as u64);
        let got = got.join().unwrap();
        assert_eq!(got.len(), data.len());
        assert!(got == data, "the bytes differ");
    }

    /// When containerd's reader goes away the rest is read and dropped, so the guest is
    /// never blocked; with no fifo at all the same.
    #[tokio::test]
    async fn output_nobody_reads_is_drained() {
        let (_dir, path, reader) = fifo();
        let fifo = open_output_fifo(&path, StdioStream::Stderr, &logger()).await;
        drop(reader);
        for fifo in [fifo, None] {
            let (mut guest, shim) = UnixStream::pair().unwrap();
            let writer = tokio::spawn(async move {
                guest.write_all(&pattern(3 << 20)).await.unwrap();
            });
            let n = relay_output(shim, fifo, Some(&path), StdioStream::Stderr, &logger())
                .await
                .unwrap();
            writer.await.unwrap();
            assert_eq!(n, 3 << 20);
        }
    }

    /// A reader that goes away and comes back (containerd restarted) gets what the guest
    /// writes after it came back; what came while nobody read is dropped.
    #[tokio::test]
    async fn output_reaches_a_reader_that_comes_back() {
        let (_dir, path, reader) = fifo();
        let (mut guest, shim) = UnixStream::pair().unwrap();
        let fifo = open_output_fifo(&path, StdioStream::Stdout, &logger()).await;
        let relay_path = path.clone();
        let relay = tokio::spawn(async move {
            relay_output(
                shim,
                fifo,
                Some(&relay_path),
                StdioStream::Stdout,
                &logger(),
            )
            .await
        });
        guest.write_all(b"before\n").await.unwrap();
        let mut first = [0u8; 7];
        let mut reader = reader;
        tokio::task::spawn_blocking(move || {
            let mut at = 0;
            while at < first.len() {
                match io::Read::read(&mut reader, &mut first[at..]) {
                    Ok(n) => at += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            assert_eq!(&first, b"before\n");
        })
        .await
        .unwrap();
        // Nobody reads now: what the guest writes is dropped, and it is not blocked.
        guest.write_all(&pattern(1 << 20)).await.unwrap();
        let back_path = path.clone();
        let back = tokio::task::spawn_blocking(move || {
            let mut r = std::fs::File::open(&back_path).unwrap();
            let mut got = Vec::new();
            io::Read::read_to_end(&mut r, &mut got).unwrap();
            got
        });
        // The relay looks for a reader twice a second; write until it found this one.
        for _ in 0..30 {
            guest.write_all(b"after\n").await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        drop(guest);
        relay.await.unwrap().unwrap();
        let got = back.await.unwrap();
        let text = String::from_utf8_lossy(&got);
        assert!(
            text.contains("after\n"),
            "the reader that came back got nothing: {text:?}"
        );
        assert!(!text.contains("before"), "{text:?}");
    }

    /// What the shim writes to the stdin fifo reaches the process, and the fifo's end
    /// of file, or CloseIO while a writer still holds it, ends the process's stdin.
    #[tokio::test]
    async fn stdin_ends_at_end_of_file_or_close_io() {
        use agent_client::fake::FakeAgent;
        let fake = Arc::new(FakeAgent::new());
        let agent: AgentRef = fake.clone();
        for (exec_id, close_io, settle) in [
            ("eof", false, true),
            ("closeio", true, true),
            // CloseIO right behind the last write, before the relay has read it: how
            // `ctr run` sends it, and under load the relay is that far behind.
            ("closeio-at-once", true, false),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("in");
            nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
            let paths = StdioPaths {
                stdin: path.display().to_string(),
                ..Default::default()
            };
            let mut relays = Relays::start(&agent, "c", exec_id, &paths, &logger());
            // Blocks until the relay opens its end: not on the runtime's thread.
            let mut writer = tokio::task::spawn_blocking(move || {
                std::fs::OpenOptions::new().write(true).open(&path)
            })
            .await
            .unwrap()
            .unwrap();
            io::Write::write_all(&mut writer, b"typed\n").unwrap();
            let writer = if close_io {
                // The writer stays open: only CloseIO can end stdin.
                if settle {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                relays.close_stdin();
                Some(writer)
            } else {
                drop(writer); // end of file
                None
            };
            let key = ("c".to_string(), exec_id.to_string());
            let got = tokio::time::timeout(Duration::from_secs(5), async {
                loop {
                    if let Some(got) = fake.stdin.lock().unwrap().get(&key) {
                        return got.clone();
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
            .await
            .unwrap_or_else(|_| panic!("{exec_id}: stdin was not closed"));
            assert_eq!(got, b"typed\n", "{exec_id}");
            drop(writer);
            relays.stop_stdin();
        }
    }

    /// Once the VM is gone, relays end at once, though the guest never ended its streams.
    #[tokio::test]
    async fn relays_end_when_the_vm_is_gone() {
        use agent_client::fake::FakeAgent;
        let fake = Arc::new(FakeAgent::new());
        let agent: AgentRef = fake.clone();
        let mut relays = Relays::start(&agent, "c", "", &StdioPaths::default(), &logger());
        tokio::time::sleep(Duration::from_millis(50)).await;
        fake.disconnect("the VMM (pid 7) was killed by SIGKILL");
        tokio::time::timeout(Duration::from_secs(5), relays.wait_outputs())
            .await
            .expect("the output relays ended");
    }

    #[tokio::test]
    async fn a_fifo_without_reader_or_a_file_is_not_used() {
        let (_dir, path, reader) = fifo();
        drop(reader);
        let started = std::time::Instant::now();
        assert!(open_output_fifo(&path, StdioStream::Stdout, &logger())
            .await
            .is_none());
        assert!(started.elapsed() >= READER_WAIT);
        let file = _dir.path().join("file");
        std::fs::write(&file, b"").unwrap();
        let file = file.display().to_string();
        assert!(open_output_fifo(&file, StdioStream::Stdout, &logger())
            .await
            .is_none());
    }
}
