//! One VM sandbox: its share on the host, its VM and the agent inside it. Creation is
//! all or nothing: a failure at any step undoes the steps before it, so a failed create
//! leaves no process, mount or directory behind.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hypervisor::{Hypervisor, VmConfig, VmInfo};
use slog::{debug, info, warn, Logger};

use crate::agent::{Agent, AgentError};
use crate::mount::{self, SharedDirs};
use crate::persist::{self, SandboxState};

/// Per-sandbox directory of the VMM's sockets and logs.
pub const VM_RUN_ROOT: &str = "/run/vc/vm";

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("preparing the shared directory for the VM: {0}")]
    Share(#[from] mount::MountError),
    #[error("creating {path}: {source}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("starting the VM: {0}")]
    Vm(String),
    #[error("{0}; last lines of the guest console:\n{1}")]
    Agent(crate::agent::AgentError, String),
    #[error("recording sandbox state: {0}")]
    Persist(std::io::Error),
}

pub struct Sandbox {
    pub agent: Agent,
    pub shared: SharedDirs,
    pub vm_info: VmInfo,
    pub state: SandboxState,
    vm: Box<dyn Hypervisor>,
    log: Logger,
    debug: bool,
}

/// What `create` has done so far, for undoing it.
struct Progress {
    state: SandboxState,
    vm: Option<Box<dyn Hypervisor>>,
}

impl Progress {
    async fn undo(mut self, log: &Logger) {
        if let Some(mut vm) = self.vm.take() {
            stop_vm(vm.as_mut(), &mut self.state, log).await;
        }
        cleanup_host(&self.state, log);
    }
}

/// Stops the VM through its hypervisor. Once that has reaped the processes, their pids
/// are dropped from `state`, so cleanup never signals a pid the system has reused since.
async fn stop_vm(vm: &mut dyn Hypervisor, state: &mut SandboxState, log: &Logger) {
    match vm.stop_vm().await {
        Ok(()) => {
            state.vmm_pid = 0;
            state.helper_pids.clear();
        }
        Err(e) => warn!(log, "stopping the VM"; "error" => %e),
    }
}

/// Unmounts, kills and removes everything `state` records. Used after a failed create,
/// at sandbox teardown, and by `delete` after a crashed shim.
pub fn cleanup_host(state: &SandboxState, log: &Logger) {
    let mut pids: Vec<i32> = state.helper_pids.clone();
    if state.vmm_pid > 0 {
        pids.insert(0, state.vmm_pid);
    }
    pids.retain(|p| *p > 0);
    if !pids.is_empty() {
        hypervisor::kill_and_reap(&pids, Duration::from_secs(2));
    }
    mount::unmount_all(&state.mounts);
    let share = SharedDirs::for_sandbox(&state.sandbox_id);
    for m in mount::mounts_under(&share.base) {
        mount::unmount(&m);
    }
    let mut dirs = state.dirs.clone();
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    for d in dirs {
        if let Err(e) = mount::remove_dir_if_unmounted(&d) {
            warn!(log, "removing sandbox directory"; "path" => d.display(), "error" => %e);
        }
    }
    if let Err(e) = SandboxState::remove(&state.sandbox_id) {
        warn!(log, "removing sandbox state"; "error" => %e);
    }
}

fn mkdir(path: &Path) -> Result<(), SandboxError> {
    std::fs::create_dir_all(path).map_err(|source| SandboxError::Dir {
        path: path.to_path_buf(),
        source,
    })
}

