//! The sandbox: every container of this guest, and the operations the RPCs delegate to.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use slog::{info, warn, Logger};
use tokio::sync::Mutex;

use crate::cgroup::oom::OomWatcher;
use crate::cgroup::resources::{self, LinuxResources};
use crate::cgroup::CgroupRoot;
use crate::container::{Container, PendingStart};
use crate::error::{refused, AgentError, Result};
use crate::pod_ns::PodNamespaces;
use crate::process::{self, Process};
use crate::reaper::{ExitStatus, Reaper};
use crate::spec::{self, Spec};
use crate::stage::protocol::{StageConfig, StageMode};
use crate::stage::spawner::StageSpawner;
use crate::volume::pod_local::PodVolumes;
use crate::volume::{ContainerVolumes, Requested};

/// How long DestroySandbox waits for the guest's file systems to sync before it answers
/// (the host gives it 2 s in all).
const SYNC_BOUND: std::time::Duration = std::time::Duration::from_secs(1);

pub struct Sandbox {
    pub log: Logger,
    reaper: Arc<Reaper>,
    cgroups: Option<CgroupRoot>,
    oom: OomWatcher,
    containers: Mutex<HashMap<String, Arc<Container>>>,
    /// Where the pod's shared namespaces are kept, and which container they belong to.
    pod_ns: PodNamespaces,
    pod_sandbox: std::sync::Mutex<Option<String>>,
    /// Starts the container stage of every create and exec.
    stages: Arc<StageSpawner>,
    /// The pod's emptyDirs, kept while the guest lives.
    pod_volumes: PodVolumes,
    /// Where containers' watched volume copies and subPath binds are (see `volume`).
    watched_root: PathBuf,
}

/// What a container's create has made so far, taken back in one place when a later step
/// fails. Once the container exists, it owns the rest (its processes, cgroup and devpts
/// instance) and its `destroy` takes everything back.
#[derive(Default)]
struct Made {
    volumes: Option<ContainerVolumes>,
    devpts: Option<PathBuf>,
    cgroup: Option<PathBuf>,
    container: Option<Arc<Container>>,
}

impl Made {
    async fn undo(self, id: &str, log: &Logger, oom: &OomWatcher) {
        if let Some(container) = self.container {
            container.destroy(log, oom).await;
            return;
        }
        if let Some(dir) = &self.cgroup {
            oom.unwatch(id);
            let _ = crate::cgroup::remove(dir).await;
        }
        if let Some(dir) = &self.devpts {
            crate::devpts::unmount_instance(dir);
        }
        if let Some(mut v) = self.volumes {
            v.stop(log);
        }
    }
}

impl Sandbox {
    /// Must run inside the tokio runtime (it starts the OOM watcher task).
    pub fn new(
        log: Logger,
        reaper: Arc<Reaper>,
        cgroups: Option<CgroupRoot>,
        stages: StageSpawner,
    ) -> Sandbox {
        if cgroups.is_none() {
            info!(log, "no cgroup v2 hierarchy; containers get no cgroups");
        }
        Sandbox {
            oom: OomWatcher::start(log.clone()),
            stages: Arc::new(stages),
            log,
            reaper,
            cgroups,
            containers: Mutex::new(HashMap::new()),
            pod_ns: PodNamespaces::default(),
            pod_sandbox: std::sync::Mutex::new(None),
            pod_volumes: PodVolumes::default(),
            watched_root: PathBuf::from(protocols::GUEST_WATCHED_VOLUMES_DIR),
        }
    }

    /// Keeps the pod's namespaces somewhere else than the guest's path (agent tests on the
    /// host).
    pub fn with_pod_namespaces(mut self, pod_ns: PodNamespaces) -> Sandbox {
        self.pod_ns = pod_ns;
        self
    }

