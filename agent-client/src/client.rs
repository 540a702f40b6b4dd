//! [`KataAgent`]: dials the hybrid vsock unix socket the VMM side exposes, performs the
//! `CONNECT <port>` handshake, and speaks ttrpc over the stream, each request with its
//! [`Deadline`] and cancelled when the VM is gone. Stdio streams dial the same socket,
//! one connection each (`protocols::stdio`).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use protocols::agent::*;
use protocols::agent_ttrpc::AgentServiceClient;
use protocols::stdio::{process_name, StdioRequest, StdioStream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::watch;

use super::{Agent, AgentError, Deadline, Result, VmGone};

/// The longest answer line read from the agent's stdio port (an `ERR` reason included).
const MAX_ANSWER_LINE: usize = 4096;

/// Reads one line of at most `max` bytes, byte by byte: whatever follows the newline
/// belongs to the guest and stays in the stream.
async fn read_line_unbuffered(stream: &mut UnixStream, max: usize) -> std::io::Result<String> {
    let mut line = Vec::with_capacity(16);
    let mut byte = [0u8; 1];
    while line.len() < max {
        if stream.read(&mut byte).await? == 0 {
            break;
        }
        line.push(byte[0]);
        if byte[0] == b'\n' {
            break;
        }
    }
    Ok(String::from_utf8_lossy(&line).into_owned())
}

/// Connects to `socket` and asks the VMM side for guest `port`; returns the raw stream
/// positioned after the `OK` line.
pub async fn hybrid_vsock_connect(socket: &Path, port: u32) -> std::io::Result<UnixStream> {
    let mut stream = UnixStream::connect(socket).await?;
    stream
        .write_all(protocols::hybrid_vsock::connect_line(port).as_bytes())
        .await?;
    let reply = read_line_unbuffered(&mut stream, protocols::hybrid_vsock::MAX_REPLY_LINE).await?;
    protocols::hybrid_vsock::check_reply(&reply).map_err(|refused| {
        std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            format!("hybrid vsock handshake for port {port}: the VMM side {refused}"),
        )
    })?;
    Ok(stream)
}

/// The longest answer line read from the agent's port forwarder.
const MAX_PORT_FORWARD_ANSWER: usize = 512;

/// Reads the guest's answer to a port-forward request for `port` on `stream`: `OK`, after
/// which the stream carries the connection's bytes, or a refusal (an error with the
/// guest's reason).
pub async fn port_forward_answer(stream: &mut UnixStream, port: u16) -> std::io::Result<()> {
    // Byte by byte: what follows the answer belongs to the connection.
    let line = read_line_unbuffered(stream, MAX_PORT_FORWARD_ANSWER).await?;
    if !line.starts_with("OK") {
        return Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            format!("the guest refused port {port}: {}", line.trim()),
        ));
    }
    Ok(())
}

/// Where the host hears that the agent listens: `<hybrid socket>_<port>` for
/// [`AGENT_READY_VSOCK_PORT`](protocols::AGENT_READY_VSOCK_PORT), on which the VMM side
/// hands over the agent's connection to that host port. Removed when dropped.
struct ReadyListener {
    listener: tokio::net::UnixListener,
    path: PathBuf,
}

/// The pause between dial attempts without a ready listener.
const RETRY_POLL: Duration = Duration::from_millis(20);
/// The longest pause between attempts while the agent's word is awaited: a retry still
/// finds an agent that never sends it (its connection is lost or refused).
const READY_POLL: Duration = Duration::from_millis(100);

impl ReadyListener {
    /// Listens beside `socket`, or None where that fails (the dial then only retries).
    fn bind(socket: &Path) -> Option<Self> {
        let mut path = socket.as_os_str().to_owned();
        path.push(format!("_{}", protocols::AGENT_READY_VSOCK_PORT));
        let path = PathBuf::from(path);
        // A previous VM of the same sandbox may have left it.
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::UnixListener::bind(&path).ok()?;
        Some(Self { listener, path })
    }

