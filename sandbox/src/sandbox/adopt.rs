//! The pooled way to a running sandbox: a VM the factory booted earlier is claimed from
//! the pool and handed over (its uid, host cgroup, priority and tap), and the guest takes
//! the pod's network through [`super::boot::connect_guest`]. Any failure undoes the
//! hand-over and the sandbox boots cold.

use std::sync::Arc;
use std::time::Instant;

use slog::{debug, info, warn, Logger};

use super::boot::connect_guest;
use super::undo::Progress;
use super::{Sandbox, SandboxError, Up};
use crate::cgroup;
use crate::network::{PodNetwork, PodScan};
use crate::persist::{self, SandboxState};
use crate::pool;
use crate::spec::SandboxSpec;
use crate::watchdog::Watched;
use agent_client::KataAgent;

impl Sandbox {
    /// Starts sandbox `id` on a VM of the pool (issue 30), when one fits: None when the
    /// pool has no ready VM of this configuration, the pod has other than one network
    /// interface, or the adoption failed (undone then; the log says why). The caller
    /// then boots cold.
    pub(super) async fn create_pooled(
        id: &str,
        cfg: &kata_config::Config,
        spec: &SandboxSpec,
        log: &Logger,
        t0: Instant,
    ) -> Option<Arc<Sandbox>> {
        let dir = cfg.factory.vm_cache_dir.clone();
        let key = pool::pool_key(cfg);
        // An empty pool (its factory stopped, or drained by a burst of starts) costs a
        // look at one directory, not a read of the pod's network.
        let ready = pool::ready_dir(&dir, &key);
        if !std::fs::read_dir(&ready).is_ok_and(|mut d| d.next().is_some()) {
            info!(log, "booting cold: no ready VM in the pool"; "pool" => ready.display());
            return None;
        }
        let pod = match &spec.netns {
            None => None,
            Some(netns) => match PodScan::read(netns).await {
                Ok(pod) if pod.interfaces() == 1 => Some(pod),
                Ok(pod) => {
                    info!(log, "booting cold: a pooled VM has one NIC and the pod has {} network interfaces", pod.interfaces());
                    return None;
                }
                Err(e) => {
                    info!(log, "booting cold: the pod's network namespace cannot be read"; "error" => %e);
                    return None;
                }
            },
        };
        let claimed = {
            let (dir, key, id) = (dir.clone(), key.clone(), id.to_string());
            tokio::task::spawn_blocking(move || pool::claim(&dir, &key, &id))
                .await
                .ok()
                .flatten()
        };
        let Some(vm) = claimed else {
            info!(log, "booting cold: no ready VM in the pool"; "pool" => ready.display());
            return None;
        };
        info!(log, "phase: VM claimed from pool"; "phase" => "VM claimed from pool",
            "elapsed_ms" => t0.elapsed().as_millis() as u64, "vm" => &vm.id,
            "vmm_pid" => vm.info.vmm_pid);
        let mut progress = Progress {
            state: SandboxState {
                sandbox_id: id.to_string(),
                shim_pid: std::process::id(),
                dirs: vec![
                    vm.shared.base.clone(),
                    vm.run_dir.clone(),
                    persist::state_dir(id),
                ],
                mounts: vm.shared.made.clone(),
                vmm_pid: vm.info.vmm_pid,
                helper_pids: vm.info.helper_pids.clone(),
                pooled: Some(persist::PooledState {
                    vm_id: vm.id.clone(),
                    netns: vm.netns.clone(),
                    claimed: pool::claimed_file(&dir, &key, id),
                }),
                ..Default::default()
            },
            vm: None,
            host_cgroup: cgroup::HostCgroup::default(),
        };
        let adopted = Self::adopt_steps(id, cfg, spec, log, &vm, pod, &mut progress, t0).await;
        let (agent, watched) = match adopted {
            Ok(up) => up,
            Err(e) => {
                warn!(log, "the pooled VM could not be adopted; it is stopped and the sandbox boots cold";
                    "vm" => &vm.id, "error" => %e);
                progress.undo(log).await;
                return None;
            }
        };
        let up = Up {
            shared: vm.shared.dirs(),
            agent,
            info: vm.info.clone(),
            progress,
            watched,
            adopted: true,
        };
        Some(Self::running(up, cfg, spec, log).await)
    }

