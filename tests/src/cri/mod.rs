//! The Kubernetes CRI side of the end-to-end tests: a CRI v1 client of a private
//! containerd ([`CriClient`], over its unix socket, with the `k8s-cri` crate's generated
//! tonic client), the streaming protocol behind Exec, Attach and PortForward
//! ([`ExecStream`], [`PortForwardStream`]), CRI log files ([`read_cri_log`]), and the
//! harness that plays kubelet around a containerd with the CRI plugin on
//! ([`CriContainerd`], [`Pod`]).
//!
//! The client is synchronous, like the tests: every call runs on the client's own tokio
//! runtime, with a deadline, and answers a [`CriError`] instead of hanging or panicking,
//! so that a test can assert on an error (a refused sysctl) as well as on a result.

mod harness;
mod kubelet;
mod logs;
mod stream;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_cri::v1 as api;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::{Channel, Endpoint, Uri};

pub use harness::*;
pub use kubelet::{assert_kubelet_volumes_behave, FakeKubelet};
pub use logs::{parse_cri_log, read_cri_log, LogLine};
pub use stream::{ExecStatus, ExecStream, PortForwardStream};

/// The CRI v1 API types (`PodSandboxConfig`, `ContainerConfig`, ...), for tests that
/// build or inspect requests beyond what the harness fills in.
pub use k8s_cri::v1 as cri_api;

/// How long a CRI call may take before the client gives up on it. RunPodSandbox boots a
/// VM (about 1 s under QEMU/TCG, more when both cores are busy), StopContainer waits for
/// the container's stop timeout.
const CALL_LIMIT: Duration = Duration::from_secs(120);

/// What went wrong in a CRI call or a stream.
#[derive(Debug, Clone)]
pub enum CriError {
    /// The socket could not be reached.
    Connect(String),
    /// The CRI answered with an error status.
    Rpc {
        call: &'static str,
        code: tonic::Code,
        message: String,
    },
    /// No answer within the client's deadline.
    Timeout { call: &'static str, after: Duration },
    /// A streaming session (WebSocket to containerd's stream server) failed.
    Stream(String),
}

impl CriError {
    /// The error text a user would read (crictl prints the same message).
    pub fn message(&self) -> String {
        match self {
            CriError::Connect(m) | CriError::Stream(m) => m.clone(),
            CriError::Rpc { message, .. } => message.clone(),
            CriError::Timeout { call, after } => {
                format!("{call} did not answer within {:.0}s", after.as_secs_f64())
            }
        }
    }
}

impl std::fmt::Display for CriError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CriError::Connect(m) => write!(f, "connecting to the CRI: {m}"),
            CriError::Rpc {
                call,
                code,
                message,
            } => write!(f, "{call}: {code:?}: {message}"),
            CriError::Timeout { .. } => write!(f, "{}", self.message()),
            CriError::Stream(m) => write!(f, "stream: {m}"),
        }
    }
}

impl std::error::Error for CriError {}

/// `field` of a `call` answer, or the error that says the CRI left it out.
fn present<T>(
    field: Option<T>,
    call: &'static str,
    what: impl FnOnce() -> String,
) -> Result<T, CriError> {
    field.ok_or_else(|| CriError::Rpc {
        call,
        code: tonic::Code::Internal,
        message: what(),
    })
}

/// A CRI v1 client (RuntimeService and ImageService) of the containerd listening on a
/// unix socket. Every method blocks until the answer (or [`CriError::Timeout`]).
pub struct CriClient {
    rt: tokio::runtime::Runtime,
    channel: Channel,
    socket: PathBuf,
    /// How long a call may take, in milliseconds (see [`CriClient::set_call_limit`]).
    limit_ms: AtomicU64,
}

