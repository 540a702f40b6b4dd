//! The cold way to a running sandbox: its share, host cgroup and pod network, the VM
//! booted for it, and the guest reached ([`connect_guest`], which the adoption of a
//! pooled VM shares).

use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hypervisor::{VmConfig, VmInfo};
use slog::{debug, info, warn, Logger};

use super::undo::{mkdir, Progress};
use super::{Sandbox, SandboxError, Up};
use crate::cgroup;
use crate::mount::SharedDirs;
use crate::network::PodNetwork;
use crate::persist::{self, SandboxState};
use crate::spec::SandboxSpec;
use crate::watchdog::{self, Watched};
use agent_client::{Agent, AgentError, KataAgent};
use futures::FutureExt;

/// Reaches the agent of a VM that runs, booted now or claimed from the pool (`info`), and
/// makes the guest the pod's: `request` (hostname, network) with fresh entropy. Fails
/// early, with the VMM's last words, when one of `watched` exits meanwhile.
pub(super) async fn connect_guest(
    cfg: &kata_config::Config,
    log: &Logger,
    info: &VmInfo,
    watched: &[Watched],
    mut request: protocols::agent::CreateSandboxRequest,
    t0: Instant,
) -> Result<KataAgent, SandboxError> {
    let timeout = cfg.agent.kata.dial_timeout.max(Duration::from_secs(1));
    let (agent, check) = KataAgent::dial(
        &info.agent_socket,
        protocols::AGENT_VSOCK_PORT,
        timeout,
        || watchdog::exited(watched),
    )
    .await
    .map_err(|e| {
        let mut tail = hypervisor::process::log_tail(&info.console_log);
        if matches!(e, AgentError::VmExited { .. }) {
            tail.push_str(&format!(
                "\nlast lines of the VMM's log {}:\n{}",
                info.vmm_log.display(),
                hypervisor::process::log_tail(&info.vmm_log)
            ));
        }
        SandboxError::Agent(e, tail)
    })?;
    info!(log, "phase: agent reachable"; "phase" => "agent reachable", "elapsed_ms" => t0.elapsed().as_millis() as u64,
        "guest_kernel" => &check.kernel_release, "agent_version" => &check.agent_version);
    crate::metrics::METRICS.phase("agent_reachable");
    request.entropy = crate::pooled::entropy().map_err(SandboxError::Entropy)?;
    agent
        .create_sandbox(request)
        .await
        .map_err(SandboxError::Guest)?;
    Ok(agent)
}

/// What a panic said, from its payload.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

