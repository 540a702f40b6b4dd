//! The sandbox: every container of this guest, and the operations the RPCs delegate to.

use std::collections::HashMap;
use std::sync::Arc;

use nix::sys::signal::Signal;
use slog::{info, warn, Logger};
use tokio::sync::Mutex;

use crate::cgroup::CgroupRoot;
use crate::container::{Container, PendingStart};
use crate::error::{AgentError, Result};
use crate::process::{self, Process};
use crate::reaper::{ExitStatus, Reaper};
use crate::spec::{self, Spec};
use crate::stage::protocol::{StageConfig, StageMode};

pub struct Sandbox {
    pub log: Logger,
    reaper: Arc<Reaper>,
    cgroups: Option<CgroupRoot>,
    containers: Mutex<HashMap<String, Arc<Container>>>,
}

impl Sandbox {
    pub fn new(log: Logger, reaper: Arc<Reaper>, cgroups: Option<CgroupRoot>) -> Sandbox {
        if cgroups.is_none() {
            info!(log, "no cgroup v2 hierarchy; containers get no cgroups");
        }
        Sandbox {
            log,
            reaper,
            cgroups,
            containers: Mutex::new(HashMap::new()),
        }
    }

    pub async fn container(&self, id: &str) -> Result<Arc<Container>> {
        self.containers
            .lock()
            .await
            .get(id)
            .cloned()
            .ok_or_else(|| AgentError::NotFound(format!("container {id} does not exist")))
    }

    pub async fn process(&self, id: &str, exec_id: &str) -> Result<Arc<Process>> {
        self.container(id).await?.process(exec_id).await
    }

    pub async fn create_container(&self, id: &str, spec_json: &[u8], stdin: bool) -> Result<()> {
        if id.is_empty() || id.contains('/') || id.starts_with('.') {
            return Err(AgentError::InvalidArgument(format!(
                "invalid container id {id:?}"
            )));
        }
        if self.containers.lock().await.contains_key(id) {
            return Err(AgentError::AlreadyExists(format!(
                "container {id} already exists"
            )));
        }
        let spec = Spec::from_json(spec_json).map_err(AgentError::InvalidArgument)?;
        let terminal = spec.process.as_ref().is_some_and(|p| p.terminal);
        let cgroup = match &self.cgroups {
            Some(root) => Some(root.create(id).map_err(|e| {
                AgentError::Internal(format!("create cgroup for container {id}: {e}"))
            })?),
            None => None,
        };
        let config = StageConfig {
            mode: StageMode::Create { spec },
            cgroup: cgroup.as_ref().map(|p| p.display().to_string()),
        };
        let launched =
            match process::launch(&self.log, &self.reaper, "", config, terminal, stdin, true).await
            {
                Ok(l) => l,
                Err(e) => {
                    if let Some(dir) = &cgroup {
                        let _ = crate::cgroup::remove(dir).await;
                    }
                    return Err(AgentError::FailedPrecondition(format!(
                        "create container {id}: {e}"
                    )));
                }
            };
        let start = launched
            .start
            .ok_or_else(|| AgentError::Internal("no start pipe".into()))?;
        let pending = PendingStart {
            start,
            sync: launched.sync,
        };
        let container = Arc::new(Container::new(id, launched.process, cgroup, pending));
        info!(self.log, "container created"; "container_id" => id, "pid" => container.init.pid);

        let mut containers = self.containers.lock().await;
        if containers.contains_key(id) {
            drop(containers);
            container.destroy(&self.log).await;
            return Err(AgentError::AlreadyExists(format!(
                "container {id} already exists"
            )));
        }
        containers.insert(id.to_string(), container);
        Ok(())
    }

    pub async fn start_container(&self, id: &str) -> Result<()> {
        let container = self.container(id).await?;
        container.start(&self.log).await?;
        info!(self.log, "container started"; "container_id" => id);
        Ok(())
    }

    pub async fn exec_process(
        &self,
        id: &str,
        exec_id: &str,
        process_json: &[u8],
        stdin: bool,
    ) -> Result<()> {
        let container = self.container(id).await?;
        if exec_id.is_empty() {
            return Err(AgentError::InvalidArgument(
                "exec_id must not be empty".into(),
            ));
        }
        if container.has_exec(exec_id).await {
            return Err(AgentError::AlreadyExists(format!(
                "container {id} already has a process {exec_id}"
            )));
        }
        if !container.is_started().await || container.init.exit_status().is_some() {
            return Err(AgentError::FailedPrecondition(format!(
                "container {id} is not running"
            )));
        }
        let process: spec::Process = serde_json::from_slice(process_json)
            .map_err(|e| AgentError::InvalidArgument(format!("invalid OCI process JSON: {e}")))?;
        process.validate().map_err(AgentError::InvalidArgument)?;
        let terminal = process.terminal;
        let config = StageConfig {
            mode: StageMode::Exec {
                process,
                init_pid: container.init.pid,
            },
            cgroup: container.cgroup.as_ref().map(|p| p.display().to_string()),
        };
        let launched = process::launch(
            &self.log,
            &self.reaper,
            exec_id,
            config,
            terminal,
            stdin,
            false,
        )
        .await
        .map_err(|e| AgentError::FailedPrecondition(format!("exec in container {id}: {e}")))?;
        let proc = Arc::new(launched.process);
        container.add_exec(proc.clone()).await?;
        if let Err(e) = process::wait_exec(&self.log, launched.sync).await {
            return Err(AgentError::FailedPrecondition(e));
        }
        info!(self.log, "process started"; "container_id" => id, "exec_id" => exec_id, "pid" => proc.pid);
        Ok(())
    }

    pub async fn signal_process(&self, id: &str, exec_id: &str, sig: u32, all: bool) -> Result<()> {
        let signal = i32::try_from(sig)
            .ok()
            .and_then(|s| Signal::try_from(s).ok())
            .ok_or_else(|| AgentError::InvalidArgument(format!("invalid signal {sig}")))?;
        self.container(id).await?.signal(exec_id, signal, all).await
    }

    pub async fn wait_process(&self, id: &str, exec_id: &str) -> Result<ExitStatus> {
        Ok(self.process(id, exec_id).await?.wait().await)
    }

    pub async fn remove_container(&self, id: &str) -> Result<()> {
        let container = self.container(id).await?;
        container.destroy(&self.log).await;
        self.containers.lock().await.remove(id);
        info!(self.log, "container removed"; "container_id" => id);
        Ok(())
    }

    /// Kills every container (before the VM or the test agent goes away).
    pub async fn destroy(&self) {
        let all: Vec<_> = self
            .containers
            .lock()
            .await
            .drain()
            .map(|(_, c)| c)
            .collect();
        for c in all {
            c.destroy(&self.log).await;
        }
        warn!(self.log, "sandbox destroyed");
    }
}