    /// Makes the guest the pod's: its hostname and network (see `network`).
    pub async fn create_sandbox(&self, req: &protocols::agent::CreateSandboxRequest) -> Result<()> {
        // First: nothing of the pod runs before the guest's randomness is its own.
        crate::entropy::add(
            std::path::Path::new(crate::entropy::RANDOM_DEVICE),
            &req.entropy,
        )
        .map_err(|e| match e {
            crate::entropy::EntropyError::TooMany(_) => {
                AgentError::InvalidArgument(format!("reseed the guest's RNG: {e}"))
            }
            _ => AgentError::Internal(format!("reseed the guest's RNG: {e}")),
        })?;
        if !req.hostname.is_empty() {
            nix::unistd::sethostname(&req.hostname).map_err(|e| {
                AgentError::InvalidArgument(format!(
                    "set the guest's hostname to {:?}: {e}",
                    req.hostname
                ))
            })?;
        }
        crate::network::configure(&req.interfaces, &req.routes, &req.neighbors)
            .await
            .map_err(|e| match e {
                crate::network::NetworkError::Netlink { .. }
                | crate::network::NetworkError::Socket(_) => {
                    AgentError::Internal(format!("set up the pod's network: {e}"))
                }
                _ => AgentError::InvalidArgument(format!("set up the pod's network: {e}")),
            })?;
        info!(self.log, "sandbox set up"; "hostname" => &req.hostname,
            "entropy_bytes" => req.entropy.len(),
            "interfaces" => req.interfaces.len(), "routes" => req.routes.len(),
            "neighbors" => req.neighbors.len());
        Ok(())
    }

