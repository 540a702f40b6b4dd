//! One VM sandbox: its share on the host, its VM and the agent inside it, from boot to
//! teardown.
//!
//! - Creation is all or nothing: a failure at any step undoes the steps before it
//!   ([`Progress::undo`]), so a failed create leaves no process, mount or directory.
//! - With `[factory] vm_cache_number` above 0, creation first claims a booted VM from the
//!   pool the VM factory keeps (`Sandbox::create_pooled`): its processes, uid claim,
//!   host cgroup, priority and tap are handed over to the sandbox, and the guest takes
//!   the pod's network. No ready VM of this configuration, a pod with other than one
//!   interface, or a failed hand-over (undone): the sandbox boots its own VM.
//! - Every guest gets 64 random bytes of the host's at CreateSandbox, mixed into its
//!   entropy pool before any container runs.
//! - While it runs, a watchdog waits on the VMM and its helpers. When one of them dies
//!   (or the guest powers off or panics, which ends the VMM), the sandbox *ends*: the
//!   agent client fails every request at once, the remaining helpers are stopped, and
//!   [`Sandbox::ended`] tells the Task service, which reports every process exited.
//! - [`Sandbox::destroy`] removes every trace from the host; it is idempotent, and safe
//!   after the sandbox ended.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hypervisor::{Hypervisor, VmInfo};
use slog::{debug, error, info, warn, Logger};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::block;
use crate::cgroup;
use crate::host_mounts::{HostMounts, HostSetupError, RealHostMounts};
use crate::mount::{self, SharedDirs};
use crate::network;
use crate::network::port_forward::PortForward;
use crate::oom_kill;
use crate::persist::SandboxState;
use crate::spec::SandboxSpec;
use crate::watchdog::{self, Watched};
use agent_client::{Agent, AgentError, KataAgent};

mod adopt;
mod boot;
mod undo;
mod update;