    /// Returns when a connection comes (it is closed at once: true) or after `most`.
    async fn wait(&self, most: Duration) -> bool {
        matches!(
            tokio::time::timeout(most, self.listener.accept()).await,
            Ok(Ok(_))
        )
    }
}

impl Drop for ReadyListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A connected agent.
#[derive(Clone)]
pub struct KataAgent {
    client: AgentServiceClient,
    /// The hybrid vsock socket, which stdio streams dial.
    socket: PathBuf,
    /// Why the VM is gone, once it is.
    gone: Arc<watch::Sender<Option<String>>>,
}

/// Deadline of one dial attempt (connect + handshake).
const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(500);
/// Deadline of the `Check` that ends a dial.
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);
/// Deadline of `DestroySandbox`: the guest powers off rather than answer.
const DESTROY_TIMEOUT: Duration = Duration::from_secs(2);

impl KataAgent {
    /// A client speaking ttrpc on `stream`, already connected to the agent through the
    /// hybrid vsock socket `socket`.
    fn over(stream: UnixStream, socket: &Path) -> Self {
        let client = ttrpc::r#async::Client::new(ttrpc::r#async::transport::Socket::from(stream));
        KataAgent {
            client: AgentServiceClient::new(client),
            socket: socket.to_path_buf(),
            gone: Arc::new(watch::channel(None).0),
        }
    }

    /// Dials until the agent answers `Check`, or `timeout` passes. `vm_gone` says whether
    /// (and how) the VM or one of its helpers ended: a VM that cannot run will not start
    /// an agent, so the dial ends then, not at its deadline.
    pub async fn dial(
        socket: &Path,
        port: u32,
        timeout: Duration,
        vm_gone: impl Fn() -> Option<String>,
    ) -> Result<(Self, CheckResponse)> {
        let start = Instant::now();
        let mut last = String::from("no attempt made");
        let ready = ReadyListener::bind(socket);
        while start.elapsed() < timeout {
            if let Some(how) = vm_gone() {
                return Err(AgentError::VmExited { how });
            }
            // Every attempt has its own short deadline, so an unanswered request cannot
            // stall the dial. (vhost-device-vsock 0.3 loses a request sent before the guest
            // driver is ready and then answers no more; our kata-vsock queues it.)
            let attempt =
                tokio::time::timeout(ATTEMPT_TIMEOUT, hybrid_vsock_connect(socket, port)).await;
            let attempt = attempt.unwrap_or_else(|_| {
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer to CONNECT {port} within {ATTEMPT_TIMEOUT:?}"),
                ))
            });
            match attempt {
                Ok(stream) => {
                    let agent = KataAgent::over(stream, socket);
                    let ctx = ttrpc::context::with_duration(CHECK_TIMEOUT);
                    let empty = Empty::new();
                    let check = agent.client.check(ctx, &empty);
                    match tokio::time::timeout(CHECK_TIMEOUT, check).await {
                        Ok(Ok(info)) => return Ok((agent, info)),
                        Ok(Err(e)) => last = format!("check: {e}"),
                        Err(_) => last = format!("check: no answer within {CHECK_TIMEOUT:?}"),
                    }
                }
                Err(e) => last = e.to_string(),
            }
            match &ready {
                Some(ready) => {
                    ready.wait(READY_POLL).await;
                }
                None => tokio::time::sleep(RETRY_POLL).await,
            }
        }
        Err(AgentError::DialTimeout {
            socket: socket.to_path_buf(),
            timeout,
            last,
        })
    }

    /// Runs one request under `deadline`, failing it at once when the VM is gone.
    async fn call<T>(
        &self,
        op: &'static str,
        deadline: Deadline,
        request: impl Future<Output = std::result::Result<T, ttrpc::Error>>,
    ) -> Result<T> {
        let mut gone = self.gone.subscribe();
        if let Some(cause) = gone.borrow_and_update().clone() {
            return Err(AgentError::VmGone { op, cause });
        }
        let answered = async {
            match deadline.duration() {
                None => Ok(request.await),
                Some(after) => tokio::time::timeout(after, request)
                    .await
                    .map_err(|_| AgentError::Timeout { op, after }),
            }
        };
        let t0 = Instant::now();
        tokio::select! {
            r = answered => {
                super::observed(op, t0.elapsed());
                r?.map_err(|source| AgentError::Rpc { op, source })
            }
            cause = gone.wait_for(Option::is_some) => {
                let cause = cause.ok().and_then(|c| c.clone()).unwrap_or_default();
                Err(AgentError::VmGone { op, cause })
            }
        }
    }
}