    fn pod_sandbox_is(&self, id: &str) -> bool {
        self.pod_sandbox
            .lock()
            .map(|p| p.as_deref() == Some(id))
            .unwrap_or(false)
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

    /// Gives container `id` its own devpts instance in place of the spec's `/dev/pts`
    /// mount (see `devpts`). Without one (the mount failed), the stage mounts the spec's
    /// and terminals come from the agent's instance.
    fn own_devpts(&self, id: &str, spec: &mut Spec) -> Option<PathBuf> {
        let m = spec
            .mounts
            .iter_mut()
            .find(|m| m.destination == "/dev/pts" && m.typ.as_deref() == Some("devpts"))?;
        match crate::devpts::mount_instance(id) {
            Ok(dir) => {
                m.typ = Some("bind".into());
                m.source = Some(dir.display().to_string());
                m.options = vec!["rbind".into(), "nosuid".into(), "noexec".into()];
                Some(dir)
            }
            Err(e) => {
                warn!(self.log, "no devpts instance of its own for the container"; "container_id" => id, "error" => %e);
                None
            }
        }
    }

    /// Creates container `id`; `pod_sandbox` makes its namespaces the pod's (`pod_ns`);
    /// `volumes` are the spec's mounts the guest keeps itself (`volume`).
    pub async fn create_container(
        &self,
        id: &str,
        spec_json: &[u8],
        stdin: bool,
        pod_sandbox: bool,
        block_devices: &[protocols::agent::BlockDevice],
        volumes: &Requested,
    ) -> Result<()> {
        protocols::id::validate(id)
            .map_err(|e| AgentError::InvalidArgument(format!("container id {e}")))?;
        if self.containers.lock().await.contains_key(id) {
            return Err(AgentError::AlreadyExists(format!(
                "container {id} already exists"
            )));
        }
        let mut spec = Spec::from_json(spec_json)?;
        self.resolve_peer_namespaces(id, &mut spec).await?;
        self.use_block_devices(id, &mut spec, block_devices)
            .await
            .map_err(|e| e.context(&format!("create container {id}")))?;
        crate::stage::preflight(&spec).map_err(refused)?;
        // What the create has made so far, taken back in one place if a later step fails.
        let mut made = Made::default();
        let created = self
            .create_steps(id, spec, stdin, pod_sandbox, volumes, &mut made)
            .await;
        let container = match created {
            Ok(container) => container,
            Err(e) => {
                made.undo(id, &self.log, &self.oom).await;
                return Err(e.context(&format!("create container {id}")));
            }
        };
        info!(self.log, "container created"; "container_id" => id, "pid" => container.init.pid,
            "pod_sandbox" => pod_sandbox);
        Ok(())
    }

    /// Points the namespaces container `id`'s spec names by another container of the
    /// sandbox ([`protocols::GUEST_CONTAINER_NS_DIR`], as the target of `kubectl debug
    /// --target`) at that container's init process.
    async fn resolve_peer_namespaces(&self, id: &str, spec: &mut Spec) -> Result<()> {
        let Some(linux) = spec.linux.as_mut() else {
            return Ok(());
        };
        for ns in linux.namespaces.iter_mut() {
            let Some(named) = ns
                .path
                .as_deref()
                .and_then(|p| p.strip_prefix(protocols::GUEST_CONTAINER_NS_DIR))
            else {
                continue;
            };
            let (peer, typ) = peer_namespace(named).ok_or_else(|| {
                AgentError::InvalidArgument(format!(
                    "container {id}: namespace path {:?} does not name a container's namespace",
                    ns.path
                ))
            })?;
            if typ != ns.typ {
                return Err(AgentError::InvalidArgument(format!(
                    "container {id}: its {} namespace names container {peer}'s {typ} namespace",
                    ns.typ
                )));
            }
            let target = self.containers.lock().await.get(peer).cloned();
            let Some(target) = target else {
                return Err(AgentError::NotFound(format!(
                    "container {id} asks for the {typ} namespace of container {peer}, which is \
                     not in this sandbox"
                )));
            };
            if target.init.exit_status().is_some() {
                return Err(AgentError::FailedPrecondition(format!(
                    "container {id} asks for the {typ} namespace of container {peer}, which has \
                     exited: start it again first"
                )));
            }
            ns.path = Some(format!("/proc/{}/ns/{typ}", target.init.pid));
        }
        Ok(())
    }

    /// Waits for the disks the shim attached for container `id` and gives its spec the
    /// guest's numbers of them (see [`crate::block`]).
    async fn use_block_devices(
        &self,
        id: &str,
        spec: &mut Spec,
        devices: &[protocols::agent::BlockDevice],
    ) -> Result<()> {
        let mut disks = Vec::new();
        for d in devices {
            let (path, address) = (d.container_path.clone(), d.scsi_address.clone());
            let disk = tokio::task::spawn_blocking(move || {
                crate::block::wait_for_disk(
                    &crate::block::sysfs(),
                    &path,
                    &address,
                    crate::block::PROBE_TIMEOUT,
                )
            })
            .await
            .map_err(|e| AgentError::Internal(format!("waiting for a block device: {e}")))??;
            info!(self.log, "block device found"; "container_id" => id,
                "container_path" => &disk.container_path, "disk" => &disk.name,
                "guest_device" => format!("{}:{}", disk.major, disk.minor));
            disks.push(disk);
        }
        crate::block::use_guest_numbers(spec, &disks)
    }

    /// The steps of [`Sandbox::create_container`] after the spec is checked; each records
    /// in `made` what it made.
    async fn create_steps(
        &self,
        id: &str,
        mut spec: Spec,
        stdin: bool,
        pod_sandbox: bool,
        volumes: &Requested,
        made: &mut Made,
    ) -> Result<Arc<Container>> {
        made.volumes = Some(crate::volume::prepare(
            &self.log,
            id,
            &mut spec,
            volumes,
            &self.pod_volumes,
            &self.watched_root,
        )?);
        let seccomp = spec.linux.as_ref().and_then(|l| l.seccomp.clone());
        // A "pid" entry without a path: a new PID namespace, the container's own.
        let own_pid_ns = spec.linux.as_ref().is_some_and(|l| {
            l.namespaces
                .iter()
                .any(|n| n.typ == "pid" && n.path.as_deref().unwrap_or("").is_empty())
        });
        made.devpts = self.own_devpts(id, &mut spec);
        let tty_dir = made
            .devpts
            .clone()
            .unwrap_or_else(|| PathBuf::from("/dev/pts"));
        let terminal = spec
            .process
            .as_ref()
            .is_some_and(|p| p.terminal)
            .then_some(tty_dir.as_path());
        let resources = spec.linux.as_ref().and_then(|l| l.resources.as_ref());
        if let Some(root) = &self.cgroups {
            made.cgroup = Some(self.create_cgroup(root, id, resources).await?);
            spec::own_cgroup_namespace(&mut spec);
        }
        let config = StageConfig {
            mode: StageMode::Create {
                spec: Box::new(spec),
            },
            cgroup: made.cgroup.as_ref().map(|p| p.display().to_string()),
        };
        let launched = process::launch(
            &self.log,
            &self.reaper,
            &self.stages,
            "",
            config,
            terminal,
            stdin,
        )
        .await?;
        let sync = launched.sync;
        let pending = launched.start.map(|start| PendingStart { start, sync });
        // From here on the container owns the cgroup and the devpts instance.
        let container = Arc::new(
            Container::new(id, launched.process, made.cgroup.take(), pending)
                .with_seccomp(seccomp)
                .with_devpts(made.devpts.take())
                .with_pid_namespace(own_pid_ns)
                .with_volumes(made.volumes.take().unwrap_or_default()),
        );
        made.container = Some(container.clone());
        if container.is_started().await {
            return Err(AgentError::Internal("no start pipe".into()));
        }
        if pod_sandbox {
            self.pod_ns.pin(container.init.pid)?;
            if let Ok(mut p) = self.pod_sandbox.lock() {
                *p = Some(id.to_string());
            }
        }
        let mut containers = self.containers.lock().await;
        if containers.contains_key(id) {
            return Err(AgentError::AlreadyExists(format!(
                "container {id} already exists"
            )));
        }
        containers.insert(id.to_string(), container.clone());
        made.container = None;
        Ok(container)
    }

    /// The container's cgroup with `resources` applied and OOM kills watched, made
    /// before any of its processes exist.
    async fn create_cgroup(
        &self,
        root: &CgroupRoot,
        id: &str,
        resources: Option<&LinuxResources>,
    ) -> Result<std::path::PathBuf> {
        let dir = root
            .create(id)
            .map_err(|e| AgentError::Internal(format!("create cgroup for container {id}: {e}")))?;
        if let Some(r) = resources {
            if let Err(e) = resources::apply(&dir, r) {
                let _ = crate::cgroup::remove(&dir).await;
                return Err(e.in_context(&format!("create container {id}")));
            }
        }
        self.oom.watch(id, &dir);
        Ok(dir)
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
        let process = spec::Process::from_json(process_json)?;
        crate::stage::preflight_process(&process).map_err(refused)?;
        let terminal = process.terminal.then_some(container.terminal_dir());
        let config = StageConfig {
            mode: StageMode::Exec {
                process: Box::new(process),
                init_pid: container.init.pid,
                seccomp: container.seccomp.clone(),
            },
            cgroup: container.cgroup.as_ref().map(|p| p.display().to_string()),
        };
        let launched = process::launch(
            &self.log,
            &self.reaper,
            &self.stages,
            exec_id,
            config,
            terminal,
            stdin,
        )
        .await
        .map_err(|e| e.context(&format!("exec in container {id}")))?;
        let proc = Arc::new(launched.process);
        container.add_exec(proc.clone()).await?;
        if let Err(e) = process::wait_exec(&self.log, launched.sync).await {
            // The process never ran (it exits, and the reaper collects it); keeping its
            // entry would only make a retry with the same exec_id fail.
            container.remove_exec(exec_id).await;
            return Err(e.context(&format!("exec in container {id}")));
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
        let status = self.process(id, exec_id).await?.wait().await;
        if exec_id.is_empty() {
            // Before the host learns of the exit: the container ends with its init.
            if let Ok(container) = self.container(id).await {
                container.end_orphans(&self.log).await;
            }
        }
        // An OOM kill is queued before the exit it caused is reported.
        self.oom.check(id);
        Ok(status)
    }

    pub async fn pause_container(&self, id: &str) -> Result<()> {
        self.container(id).await?.pause().await?;
        info!(self.log, "container paused"; "container_id" => id);
        Ok(())
    }

    pub async fn resume_container(&self, id: &str) -> Result<()> {
        self.container(id).await?.resume().await?;
        info!(self.log, "container resumed"; "container_id" => id);
        Ok(())
    }

    pub async fn stats_container(
        &self,
        id: &str,
    ) -> Result<protocols::agent::StatsContainerResponse> {
        self.container(id).await?.stats()
    }

    /// Every container's id and cgroup figures, for GetMetrics (a container whose cgroup
    /// cannot be read is left out).
    pub async fn all_stats(&self) -> Vec<(String, protocols::agent::StatsContainerResponse)> {
        let all: Vec<_> = self.containers.lock().await.values().cloned().collect();
        all.iter()
            .filter_map(|c| Some((c.id.clone(), c.stats().ok()?)))
            .collect()
    }

    /// Applies an OCI LinuxResources JSON object to a running container.
    pub async fn update_container(&self, id: &str, resources_json: &[u8]) -> Result<()> {
        let container = self.container(id).await?;
        let resources = LinuxResources::from_json(resources_json)
            .map_err(|e| e.in_context(&format!("update container {id}")))?;
        container.update(&resources)?;
        info!(self.log, "container resources updated"; "container_id" => id);
        Ok(())
    }

    /// Waits for the next OOM kill in any container; returns the container's id.
    pub async fn next_oom_event(&self) -> String {
        self.oom.next().await
    }

    pub async fn remove_container(&self, id: &str) -> Result<()> {
        let container = self.container(id).await?;
        container.destroy(&self.log, &self.oom).await;
        self.containers.lock().await.remove(id);
        if self.pod_sandbox_is(id) {
            self.pod_ns.unpin();
            if let Ok(mut p) = self.pod_sandbox.lock() {
                *p = None;
            }
        }
        info!(self.log, "container removed"; "container_id" => id);
        Ok(())
    }

    /// Ends a guest about to be reset: kills every process but the agent (PID 1's
    /// `kill(-1)`), containers, their execs and the stage zygote alike, then flushes what
    /// they left in the page cache to the shared file systems (volumes written through
    /// `mmap` have dirty pages until then), waiting at most [`SYNC_BOUND`]: a virtiofsd
    /// that is gone would make `sync` wait forever. Nothing is unmounted or removed; the
    /// reset does that.
    pub async fn end_guest(&self) {
        if let Err(e) = kill(Pid::from_raw(-1), Signal::SIGKILL) {
            warn!(self.log, "cannot kill the guest's processes"; "error" => %e);
        }
        let synced =
            tokio::time::timeout(SYNC_BOUND, tokio::task::spawn_blocking(nix::unistd::sync));
        if synced.await.is_err() {
            warn!(self.log, "the file systems are still syncing; ending anyway"; "waited" => ?SYNC_BOUND);
        }
        info!(self.log, "sandbox destroyed");
    }

    /// Kills every container and removes what it set up (before the test agent goes
    /// away, or on SIGTERM).
    pub async fn destroy(&self) {
        let all: Vec<_> = self
            .containers
            .lock()
            .await
            .drain()
            .map(|(_, c)| c)
            .collect();
        for c in all {
            c.destroy(&self.log, &self.oom).await;
        }
        self.stages.shutdown();
        self.pod_volumes.release();
        if let Ok(mut p) = self.pod_sandbox.lock() {
            if p.take().is_some() {
                self.pod_ns.unpin();
            }
        }
        info!(self.log, "sandbox destroyed");
    }
}

/// The container id and namespace type of a path under
/// [`protocols::GUEST_CONTAINER_NS_DIR`] (`rest` is what follows it: `/<id>/<type>`).
fn peer_namespace(rest: &str) -> Option<(&str, &str)> {
    let (peer, typ) = rest.strip_prefix('/')?.split_once('/')?;
    protocols::id::validate(peer).ok()?;
    crate::spec::NAMESPACE_TYPES
        .contains(&typ)
        .then_some((peer, typ))
}

#[cfg(test)]
mod tests {
    use super::peer_namespace;

    #[test]
    fn a_peer_namespace_path_names_a_container_and_a_type() {
        assert_eq!(peer_namespace("/main/pid"), Some(("main", "pid")));
        assert_eq!(peer_namespace("/main/pid/x"), None);
        assert_eq!(peer_namespace("/../pid"), None);
        assert_eq!(peer_namespace("/main/wormhole"), None);
        assert_eq!(peer_namespace("main/pid"), None);
        assert_eq!(peer_namespace("/main"), None);
    }
}