pub use boot::LaunchError;
pub use undo::cleanup_host;
use undo::{stop_vm, Progress};
pub use update::UpdateError;

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
    Agent(AgentError, String),
    #[error("recording sandbox state: {0}")]
    Persist(std::io::Error),
    #[error("placing the sandbox in its host cgroup: {0}")]
    Cgroup(#[from] cgroup::CgroupError),
    #[error("wiring the pod's network to the VM: {0}")]
    Network(#[from] network::NetworkError),
    #[error("setting up the guest for the pod: {0}")]
    Guest(AgentError),
    #[error("reading random bytes for the guest from the host kernel: {0}")]
    Entropy(std::io::Error),
    /// A bug: the boot panicked. What it had made is undone all the same.
    #[error("the boot stopped on a bug ({0}); what it had made on the host is undone; report it with the shim's log")]
    Panicked(String),
}

pub struct Sandbox {
    pub shared: SharedDirs,
    /// Where the guest finds container `<id>`'s rootfs directory `<id>/rootfs`: the
    /// rootfs share's mount when the VM has one, else the share's.
    pub guest_rootfs_root: &'static str,
    agent: Arc<dyn Agent>,
    /// The host pid containerd sees for the sandbox container's task: the VMM's (the
    /// pod's other containers report their own, see [`crate::pid_anchor`]).
    task_pid: u32,
    console_log: Option<PathBuf>,
    /// What `delete` needs after a crashed shim; saved on every change when `persist`.
    state: Mutex<SandboxState>,
    persist: bool,
    /// None once stopped (or in tests, where there is no VM).
    vm: tokio::sync::Mutex<Option<Box<dyn Hypervisor>>>,
    /// Why the VM ended on its own, once it has.
    ended: watch::Sender<Option<String>>,
    watchdog: Mutex<Option<JoinHandle<()>>>,
    /// The host end of port-forward, for pods with a network namespace.
    port_forward: Mutex<Option<PortForward>>,
    /// The pod's host cgroup the VMM and helpers run in (none without `cgroupsPath`).
    host_cgroup: cgroup::HostCgroup,
    /// Its memory cgroup and the OOM kills counted there before the VM ran.
    oom_watch: Option<(oom_kill::MemoryCgroup, u64)>,
    /// What the VM needs, for the reason an OOM kill of the VMM is given.
    pod_memory: Mutex<oom_kill::PodMemory>,
    /// Why the VM ended when the host's OOM killer killed the VMM in the pod's cgroup.
    oom_reason: std::sync::OnceLock<String>,
    /// What the VM may become on an in-place resize, and its size now (none until the
    /// launcher sets it, and in tests).
    room: Mutex<Option<(crate::resize::Room, crate::resize::Needed)>>,
    /// Where containers' rootfs and binds are mounted on the share (the host's mount
    /// table; nothing in the task service's unit tests).
    host_mounts: Box<dyn HostMounts>,
    log: Logger,
    debug: bool,
}

/// The host side of a container [`Sandbox::create_container`] made: its mounts on the
/// share, and its directory there.
pub struct HostContainer {
    pub mounts: Vec<PathBuf>,
    pub share_dir: PathBuf,
    /// Host block devices attached to the VM for it (the hypervisor's ids).
    pub block_devices: Vec<String>,
}

/// Why a container could not be created in the sandbox.
#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    /// Its rootfs or a bind could not be mounted on the share: the request's to fix.
    #[error(transparent)]
    Host(#[from] HostSetupError),
    #[error("encoding the container's OCI spec for the guest: {0}")]
    Spec(serde_json::Error),
    /// A block device of its spec cannot be attached to the VM.
    #[error("container {id}: {why}")]
    Device { id: String, why: String },
    /// The agent refused or failed the create.
    #[error(transparent)]
    Guest(AgentError),
}

/// A sandbox's VM once it is up and its agent answered, cold or adopted from the pool.
struct Up {
    shared: SharedDirs,
    agent: KataAgent,
    info: VmInfo,
    /// With the VM's handle.
    progress: Progress,
    watched: Vec<Watched>,
    /// Started by the VM factory, not by this shim (watched by pidfd).
    adopted: bool,
}

impl Sandbox {
    /// The sandbox around a VM that is up and whose agent answered: watched, and with
    /// port-forward for a pod with a network.
    async fn running(
        up: Up,
        cfg: &kata_config::Config,
        spec: &SandboxSpec,
        log: &Logger,
    ) -> Arc<Sandbox> {
        let oom_watch = oom_kill::MemoryCgroup::among(&up.progress.host_cgroup.dirs).map(|cg| {
            let before = cg.oom_kills();
            (cg, before)
        });
        let vm_mib = if cfg.runtime.hypervisor_name == kata_config::HypervisorName::Builtin {
            cfg.hypervisor.builtin.default_memory
        } else {
            cfg.hypervisor.qemu.default_memory
        };
        let pod_memory = oom_kill::PodMemory {
            vm_mib: u64::from(vm_mib),
            limits_bytes: spec
                .resources
                .memory
                .as_deref()
                .and_then(|m| m.trim().parse().ok())
                .unwrap_or(0),
        };
        let sb = Arc::new(Sandbox {
            shared: up.shared,
            guest_rootfs_root: hypervisor::guest_rootfs_root(cfg),
            agent: Arc::new(up.agent),
            task_pid: up.info.vmm_pid.max(0) as u32,
            console_log: Some(up.info.console_log.clone()),
            state: Mutex::new(up.progress.state),
            persist: true,
            vm: tokio::sync::Mutex::new(up.progress.vm),
            ended: watch::channel(None).0,
            watchdog: Mutex::new(None),
            port_forward: Mutex::new(None),
            host_cgroup: up.progress.host_cgroup,
            oom_watch,
            pod_memory: Mutex::new(pod_memory),
            oom_reason: std::sync::OnceLock::new(),
            room: Mutex::new(None),
            host_mounts: Box::new(RealHostMounts),
            log: log.clone(),
            debug: cfg.runtime.enable_debug,
        });
        sb.start_watchdog(up.watched, up.adopted);
        if let Some(netns) = &spec.netns {
            sb.start_port_forward(netns, up.info.agent_socket.clone())
                .await;
        }
        sb
    }

    /// A sandbox without a VM around `agent`, sharing from `shared`, for unit tests:
    /// containers' mounts are only directories ([`crate::host_mounts::DirsOnly`]), so the
    /// tests run without root. Its host cgroup is `cgroup_dirs` (test trees of cgroup
    /// files, for the host OOM killer's counters; none: no cgroup).
    #[cfg(any(test, feature = "test-utils"))]
    pub fn for_test_in(
        id: &str,
        agent: Arc<dyn Agent>,
        shared: SharedDirs,
        cgroup_dirs: &[PathBuf],
    ) -> Arc<Sandbox> {
        let oom_watch = oom_kill::MemoryCgroup::among(cgroup_dirs).map(|cg| {
            let before = cg.oom_kills();
            (cg, before)
        });
        Arc::new(Sandbox {
            state: Mutex::new(SandboxState {
                sandbox_id: id.to_string(),
                dirs: vec![shared.base.clone()],
                ..Default::default()
            }),
            shared,
            guest_rootfs_root: protocols::GUEST_SHARED_DIR,
            agent,
            task_pid: 4242,
            console_log: None,
            persist: false,
            vm: tokio::sync::Mutex::new(None),
            ended: watch::channel(None).0,
            watchdog: Mutex::new(None),
            port_forward: Mutex::new(None),
            host_cgroup: cgroup::HostCgroup::default(),
            oom_watch,
            pod_memory: Mutex::new(oom_kill::PodMemory {
                vm_mib: 358,
                limits_bytes: 256 << 20,
            }),
            oom_reason: std::sync::OnceLock::new(),
            room: Mutex::new(None),
            host_mounts: Box::new(crate::host_mounts::DirsOnly),
            log: hypervisor::discard_logger(),
            debug: false,
        })
    }

    pub fn agent(&self) -> Arc<dyn Agent> {
        self.agent.clone()
    }

    pub fn task_pid(&self) -> u32 {
        self.task_pid
    }

    /// Resolves once the VM has ended on its own; yields the cause.
    pub fn ended(&self) -> watch::Receiver<Option<String>> {
        self.ended.subscribe()
    }

    /// Why the VM ended on its own, if it has.
    pub fn end_cause(&self) -> Option<String> {
        self.ended.borrow().clone()
    }

    /// Serves port-forward into the guest from the pod's network namespace. Without it
    /// the pod runs on; only port-forward is missing, which the log says.
    async fn start_port_forward(&self, netns: &Path, agent_socket: PathBuf) {
        match PortForward::start(netns, agent_socket, self.log.clone()).await {
            Ok(pf) => {
                {
                    let mut state = self.lock_state();
                    if let Some(net) = state.network.as_mut() {
                        net.port_forward = Some(pf.redirect);
                    }
                    self.save_locked(&state);
                }
                if let Ok(mut slot) = self.port_forward.lock() {
                    *slot = Some(pf);
                }
            }
            Err(e) => warn!(self.log, "port-forward into this pod will not work"; "error" => %e),
        }
    }

    /// Watches the VM's processes: the shim's children through its reaper, others' (a
    /// pooled VM's, `of_others`) through pidfds.
    fn start_watchdog(self: &Arc<Self>, watched: Vec<Watched>, of_others: bool) {
        let sb = Arc::downgrade(self);
        let task = tokio::spawn(async move {
            let cause = if of_others {
                watchdog::first_exit_of_others(watched).await
            } else {
                watchdog::first_exit(watched).await
            };
            if let Some(sb) = sb.upgrade() {
                sb.vm_ended(&cause).await;
            }
        });
        if let Ok(mut w) = self.watchdog.lock() {
            *w = Some(task);
        }
    }

    /// The VM ended on its own (`cause` says how): every agent request fails from now on,
    /// what is left of the VM is stopped, and whoever watches [`Sandbox::ended`] is told.
    /// Mounts stay until the containers are deleted.
    pub async fn vm_ended(&self, cause: &str) {
        let tail = self
            .console_log
            .as_deref()
            .map(hypervisor::process::log_tail)
            .unwrap_or_default();
        let cause = match self.oom_killed(cause) {
            Some(reason) => {
                error!(self.log, "the host's OOM killer ended the sandbox's VM: {reason}";
                    "cgroup_oom" => true);
                let _ = self.oom_reason.set(reason.clone());
                reason
            }
            None => cause.to_string(),
        };
        error!(self.log, "the sandbox VM is gone; every process of its containers is reported exited";
            "cause" => &cause, "console" => tail);
        // Told before the agent fails its requests: a process whose wait fails then finds
        // how the VM ended.
        self.ended.send_replace(Some(cause.clone()));
        self.agent.disconnect(&cause);
        self.stop_vm().await;
    }

    /// The reason the VM ended when the sandbox's memory cgroup counted an OOM kill
    /// since the VM ran (the VMM killed, or a helper, whichever ended first).
    fn oom_killed(&self, cause: &str) -> Option<String> {
        let (cg, before) = self.oom_watch.as_ref()?;
        let kill = cg.kill_since(*before)?;
        Some(oom_kill::reason(
            &kill,
            &oom_kill::victim(cause),
            &self.pod_memory.lock().unwrap_or_else(|e| e.into_inner()),
        ))
    }

    /// Why the VM ended, when the host's OOM killer ended it (see [`oom_kill`]).
    pub fn oom_reason(&self) -> Option<String> {
        self.oom_reason.get().cloned()
    }

    async fn stop_vm(&self) {
        let mut vm = self.vm.lock().await;
        if let Some(mut v) = vm.take() {
            let mut copy = self.lock_state().clone();
            stop_vm(v.as_mut(), &mut copy, &self.log).await;
            let mut state = self.lock_state();
            state.vmm_pid = copy.vmm_pid;
            state.helper_pids = copy.helper_pids;
            self.save_locked(&state);
        }
    }

    /// Whether the sandbox runs on a VM claimed from the factory's pool.
    pub fn pooled(&self) -> bool {
        self.lock_state().pooled.is_some()
    }

    fn lock_state(&self) -> std::sync::MutexGuard<'_, SandboxState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn save_locked(&self, state: &SandboxState) {
        if self.persist {
            if let Err(e) = state.save() {
                warn!(self.log, "recording sandbox state"; "error" => %e);
            }
        }
    }

    /// The pids of the VM's helper processes (virtiofsd, the vsock backend).
    pub fn helper_pids(&self) -> Vec<i32> {
        self.lock_state().helper_pids.clone()
    }

    /// Records host mounts made for a container, so a crashed shim's `delete` finds them.
    pub fn add_mounts(&self, mounts: &[PathBuf]) {
        let mut state = self.lock_state();
        state.mounts.extend(mounts.iter().cloned());
        self.save_locked(&state);
    }

    /// Forgets host mounts that were undone.
    fn remove_mounts(&self, mounts: &[PathBuf]) {
        let mut state = self.lock_state();
        state.mounts.retain(|m| !mounts.contains(m));
        self.save_locked(&state);
    }

    /// Creates container `id` in the sandbox, all or nothing: its rootfs (containerd's
    /// `rootfs` mounts, else the bundle's) and `binds` on the share, recorded for a
    /// crashed shim's `delete`; the host block devices of its spec attached to the VM;
    /// `spec` pointed at the guest's view of them; then the agent's CreateContainer.
    #[allow(clippy::too_many_arguments)]
    pub async fn create_container(
        &self,
        id: &str,
        bundle: &Path,
        rootfs: &[crate::spec::RootfsMount],
        guest_mounts: &crate::spec::GuestMounts,
        mut spec: serde_json::Value,
        stdin: bool,
        pod_sandbox: bool,
    ) -> Result<HostContainer, ContainerError> {
        // Checked before anything is made: a bad entry leaves nothing to undo.
        let devices = block::spec_block_devices(&spec).map_err(|e| ContainerError::Device {
            id: id.to_string(),
            why: e.to_string(),
        })?;
        let share_dir = self.shared.mounts.join(id);
        let serving = mount::serving_namespaces(&self.helper_pids());
        let (rootfs, idmapped) = crate::spec::rootfs_without_idmap(rootfs);
        crate::spec::mark_rootfs_idmap(&mut spec, idmapped);
        let mounts = self
            .host_mounts
            .setup(bundle, &rootfs, &share_dir, &guest_mounts.binds, &serving)
            .await?;
        self.add_mounts(&mounts);
        let mut made = HostContainer {
            mounts,
            share_dir,
            block_devices: Vec::new(),
        };
        let created = async {
            if idmapped {
                // containerd's snapshotter gave the snapshot's top directory to the
                // container's root on the host (its mapped uid); mapped again in the guest,
                // that would be no uid of the container: the guest maps uid 0 to its root.
                let top = bundle.join("rootfs");
                std::os::unix::fs::lchown(&top, Some(0), Some(0)).map_err(|e| {
                    ContainerError::Host(HostSetupError::Rootfs {
                        target: top.clone(),
                        detail: format!("giving the ID-mapped snapshot's top to uid 0: {e}"),
                    })
                })?;
            }
            let wire = self
                .attach_block_devices(id, &devices, &mut made.block_devices)
                .await?;
            crate::spec::set_guest_rootfs(&mut spec, self.guest_rootfs_root, id);
            let oci_spec = serde_json::to_vec(&spec).map_err(ContainerError::Spec)?;
            self.agent
                .create_container(protocols::agent::CreateContainerRequest {
                    container_id: id.to_string(),
                    oci_spec,
                    stdin,
                    pod_sandbox,
                    block_devices: wire,
                    pod_local_volumes: guest_mounts.pod_local.clone(),
                    watched_volumes: guest_mounts.watched.clone(),
                    ..Default::default()
                })
                .await
                .map_err(ContainerError::Guest)
        }
        .await;
        match created {
            Ok(()) => Ok(made),
            Err(e) => {
                self.remove_block_devices(id, &made.block_devices).await;
                self.remove_container_host(&made.mounts, &made.share_dir);
                Err(e)
            }
        }
    }

    /// Attaches each of `devices` to the VM, its id in `attached` as soon as it is;
    /// returns what the agent needs to find them.
    async fn attach_block_devices(
        &self,
        id: &str,
        devices: &[block::SpecBlockDevice],
        attached: &mut Vec<String>,
    ) -> Result<Vec<protocols::agent::BlockDevice>, ContainerError> {
        if devices.is_empty() {
            return Ok(Vec::new());
        }
        let failed = |d: &block::SpecBlockDevice, why: String| ContainerError::Device {
            id: id.to_string(),
            why: format!("{d} cannot be given to the container: {why}"),
        };
        let mut vm = self.vm.lock().await;
        let Some(vm) = vm.as_mut() else {
            return Err(ContainerError::Device {
                id: id.to_string(),
                why: "its block devices cannot be attached: the sandbox's VM is not running".into(),
            });
        };
        let mut wire = Vec::new();
        for d in devices {
            let file = block::open_host_device(d).map_err(|e| ContainerError::Device {
                id: id.to_string(),
                why: e.to_string(),
            })?;
            let disk = vm
                .add_block_device(file, d.read_only)
                .await
                .map_err(|e| failed(d, e.to_string()))?;
            info!(self.log, "block device attached to the VM"; "container" => id,
                "container_path" => &d.container_path, "host_device" => format!("{}:{}", d.major, d.minor),
                "read_only" => d.read_only, "device" => &disk.id, "scsi_address" => disk.scsi_address());
            attached.push(disk.id.clone());
            wire.push(protocols::agent::BlockDevice {
                container_path: d.container_path.clone(),
                scsi_address: disk.scsi_address(),
                ..Default::default()
            });
        }
        Ok(wire)
    }

    /// Detaches container `id`'s block devices from the VM (nothing to do once it is
    /// gone: its end took them along).
    pub async fn remove_block_devices(&self, id: &str, devices: &[String]) {
        if devices.is_empty() {
            return;
        }
        let mut vm = self.vm.lock().await;
        let Some(vm) = vm.as_mut() else {
            return;
        };
        for dev in devices {
            match vm.remove_block_device(dev).await {
                Ok(()) => {
                    info!(self.log, "block device detached from the VM"; "container" => id, "device" => dev)
                }
                Err(e) => {
                    warn!(self.log, "detaching a block device from the VM"; "container" => id, "device" => dev, "error" => %e)
                }
            }
        }
    }

    /// Undoes the host side of a container (its mounts on the share).
    pub fn remove_container_host(&self, mounts: &[PathBuf], share_dir: &Path) {
        self.host_mounts.teardown(mounts, share_dir);
        self.remove_mounts(mounts);
    }

    /// Ends the VM and removes every trace of the sandbox from the host. Idempotent.
    pub async fn destroy(&self) {
        if let Some(w) = self.watchdog.lock().ok().and_then(|mut w| w.take()) {
            w.abort();
        }
        drop(self.port_forward.lock().ok().and_then(|mut p| p.take()));
        if self.end_cause().is_none() {
            // Best effort: a clean guest power-off first, then the hypervisor stops the rest.
            let _ = self.agent.destroy_sandbox().await;
        }
        // Ends the long polls still pending (OOM events, relays of unwaited processes).
        self.agent.disconnect("the sandbox was destroyed");
        // What the VM cost the host, while its processes still count.
        let figures = crate::stats::host_figures(&self.host_cgroup);
        if let (Some(f), Some(dir)) = (figures, self.host_cgroup.dirs.first()) {
            info!(self.log, "the sandbox's host cgroup at teardown";
                "cgroup" => dir.display(),
                "cpu_usage_usec" => f.cpu_usage_usec, "memory_usage_bytes" => f.memory_usage,
                "memory_limit_bytes" => f.memory_usage_limit, "pids" => f.pids_current,
                "oom_kills" => f.memory_events_oom_kill);
        }
        self.stop_vm().await;
        if self.debug {
            if let Some(log) = &self.console_log {
                let tail = hypervisor::process::log_tail(log);
                debug!(self.log, "guest console (last lines)"; "console" => tail);
            }
        }
        let state = self.lock_state().clone();
        cleanup_host(&state, &self.log).await;
        info!(self.log, "sandbox destroyed");
    }
}