/// The ttrpc context of a request: the shim enforces deadlines itself (see `call`).
fn ctx() -> ttrpc::context::Context {
    ttrpc::context::with_timeout(0)
}

#[async_trait]
impl Agent for KataAgent {
    fn disconnect(&self, cause: &str) {
        self.gone.send_if_modified(|g| {
            let first = g.is_none();
            if first {
                *g = Some(cause.to_string());
            }
            first
        });
    }

    async fn create_sandbox(&self, req: CreateSandboxRequest) -> Result<()> {
        let r = self.client.create_sandbox(ctx(), &req);
        self.call("CreateSandbox", Deadline::Setup, r).await?;
        Ok(())
    }

    async fn create_container(&self, req: CreateContainerRequest) -> Result<()> {
        let r = self.client.create_container(ctx(), &req);
        self.call("CreateContainer", Deadline::Setup, r).await?;
        Ok(())
    }

    async fn start_container(&self, id: &str) -> Result<()> {
        let req = container_req(id);
        let r = self.client.start_container(ctx(), &req);
        self.call("StartContainer", Deadline::Setup, r).await?;
        Ok(())
    }

    async fn remove_container(&self, id: &str) -> Result<()> {
        let req = container_req(id);
        let r = self.client.remove_container(ctx(), &req);
        self.call("RemoveContainer", Deadline::Setup, r).await?;
        Ok(())
    }

    async fn exec_process(
        &self,
        id: &str,
        exec_id: &str,
        process: Vec<u8>,
        stdin: bool,
    ) -> Result<()> {
        let req = ExecProcessRequest {
            container_id: id.to_string(),
            exec_id: exec_id.to_string(),
            process,
            stdin,
            ..Default::default()
        };
        let r = self.client.exec_process(ctx(), &req);
        self.call("ExecProcess", Deadline::Setup, r).await?;
        Ok(())
    }

    async fn signal_process(&self, id: &str, exec_id: &str, signal: u32, all: bool) -> Result<()> {
        let req = SignalProcessRequest {
            container_id: id.to_string(),
            exec_id: exec_id.to_string(),
            signal,
            all,
            ..Default::default()
        };
        let r = self.client.signal_process(ctx(), &req);
        self.call("SignalProcess", Deadline::Control, r).await?;
        Ok(())
    }

    async fn wait_process(&self, id: &str, exec_id: &str) -> Result<i32> {
        let req = process_req(id, exec_id);
        let r = self.client.wait_process(ctx(), &req);
        Ok(self.call("WaitProcess", Deadline::None, r).await?.status)
    }

    async fn list_processes(&self, id: &str) -> Result<Vec<i32>> {
        let req = container_req(id);
        let r = self.client.list_processes(ctx(), &req);
        Ok(self.call("ListProcesses", Deadline::Control, r).await?.pids)
    }

    async fn open_stdio(&self, id: &str, exec_id: &str, stream: StdioStream) -> Result<UnixStream> {
        let failed = |why: String| AgentError::Stdio {
            stream,
            process: process_name(id, exec_id),
            why,
        };
        let line = StdioRequest {
            container_id: id.to_string(),
            exec_id: exec_id.to_string(),
            stream,
        }
        .line()
        .map_err(|e| failed(e.to_string()))?;
        let attach = async {
            let mut conn = hybrid_vsock_connect(&self.socket, protocols::STDIO_VSOCK_PORT)
                .await
                .map_err(|e| {
                    failed(format!("connecting through {}: {e}", self.socket.display()))
                })?;
            conn.write_all(line.as_bytes())
                .await
                .map_err(|e| failed(format!("sending the request: {e}")))?;
            let answer = read_line_unbuffered(&mut conn, MAX_ANSWER_LINE)
                .await
                .map_err(|e| failed(format!("reading the agent's answer: {e}")))?;
            protocols::stdio::parse_answer(&answer).map_err(|e| failed(e.to_string()))?;
            Ok::<_, AgentError>(conn)
        };
        // Attaching is prompt work in the guest: it has the Control deadline.
        self.call("OpenStdio", Deadline::Control, async { Ok(attach.await) })
            .await?
    }