    /// The hand-over of a claimed pooled VM `vm` to sandbox `id`: its uid claim, host
    /// cgroup and priority, the pod's network, then the guest (reseeded, hostname,
    /// network). Everything done is in `progress` for undoing.
    #[allow(clippy::too_many_arguments)]
    async fn adopt_steps(
        id: &str,
        cfg: &kata_config::Config,
        spec: &SandboxSpec,
        log: &Logger,
        vm: &pool::PooledVm,
        pod: Option<PodScan>,
        progress: &mut Progress,
        t0: Instant,
    ) -> Result<(KataAgent, Vec<Watched>), SandboxError> {
        progress.state.save().map_err(SandboxError::Persist)?;
        // Recorded in persist.json: the claimed file has done its work.
        if let Some(pooled) = &progress.state.pooled {
            let _ = std::fs::remove_file(&pooled.claimed);
        }
        let ids = vm
            .take_over_ids(id)
            .map_err(|e| SandboxError::Vm(e.to_string()))?;
        progress.vm = Some(Box::new(hypervisor::adopted::Adopted::new(
            vm.info.clone(),
            vm.run_dir.clone(),
            ids,
            log.clone(),
        )));
        // Named now, while they run: a name read after a death says nothing.
        let mut watched = vec![Watched::vmm(vm.info.vmm_pid)];
        watched.extend(vm.info.helper_pids.iter().map(|&p| Watched::helper(p)));

        let steps = Instant::now();
        let procs = crate::pooled::processes(&vm.pids());
        // First: the VM runs at full priority from here on (the factory booted it at 19).
        let threads = crate::pooled::renice(&procs, 0);
        let reniced_ms = steps.elapsed().as_secs_f64() * 1e3;
        if let Some(path) = &spec.cgroups_path {
            progress.enter_host_cgroup(path)?;
        }
        let mut pod_network = None;
        if let Some(pod) = pod {
            let net = PodNetwork::adopt(pod, &vm.netns, &vm.tap).await?;
            progress.state.network = Some(net.state.clone());
            progress.state.save().map_err(SandboxError::Persist)?;
            pod_network = Some(net);
        }
        // While the guest is reached: the moves into the pod's cgroup and the removal of
        // the pool's network namespace bind (the tap has moved, or stays unused; the
        // namespace lives on with the VMM alone). Each may wait for an RCU grace period.
        let background = {
            let (dirs, procs, netns) = (
                progress.host_cgroup.dirs.clone(),
                procs.clone(),
                vm.netns.clone(),
            );
            tokio::task::spawn_blocking(move || {
                let at = Instant::now();
                let moved = crate::pooled::move_to_cgroup(&dirs, &procs);
                let moved_ms = at.elapsed().as_secs_f64() * 1e3;
                let mut left = pool::Leftovers::default();
                pool::remove_netns(&netns, &mut left);
                (moved, moved_ms, left)
            })
        };
        info!(log, "phase: VM handed over"; "phase" => "VM handed over",
            "elapsed_ms" => t0.elapsed().as_millis() as u64, "processes" => procs.len());
        crate::metrics::METRICS.phase("vmm_launched");
        let handed_ms = steps.elapsed().as_secs_f64() * 1e3;

        let request = match &pod_network {
            Some(net) => net.pooled_sandbox_request(&spec.hostname, &vm.mac),
            None => protocols::agent::CreateSandboxRequest {
                hostname: spec.hostname.clone(),
                ..Default::default()
            },
        };
        let guest = connect_guest(cfg, log, &vm.info, &watched, request, t0);
        // Both end before this returns, also on failure (undo then removes the cgroup).
        let (background, guest) = tokio::join!(background, guest);
        let (moved, moved_ms, left) =
            background.map_err(|e| SandboxError::Vm(format!("handing the pooled VM over: {e}")))?;
        debug!(log, "pooled VM hand-over steps";
            "renice_ms" => reniced_ms, "threads" => threads,
            "cgroup_and_network_ms" => handed_ms - reniced_ms,
            "cgroup_move_ms" => moved_ms);
        if !left.is_empty() {
            warn!(log, "removing the pooled VM's network namespace"; "error" => %left);
        }
        moved.map_err(|e| SandboxError::Vm(e.to_string()))?;
        let agent = guest?;
        Ok((agent, watched))
    }
}
