//! The shim's client of kata-agent: dials the hybrid vsock unix socket the VMM side
//! exposes, performs the `CONNECT <port>` handshake, and speaks ttrpc over the stream.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use protocols::agent::*;
use protocols::agent_ttrpc::AgentServiceClient;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

/// Failures talking to the agent, phrased for a containerd user reading `ctr`'s output.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("the agent in the VM did not answer on {socket} within {timeout:?}: {last}")]
    DialTimeout {
        socket: PathBuf,
        timeout: Duration,
        last: String,
    },
    #[error("the VM stopped before its agent answered: the VMM (pid {pid}) {how}")]
    VmmExited { pid: i32, how: String },
    #[error("agent request {op} failed: {source}")]
    Rpc {
        op: &'static str,
        #[source]
        source: ttrpc::Error,
    },
}

pub type Result<T> = std::result::Result<T, AgentError>;

/// Connects to `socket` and asks the VMM side for guest `port`; returns the raw stream
/// positioned after the `OK` line.
pub async fn hybrid_vsock_connect(socket: &Path, port: u32) -> std::io::Result<UnixStream> {
    let mut stream = UnixStream::connect(socket).await?;
    stream
        .write_all(format!("CONNECT {port}\n").as_bytes())
        .await?;
    // Read the reply byte by byte: anything after the newline belongs to the guest.
    let mut line = Vec::with_capacity(16);
    let mut reader = BufReader::with_capacity(1, &mut stream);
    reader.read_until(b'\n', &mut line).await?;
    let reply = String::from_utf8_lossy(&line);
    if !reply.to_ascii_uppercase().starts_with("OK") {
        return Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            format!(
                "hybrid vsock handshake for port {port} answered {:?}",
                reply.trim_end()
            ),
        ));
    }
    Ok(stream)
}

/// A connected agent.
#[derive(Clone)]
pub struct Agent {
    client: AgentServiceClient,
}

/// Deadline of one dial attempt (connect + handshake).
const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(500);

/// No deadline: waits and reads are long polls that end when the guest has news.
fn no_timeout() -> ttrpc::context::Context {
    ttrpc::context::with_timeout(0)
}

/// Short deadline for control requests, so a wedged guest surfaces as an error.
fn control() -> ttrpc::context::Context {
    ttrpc::context::with_duration(Duration::from_secs(30))
}

macro_rules! rpc {
    ($op:literal, $call:expr) => {
        $call
            .await
            .map_err(|source| AgentError::Rpc { op: $op, source })
    };
}

impl Agent {
    /// Dials until the agent answers `Check`, or `timeout` passes.
    pub async fn dial(
        socket: &Path,
        port: u32,
        timeout: Duration,
        vmm_pid: i32,
    ) -> Result<(Self, CheckResponse)> {
        let start = Instant::now();
        let mut last = String::from("no attempt made");
        while start.elapsed() < timeout {
            // A VMM that died will not start an agent: say so now, not at the deadline.
            if let Some(how) = hypervisor::process::exit_description(vmm_pid) {
                return Err(AgentError::VmmExited { pid: vmm_pid, how });
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
                    let client = ttrpc::r#async::Client::new(
                        ttrpc::r#async::transport::Socket::from(stream),
                    );
                    let agent = Agent {
                        client: AgentServiceClient::new(client),
                    };
                    let ctx = ttrpc::context::with_duration(Duration::from_secs(5));
                    let empty = Empty::new();
                    let check = agent.client.check(ctx, &empty);
                    match tokio::time::timeout(Duration::from_secs(5), check).await {
                        Ok(Ok(info)) => return Ok((agent, info)),
                        Ok(Err(e)) => last = format!("check: {e}"),
                        Err(_) => last = "check: no answer within 5s".into(),
                    }
                }
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(AgentError::DialTimeout {
            socket: socket.to_path_buf(),
            timeout,
            last,
        })
    }

    pub async fn create_container(&self, id: &str, spec: Vec<u8>, stdin: bool) -> Result<()> {
        let req = CreateContainerRequest {
            container_id: id.to_string(),
            oci_spec: spec,
            stdin,
            ..Default::default()
        };
        rpc!(
            "CreateContainer",
            self.client.create_container(control(), &req)
        )?;
        Ok(())
    }

    pub async fn start_container(&self, id: &str) -> Result<()> {
        let req = container_req(id);
        rpc!(
            "StartContainer",
            self.client.start_container(control(), &req)
        )?;
        Ok(())
    }

    pub async fn remove_container(&self, id: &str) -> Result<()> {
        let req = container_req(id);
        rpc!(
            "RemoveContainer",
            self.client.remove_container(control(), &req)
        )?;
        Ok(())
    }

    pub async fn exec_process(
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
        rpc!("ExecProcess", self.client.exec_process(control(), &req))?;
        Ok(())
    }

