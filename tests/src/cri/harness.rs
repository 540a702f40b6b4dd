//! [`CriContainerd`]: a private containerd with the CRI plugin on, and the kubelet around
//! it. Per instance: a CNI network of its own (bridge + host-local on a private /24,
//! portmap; CRI adds `lo` itself with the loopback plugin), the busybox and pause images in
//! the `k8s.io` namespace, a cgroup tree `/kata-e2e-<pid>-<n>` under which every pod gets
//! the `cgroup_parent` kubelet would have made (in every cgroup v1 hierarchy, before
//! RunPodSandbox), and a log directory per pod. Pods run with one RuntimeClass handler
//! ([`Handler`]: `runc` or `kata`).
//!
//! Everything is undone when the instance is dropped, also when a test fails half-way:
//! pods stopped and removed through the CRI, containerd stopped (with its shims and their
//! children) by `containerd-private.sh`, then whatever a sandbox left behind, the pods'
//! network namespaces, the cgroups, the bridge and the IPAM state.
//!
//! [`CriContainerd::pod_leftovers`] is the leak check of a removed pod.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{api, CriClient, CriError, LogLine};
use crate::{
    alive, env, leftovers, poll, signal, wait_gone, Containerd, RuntimeConfig, SandboxCleanup,
    StartOptions, IMAGE,
};

/// The pod sandbox image (`scripts/pause-image.sh`, `KATA_TEST_PAUSE_IMAGE`).
pub const PAUSE_IMAGE: &str = "localhost/kata-e2e-pause:latest";

/// The containerd namespace of the CRI.
pub const CRI_NAMESPACE: &str = "k8s.io";

/// The Kubernetes namespace of the tests' pods.
pub const POD_NAMESPACE: &str = "kata-e2e";

const CGROUP_MOUNTS: &str = "/sys/fs/cgroup";

/// Instances started by this test process, for names unique within it.
static INSTANCES: AtomicU32 = AtomicU32::new(0);

/// The RuntimeClass handler a test's pods run with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handler {
    /// containerd's runc shim: the reference the harness and the cases are checked with.
    Runc,
    /// Our runtime (`io.containerd.kata.v2`): every pod in a VM.
    Kata,
}

impl Handler {
    /// The handler's name in containerd's configuration and in RunPodSandbox.
    pub fn name(self) -> &'static str {
        match self {
            Handler::Runc => "runc",
            Handler::Kata => "kata",
        }
    }

    /// Whether pods of this handler run in a VM (so have a shim, a VMM and helpers).
    pub fn is_vm(self) -> bool {
        self == Handler::Kata
    }
}

/// The CNI network of an instance: a bridge of its own on a private /24.
#[derive(Clone, Debug)]
pub struct CniNetwork {
    /// The network's name in the conflist.
    pub name: String,
    /// The bridge the pods' veths join (at most 15 characters).
    pub bridge: String,
    /// The first three octets of the /24.
    pub prefix: [u8; 3],
}

impl CniNetwork {
    /// `10.a.b.0/24`.
    pub fn subnet(&self) -> String {
        let [a, b, c] = self.prefix;
        format!("{a}.{b}.{c}.0/24")
    }

    /// The bridge's address, the pods' default gateway: `10.a.b.1`.
    pub fn gateway(&self) -> String {
        let [a, b, c] = self.prefix;
        format!("{a}.{b}.{c}.1")
    }

    fn conflist(&self, ipam_dir: &Path) -> String {
        let conf = serde_json::json!({
            "cniVersion": "0.4.0",
            "name": self.name,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": true,
                    "ipMasq": false,
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{ "subnet": self.subnet(), "gateway": self.gateway() }]],
                        "routes": [{ "dst": "0.0.0.0/0" }],
                        "dataDir": ipam_dir.display().to_string(),
                    }
                },
                { "type": "portmap", "capabilities": { "portMappings": true } }
            ]
        });
        serde_json::to_string_pretty(&conf).unwrap_or_default()
    }

    /// A /24 and a bridge name no other network of this host uses now: not routed (a
    /// bridge with pods), not in another live instance's conflist (whose bridge CNI makes
    /// only with its first pod).
    fn choose(instance: u32) -> Self {
        let pid = std::process::id();
        let mut taken = run_text("ip", &["-4", "route", "show"]);
        let tmp = std::env::temp_dir();
        for entry in std::fs::read_dir(&tmp).into_iter().flatten().flatten() {
            if entry.file_name().to_string_lossy().starts_with("kata-e2e-") {
                let conf = entry.path().join("cni/net.d/10-kata-e2e.conflist");
                taken.push_str(&std::fs::read_to_string(conf).unwrap_or_default());
            }
        }
        let a = 10u8;
        let b = 100 + (pid % 100) as u8;
        let mut c = (instance % 256) as u8;
        for _ in 0..256 {
            if !taken.contains(&format!("{a}.{b}.{c}.")) {
                break;
            }
            c = c.wrapping_add(1);
        }
        CniNetwork {
            name: format!("kata-e2e-{pid}-{instance}"),
            bridge: format!("kte{pid}n{instance}"),
            prefix: [a, b, c],
        }
    }
}