    fn vm_gone(&self) -> VmGone {
        VmGone::new(self.gone.subscribe())
    }

    async fn tty_win_resize(&self, id: &str, exec_id: &str, rows: u32, columns: u32) -> Result<()> {
        let req = TtyWinResizeRequest {
            container_id: id.to_string(),
            exec_id: exec_id.to_string(),
            rows,
            columns,
            ..Default::default()
        };
        let r = self.client.tty_win_resize(ctx(), &req);
        self.call("TtyWinResize", Deadline::Control, r).await?;
        Ok(())
    }

    async fn pause_container(&self, id: &str) -> Result<()> {
        let req = container_req(id);
        let r = self.client.pause_container(ctx(), &req);
        self.call("PauseContainer", Deadline::Control, r).await?;
        Ok(())
    }

    async fn resume_container(&self, id: &str) -> Result<()> {
        let req = container_req(id);
        let r = self.client.resume_container(ctx(), &req);
        self.call("ResumeContainer", Deadline::Control, r).await?;
        Ok(())
    }

    async fn stats_container(&self, id: &str) -> Result<StatsContainerResponse> {
        let req = container_req(id);
        let r = self.client.stats_container(ctx(), &req);
        self.call("StatsContainer", Deadline::Control, r).await
    }

    async fn update_container(&self, id: &str, resources: Vec<u8>) -> Result<()> {
        let req = UpdateContainerRequest {
            container_id: id.to_string(),
            resources,
            ..Default::default()
        };
        let r = self.client.update_container(ctx(), &req);
        self.call("UpdateContainer", Deadline::Control, r).await?;
        Ok(())
    }

    async fn get_oom_event(&self) -> Result<String> {
        let empty = Empty::new();
        let r = self.client.get_oom_event(ctx(), &empty);
        Ok(self
            .call("GetOOMEvent", Deadline::None, r)
            .await?
            .container_id)
    }

    async fn set_online_cpus(&self, count: u32) -> Result<u32> {
        let req = OnlineCpusRequest {
            count,
            ..Default::default()
        };
        let r = self.client.set_online_cpus(ctx(), &req);
        Ok(self
            .call("SetOnlineCpus", Deadline::Control, r)
            .await?
            .online)
    }

    async fn get_metrics(&self) -> Result<String> {
        let req = GetMetricsRequest::new();
        let r = self.client.get_metrics(ctx(), &req);
        Ok(self.call("GetMetrics", Deadline::Control, r).await?.metrics)
    }

    async fn destroy_sandbox(&self) -> Result<()> {
        let empty = Empty::new();
        let r = self.client.destroy_sandbox(ctx(), &empty);
        let r = tokio::time::timeout(
            DESTROY_TIMEOUT,
            self.call("DestroySandbox", Deadline::None, r),
        );
        r.await.map_err(|_| AgentError::Timeout {
            op: "DestroySandbox",
            after: DESTROY_TIMEOUT,
        })??;
        Ok(())
    }
}

fn container_req(id: &str) -> ContainerRequest {
    ContainerRequest {
        container_id: id.to_string(),
        ..Default::default()
    }
}