/// Why a sandbox could not be launched.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The pod's resources cannot be met or read.
    #[error(transparent)]
    Size(#[from] crate::sizing::SizingError),
    /// The VM did not come up.
    #[error(transparent)]
    Boot(#[from] SandboxError),
}

impl Sandbox {
    /// Sizes the VM for the pod (`cfg` is the RuntimeClass's configuration), boots it (or
    /// takes a pooled one) and sets how far an in-place resize may take it.
    pub async fn launch(
        id: &str,
        cfg: kata_config::Config,
        spec: &SandboxSpec,
        log: &Logger,
    ) -> Result<Arc<Sandbox>, LaunchError> {
        let (cfg, size) = crate::sizing::apply(cfg, &spec.resources)?;
        info!(log, "sandbox size: {} vCPUs, {} MiB", size.vcpus, size.memory_mib;
            "vcpus" => size.vcpus, "memory_mib" => size.memory_mib, "why" => &size.why);
        crate::metrics::METRICS.set_vm_size(size.vcpus, size.memory_mib);
        let sandbox = Sandbox::create(id, &cfg, spec, log).await?;
        let mut room = crate::resize::Room::of_config(&cfg);
        if sandbox.pooled() {
            // A pooled VM is the pool's size (this pod's, or it would not have been
            // claimed) and keeps it: the hand-over gives the shim no balloon to work.
            room.resize_vcpus = 0;
            room.resize_memory_mib = 0;
        }
        sandbox.set_room(room);
        Ok(sandbox)
    }

    /// Boots the VM for sandbox `id`, connects to its agent and starts watching the VM.
    pub async fn create(
        id: &str,
        cfg: &kata_config::Config,
        spec: &SandboxSpec,
        log: &Logger,
    ) -> Result<Arc<Sandbox>, SandboxError> {
        let t0 = Instant::now();
        if cfg.factory.enabled() {
            if let Some(sb) = Self::create_pooled(id, cfg, spec, log, t0).await {
                return Ok(sb);
            }
        }
        let shared = SharedDirs::for_sandbox(id);
        let run_dir = layout::vm_run_root().join(id);
        let mut progress = Progress {
            state: SandboxState {
                sandbox_id: id.to_string(),
                shim_pid: std::process::id(),
                dirs: vec![shared.base.clone(), run_dir.clone(), persist::state_dir(id)],
                ..Default::default()
            },
            vm: None,
            host_cgroup: cgroup::HostCgroup::default(),
        };
        // A panic on the way is a bug, but it must not leave a VM without a sandbox.
        let booted = AssertUnwindSafe(Self::create_steps(
            id,
            cfg,
            spec,
            log,
            &shared,
            &run_dir,
            &mut progress,
            t0,
        ))
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| Err(SandboxError::Panicked(panic_text(panic.as_ref()))));
        let (agent, info, watched) = match booted {
            Ok(up) => up,
            Err(e) => {
                warn!(log, "sandbox create failed, undoing"; "error" => %e);
                progress.undo(log).await;
                return Err(e);
            }
        };
        let up = Up {
            shared,
            agent,
            info,
            progress,
            watched,
            adopted: false,
        };
        Ok(Self::running(up, cfg, spec, log).await)
    }

    #[allow(clippy::too_many_arguments)]
    async fn create_steps(
        id: &str,
        cfg: &kata_config::Config,
        spec: &SandboxSpec,
        log: &Logger,
        shared: &SharedDirs,
        run_dir: &Path,
        progress: &mut Progress,
        t0: Instant,
    ) -> Result<(KataAgent, VmInfo, Vec<Watched>), SandboxError> {
        progress.state.save().map_err(SandboxError::Persist)?;
        let made = shared.setup()?;
        progress.state.mounts.extend(made);
        mkdir(run_dir)?;
        progress.state.save().map_err(SandboxError::Persist)?;

        if let Some(path) = &spec.cgroups_path {
            progress.enter_host_cgroup(path)?;
        }
        let mut pod_network = None;
        if let Some(netns) = &spec.netns {
            let net = PodNetwork::setup(netns).await?;
            progress.state.network = Some(net.state.clone());
            progress.state.save().map_err(SandboxError::Persist)?;
            debug!(log, "pod network wired"; "netns" => netns.display(),
                "endpoints" => format!("{:?}", net.state.endpoints));
            pod_network = Some(net);
        }

        let mut vm = hypervisor::new_hypervisor(cfg, log.clone());
        let vm_cfg = VmConfig {
            sandbox_id: id.to_string(),
            run_dir: run_dir.to_path_buf(),
            shared_dir: shared.shared.clone(),
            debug: cfg.runtime.enable_debug,
            netns: pod_network.as_ref().map(|n| n.state.netns.clone()),
            net: pod_network
                .as_ref()
                .map(PodNetwork::nics)
                .unwrap_or_default(),
            cgroup: progress.host_cgroup.dirs.clone(),
        };
        let started = vm.start_vm(&vm_cfg).await;
        // Kept even when the start failed: undo stops whatever it had started.
        progress.vm = Some(vm);
        let info = started.map_err(|e| SandboxError::Vm(e.to_string()))?;
        progress.state.vmm_pid = info.vmm_pid;
        progress.state.helper_pids = info.helper_pids.clone();
        progress.state.save().map_err(SandboxError::Persist)?;
        // Named now, while they run: a name read after a death says nothing.
        let mut watched = vec![Watched::vmm(info.vmm_pid)];
        watched.extend(info.helper_pids.iter().map(|&p| Watched::helper(p)));
        info!(log, "phase: VMM launched"; "phase" => "VMM launched", "elapsed_ms" => t0.elapsed().as_millis() as u64,
            "vmm_pid" => info.vmm_pid, "accelerator" => &info.accelerator);
        crate::metrics::METRICS.phase("vmm_launched");

        // The guest becomes the pod's: its own randomness, hostname and network.
        let request = match &pod_network {
            Some(net) => net.sandbox_request(&spec.hostname),
            None => protocols::agent::CreateSandboxRequest {
                hostname: spec.hostname.clone(),
                ..Default::default()
            },
        };
        let agent = connect_guest(cfg, log, &info, &watched, request, t0).await?;
        Ok((agent, info, watched))
    }
}