/// A pod the CRI runs, with what kubelet made for it.
pub struct Pod {
    pub id: String,
    /// The configuration it was created with (CreateContainer needs it again).
    pub config: api::PodSandboxConfig,
    pub handler: Handler,
    /// The pod's IP from PodSandboxStatus ("" if it has none).
    pub ip: String,
    /// The pod's network namespace as containerd named it (`/var/run/netns/cni-...`).
    pub netns: Option<PathBuf>,
    /// The pod's cgroup, relative to each hierarchy (`/kata-e2e-<pid>-<n>/pod<uid>`).
    pub cgroup_parent: String,
    /// The pod's `log_directory`.
    pub log_dir: PathBuf,
    /// The network namespace, held open so that the leak check can still look into it
    /// once containerd has removed its name.
    netns_fd: Option<File>,
}

impl Pod {
    pub fn name(&self) -> &str {
        self.config
            .metadata
            .as_ref()
            .map(|m| m.name.as_str())
            .unwrap_or("")
    }

    pub fn uid(&self) -> &str {
        self.config
            .metadata
            .as_ref()
            .map(|m| m.uid.as_str())
            .unwrap_or("")
    }

    pub fn hostname(&self) -> &str {
        &self.config.hostname
    }
}

/// What ExecSync answered.
#[derive(Clone, Debug)]
pub struct ExecOutput {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i32,
}

/// What the instance must undo for a pod, kept apart from [`Pod`] (which the test owns).
#[derive(Clone, Debug, Default)]
struct PodRecord {
    uid: String,
    /// `None` until RunPodSandbox answered, and again once the pod was removed.
    id: Option<String>,
    netns: Option<PathBuf>,
}

/// A private containerd with the CRI plugin on, for pods of one [`Handler`].
pub struct CriContainerd {
    containerd: Option<Containerd>,
    cri: CriClient,
    handler: Handler,
    network: CniNetwork,
    /// `/kata-e2e-<pid>-<n>`: every pod's cgroup is below it, in every hierarchy.
    cgroup_root: String,
    /// This instance's number in the test process.
    instance: u32,
    pods: Mutex<Vec<PodRecord>>,
    next_pod: AtomicU32,
}

impl CriContainerd {
    /// A private containerd (test `name`) with the CRI on, whose pods run with `handler`,
    /// and the runtime's default test configuration (QEMU).
    pub fn start(name: &str, handler: Handler) -> Self {
        Self::start_configured(name, handler, &RuntimeConfig::qemu())
    }

    /// The same on containerd `version` ("1.7", "2.1", "2.3", "2.4": see
    /// [`Containerd::start_version`]).
    pub fn start_version(name: &str, handler: Handler, version: &str) -> Self {
        let bin = crate::containerd_bin_dir(version);
        Self::start_in(
            name,
            handler,
            &RuntimeConfig::qemu(),
            Some(&bin),
            version.starts_with('2'),
        )
    }

    /// The same with the runtime configuration `config` (for the `kata` handler).
    pub fn start_configured(name: &str, handler: Handler, config: &RuntimeConfig) -> Self {
        Self::start_in(name, handler, config, None, false)
    }