fn process_req(id: &str, exec_id: &str) -> ProcessRequest {
    ProcessRequest {
        container_id: id.to_string(),
        exec_id: exec_id.to_string(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;
    use tokio::net::UnixListener;

    #[tokio::test]
    async fn handshake_keeps_bytes_after_ok_line() {
        let dir = std::env::temp_dir().join(format!("hvsock-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("s");
        let listener = UnixListener::bind(&sock).unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 13];
            s.read_exact(&mut buf).await.unwrap();
            assert_eq!(&buf, b"CONNECT 1024\n");
            s.write_all(b"OK 1073741824\nguest-bytes").await.unwrap();
        });
        let mut stream = hybrid_vsock_connect(&sock, 1024).await.unwrap();
        let mut rest = String::new();
        stream.read_to_string(&mut rest).await.unwrap();
        assert_eq!(rest, "guest-bytes");
        server.await.unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn handshake_refusal_is_an_error() {
        let dir = std::env::temp_dir().join(format!("hvsock-refuse-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("s");
        let listener = UnixListener::bind(&sock).unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            s.write_all(b"FAILED\n").await.unwrap();
        });
        let err = hybrid_vsock_connect(&sock, 1024).await.unwrap_err();
        assert!(err.to_string().contains("FAILED"), "{err}");
        server.await.unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The port forwarder's answer: after `OK` the stream is the connection's, byte for
    /// byte; anything else refuses the port with the guest's words, however long.
    #[tokio::test]
    async fn a_port_forward_answer_keeps_the_connections_bytes_or_refuses() {
        let (mut shim, mut guest) = UnixStream::pair().unwrap();
        guest.write_all(b"OK\nHTTP/1.1 200").await.unwrap();
        drop(guest);
        port_forward_answer(&mut shim, 80).await.unwrap();
        let mut rest = String::new();
        shim.read_to_string(&mut rest).await.unwrap();
        assert_eq!(rest, "HTTP/1.1 200");

        let (mut shim, mut guest) = UnixStream::pair().unwrap();
        let mut answer = b"ERR nothing listens on 81 ".to_vec();
        answer.resize(2000, b'x');
        guest.write_all(&answer).await.unwrap();
        drop(guest);
        let err = port_forward_answer(&mut shim, 81).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
        let msg = err.to_string();
        assert!(
            msg.contains("refused port 81: ERR nothing listens"),
            "{msg}"
        );
        // At most 512 bytes of it are read: the rest is left unread, not buffered.
        assert!(msg.len() < 600, "{} bytes", msg.len());
    }

    /// The agent's word that it listens arrives on `<socket>_1029` (the VMM side's
    /// path for a guest connection to host port 1029), which exists only while dialing.
    #[tokio::test]
    async fn the_agents_ready_word_arrives_beside_the_hybrid_socket() {
        let dir = std::env::temp_dir().join(format!("hvsock-ready-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("kata.hvsock");
        let path = dir.join(format!("kata.hvsock_{}", protocols::AGENT_READY_VSOCK_PORT));
        let ready = ReadyListener::bind(&sock).expect("bind");
        assert!(path.exists());
        let agent = std::os::unix::net::UnixStream::connect(&path).unwrap();
        assert!(ready.wait(Duration::from_secs(60)).await);
        drop(agent);
        drop(ready);
        assert!(!path.exists(), "{} left behind", path.display());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_vmm_that_exited_ends_the_dial_at_once() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        let _ = child.wait();
        let err = match KataAgent::dial(
            Path::new("/nonexistent/kata.hvsock"),
            1024,
            Duration::from_secs(30),
            || {
                // The shim asks the hypervisor crate; a reaped pid is gone from /proc.
                (!Path::new(&format!("/proc/{pid}")).exists())
                    .then(|| format!("the VMM (pid {pid}) exited"))
            },
        )
        .await
        {
            Err(e) => e,
            Ok(_) => panic!("dialled an agent that does not exist"),
        };
        assert!(matches!(err, AgentError::VmExited { .. }), "{err}");
        // Not DialTimeout: the dial did not wait for its deadline.
        assert!(err.to_string().contains(&format!("pid {pid}")), "{err}");
    }

    /// A hybrid vsock socket whose guest answers one stdio request with `answer`, and
    /// sends the request line it got back through the returned task.
    fn stdio_guest(
        dir: &Path,
        answer: &'static [u8],
    ) -> (KataAgent, tokio::task::JoinHandle<String>) {
        let sock = dir.join("kata.hvsock");
        let listener = UnixListener::bind(&sock).unwrap();
        let guest = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let connect = read_line_unbuffered(&mut s, 64).await.unwrap();
            assert_eq!(
                connect,
                format!("CONNECT {}\n", protocols::STDIO_VSOCK_PORT)
            );
            s.write_all(b"OK 1073741825\n").await.unwrap();
            let request = read_line_unbuffered(&mut s, 512).await.unwrap();
            s.write_all(answer).await.unwrap();
            request
        });
        let api = std::os::unix::net::UnixStream::pair().unwrap().0;
        api.set_nonblocking(true).unwrap();
        let agent = KataAgent::over(UnixStream::from_std(api).unwrap(), &sock);
        (agent, guest)
    }

    #[tokio::test]
    async fn a_stdio_stream_names_its_process_and_keeps_the_bytes_after_ok() {
        let dir = tempfile::tempdir().unwrap();
        let (agent, guest) = stdio_guest(dir.path(), b"OK\nfirst bytes");
        let mut conn = agent
            .open_stdio("c1", "e1", StdioStream::Stderr)
            .await
            .unwrap();
        assert_eq!(guest.await.unwrap(), "stderr c1 e1\n");
        let mut rest = String::new();
        conn.read_to_string(&mut rest).await.unwrap();
        assert_eq!(rest, "first bytes");
    }

    #[tokio::test]
    async fn a_refused_stdio_stream_says_which_and_why() {
        let dir = tempfile::tempdir().unwrap();
        let (agent, guest) = stdio_guest(dir.path(), b"ERR container c1 does not exist\n");
        let err = agent
            .open_stdio("c1", "", StdioStream::Stdout)
            .await
            .unwrap_err();
        assert_eq!(guest.await.unwrap(), "stdout c1\n");
        assert_eq!(
            err.to_string(),
            "cannot attach stdout of the init process of container c1: container c1 does \
             not exist"
        );
        agent.disconnect("the VMM (pid 3) exited");
        let gone = agent
            .open_stdio("c1", "", StdioStream::Stdout)
            .await
            .unwrap_err();
        assert!(gone.vm_gone(), "{gone}");
    }

    /// A guest that accepts requests and never answers them.
    fn silent_guest(name: &str) -> (tempfile::TempDir, KataAgent, tokio::task::JoinHandle<()>) {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join(name);
        let listener = UnixListener::bind(&sock).unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut sink = Vec::new();
            let _ = s.read_to_end(&mut sink).await;
        });
        let stream = std::os::unix::net::UnixStream::connect(&sock).unwrap();
        stream.set_nonblocking(true).unwrap();
        let agent = KataAgent::over(UnixStream::from_std(stream).unwrap(), &sock);
        (dir, agent, server)
    }

    #[tokio::test(start_paused = true)]
    async fn an_unanswered_control_request_ends_at_its_deadline() {
        let (_dir, agent, server) = silent_guest("deadline");
        let err = agent.signal_process("c", "", 9, false).await.unwrap_err();
        assert!(
            matches!(err, AgentError::Timeout { op: "SignalProcess", after } if Some(after) == Deadline::Control.duration()),
            "{err}"
        );
        assert!(err.to_string().contains("no answer within"), "{err}");
        server.abort();
    }

    #[tokio::test]
    async fn a_disconnect_ends_pending_long_polls_and_refuses_new_requests() {
        let (_dir, agent, server) = silent_guest("gone");
        let waiter = {
            let agent = agent.clone();
            tokio::spawn(async move { agent.wait_process("c", "").await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "WaitProcess must wait for the guest");
        agent.disconnect("the VMM (pid 42) was killed by SIGKILL");
        let err = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("WaitProcess ended once the VM was gone")
            .unwrap()
            .unwrap_err();
        assert!(err.vm_gone(), "{err}");
        assert!(err.to_string().contains("pid 42"), "{err}");
        let later = agent.list_processes("c").await.unwrap_err();
        assert!(
            matches!(
                later,
                AgentError::VmGone {
                    op: "ListProcesses",
                    ..
                }
            ),
            "{later}"
        );
        server.abort();
    }
}
