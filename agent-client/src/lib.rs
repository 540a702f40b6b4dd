//! The shim's side of kata-agent: the [`Agent`] trait is what the Task service asks of
//! the guest, [`KataAgent`] speaks it over ttrpc through the VMM's hybrid vsock socket.
//!
//! Two rules hold for every request, so that no RPC of the shim can hang on a guest:
//! - a request that should answer promptly has a deadline fitting it (see
//!   [`Deadline`]); waits are long polls without one;
//! - once the VM is known to be gone ([`Agent::disconnect`]), every pending and later
//!   request fails at once with [`AgentError::VmGone`], long polls included, and
//!   [`Agent::vm_gone`] tells whoever holds a stdio stream (the shim's `io`) to let go.
//!
//! Stdio is no request: each stream of a process is a connection of its own to the
//! agent ([`Agent::open_stdio`], `protocols::stdio`), which then carries plain bytes.
//!
//! The trait is the seam the shim's unit tests use to drive the Task state machine without
//! a VM ([`fake::FakeAgent`], feature `fake`). The fuzz targets read the agent's answers
//! through [`KataAgent`] as the shim does.

mod client;
#[cfg(any(test, feature = "fake"))]
pub mod fake;

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use protocols::agent::StatsContainerResponse;
use protocols::stdio::StdioStream;
use tokio::net::UnixStream;
use tokio::sync::watch;

pub use client::{hybrid_vsock_connect, port_forward_answer, KataAgent};

/// Told how long each answered agent request took (its name, e.g.
/// `grpc.CreateContainerRequest`): where the crate's user keeps such figures (the shim's
/// metrics set it at start).
pub type RequestObserver = fn(&'static str, Duration);

static OBSERVER: std::sync::OnceLock<RequestObserver> = std::sync::OnceLock::new();

/// Sets the [`RequestObserver`] (once; later calls are ignored).
pub fn observe_requests(observer: RequestObserver) {
    let _ = OBSERVER.set(observer);
}

fn observed(op: &'static str, took: Duration) {
    if let Some(observe) = OBSERVER.get() {
        observe(op, took);
    }
}

/// Failures talking to the agent, phrased for a containerd user reading `ctr`'s output.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("the agent in the VM did not answer on {socket} within {timeout:?}: {last}")]
    DialTimeout {
        socket: PathBuf,
        timeout: Duration,
        last: String,
    },
    #[error("the VM stopped before its agent answered: {how}")]
    VmExited { how: String },
    #[error("agent request {op} failed: {source}")]
    Rpc {
        op: &'static str,
        #[source]
        source: ttrpc::Error,
    },
    #[error(
        "agent request {op} got no answer within {after:?}; the guest may be overloaded or hung"
    )]
    Timeout { op: &'static str, after: Duration },
    #[error("agent request {op} cannot be served: the sandbox VM is gone ({cause})")]
    VmGone { op: &'static str, cause: String },
    #[error("cannot attach {stream} of {process}: {why}")]
    Stdio {
        stream: StdioStream,
        process: String,
        why: String,
    },
}

impl AgentError {
    /// Whether the request failed because the VM ended, not because of the request.
    pub fn vm_gone(&self) -> bool {
        matches!(self, AgentError::VmGone { .. })
    }
}

pub type Result<T> = std::result::Result<T, AgentError>;

/// Tells when the sandbox's VM is gone (see [`Agent::disconnect`]).
#[derive(Clone)]
pub struct VmGone(watch::Receiver<Option<String>>);

impl VmGone {
    pub fn new(rx: watch::Receiver<Option<String>>) -> Self {
        VmGone(rx)
    }

    /// Resolves with the cause once the VM is gone; never while it runs.
    pub async fn wait(&mut self) -> String {
        match self.0.wait_for(Option::is_some).await {
            Ok(cause) => cause.clone().unwrap_or_default(),
            Err(_) => "the sandbox's agent connection was dropped".to_string(),
        }
    }
}

/// How long a request may take before the shim gives up on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deadline {
    /// Long polls (waits, stream reads, OOM events): they answer when the guest has news,
    /// and end only with the process, the stream or the VM.
    None,
    /// Requests whose work in the guest is small (signals, stats, resize, ...).
    Control,
    /// Requests that set up a container or process: the guest reads its rootfs over
    /// virtio-fs and forks, which under TCG on a loaded host takes seconds.
    Setup,
}

impl Deadline {
    pub fn duration(self) -> Option<Duration> {
        match self {
            Deadline::None => None,
            Deadline::Control => Some(Duration::from_secs(15)),
            Deadline::Setup => Some(Duration::from_secs(60)),
        }
    }
}

/// What the Task service asks of the agent in the guest.
#[async_trait]
pub trait Agent: Send + Sync {
    /// The VM is gone (`cause` says why): fail every pending and later request at once.
    fn disconnect(&self, cause: &str);

    /// Makes the guest the pod's (hostname, network), before its first container.
    async fn create_sandbox(&self, req: protocols::agent::CreateSandboxRequest) -> Result<()>;
    /// `req.pod_sandbox`: the container's namespaces become the ones the pod shares.
    async fn create_container(&self, req: protocols::agent::CreateContainerRequest) -> Result<()>;
    async fn start_container(&self, id: &str) -> Result<()>;
    async fn remove_container(&self, id: &str) -> Result<()>;
    async fn exec_process(
        &self,
        id: &str,
        exec_id: &str,
        process: Vec<u8>,
        stdin: bool,
    ) -> Result<()>;
    async fn signal_process(&self, id: &str, exec_id: &str, signal: u32, all: bool) -> Result<()>;
    /// The process's exit status once it has exited.
    async fn wait_process(&self, id: &str, exec_id: &str) -> Result<i32>;
    async fn list_processes(&self, id: &str) -> Result<Vec<i32>>;
    /// Attaches `stream` of the process: a connection that carries the stream's bytes
    /// (an output stream until the process's end of file; stdin until the shim's
    /// half-close, which ends the process's stdin).
    async fn open_stdio(&self, id: &str, exec_id: &str, stream: StdioStream) -> Result<UnixStream>;
    /// Tells when the VM is gone.
    fn vm_gone(&self) -> VmGone;
    async fn tty_win_resize(&self, id: &str, exec_id: &str, rows: u32, columns: u32) -> Result<()>;
    async fn pause_container(&self, id: &str) -> Result<()>;
    async fn resume_container(&self, id: &str) -> Result<()>;
    async fn stats_container(&self, id: &str) -> Result<StatsContainerResponse>;
    /// `resources` is the OCI LinuxResources object as JSON.
    async fn update_container(&self, id: &str, resources: Vec<u8>) -> Result<()>;
    /// Waits for the next OOM kill in the guest; returns the container's id.
    async fn get_oom_event(&self) -> Result<String>;
    /// Asks the guest to end the VM; a closed connection is the expected answer.
    async fn destroy_sandbox(&self) -> Result<()>;
    /// The guest's figures as Prometheus text (untrusted: see `crate::metrics`).
    async fn get_metrics(&self) -> Result<String>;
    /// Makes the guest's CPUs 0 to `count`-1 the online ones; returns how many are.
    async fn set_online_cpus(&self, count: u32) -> Result<u32>;
}
