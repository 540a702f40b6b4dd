//! The ttrpc AgentService: one short method per RPC, each delegating to the sandbox.
//!
//! ttrpc's async server runs every unary request in its own task, so a WaitProcess that
//! waits for an exit does not hold up anything else. Stdio does not travel here: each
//! stream has a connection of its own (`stdio::streams`).

use std::sync::Arc;

use async_trait::async_trait;
use protocols::agent::*;
use protocols::agent_ttrpc::AgentService;
use ttrpc::r#async::TtrpcContext;

use crate::error::AgentError;
use crate::sandbox::Sandbox;

pub struct AgentRpc {
    pub sandbox: Arc<Sandbox>,
    pub ending: Ending,
}

/// How DestroySandbox ends the sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// PID 1 of a guest: every process killed and the file systems synced, then, after
    /// the answer, the guest resets (the host stops the VM at the answer anyway).
    /// Unmounting and removing each container's pieces first would be work the reset
    /// undoes, on the path of every sandbox's teardown.
    ResetGuest,
    /// An agent on the host (tests): each container is removed, then the agent exits.
    ExitAgent,
}

type RpcResult<T> = ttrpc::Result<T>;

#[async_trait]
impl AgentService for AgentRpc {
    async fn create_sandbox(&self, _: &TtrpcContext, r: CreateSandboxRequest) -> RpcResult<Empty> {
        self.sandbox.create_sandbox(&r).await?;
        Ok(Empty::new())
    }

    async fn create_container(
        &self,
        _: &TtrpcContext,
        r: CreateContainerRequest,
    ) -> RpcResult<Empty> {
        let volumes = crate::volume::Requested {
            pod_local: r.pod_local_volumes,
            watched: r.watched_volumes,
        };
        self.sandbox
            .create_container(
                &r.container_id,
                &r.oci_spec,
                r.stdin,
                r.pod_sandbox,
                &r.block_devices,
                &volumes,
            )
            .await?;
        Ok(Empty::new())
    }

    async fn start_container(&self, _: &TtrpcContext, r: ContainerRequest) -> RpcResult<Empty> {
        self.sandbox.start_container(&r.container_id).await?;
        Ok(Empty::new())
    }

    async fn remove_container(&self, _: &TtrpcContext, r: ContainerRequest) -> RpcResult<Empty> {
        self.sandbox.remove_container(&r.container_id).await?;
        Ok(Empty::new())
    }

    async fn exec_process(&self, _: &TtrpcContext, r: ExecProcessRequest) -> RpcResult<Empty> {
        self.sandbox
            .exec_process(&r.container_id, &r.exec_id, &r.process, r.stdin)
            .await?;
        Ok(Empty::new())
    }

    async fn signal_process(&self, _: &TtrpcContext, r: SignalProcessRequest) -> RpcResult<Empty> {
        self.sandbox
            .signal_process(&r.container_id, &r.exec_id, r.signal, r.all)
            .await?;
        Ok(Empty::new())
    }

    async fn wait_process(
        &self,
        _: &TtrpcContext,
        r: ProcessRequest,
    ) -> RpcResult<WaitProcessResponse> {
        let status = self
            .sandbox
            .wait_process(&r.container_id, &r.exec_id)
            .await?;
        let mut resp = WaitProcessResponse::new();
        resp.status = status;
        Ok(resp)
    }

    async fn list_processes(
        &self,
        _: &TtrpcContext,
        r: ContainerRequest,
    ) -> RpcResult<ListProcessesResponse> {
        let container = self.sandbox.container(&r.container_id).await?;
        let mut resp = ListProcessesResponse::new();
        resp.pids = container.pids().await;
        Ok(resp)
    }

    async fn tty_win_resize(&self, _: &TtrpcContext, r: TtyWinResizeRequest) -> RpcResult<Empty> {
        let process = self.sandbox.process(&r.container_id, &r.exec_id).await?;
        let tty = process.tty.as_ref().ok_or_else(|| {
            AgentError::FailedPrecondition(format!(
                "process {}/{} has no terminal",
                r.container_id, r.exec_id
            ))
        })?;
        let rows = u16::try_from(r.rows).unwrap_or(u16::MAX);
        let cols = u16::try_from(r.columns).unwrap_or(u16::MAX);
        crate::stdio::resize(tty, rows, cols)
            .map_err(|e| AgentError::Internal(format!("resize terminal: {e}")))?;
        Ok(Empty::new())
    }

    async fn pause_container(&self, _: &TtrpcContext, r: ContainerRequest) -> RpcResult<Empty> {
        self.sandbox.pause_container(&r.container_id).await?;
        Ok(Empty::new())
    }

    async fn resume_container(&self, _: &TtrpcContext, r: ContainerRequest) -> RpcResult<Empty> {
        self.sandbox.resume_container(&r.container_id).await?;
        Ok(Empty::new())
    }

    async fn stats_container(
        &self,
        _: &TtrpcContext,
        r: ContainerRequest,
    ) -> RpcResult<StatsContainerResponse> {
        Ok(self.sandbox.stats_container(&r.container_id).await?)
    }

    async fn update_container(
        &self,
        _: &TtrpcContext,
        r: UpdateContainerRequest,
    ) -> RpcResult<Empty> {
        self.sandbox
            .update_container(&r.container_id, &r.resources)
            .await?;
        Ok(Empty::new())
    }

    /// Long poll: answers when the kernel OOM-kills a container process.
    async fn get_oom_event(&self, _: &TtrpcContext, _: Empty) -> RpcResult<OOMEvent> {
        let mut resp = OOMEvent::new();
        resp.container_id = self.sandbox.next_oom_event().await;
        Ok(resp)
    }

    async fn get_metrics(&self, _: &TtrpcContext, _: GetMetricsRequest) -> RpcResult<Metrics> {
        let containers = self.sandbox.all_stats().await;
        let mut resp = Metrics::new();
        resp.metrics = crate::metrics::gather(containers).await;
        Ok(resp)
    }

    async fn set_online_cpus(
        &self,
        _: &TtrpcContext,
        r: OnlineCpusRequest,
    ) -> RpcResult<OnlineCpusResponse> {
        let count = r.count;
        // Bringing a CPU up or down waits for it (a TCG guest takes a while): off the
        // runtime's threads.
        let online = tokio::task::spawn_blocking(move || {
            crate::cpus::set_online(std::path::Path::new(crate::cpus::CPU_DIR), count)
        })
        .await
        .map_err(|e| AgentError::Internal(format!("set online CPUs: {e}")))??;
        let mut resp = OnlineCpusResponse::new();
        resp.online = online;
        Ok(resp)
    }

    async fn check(&self, _: &TtrpcContext, _: Empty) -> RpcResult<CheckResponse> {
        let mut resp = CheckResponse::new();
        resp.agent_version = env!("CARGO_PKG_VERSION").to_string();
        resp.kernel_release = kernel_release();
        Ok(resp)
    }

    async fn destroy_sandbox(&self, _: &TtrpcContext, _: Empty) -> RpcResult<Empty> {
        let ending = self.ending;
        match ending {
            Ending::ResetGuest => self.sandbox.end_guest().await,
            Ending::ExitAgent => self.sandbox.destroy().await,
        }
        tokio::spawn(async move {
            // Give the reply a moment to leave before the guest resets.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            match ending {
                Ending::ResetGuest => crate::init::reset_vm(),
                Ending::ExitAgent => std::process::exit(0),
            }
        });
        Ok(Empty::new())
    }
}

/// `uname -r`.
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}
