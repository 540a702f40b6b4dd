//! Test harness: a kata-agent on a unix socket, a busybox rootfs, and a runc-shaped spec.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use protocols::agent::*;
use protocols::agent_ttrpc::AgentServiceClient;
use protocols::stdio::{StdioRequest, StdioStream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use ttrpc::context::Context;

const APPLETS: &[&str] = &[
    "sh", "echo", "cat", "sleep", "true", "false", "pwd", "env", "id", "ls", "head", "wc",
    "md5sum", "dd", "hostname", "uname", "tee",
];

/// An agent started for one test, with a client connected to it.
pub struct TestAgent {
    pub client: AgentServiceClient,
    pub dir: PathBuf,
    _process: AgentProcess,
}

/// Kills the agent and removes its directory on drop, also when a test fails.
struct AgentProcess {
    child: Child,
    dir: PathBuf,
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        // SIGTERM lets the agent kill its containers first.
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        for _ in 0..100 {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl TestAgent {
    /// The agent's pid, to look for processes it left behind.
    pub fn pid(&self) -> u32 {
        self._process.child.id()
    }

    /// Processes whose parent is the agent (it is a child subreaper, so every container
    /// process it ever started ends up here until reaped), but for its stage zygote
    /// (stage::spawner), which lives as long as the agent.
    pub fn children(&self) -> Vec<String> {
        self.child_stats()
            .into_iter()
            .filter(|(_, comm, _)| !is_zygote(comm))
            .map(|(_, _, stat)| stat)
            .collect()
    }

    /// The pid of the agent's stage zygote, if it has one.
    pub fn zygote_pid(&self) -> Option<u32> {
        self.child_stats()
            .into_iter()
            .find(|(_, comm, _)| is_zygote(comm))
            .map(|(pid, _, _)| pid)
    }

    /// Waits (a few seconds at most) until the zygote has named itself: the agent forks
    /// it first thing, but on a busy machine the child may not have run yet when the
    /// agent listens, and until then it looks like a container process.
    async fn await_zygote_name(&self) {
        for _ in 0..200 {
            if self.zygote_pid().is_some() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// (pid, comm, whole stat line) of each process whose parent is the agent.
    fn child_stats(&self) -> Vec<(u32, String, String)> {
        let agent = self.pid().to_string();
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").expect("read /proc").flatten() {
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            // "pid (comm) state ppid ...": comm may hold spaces, so split after ')'.
            let Some((head, rest)) = stat.rsplit_once(')') else {
                continue;
            };
            if rest.split_whitespace().nth(1) != Some(agent.as_str()) {
                continue;
            }
            let Some((pid, comm)) = head.split_once(" (") else {
                continue;
            };
            let Ok(pid) = pid.parse() else {
                continue;
            };
            found.push((pid, comm.to_string(), stat.trim().to_string()));
        }
        found
    }
}

fn is_zygote(comm: &str) -> bool {
    kata_agent::stage::spawner::ZYGOTE_NAME.to_bytes() == comm.as_bytes()
}

pub fn ctx() -> Context {
    ttrpc::context::with_timeout(0)
}

impl TestAgent {
    pub async fn start(name: &str) -> TestAgent {
        let dir =
            std::env::temp_dir().join(format!("kata-agent-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create test dir");
        let sock = dir.join("agent.sock");
        let addr = format!("unix://{}", sock.display());
        let log = std::fs::File::create(dir.join("agent.log")).expect("create agent log");
        let child = Command::new(env!("CARGO_BIN_EXE_kata-agent"))
            .args(["--listen", &addr])
            .stderr(log)
            .spawn()
            .expect("start kata-agent");
        let process = AgentProcess {
            child,
            dir: dir.clone(),
        };
        for _ in 0..200 {
            if sock.exists() {
                if let Ok(c) = ttrpc::r#async::Client::connect(&addr).await {
                    let client = AgentServiceClient::new(c);
                    let agent = TestAgent {
                        client,
                        dir,
                        _process: process,
                    };
                    agent.await_zygote_name().await;
                    return agent;
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("kata-agent did not listen on {addr}");
    }

    /// A busybox rootfs at `<dir>/<id>/rootfs`.
    pub fn rootfs(&self, id: &str) -> PathBuf {
        let rootfs = self.dir.join(id).join("rootfs");
        let bin = rootfs.join("bin");
        std::fs::create_dir_all(&bin).expect("create rootfs/bin");
        for d in ["proc", "sys", "dev", "tmp", "work"] {
            std::fs::create_dir_all(rootfs.join(d)).expect("create rootfs dir");
        }
        std::fs::copy("/bin/busybox", bin.join("busybox")).expect("copy busybox");
        for applet in APPLETS {
            std::os::unix::fs::symlink("busybox", bin.join(applet)).expect("symlink applet");
        }
        rootfs
    }

    /// `runc spec`, adjusted: our rootfs, args, env, no network namespace.
    pub fn spec(&self, rootfs: &Path, args: &[&str], env: &[&str], cwd: &str) -> Vec<u8> {
        let work = rootfs.parent().expect("bundle dir");
        let _ = std::fs::remove_file(work.join("config.json"));
        let status = Command::new("runc")
            .arg("spec")
            .current_dir(work)
            .status()
            .expect("run runc spec");
        assert!(status.success(), "runc spec failed");
        let text = std::fs::read_to_string(work.join("config.json")).expect("read config.json");
        let mut spec: serde_json::Value = serde_json::from_str(&text).expect("parse runc spec");
        spec["root"]["path"] = rootfs.display().to_string().into();
        spec["root"]["readonly"] = false.into();
        spec["process"]["terminal"] = false.into();
        spec["process"]["args"] = args.into();
        let mut full_env = vec!["PATH=/bin"];
        full_env.extend_from_slice(env);
        spec["process"]["env"] = full_env.into();
        spec["process"]["cwd"] = cwd.into();
        spec["hostname"] = "testbox".into();
        if let Some(ns) = spec["linux"]["namespaces"].as_array_mut() {
            ns.retain(|n| n["type"] != "network");
        }
        serde_json::to_vec(&spec).expect("encode spec")
    }

    pub async fn create(&self, id: &str, spec: Vec<u8>, stdin: bool) -> ttrpc::Result<Empty> {
        let mut req = CreateContainerRequest::new();
        req.container_id = id.into();
        req.oci_spec = spec;
        req.stdin = stdin;
        self.client.create_container(ctx(), &req).await
    }

    pub async fn start_container(&self, id: &str) -> ttrpc::Result<Empty> {
        let mut req = ContainerRequest::new();
        req.container_id = id.into();
        self.client.start_container(ctx(), &req).await
    }

    pub async fn remove(&self, id: &str) -> ttrpc::Result<Empty> {
        let mut req = ContainerRequest::new();
        req.container_id = id.into();
        self.client.remove_container(ctx(), &req).await
    }

    /// Sends `signal` to the init process of container `id`.
    pub async fn signal(&self, id: &str, signal: u32) -> ttrpc::Result<Empty> {
        let mut req = SignalProcessRequest::new();
        req.container_id = id.into();
        req.signal = signal;
        self.client.signal_process(ctx(), &req).await
    }

    pub async fn wait(&self, id: &str, exec_id: &str) -> i32 {
        let mut req = ProcessRequest::new();
        req.container_id = id.into();
        req.exec_id = exec_id.into();
        self.client
            .wait_process(ctx(), &req)
            .await
            .expect("wait process")
            .status
    }

    /// The agent's stdio socket (`<api socket>.stdio`).
    pub fn stdio_socket(&self) -> PathBuf {
        self.dir.join("agent.sock.stdio")
    }

    /// Asks for one stdio stream of a process: the agent's answer, and the connection.
    pub async fn request_stream(
        &self,
        id: &str,
        exec_id: &str,
        stream: StdioStream,
    ) -> (Result<(), String>, UnixStream) {
        request_stream(&self.stdio_socket(), id, exec_id, stream).await
    }

    /// Attaches one stdio stream of a process.
    pub async fn open_stream(&self, id: &str, exec_id: &str, stream: StdioStream) -> UnixStream {
        open_stream(&self.stdio_socket(), id, exec_id, stream).await
    }

    /// Reads an output stream to its end in a task.
    pub fn read_all(
        &self,
        id: &str,
        exec_id: &str,
        stderr: bool,
    ) -> tokio::task::JoinHandle<Vec<u8>> {
        let (socket, id, exec_id) = (self.stdio_socket(), id.to_string(), exec_id.to_string());
        let stream = if stderr {
            StdioStream::Stderr
        } else {
            StdioStream::Stdout
        };
        tokio::spawn(async move {
            let mut conn = open_stream(&socket, &id, &exec_id, stream).await;
            let mut out = Vec::new();
            conn.read_to_end(&mut out).await.expect("read the stream");
            out
        })
    }

    /// Creates, starts and waits for a container; returns (status, stdout, stderr).
    pub async fn run(
        &self,
        id: &str,
        args: &[&str],
        env: &[&str],
        cwd: &str,
    ) -> (i32, Vec<u8>, Vec<u8>) {
        let rootfs = self.rootfs(id);
        let spec = self.spec(&rootfs, args, env, cwd);
        self.create(id, spec, false)
            .await
            .expect("create container");
        let out = self.read_all(id, "", false);
        let err = self.read_all(id, "", true);
        self.start_container(id).await.expect("start container");
        let status = self.wait(id, "").await;
        let out = out.await.expect("stdout task");
        let err = err.await.expect("stderr task");
        (status, out, err)
    }
}

/// Sends the request line for `stream` on the agent's stdio socket `socket` and reads
/// the answer line, leaving the stream's bytes in the connection.
pub async fn request_stream(
    socket: &Path,
    id: &str,
    exec_id: &str,
    stream: StdioStream,
) -> (Result<(), String>, UnixStream) {
    let mut conn = UnixStream::connect(socket)
        .await
        .expect("connect to the agent's stdio socket");
    let req = StdioRequest {
        container_id: id.into(),
        exec_id: exec_id.into(),
        stream,
    };
    conn.write_all(req.line().expect("request line").as_bytes())
        .await
        .expect("send the stdio request");
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while byte[0] != b'\n' {
        if conn.read(&mut byte).await.expect("read the answer") == 0 {
            break;
        }
        line.push(byte[0]);
    }
    let answer = protocols::stdio::parse_answer(&String::from_utf8_lossy(&line));
    (answer.map_err(|e| e.to_string()), conn)
}

async fn open_stream(socket: &Path, id: &str, exec_id: &str, stream: StdioStream) -> UnixStream {
    let (answer, conn) = request_stream(socket, id, exec_id, stream).await;
    if let Err(why) = answer {
        panic!("the agent refused {stream} of {id}/{exec_id}: {why}");
    }
    conn
}

pub fn md5(data: &[u8]) -> String {
    let mut child = Command::new("md5sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("md5sum");
    use std::io::Write;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(data)
        .expect("feed md5sum");
    let out = child.wait_with_output().expect("md5sum output");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_string()
}

pub fn code(e: &ttrpc::Error) -> Option<ttrpc::Code> {
    match e {
        ttrpc::Error::RpcStatus(s) => Some(s.code()),
        _ => None,
    }
}

pub fn message(e: &ttrpc::Error) -> String {
    match e {
        ttrpc::Error::RpcStatus(s) => s.message().to_string(),
        other => format!("{other:?}"),
    }
}

impl TestAgent {
    /// Runs ExecProcess and starts reading the new process's stdout.
    pub async fn read_all_after_exec(
        &self,
        req: &ExecProcessRequest,
    ) -> tokio::task::JoinHandle<Vec<u8>> {
        self.client
            .exec_process(ctx(), req)
            .await
            .expect("exec process");
        self.read_all(&req.container_id, &req.exec_id, false)
    }

    pub async fn wait_err(&self, id: &str) -> ttrpc::Error {
        let mut req = ProcessRequest::new();
        req.container_id = id.into();
        self.client
            .wait_process(ctx(), &req)
            .await
            .expect_err("wait must fail")
    }
}