impl Sandbox {
    /// Boots the VM for sandbox `id` and connects to its agent.
    pub async fn create(
        id: &str,
        cfg: &kata_config::Config,
        log: &Logger,
    ) -> Result<Sandbox, SandboxError> {
        let t0 = Instant::now();
        let shared = SharedDirs::for_sandbox(id);
        let run_dir = Path::new(VM_RUN_ROOT).join(id);
        let mut progress = Progress {
            state: SandboxState {
                sandbox_id: id.to_string(),
                shim_pid: std::process::id(),
                dirs: vec![shared.base.clone(), run_dir.clone(), persist::state_dir(id)],
                ..Default::default()
            },
            vm: None,
        };
        match Self::create_steps(id, cfg, log, &shared, &run_dir, &mut progress, t0).await {
            Ok((agent, vm_info)) => {
                let vm = progress
                    .vm
                    .take()
                    .ok_or_else(|| SandboxError::Vm("VM handle lost".into()))?;
                Ok(Sandbox {
                    agent,
                    shared,
                    vm_info,
                    state: progress.state,
                    vm,
                    log: log.clone(),
                    debug: cfg.runtime.enable_debug,
                })
            }
            Err(e) => {
                warn!(log, "sandbox create failed, undoing"; "error" => %e);
                progress.undo(log).await;
                Err(e)
            }
        }
    }

    async fn create_steps(
        id: &str,
        cfg: &kata_config::Config,
        log: &Logger,
        shared: &SharedDirs,
        run_dir: &Path,
        progress: &mut Progress,
        t0: Instant,
    ) -> Result<(Agent, VmInfo), SandboxError> {
        progress.state.save().map_err(SandboxError::Persist)?;
        let made = shared.setup()?;
        progress.state.mounts.extend(made);
        mkdir(run_dir)?;
        progress.state.save().map_err(SandboxError::Persist)?;

        let mut vm = hypervisor::new_hypervisor(cfg, log.clone());
        let vm_cfg = VmConfig {
            sandbox_id: id.to_string(),
            run_dir: run_dir.to_path_buf(),
            shared_dir: shared.shared.clone(),
            debug: cfg.runtime.enable_debug,
        };
        let started = vm.start_vm(&vm_cfg).await;
        // Kept even when the start failed: undo stops whatever it had started.
        progress.vm = Some(vm);
        let info = started.map_err(|e| SandboxError::Vm(e.to_string()))?;
        progress.state.vmm_pid = info.vmm_pid;
        progress.state.helper_pids = info.helper_pids.clone();
        progress.state.save().map_err(SandboxError::Persist)?;
        debug!(log, "phase: VMM launched"; "elapsed_ms" => t0.elapsed().as_millis() as u64,
            "vmm_pid" => info.vmm_pid, "accelerator" => &info.accelerator);

        let timeout = cfg.agent.kata.dial_timeout.max(Duration::from_secs(1));
        let (agent, check) = Agent::dial(
            &info.agent_socket,
            protocols::AGENT_VSOCK_PORT,
            timeout,
            info.vmm_pid,
        )
        .await
        .map_err(|e| {
            let mut tail = hypervisor::process::log_tail(&info.console_log);
            if matches!(e, AgentError::VmmExited { .. }) {
                tail.push_str(&format!(
                    "\nlast lines of the VMM's log {}:\n{}",
                    info.vmm_log.display(),
                    hypervisor::process::log_tail(&info.vmm_log)
                ));
            }
            SandboxError::Agent(e, tail)
        })?;
        info!(log, "phase: agent reachable"; "elapsed_ms" => t0.elapsed().as_millis() as u64,
            "guest_kernel" => &check.kernel_release, "agent_version" => &check.agent_version);
        Ok((agent, info))
    }

    pub fn save(&self) {
        if let Err(e) = self.state.save() {
            warn!(self.log, "recording sandbox state"; "error" => %e);
        }
    }

    /// Ends the VM and removes every trace of the sandbox from the host.
    pub async fn destroy(mut self) {
        // Best effort: a clean guest reset first, then the hypervisor stops what is left.
        let _ = tokio::time::timeout(Duration::from_secs(2), self.agent.destroy_sandbox()).await;
        stop_vm(self.vm.as_mut(), &mut self.state, &self.log).await;
        if self.debug {
            let tail = hypervisor::process::log_tail(&self.vm_info.console_log);
            debug!(self.log, "guest console (last lines)"; "console" => tail);
        }
        cleanup_host(&self.state, &self.log);
        info!(self.log, "sandbox destroyed");
    }

    /// The host pid containerd sees for every task of this sandbox (the VMM's, as Kata).
    pub fn task_pid(&self) -> u32 {
        self.vm_info.vmm_pid.max(0) as u32
    }
}