    pub async fn signal_process(
        &self,
        id: &str,
        exec_id: &str,
        signal: u32,
        all: bool,
    ) -> Result<()> {
        let req = SignalProcessRequest {
            container_id: id.to_string(),
            exec_id: exec_id.to_string(),
            signal,
            all,
            ..Default::default()
        };
        rpc!("SignalProcess", self.client.signal_process(control(), &req))?;
        Ok(())
    }

    /// Returns the process's exit status once it has exited.
    pub async fn wait_process(&self, id: &str, exec_id: &str) -> Result<i32> {
        let req = process_req(id, exec_id);
        let resp = rpc!("WaitProcess", self.client.wait_process(no_timeout(), &req))?;
        Ok(resp.status)
    }

    pub async fn list_processes(&self, id: &str) -> Result<Vec<i32>> {
        let req = container_req(id);
        let resp = rpc!("ListProcesses", self.client.list_processes(control(), &req))?;
        Ok(resp.pids)
    }

    /// Up to `len` bytes of the process's stdout (or stderr); empty at end of stream.
    pub async fn read_stream(
        &self,
        id: &str,
        exec_id: &str,
        stderr: bool,
        len: u32,
    ) -> Result<Vec<u8>> {
        let req = ReadStreamRequest {
            container_id: id.to_string(),
            exec_id: exec_id.to_string(),
            len,
            ..Default::default()
        };
        let resp = if stderr {
            rpc!("ReadStderr", self.client.read_stderr(no_timeout(), &req))?
        } else {
            rpc!("ReadStdout", self.client.read_stdout(no_timeout(), &req))?
        };
        Ok(resp.data)
    }

    pub async fn write_stdin(&self, id: &str, exec_id: &str, data: Vec<u8>) -> Result<u32> {
        let req = WriteStreamRequest {
            container_id: id.to_string(),
            exec_id: exec_id.to_string(),
            data,
            ..Default::default()
        };
        let resp = rpc!("WriteStdin", self.client.write_stdin(no_timeout(), &req))?;
        Ok(resp.len)
    }

    pub async fn close_stdin(&self, id: &str, exec_id: &str) -> Result<()> {
        let req = process_req(id, exec_id);
        rpc!("CloseStdin", self.client.close_stdin(control(), &req))?;
        Ok(())
    }

    pub async fn tty_win_resize(
        &self,
        id: &str,
        exec_id: &str,
        rows: u32,
        columns: u32,
    ) -> Result<()> {
        let req = TtyWinResizeRequest {
            container_id: id.to_string(),
            exec_id: exec_id.to_string(),
            rows,
            columns,
            ..Default::default()
        };
        rpc!("TtyWinResize", self.client.tty_win_resize(control(), &req))?;
        Ok(())
    }

    pub async fn pause_container(&self, id: &str) -> Result<()> {
        let req = container_req(id);
        rpc!(
            "PauseContainer",
            self.client.pause_container(control(), &req)
        )?;
        Ok(())
    }

    pub async fn resume_container(&self, id: &str) -> Result<()> {
        let req = container_req(id);
        rpc!(
            "ResumeContainer",
            self.client.resume_container(control(), &req)
        )?;
        Ok(())
    }

    pub async fn stats_container(&self, id: &str) -> Result<StatsContainerResponse> {
        let req = container_req(id);
        rpc!(
            "StatsContainer",
            self.client.stats_container(control(), &req)
        )
    }

    /// `resources` is the OCI LinuxResources object as JSON.
    pub async fn update_container(&self, id: &str, resources: Vec<u8>) -> Result<()> {
        let req = UpdateContainerRequest {
            container_id: id.to_string(),
            resources,
            ..Default::default()
        };
        rpc!(
            "UpdateContainer",
            self.client.update_container(control(), &req)
        )?;
        Ok(())
    }

    /// Waits for the next OOM kill in the guest; returns the container's id.
    pub async fn get_oom_event(&self) -> Result<String> {
        let resp = rpc!(
            "GetOOMEvent",
            self.client.get_oom_event(no_timeout(), &Empty::new())
        )?;
        Ok(resp.container_id)
    }

    /// Asks the guest to end the VM; a closed connection is the expected answer.
    pub async fn destroy_sandbox(&self) -> Result<()> {
        let ctx = ttrpc::context::with_duration(Duration::from_secs(2));
        rpc!(
            "DestroySandbox",
            self.client.destroy_sandbox(ctx, &Empty::new())
        )?;
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

    #[tokio::test]
    async fn a_vmm_that_exited_ends_the_dial_at_once() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        let _ = child.wait();
        let err = match Agent::dial(
            Path::new("/nonexistent/kata.hvsock"),
            1024,
            Duration::from_secs(30),
            pid,
        )
        .await
        {
            Err(e) => e,
            Ok(_) => panic!("dialled an agent that does not exist"),
        };
        assert!(matches!(err, AgentError::VmmExited { .. }), "{err}");
        // Not DialTimeout: the dial did not wait for its deadline.
        assert!(err.to_string().contains(&format!("pid {pid}")), "{err}");
    }
}