impl CriClient {
    /// Connects to the CRI served on `socket` (containerd's gRPC socket).
    pub fn connect(socket: &Path) -> Result<Self, CriError> {
        // Two workers: stream sessions keep running in the background while a test thread
        // waits on them or makes another call.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("cri-client")
            .enable_all()
            .build()
            .map_err(|e| CriError::Connect(format!("starting a tokio runtime: {e}")))?;
        let path = socket.to_path_buf();
        let channel = rt.block_on(async {
            // The URI is required by tonic but unused: the connector dials the socket.
            let endpoint = Endpoint::try_from("http://[::1]:50051")
                .map_err(|e| CriError::Connect(e.to_string()))?
                .connect_timeout(Duration::from_secs(10));
            let connector = tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(&path).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            });
            endpoint
                .connect_with_connector(connector)
                .await
                .map_err(|e| CriError::Connect(format!("{}: {e}", socket.display())))
        })?;
        Ok(CriClient {
            rt,
            channel,
            socket: socket.to_path_buf(),
            limit_ms: AtomicU64::new(CALL_LIMIT.as_millis() as u64),
        })
    }

    /// The socket this client talks to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// How long each call may take from now on (120 s by default; StopContainer and
    /// ExecSync get their own timeout on top).
    pub fn set_call_limit(&self, limit: Duration) {
        self.limit_ms
            .store(limit.as_millis() as u64, Ordering::Relaxed);
    }

    fn limit(&self) -> Duration {
        Duration::from_millis(self.limit_ms.load(Ordering::Relaxed))
    }

    /// The runtime on which stream sessions run.
    pub(crate) fn runtime(&self) -> &tokio::runtime::Runtime {
        &self.rt
    }

    /// Runs `f` on a fresh client of the channel, within the call limit plus `extra`.
    fn call<T, F, Fut>(&self, call: &'static str, extra: Duration, f: F) -> Result<T, CriError>
    where
        F: FnOnce(RuntimeServiceClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let limit = self.limit() + extra;
        let client = RuntimeServiceClient::new(self.channel.clone());
        self.rt.block_on(async move {
            match tokio::time::timeout(limit, f(client)).await {
                Err(_) => Err(CriError::Timeout { call, after: limit }),
                Ok(Err(status)) => Err(CriError::Rpc {
                    call,
                    code: status.code(),
                    message: status.message().to_string(),
                }),
                Ok(Ok(response)) => Ok(response.into_inner()),
            }
        })
    }

    fn image_call<T, F, Fut>(&self, call: &'static str, f: F) -> Result<T, CriError>
    where
        F: FnOnce(ImageServiceClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let limit = self.limit();
        let client = ImageServiceClient::new(self.channel.clone());
        self.rt.block_on(async move {
            match tokio::time::timeout(limit, f(client)).await {
                Err(_) => Err(CriError::Timeout { call, after: limit }),
                Ok(Err(status)) => Err(CriError::Rpc {
                    call,
                    code: status.code(),
                    message: status.message().to_string(),
                }),
                Ok(Ok(response)) => Ok(response.into_inner()),
            }
        })
    }

    /// Version: the runtime's name and version (containerd's CRI answers "containerd").
    pub fn version(&self) -> Result<api::VersionResponse, CriError> {
        self.call("Version", Duration::ZERO, |mut c| async move {
            c.version(api::VersionRequest {
                version: "v1".into(),
            })
            .await
        })
    }

    /// Status: the runtime's and the network's readiness conditions.
    pub fn status(&self) -> Result<api::StatusResponse, CriError> {
        self.call("Status", Duration::ZERO, |mut c| async move {
            c.status(api::StatusRequest { verbose: false }).await
        })
    }

    /// RunPodSandbox with `handler` (the RuntimeClass handler: `runc`, `kata`); the id.
    pub fn run_pod_sandbox(
        &self,
        config: &api::PodSandboxConfig,
        handler: &str,
    ) -> Result<String, CriError> {
        let req = api::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: handler.to_string(),
        };
        self.call("RunPodSandbox", Duration::ZERO, |mut c| async move {
            c.run_pod_sandbox(req).await
        })
        .map(|r| r.pod_sandbox_id)
    }

    /// PodSandboxStatus; `verbose` adds containerd's `info` (JSON, with the runtime spec).
    pub fn pod_sandbox_status(
        &self,
        id: &str,
        verbose: bool,
    ) -> Result<api::PodSandboxStatusResponse, CriError> {
        let req = api::PodSandboxStatusRequest {
            pod_sandbox_id: id.to_string(),
            verbose,
        };
        self.call("PodSandboxStatus", Duration::ZERO, |mut c| async move {
            c.pod_sandbox_status(req).await
        })
    }

    /// The pod's IP as PodSandboxStatus reports it (empty when it has none).
    pub fn pod_ip(&self, id: &str) -> Result<String, CriError> {
        let status = self.pod_sandbox_status(id, false)?;
        Ok(status
            .status
            .and_then(|s| s.network)
            .map(|n| n.ip)
            .unwrap_or_default())
    }

    pub fn stop_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let req = api::StopPodSandboxRequest {
            pod_sandbox_id: id.to_string(),
        };
        self.call("StopPodSandbox", Duration::ZERO, |mut c| async move {
            c.stop_pod_sandbox(req).await
        })
        .map(|_| ())
    }

    pub fn remove_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let req = api::RemovePodSandboxRequest {
            pod_sandbox_id: id.to_string(),
        };
        self.call("RemovePodSandbox", Duration::ZERO, |mut c| async move {
            c.remove_pod_sandbox(req).await
        })
        .map(|_| ())
    }

    /// Every pod sandbox the CRI knows.
    pub fn list_pod_sandbox(&self) -> Result<Vec<api::PodSandbox>, CriError> {
        self.call("ListPodSandbox", Duration::ZERO, |mut c| async move {
            c.list_pod_sandbox(api::ListPodSandboxRequest { filter: None })
                .await
        })
        .map(|r| r.items)
    }

    /// CreateContainer in pod `pod_id` (whose config is `sandbox_config`); the id.
    pub fn create_container(
        &self,
        pod_id: &str,
        config: &api::ContainerConfig,
        sandbox_config: &api::PodSandboxConfig,
    ) -> Result<String, CriError> {
        let req = api::CreateContainerRequest {
            pod_sandbox_id: pod_id.to_string(),
            config: Some(config.clone()),
            sandbox_config: Some(sandbox_config.clone()),
        };
        self.call("CreateContainer", Duration::ZERO, |mut c| async move {
            c.create_container(req).await
        })
        .map(|r| r.container_id)
    }

    pub fn start_container(&self, id: &str) -> Result<(), CriError> {
        let req = api::StartContainerRequest {
            container_id: id.to_string(),
        };
        self.call("StartContainer", Duration::ZERO, |mut c| async move {
            c.start_container(req).await
        })
        .map(|_| ())
    }

    /// ContainerStatus (state, exit code, log path, ...).
    pub fn container_status(&self, id: &str) -> Result<api::ContainerStatus, CriError> {
        let req = api::ContainerStatusRequest {
            container_id: id.to_string(),
            verbose: false,
        };
        self.call("ContainerStatus", Duration::ZERO, |mut c| async move {
            c.container_status(req).await
        })
        .and_then(|r| {
            present(r.status, "ContainerStatus", || {
                format!("no status for container {id}")
            })
        })
    }

    /// The container's state (`ContainerState::Running`, `Exited`, ...).
    pub fn container_state(&self, id: &str) -> Result<api::ContainerState, CriError> {
        let status = self.container_status(id)?;
        Ok(api::ContainerState::try_from(status.state)
            .unwrap_or(api::ContainerState::ContainerUnknown))
    }

    /// UpdateContainerResources, as kubelet's in-place resize sends it.
    pub fn update_container_resources(
        &self,
        id: &str,
        linux: api::LinuxContainerResources,
    ) -> Result<(), CriError> {
        let req = api::UpdateContainerResourcesRequest {
            container_id: id.to_string(),
            linux: Some(linux),
            ..Default::default()
        };
        self.call(
            "UpdateContainerResources",
            Duration::ZERO,
            |mut c| async move { c.update_container_resources(req).await },
        )
        .map(|_| ())
    }

    /// StopContainer: the stop signal, then SIGKILL after `timeout_secs`.
    pub fn stop_container(&self, id: &str, timeout_secs: i64) -> Result<(), CriError> {
        let req = api::StopContainerRequest {
            container_id: id.to_string(),
            timeout: timeout_secs,
        };
        let extra = Duration::from_secs(timeout_secs.max(0) as u64);
        self.call("StopContainer", extra, |mut c| async move {
            c.stop_container(req).await
        })
        .map(|_| ())
    }

    pub fn remove_container(&self, id: &str) -> Result<(), CriError> {
        let req = api::RemoveContainerRequest {
            container_id: id.to_string(),
        };
        self.call("RemoveContainer", Duration::ZERO, |mut c| async move {
            c.remove_container(req).await
        })
        .map(|_| ())
    }

    /// Every container the CRI knows, of every pod.
    pub fn list_containers(&self) -> Result<Vec<api::Container>, CriError> {
        self.call("ListContainers", Duration::ZERO, |mut c| async move {
            c.list_containers(api::ListContainersRequest { filter: None })
                .await
        })
        .map(|r| r.containers)
    }

    /// ExecSync of `cmd` in container `id`, `timeout_secs` 0 for none.
    pub fn exec_sync(
        &self,
        id: &str,
        cmd: &[&str],
        timeout_secs: i64,
    ) -> Result<api::ExecSyncResponse, CriError> {
        let req = api::ExecSyncRequest {
            container_id: id.to_string(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            timeout: timeout_secs,
        };
        let extra = Duration::from_secs(timeout_secs.max(0) as u64);
        self.call(
            "ExecSync",
            extra,
            |mut c| async move { c.exec_sync(req).await },
        )
    }

    /// Exec: the stream server URL to connect to (see [`CriClient::exec_stream`]).
    pub fn exec_url(&self, req: api::ExecRequest) -> Result<String, CriError> {
        self.call(
            "Exec",
            Duration::ZERO,
            |mut c| async move { c.exec(req).await },
        )
        .map(|r| r.url)
    }

    /// Attach: the stream server URL to connect to (see [`CriClient::attach_stream`]).
    pub fn attach_url(&self, req: api::AttachRequest) -> Result<String, CriError> {
        self.call("Attach", Duration::ZERO, |mut c| async move {
            c.attach(req).await
        })
        .map(|r| r.url)
    }

    /// PortForward: the stream server URL to connect to (see
    /// [`CriClient::port_forward_stream`]).
    pub fn port_forward_url(&self, req: api::PortForwardRequest) -> Result<String, CriError> {
        self.call("PortForward", Duration::ZERO, |mut c| async move {
            c.port_forward(req).await
        })
        .map(|r| r.url)
    }

    /// Exec of `cmd` in container `id` as a live session: stdout (and stderr unless
    /// `tty`), stdin if asked. Speaks `v4.channel.k8s.io` over WebSocket.
    pub fn exec_stream(
        &self,
        id: &str,
        cmd: &[&str],
        stdin: bool,
        tty: bool,
    ) -> Result<ExecStream, CriError> {
        let url = self.exec_url(api::ExecRequest {
            container_id: id.to_string(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            tty,
            stdin,
            stdout: true,
            stderr: !tty,
        })?;
        ExecStream::open(self, &url)
    }

    /// Attach to container `id`'s main process: stdout (and stderr unless `tty`), stdin
    /// if asked (the container must have been created with `stdin: true`).
    pub fn attach_stream(&self, id: &str, stdin: bool, tty: bool) -> Result<ExecStream, CriError> {
        let url = self.attach_url(api::AttachRequest {
            container_id: id.to_string(),
            stdin,
            tty,
            stdout: true,
            stderr: !tty,
        })?;
        ExecStream::open(self, &url)
    }

    /// Port-forward to `port` of pod `pod_id`: one TCP connection to `localhost:port` in
    /// the pod's network namespace, carried over a WebSocket (`portforward.k8s.io`
    /// framing: a data and an error channel, each opened by the port number).
    pub fn port_forward_stream(
        &self,
        pod_id: &str,
        port: u16,
    ) -> Result<PortForwardStream, CriError> {
        let url = self.port_forward_url(api::PortForwardRequest {
            pod_sandbox_id: pod_id.to_string(),
            port: vec![i32::from(port)],
        })?;
        PortForwardStream::open(self, &url, port)
    }

    pub fn container_stats(&self, id: &str) -> Result<api::ContainerStats, CriError> {
        let req = api::ContainerStatsRequest {
            container_id: id.to_string(),
        };
        self.call("ContainerStats", Duration::ZERO, |mut c| async move {
            c.container_stats(req).await
        })
        .and_then(|r| {
            present(r.stats, "ContainerStats", || {
                format!("no stats for container {id}")
            })
        })
    }

    /// ListContainerStats, of the containers of pod `pod_id` if given, else of all.
    pub fn list_container_stats(
        &self,
        pod_id: Option<&str>,
    ) -> Result<Vec<api::ContainerStats>, CriError> {
        let filter = pod_id.map(|p| api::ContainerStatsFilter {
            pod_sandbox_id: p.to_string(),
            ..Default::default()
        });
        self.call("ListContainerStats", Duration::ZERO, |mut c| async move {
            c.list_container_stats(api::ListContainerStatsRequest { filter })
                .await
        })
        .map(|r| r.stats)
    }

    pub fn pod_sandbox_stats(&self, pod_id: &str) -> Result<api::PodSandboxStats, CriError> {
        let req = api::PodSandboxStatsRequest {
            pod_sandbox_id: pod_id.to_string(),
        };
        self.call("PodSandboxStats", Duration::ZERO, |mut c| async move {
            c.pod_sandbox_stats(req).await
        })
        .and_then(|r| {
            present(r.stats, "PodSandboxStats", || {
                format!("no stats for pod {pod_id}")
            })
        })
    }

    /// ListPodSandboxStats, of pod `pod_id` if given, else of all.
    pub fn list_pod_sandbox_stats(
        &self,
        pod_id: Option<&str>,
    ) -> Result<Vec<api::PodSandboxStats>, CriError> {
        let filter = pod_id.map(|p| api::PodSandboxStatsFilter {
            id: p.to_string(),
            ..Default::default()
        });
        self.call("ListPodSandboxStats", Duration::ZERO, |mut c| async move {
            c.list_pod_sandbox_stats(api::ListPodSandboxStatsRequest { filter })
                .await
        })
        .map(|r| r.stats)
    }

    /// The images the CRI sees (namespace `k8s.io`).
    pub fn list_images(&self) -> Result<Vec<api::Image>, CriError> {
        self.image_call("ListImages", |mut c| async move {
            c.list_images(api::ListImagesRequest { filter: None }).await
        })
        .map(|r| r.images)
    }
}

/// CPU (cumulative ns) and memory (working set bytes) of a stats answer, 0 when absent.
pub fn cpu_and_memory(
    cpu: Option<&api::CpuUsage>,
    memory: Option<&api::MemoryUsage>,
) -> (u64, u64) {
    let cpu = cpu
        .and_then(|c| c.usage_core_nano_seconds.as_ref())
        .map(|v| v.value)
        .unwrap_or(0);
    let mem = memory
        .and_then(|m| m.working_set_bytes.as_ref())
        .map(|v| v.value)
        .unwrap_or(0);
    (cpu, mem)
}