    /// `bin_dir`: another containerd's binaries; `v3`: it reads configuration version 3 or
    /// later (containerd 2.x), whose CRI is split into plugins of their own. The kata
    /// runtimes are the deploy snippet the README has users append for that version
    /// ([`kata_snippet`]).
    fn start_in(
        name: &str,
        handler: Handler,
        config: &RuntimeConfig,
        bin_dir: Option<&std::path::Path>,
        v3: bool,
    ) -> Self {
        let instance = INSTANCES.fetch_add(1, Ordering::SeqCst);
        let dir = Containerd::dir_for(name);
        let conf_dir = dir.join("cni/net.d");
        std::fs::create_dir_all(&conf_dir).expect("creating the CNI configuration dir");
        let network = CniNetwork::choose(instance);
        std::fs::write(
            conf_dir.join("10-kata-e2e.conflist"),
            network.conflist(&dir.join("cni/ipam")),
        )
        .expect("writing the CNI configuration");
        let snippet = dir.join("kata-containerd.toml");
        std::fs::write(&snippet, kata_snippet(v3)).expect("writing the kata runtimes snippet");
        let script_env = vec![
            ("CONTAINERD_ENABLE_CRI".to_string(), "1".to_string()),
            ("CONTAINERD_EXTRA_TOML".to_string(), cri_plugin_toml(v3)),
            (
                "CONTAINERD_KATA_SNIPPET".to_string(),
                snippet.display().to_string(),
            ),
            (
                "CONTAINERD_CNI_CONF_DIR".to_string(),
                conf_dir.display().to_string(),
            ),
        ];
        // From here on, a panic stops containerd (Containerd's Drop), and then (once it
        // exists) the instance's Drop undoes the rest.
        let containerd = Containerd::start_instance(
            name,
            config,
            StartOptions {
                bin_dir,
                script_env,
                import_default: false,
            },
        );
        for tar in [env("KATA_TEST_IMAGE"), env("KATA_TEST_PAUSE_IMAGE")] {
            let out = containerd.ctr(&["-n", CRI_NAMESPACE, "images", "import", &tar]);
            assert!(
                out.status.success(),
                "importing {tar} into namespace {CRI_NAMESPACE} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let cri = CriClient::connect(&containerd.socket)
            .unwrap_or_else(|e| panic!("{e}\n{}", containerd.log_tail()));
        let c = CriContainerd {
            containerd: Some(containerd),
            cri,
            handler,
            network,
            cgroup_root: format!("/kata-e2e-{}-{instance}", std::process::id()),
            instance,
            pods: Mutex::new(Vec::new()),
            next_pod: AtomicU32::new(0),
        };
        c.wait_ready();
        c
    }

    /// Waits until the CRI sees both images (it learns of imports through events) and
    /// reports its network ready (it has loaded our CNI configuration): after the start,
    /// and after a restart of containerd.
    pub fn wait_ready(&self) {
        let images_seen = poll(Duration::from_secs(20), Duration::from_millis(100), || {
            let images = self.cri.list_images().ok()?;
            let has = |name: &str| images.iter().any(|i| i.repo_tags.iter().any(|t| t == name));
            (has(IMAGE) && has(PAUSE_IMAGE)).then_some(())
        });
        assert!(
            images_seen.is_some(),
            "the CRI does not list {IMAGE} and {PAUSE_IMAGE}: {:?}\n{}",
            self.cri.list_images(),
            self.log_tail()
        );
        // The two conditions kubelet requires; containerd 2.2+ adds others that it ignores
        // (ContainerdHasNoDeprecationWarnings, false on this host's cgroup v1).
        let ready = poll(Duration::from_secs(20), Duration::from_millis(100), || {
            let status = self.cri.status().ok()?.status?;
            ["RuntimeReady", "NetworkReady"]
                .iter()
                .all(|t| status.conditions.iter().any(|c| c.r#type == *t && c.status))
                .then_some(())
        });
        assert!(
            ready.is_some(),
            "the CRI never became ready: {:?}\n{}",
            self.cri.status(),
            self.log_tail()
        );
    }

    /// The CRI client.
    pub fn cri(&self) -> &CriClient {
        &self.cri
    }

    /// The private containerd (its dir, socket, log, `ctr`).
    pub fn containerd(&self) -> &Containerd {
        self.containerd
            .as_ref()
            .expect("containerd is there until the instance is dropped")
    }

    pub fn handler(&self) -> Handler {
        self.handler
    }

    /// The instance's CNI network.
    pub fn network(&self) -> &CniNetwork {
        &self.network
    }

    /// The last lines of containerd's log (where the shim logs too), for failure messages.
    pub fn log_tail(&self) -> String {
        self.containerd
            .as_ref()
            .map(|c| c.log_tail())
            .unwrap_or_default()
    }

    /// A pod configuration as kubelet would send it: metadata (name, a fresh uid,
    /// namespace `kata-e2e`), hostname `name`, a log directory of its own, a
    /// `cgroup_parent` below the instance's cgroup tree, and the usual namespaces: the
    /// pod's network and IPC, a PID namespace per container. Change what a case needs
    /// (sysctls, port mappings, `pid` = POD) before [`CriContainerd::run_pod`].
    pub fn pod_config(&self, name: &str) -> api::PodSandboxConfig {
        let n = self.next_pod.fetch_add(1, Ordering::SeqCst);
        let uid = format!("{}-{}-{n}", std::process::id(), self.instance);
        let log_dir = self.containerd().dir.join("pods").join(&uid);
        api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: name.to_string(),
                uid: uid.clone(),
                namespace: POD_NAMESPACE.to_string(),
                attempt: 0,
            }),
            hostname: name.to_string(),
            log_directory: log_dir.display().to_string(),
            labels: HashMap::from([("kata-e2e/test".to_string(), name.to_string())]),
            linux: Some(api::LinuxPodSandboxConfig {
                cgroup_parent: format!("{}/pod{uid}", self.cgroup_root),
                security_context: Some(api::LinuxSandboxSecurityContext {
                    namespace_options: Some(namespaces(api::NamespaceMode::Container)),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Runs a pod (see [`CriContainerd::try_run_pod`]); panics with containerd's log if
    /// RunPodSandbox fails.
    pub fn run_pod(&self, config: api::PodSandboxConfig) -> Pod {
        self.try_run_pod(config).unwrap_or_else(|e| {
            panic!(
                "RunPodSandbox ({}): {e}\n{}",
                self.handler.name(),
                self.log_tail()
            )
        })
    }

    /// Does what kubelet does before RunPodSandbox (the pod's cgroup in every cgroup v1
    /// hierarchy, its log directory), runs the pod with the instance's handler, and
    /// reads its IP and network namespace. On failure the cgroup is removed again.
    pub fn try_run_pod(&self, config: api::PodSandboxConfig) -> Result<Pod, CriError> {
        let cgroup_parent = cgroup_parent_of(&config);
        let uid = pod_uid(&config);
        let log_dir = PathBuf::from(&config.log_directory);
        std::fs::create_dir_all(&log_dir).expect("creating the pod's log directory");
        if !cgroup_parent.is_empty() {
            create_cgroup(&cgroup_parent);
        }
        self.record(PodRecord {
            uid: uid.clone(),
            ..Default::default()
        });
        let id = match self.cri.run_pod_sandbox(&config, self.handler.name()) {
            Ok(id) => id,
            Err(e) => {
                self.unrecord(&uid);
                if !cgroup_parent.is_empty() {
                    let _ = remove_cgroup(&cgroup_parent, false);
                }
                return Err(e);
            }
        };
        self.update_record(&uid, |r| r.id = Some(id.clone()));
        self.pod_of(id, config)
    }

    /// Takes over pod sandbox `id`, which the CRI lists but whose RunPodSandbox (with
    /// `config`) never answered (containerd restarted under it), as kubelet does when it
    /// finds it: the instance's clean-up removes it from now on, and the [`Pod`] (its IP
    /// and network namespace from PodSandboxStatus) serves
    /// [`CriContainerd::stop_and_remove_pod`] and the leak checks.
    pub fn adopt_pod(&self, id: &str, config: api::PodSandboxConfig) -> Result<Pod, CriError> {
        let uid = pod_uid(&config);
        self.record(PodRecord {
            uid,
            id: Some(id.to_string()),
            ..Default::default()
        });
        self.pod_of(id.to_string(), config)
    }

    /// The [`Pod`] of sandbox `id` (recorded), run with `config`.
    fn pod_of(&self, id: String, config: api::PodSandboxConfig) -> Result<Pod, CriError> {
        let uid = pod_uid(&config);
        let cgroup_parent = cgroup_parent_of(&config);
        let log_dir = PathBuf::from(&config.log_directory);
        let status = self.cri.pod_sandbox_status(&id, true)?;
        let ip = status
            .status
            .as_ref()
            .and_then(|s| s.network.as_ref())
            .map(|n| n.ip.clone())
            .unwrap_or_default();
        let netns = status.info.get("info").and_then(|info| netns_of(info));
        self.update_record(&uid, |r| r.netns = netns.clone());
        let netns_fd = netns.as_ref().and_then(|p| File::open(p).ok());
        Ok(Pod {
            id,
            config,
            handler: self.handler,
            ip,
            netns,
            cgroup_parent,
            log_dir,
            netns_fd,
        })
    }

    fn record(&self, r: PodRecord) {
        if let Ok(mut pods) = self.pods.lock() {
            pods.push(r);
        }
    }

    fn update_record(&self, uid: &str, f: impl FnOnce(&mut PodRecord)) {
        if let Ok(mut pods) = self.pods.lock() {
            if let Some(r) = pods.iter_mut().find(|r| r.uid == uid) {
                f(r);
            }
        }
    }

    fn unrecord(&self, uid: &str) {
        if let Ok(mut pods) = self.pods.lock() {
            pods.retain(|r| r.uid != uid);
        }
    }

    /// A container configuration as kubelet would send it for `pod`: the busybox image,
    /// `cmd` as the command, a log file `<name>.log` in the pod's log directory, and the
    /// pod's namespace options (so `pid` = POD in the pod means it for the container too).
    pub fn container_config(&self, pod: &Pod, name: &str, cmd: &[&str]) -> api::ContainerConfig {
        let ns = pod
            .config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.clone());
        api::ContainerConfig {
            metadata: Some(api::ContainerMetadata {
                name: name.to_string(),
                attempt: 0,
            }),
            image: Some(api::ImageSpec {
                image: IMAGE.to_string(),
                ..Default::default()
            }),
            command: cmd.iter().map(|s| s.to_string()).collect(),
            log_path: format!("{name}.log"),
            linux: Some(api::LinuxContainerConfig {
                security_context: Some(api::LinuxContainerSecurityContext {
                    namespace_options: ns,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// CreateContainer of `config` in `pod`.
    pub fn create_container(
        &self,
        pod: &Pod,
        config: &api::ContainerConfig,
    ) -> Result<String, CriError> {
        self.cri.create_container(&pod.id, config, &pod.config)
    }

    /// CreateContainer + StartContainer, then waits until it runs; panics (with
    /// containerd's log) on failure. The container id.
    pub fn start_container(&self, pod: &Pod, config: api::ContainerConfig) -> String {
        let name = config
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        let id = self
            .create_container(pod, &config)
            .unwrap_or_else(|e| panic!("CreateContainer {name}: {e}\n{}", self.log_tail()));
        if let Err(e) = self.cri.start_container(&id) {
            panic!("StartContainer {name}: {e}\n{}", self.log_tail());
        }
        assert!(
            self.wait_container_state(
                &id,
                api::ContainerState::ContainerRunning,
                Duration::from_secs(60)
            ),
            "container {name} is not running: {:?}\n{}",
            self.cri.container_status(&id),
            self.log_tail()
        );
        id
    }

    /// Waits up to `limit` until container `id` is in `state`.
    pub fn wait_container_state(
        &self,
        id: &str,
        state: api::ContainerState,
        limit: Duration,
    ) -> bool {
        poll(limit, Duration::from_millis(100), || {
            (self.cri.container_state(id).ok()? == state).then_some(())
        })
        .is_some()
    }

    /// ExecSync of `cmd` in container `id` (60 s timeout); panics if the CRI call fails.
    pub fn exec(&self, id: &str, cmd: &[&str]) -> ExecOutput {
        let r = self
            .cri
            .exec_sync(id, cmd, 60)
            .unwrap_or_else(|e| panic!("ExecSync {cmd:?}: {e}\n{}", self.log_tail()));
        ExecOutput {
            stdout: String::from_utf8_lossy(&r.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&r.stderr).into_owned(),
            exit_code: r.exit_code,
        }
    }

    /// The live shim processes of this instance (their pid and command line).
    pub fn shims_left(&self) -> Vec<String> {
        let socket = self.containerd().socket.display().to_string();
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        dir.flatten()
            .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
            .filter(|&pid| alive(pid))
            .filter_map(|pid| {
                let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
                let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
                (cmdline.contains("containerd-shim") && cmdline.contains(&socket))
                    .then(|| format!("{pid}: {cmdline}"))
            })
            .collect()
    }

    /// The lines of container `id`'s CRI log file so far.
    pub fn container_log(&self, id: &str) -> Vec<LogLine> {
        let status = self
            .cri
            .container_status(id)
            .unwrap_or_else(|e| panic!("ContainerStatus {id}: {e}"));
        super::read_cri_log(Path::new(&status.log_path))
    }

    /// A host directory for volume `name` of `pod` (an emptyDir), created empty.
    pub fn volume_dir(&self, pod: &Pod, name: &str) -> PathBuf {
        let dir = self
            .containerd()
            .dir
            .join("volumes")
            .join(pod.uid())
            .join(name);
        std::fs::create_dir_all(&dir).expect("creating a volume dir");
        dir
    }

    /// StopPodSandbox then RemovePodSandbox (panics if either fails), then removes the
    /// pod's cgroup as kubelet does. Check what is left with [`CriContainerd::pod_leftovers`]
    /// or [`CriContainerd::assert_pod_removed_cleanly`].
    pub fn stop_and_remove_pod(&self, pod: &Pod) {
        if let Err(e) = self.cri.stop_pod_sandbox(&pod.id) {
            panic!("StopPodSandbox: {e}\n{}", self.log_tail());
        }
        if let Err(e) = self.cri.remove_pod_sandbox(&pod.id) {
            panic!("RemovePodSandbox: {e}\n{}", self.log_tail());
        }
        self.update_record(pod.uid(), |r| r.id = None);
        if !pod.cgroup_parent.is_empty() {
            // The sandbox's own cgroup below it goes with its last process: retry a while.
            let _ = poll(Duration::from_secs(10), Duration::from_millis(100), || {
                remove_cgroup(&pod.cgroup_parent, false).ok()
            });
        }
    }

    /// Removes the cgroup of a pod run with `config` that the CRI no longer knows, as
    /// kubelet does for a pod it deleted (without killing what is in it: a process left
    /// there is a leak the caller reports). The error names what could not be removed.
    pub fn remove_pod_cgroup(&self, config: &api::PodSandboxConfig) -> Result<(), String> {
        let path = cgroup_parent_of(config);
        if path.is_empty() {
            return Ok(());
        }
        remove_cgroup(&path, false)
    }

    /// The addresses the instance's CNI IPAM (host-local) still has allocated: one per pod
    /// whose network the CRI set up and did not tear down.
    pub fn ipam_allocations(&self) -> Vec<String> {
        let dir = self
            .containerd()
            .dir
            .join("cni/ipam")
            .join(&self.network.name);
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
            .collect()
    }

    /// Stops and removes `pod`, then checks (for up to 20 s) that nothing of it is left.
    pub fn remove_pod_checked(&self, pod: Pod) {
        self.stop_and_remove_pod(&pod);
        self.assert_pod_removed_cleanly(&pod);
    }

    /// Panics unless [`CriContainerd::pod_leftovers`] of the removed `pod` become empty
    /// within 20 s (the shim's own shutdown takes a moment).
    pub fn assert_pod_removed_cleanly(&self, pod: &Pod) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = self.pod_leftovers(pod);
            if left.is_empty() {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "pod {} ({}) left behind:\n{}\n{}",
                    pod.name(),
                    pod.id,
                    left.join("\n"),
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// What is left of a pod after RemovePodSandbox: the CRI still listing it; for a VM,
    /// the sandbox's processes, mounts and `/run/vc` directories ([`leftovers`]); any
    /// process naming the pod's id (a shim); runc state; its network namespace's name;
    /// inside that namespace (held open since the pod started), any link but `lo`, any
    /// ingress/clsact qdisc or tc filter (a tap and its mirred redirection); its cgroup
    /// in any hierarchy.
    pub fn pod_leftovers(&self, pod: &Pod) -> Vec<String> {
        let mut found = Vec::new();
        match self.cri.list_pod_sandbox() {
            Ok(pods) if pods.iter().any(|p| p.id == pod.id) => {
                found.push("the CRI still lists the pod".to_string())
            }
            Ok(_) => {}
            Err(e) => found.push(format!("ListPodSandbox failed: {e}")),
        }
        if pod.handler.is_vm() {
            found.extend(leftovers(&pod.id));
        }
        found.extend(processes_naming(&pod.id));
        let runc_state = Path::new("/run/containerd/runc")
            .join(CRI_NAMESPACE)
            .join(&pod.id);
        if runc_state.exists() {
            found.push(format!("runc state {}", runc_state.display()));
        }
        if let Some(ns) = &pod.netns {
            if ns.exists() {
                found.push(format!("network namespace {}", ns.display()));
            }
        }
        if let Some(fd) = &pod.netns_fd {
            found.extend(netns_leftovers(fd));
        }
        if !pod.cgroup_parent.is_empty() {
            for h in cgroup_hierarchies(true) {
                let dir = format!("{h}{}", pod.cgroup_parent);
                if Path::new(&dir).exists() {
                    let below = cgroup_dirs(Path::new(&dir)).len() - 1;
                    found.push(format!("cgroup {dir} ({below} cgroups below it)"));
                }
            }
        }
        // The shim of a VM sandbox is found twice (by its pid and by its id).
        let mut seen = std::collections::HashSet::new();
        found.retain(|f| seen.insert(f.clone()));
        found
    }
}

impl CriContainerd {
    /// Copies containerd's log (with the shim's lines) to
    /// `$TMPDIR/kata-e2e-logs/<instance dir>.log` before the instance's dir goes, so that
    /// a failed case can be read in full; says where on stderr.
    fn keep_log(&self) {
        let Some(c) = self.containerd.as_ref() else {
            return;
        };
        let dest_dir = std::env::temp_dir().join("kata-e2e-logs");
        let name = c
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let dest = dest_dir.join(format!("{name}.log"));
        let copied = std::fs::create_dir_all(&dest_dir)
            .and_then(|_| std::fs::copy(c.dir.join("containerd.log"), &dest));
        match copied {
            Ok(_) => eprintln!("containerd's log is kept in {}", dest.display()),
            Err(e) => eprintln!("keeping containerd's log: {e}"),
        }
    }
}

impl Drop for CriContainerd {
    fn drop(&mut self) {
        let records = self.pods.lock().map(|p| p.clone()).unwrap_or_default();
        // Through the CRI first, as kubelet would: the runtime's own clean-up.
        self.cri.set_call_limit(Duration::from_secs(60));
        for r in &records {
            if let Some(id) = &r.id {
                if let Err(e) = self.cri.stop_pod_sandbox(id) {
                    eprintln!("clean-up: StopPodSandbox {id}: {e}");
                }
                if let Err(e) = self.cri.remove_pod_sandbox(id) {
                    eprintln!("clean-up: RemovePodSandbox {id}: {e}");
                }
            }
        }
        if std::thread::panicking() {
            self.keep_log();
        }
        // containerd-private.sh stop: tasks killed, containerd stopped, leftover shims and
        // their children killed, mounts under the dir undone, the dir (CNI state) removed.
        drop(self.containerd.take());
        for r in &records {
            if let Some(id) = &r.id {
                drop(SandboxCleanup::new(id));
            }
            if let Some(ns) = &r.netns {
                if ns.exists() {
                    let _ = nix::mount::umount2(ns, nix::mount::MntFlags::MNT_DETACH);
                    let _ = std::fs::remove_file(ns);
                }
            }
        }
        if let Err(e) = remove_cgroup(&self.cgroup_root, true) {
            eprintln!("clean-up: {e}");
        }
        let link = Path::new("/sys/class/net").join(&self.network.bridge);
        if link.exists() {
            let out = Command::new("ip")
                .args(["link", "del", &self.network.bridge])
                .output();
            if let Ok(o) = out {
                if !o.status.success() {
                    eprintln!(
                        "clean-up: ip link del {}: {}",
                        self.network.bridge,
                        String::from_utf8_lossy(&o.stderr)
                    );
                }
            }
        }
    }
}

/// The kata runtimes for containerd's configuration: the deploy snippet that the README
/// has users append (`deploy/containerd/`: `kata-containerd-1.x.toml` for configuration
/// version 2, containerd 1.x; `kata-containerd-2.x.toml` for versions 3 and 4, containerd
/// 2.x), as it is. It has no options table: the shim finds its configuration by its name,
/// and here by `KATA_CONF_FILE`, which names the test's (see `Containerd::script`).
pub(crate) fn kata_snippet(v3: bool) -> String {
    if v3 {
        include_str!("../../../deploy/containerd/kata-containerd-2.x.toml").to_string()
    } else {
        include_str!("../../../deploy/containerd/kata-containerd-1.x.toml").to_string()
    }
}

/// The CRI plugin's own table (containerd 1.x, config version 2), appended to the
/// configuration `containerd-private.sh` writes (which then has no such table: it writes one
/// only for `CONTAINERD_SANDBOX_IMAGE`, left unset). The sandbox image is our pause image.
/// Where this process lacks CAP_SYS_RESOURCE (this development machine runs in a container
/// that drops it), no process may lower its OOM score, and runc fails the pause container's
/// `oomScoreAdj` of -998 ("can't get final child's PID from pipe"); containerd's
/// `restrict_oom_score_adj` then clamps scores to its own, as on rootless hosts.
fn cri_plugin_toml(v3: bool) -> String {
    let image = crate::toml_str(PAUSE_IMAGE);
    let restrict = !has_capability(CAP_SYS_RESOURCE);
    if v3 {
        // containerd 2.x: the pause image is a pinned image of the images plugin, the
        // OOM score setting the runtime plugin's.
        let mut toml = format!(
            "[plugins.\"io.containerd.cri.v1.images\".pinned_images]\n  sandbox = {image}\n"
        );
        if restrict {
            toml.push_str(
                "[plugins.\"io.containerd.cri.v1.runtime\"]\n  restrict_oom_score_adj = true\n",
            );
        }
        return toml;
    }
    let mut toml = format!("[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = {image}\n");
    if restrict {
        toml.push_str("  restrict_oom_score_adj = true\n");
    }
    toml
}

const CAP_SYS_RESOURCE: u32 = 24;

/// Whether this process has capability number `cap` in its effective set.
fn has_capability(cap: u32) -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .map(|mask| mask & (1 << cap) != 0)
        .unwrap_or(false)
}

/// The pod's uid in `config`.
pub fn pod_uid(config: &api::PodSandboxConfig) -> String {
    config
        .metadata
        .as_ref()
        .map(|m| m.uid.clone())
        .unwrap_or_default()
}

/// The pod's `cgroup_parent` in `config` ("" if none).
fn cgroup_parent_of(config: &api::PodSandboxConfig) -> String {
    config
        .linux
        .as_ref()
        .map(|l| l.cgroup_parent.clone())
        .unwrap_or_default()
}

/// Namespace options: the pod's network and IPC, `pid` as given.
pub fn namespaces(pid: api::NamespaceMode) -> api::NamespaceOption {
    api::NamespaceOption {
        network: api::NamespaceMode::Pod as i32,
        pid: pid as i32,
        ipc: api::NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

/// Sets the pod's PID namespace mode (POD: its containers share one, with the pause
/// process as PID 1).
pub fn set_pod_pid_mode(config: &mut api::PodSandboxConfig, pid: api::NamespaceMode) {
    let linux = config.linux.get_or_insert_with(Default::default);
    let sc = linux.security_context.get_or_insert_with(Default::default);
    sc.namespace_options = Some(namespaces(pid));
}

/// Adds a pod sysctl.
pub fn add_sysctl(config: &mut api::PodSandboxConfig, key: &str, value: &str) {
    config
        .linux
        .get_or_insert_with(Default::default)
        .sysctls
        .insert(key.to_string(), value.to_string());
}

/// A TCP port mapping `host_port` (on every host address) to `container_port`.
pub fn tcp_port_mapping(container_port: u16, host_port: u16) -> api::PortMapping {
    api::PortMapping {
        protocol: api::Protocol::Tcp as i32,
        container_port: i32::from(container_port),
        host_port: i32::from(host_port),
        host_ip: String::new(),
    }
}

/// A read-write bind of host directory `host` at `container_path`.
pub fn bind_mount(host: &Path, container_path: &str) -> api::Mount {
    api::Mount {
        container_path: container_path.to_string(),
        host_path: host.display().to_string(),
        readonly: false,
        propagation: api::MountPropagation::PropagationPrivate as i32,
        ..Default::default()
    }
}

/// The network namespace path in containerd's verbose sandbox info (its runtime spec).
fn netns_of(info: &str) -> Option<PathBuf> {
    let v: serde_json::Value = serde_json::from_str(info).ok()?;
    v["runtimeSpec"]["linux"]["namespaces"]
        .as_array()?
        .iter()
        .find(|n| n["type"] == "network")
        .and_then(|n| n["path"].as_str())
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

fn run_text(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Links, qdiscs and filters left in the network namespace `ns` (an open nsfs file).
fn netns_leftovers(ns: &File) -> Vec<String> {
    let path = format!("/proc/{}/fd/{}", std::process::id(), ns.as_raw_fd());
    let net = format!("--net={path}");
    let in_ns = |args: &[&str]| {
        let mut all = vec![net.as_str()];
        all.extend_from_slice(args);
        run_text("nsenter", &all)
    };
    let mut found = Vec::new();
    let links = in_ns(&["ip", "-o", "link", "show"]);
    let mut names = Vec::new();
    for line in links.lines() {
        // "2: tap0_kata: <...> ..." (veths print as "eth0@if12").
        let name = line
            .split(": ")
            .nth(1)
            .map(|n| n.split('@').next().unwrap_or(n).to_string())
            .unwrap_or_default();
        if name.is_empty() {
            continue;
        }
        if name != "lo" {
            found.push(format!(
                "link in the pod's network namespace: {}",
                line.trim()
            ));
        }
        names.push(name);
    }
    for line in in_ns(&["tc", "qdisc", "show"]).lines() {
        if line.contains("ingress") || line.contains("clsact") {
            found.push(format!(
                "qdisc in the pod's network namespace: {}",
                line.trim()
            ));
        }
    }
    for name in &names {
        let filters = in_ns(&["tc", "filter", "show", "dev", name, "ingress"]);
        if !filters.trim().is_empty() {
            found.push(format!(
                "tc filter on {name} (ingress) in the pod's network namespace: {}",
                filters.trim()
            ));
        }
    }
    found
}

/// Live processes (other than this test) whose command line names `id`.
fn processes_naming(id: &str) -> Vec<String> {
    let me = std::process::id() as i32;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|&pid| pid != me && alive(pid))
        .filter_map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
            cmdline
                .contains(id)
                .then(|| format!("process {pid}: {cmdline}"))
        })
        .collect()
}

/// The mount points of the cgroup hierarchies under /sys/fs/cgroup: the v1 ones, and the
/// v2 one too if `with_v2`.
fn cgroup_hierarchies(with_v2: bool) -> Vec<String> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, point, fstype) = (f.next()?, f.next()?, f.next()?);
            let wanted = fstype == "cgroup" || (with_v2 && fstype == "cgroup2");
            (wanted && point.starts_with(CGROUP_MOUNTS)).then(|| point.to_string())
        })
        .collect()
}

/// Creates cgroup `path` (relative to each hierarchy) in every cgroup v1 hierarchy, as
/// kubelet's cgroupfs driver does for a pod; cpuset levels get their parent's CPUs and
/// memory nodes (a new cpuset cgroup has none). One at a time: pods started at once
/// share their parents, which must be made, and given their CPUs, once.
fn create_cgroup(path: &str) {
    static CREATING: Mutex<()> = Mutex::new(());
    let _one = CREATING.lock().unwrap_or_else(|e| e.into_inner());
    for h in cgroup_hierarchies(false) {
        let mut dir = PathBuf::from(&h);
        for part in path.split('/').filter(|p| !p.is_empty()) {
            let parent = dir.clone();
            dir.push(part);
            if dir.exists() {
                continue;
            }
            std::fs::create_dir(&dir)
                .unwrap_or_else(|e| panic!("creating cgroup {}: {e}", dir.display()));
            for file in ["cpuset.cpus", "cpuset.mems"] {
                if let Ok(v) = std::fs::read_to_string(parent.join(file)) {
                    let _ = std::fs::write(dir.join(file), v.trim());
                }
            }
        }
    }
}

/// The cgroups at and below `dir`, deepest first.
fn cgroup_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut all = vec![dir.to_path_buf()];
    let mut i = 0;
    while i < all.len() {
        if let Ok(entries) = std::fs::read_dir(&all[i]) {
            for e in entries.flatten() {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    all.push(e.path());
                }
            }
        }
        i += 1;
    }
    all.reverse();
    all
}

/// Removes cgroup `path` and everything below it in every hierarchy (v2 too: runc makes
/// the path there as well). With `kill`, the processes still in them (leftovers of this
/// test's pods) are killed by pid first; without, a busy cgroup is an error.
fn remove_cgroup(path: &str, kill: bool) -> Result<(), String> {
    let mut errors = Vec::new();
    for h in cgroup_hierarchies(true) {
        let top = PathBuf::from(format!("{h}{path}"));
        if !top.exists() {
            continue;
        }
        for dir in cgroup_dirs(&top) {
            if kill {
                let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    eprintln!(
                        "clean-up: killing process {pid} left in cgroup {}",
                        dir.display()
                    );
                    signal(pid, nix::sys::signal::Signal::SIGKILL);
                    let _ = wait_gone(pid, Duration::from_secs(5));
                }
            }
            if let Err(e) = std::fs::remove_dir(&dir) {
                errors.push(format!("removing cgroup {}: {e}", dir.display()));
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// The host's own address on the interface of its default route (else its first global
/// IPv4 address): where a host port is reached from the host as from outside.
pub fn host_ip() -> String {
    let route = run_text("ip", &["-4", "route", "show", "default"]);
    let dev = route
        .split_whitespace()
        .skip_while(|w| *w != "dev")
        .nth(1)
        .map(str::to_string);
    let mut args = vec!["-4", "-o", "addr", "show", "scope", "global"];
    if let Some(d) = dev.as_deref() {
        args.extend_from_slice(&["dev", d]);
    }
    let addrs = run_text("ip", &args);
    addrs
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|cidr| cidr.split('/').next())
        .map(str::to_string)
        .expect("the host has no global IPv4 address")
}

/// A TCP port nothing listens on now (the kernel's pick), for a host port.
pub fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("0.0.0.0:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("picking a free TCP port")
}

/// One HTTP/1.0 GET of `path` from `host:port`; the whole response.
pub fn http_get(host: &str, port: u16, path: &str) -> Result<String, String> {
    let addr: SocketAddr = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("{host}:{port}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host}:{port}: no address"))?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3))
        .map_err(|e| format!("connecting to {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n")
        .map_err(|e| format!("writing to {addr}: {e}"))?;
    let mut response = String::new();
    s.read_to_string(&mut response)
        .map_err(|e| format!("reading from {addr}: {e}"))?;
    Ok(response)
}

/// Retries [`http_get`] for up to `limit` until the response contains `needle`; the last
/// error (or response) if it never does.
pub fn wait_http(
    host: &str,
    port: u16,
    path: &str,
    needle: &str,
    limit: Duration,
) -> Result<String, String> {
    let deadline = Instant::now() + limit;
    loop {
        let last = match http_get(host, port, path) {
            Ok(r) if r.contains(needle) => return Ok(r),
            Ok(r) => format!("unexpected response: {r:?}"),
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            return Err(last);
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kata_snippet_is_the_deploy_file_as_shipped() {
        for (v3, plugin) in [
            (false, "io.containerd.grpc.v1.cri"),
            (true, "io.containerd.cri.v1.runtime"),
        ] {
            let text = kata_snippet(v3);
            assert!(
                text.contains(&format!(
                    "[plugins.\"{plugin}\".containerd.runtimes.kata]\n  runtime_type = \"io.containerd.kata.v2\"\n  privileged_without_host_devices = true\n"
                )),
                "{text}"
            );
            // No options table (containerd 2.3+ fails user-namespaced containers through
            // one); kata-builtin is a runtime type of its own, whose shim's name picks its
            // configuration file.
            assert!(!text.contains("ConfigPath ="), "{text}");
            assert!(
                text.contains("runtime_type = \"io.containerd.kata-builtin.v2\""),
                "{text}"
            );
        }
    }
}
