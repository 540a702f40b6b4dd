//! The builtin backend: spawns `kata-vmm --config <run_dir>/vmm.json` (the `vmm` crate's
//! KVM VMM) and waits until it is running the guest.
//!
//! kata-vmm serves the agent's hybrid vsock socket itself; the one helper is virtiofsd
//! (two with the rootfs share, see [`crate::virtiofsd`]), started first, whose socket
//! kata-vmm's virtio-fs frontend connects to while it builds the VM. Readiness: kata-vmm
//! writes `<run_dir>/vmm.ready` (its pid) once the vCPUs run; the agent socket exists
//! from before that. Stop is kill + reap by pid, as for QEMU; a
//! failed start stops whatever it had started.
//!
//! kata-vmm needs a KVM that runs guests at full speed (`kata-vmm check`); on an emulated
//! KVM it starts, but Linux does not boot.
//!
//! [`vmm_json`] is the configuration's one typed model, which kata-vmm reads as well.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use kata_config::{BuiltinConfig, HostProcesses};
use slog::{o, Logger};

use crate::accel::{self, Accel};
use crate::backend::Backend;
use crate::console::{self, CONSOLE_FD, CONSOLE_LOG_CAP};
use crate::jail::{self, DevNode, Jail, ReadOnlyFile, SandboxIds};
use crate::kernel_cmdline::KernelCmdline;
use crate::process::{exit_description, Daemon, Place, POLL};
use crate::virtiofsd::{log_command, FsFiles, Shares};
use crate::{Error, VmConfig, VmInfo, SHARED_FS_TAG};
use protocols::{ROOTFS_FS_TAG, ROOTFS_SHARE_PARAM};

pub use vmm_contract::vmm_json;

/// The kernel command line before the user's `kernel_params`: a reset (through the i8042,
/// `reboot=k`) or a panic ends kata-vmm; there is no PCI bus and only a minimal i8042.
/// `io_delay=none`: no port 0x80 write (an exit each) after every legacy port write.
pub const BASE_KERNEL_PARAMS: &str =
    "console=ttyS0 reboot=k panic=-1 pci=off i8042.noaux i8042.nomux i8042.nopnp i8042.dumbkbd io_delay=none";
/// The guest CID.
pub const GUEST_CID: u32 = 3;
/// How long kata-vmm may take to build the VM and start its vCPUs.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Files of a builtin sandbox in its run directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltinLayout {
    /// kata-vmm's configuration.
    pub config: PathBuf,
    /// Written by kata-vmm once the vCPUs run.
    pub ready_file: PathBuf,
    /// Hybrid vsock socket the shim dials the agent on.
    pub agent_socket: PathBuf,
    /// The guest's serial console, as the shim keeps it (bounded: see `crate::console`).
    pub console_log: PathBuf,
    /// kata-vmm's own stdout and stderr (JSON lines).
    pub vmm_log: PathBuf,
    /// virtiofsd of the share (virtiofsd listens, kata-vmm connects).
    pub fs: FsFiles,
    /// virtiofsd of the rootfs share, when the VM has one.
    pub rootfs_fs: FsFiles,
}

impl BuiltinLayout {
    pub fn new(run_dir: &Path) -> Self {
        Self {
            config: run_dir.join("vmm.json"),
            ready_file: run_dir.join("vmm.ready"),
            agent_socket: run_dir.join("kata.hvsock"),
            console_log: run_dir.join("console.log"),
            vmm_log: run_dir.join("kata-vmm.log"),
            fs: FsFiles::new(run_dir, "virtiofsd"),
            rootfs_fs: FsFiles::new(run_dir, "virtiofsd-rootfs"),
        }
    }

    /// Files a previous run may have left behind that a new run must not find
    /// (virtiofsd's pid file sits next to its socket).
    fn stale_files(&self) -> Vec<PathBuf> {
        let mut files = vec![self.ready_file.clone(), self.agent_socket.clone()];
        files.extend(self.fs.stale_files());
        files.extend(self.rootfs_fs.stale_files());
        files
    }
}

/// The guest kernel command line.
pub fn kernel_cmdline(config: &BuiltinConfig, debug: bool) -> String {
    let mut line = KernelCmdline::new(BASE_KERNEL_PARAMS, debug);
    line.push_if(config.rootfs_share().is_some(), ROOTFS_SHARE_PARAM);
    line.finish(&config.kernel_params)
}

/// kata-vmm's `vmm.json` for this sandbox, checked as kata-vmm will check it.
pub fn vmm_config(
    config: &BuiltinConfig,
    layout: &BuiltinLayout,
    debug: bool,
    net: &[crate::NetDevice],
) -> Result<vmm_json::VmConfig, Error> {
    let invalid = |what: String| {
        Error::Unsupported(format!(
            "starting kata-vmm failed: its configuration would be invalid: {what}"
        ))
    };
    let vcpus = u8::try_from(config.default_vcpus).map_err(|_| {
        invalid(format!(
            "default_vcpus is {}, expected 1 to 32",
            config.default_vcpus
        ))
    })?;
    let vmm = vmm_json::VmConfig {
        kernel: config.kernel.clone(),
        initrd: Some(config.initrd.clone()),
        cmdline: kernel_cmdline(config, debug),
        vcpus,
        memory_mib: config.default_memory.into(),
        // The shim reads the console into `layout.console_log` (see `crate::console`).
        serial_log: None,
        serial_fd: Some(CONSOLE_FD),
        vsock: Some(vmm_json::VsockConfig {
            guest_cid: GUEST_CID.into(),
            uds_path: layout.agent_socket.clone(),
        }),
        fs: fs_devices(config, layout),
        block: Vec::new(),
        net: net
            .iter()
            .map(|n| vmm_json::NetConfig {
                tap: n.tap.clone(),
                mac: Some(n.mac.clone()),
            })
            .collect(),
        rng: true,
        seccomp: true,
        ready_file: Some(layout.ready_file.clone()),
    };
    vmm.validate().map_err(|e| invalid(e.to_string()))?;
    Ok(vmm)
}

/// The share's virtio-fs device, and the rootfs share's when the VM has one.
fn fs_devices(config: &BuiltinConfig, layout: &BuiltinLayout) -> Vec<vmm_json::FsConfig> {
    let device = |files: &FsFiles, tag: &str| vmm_json::FsConfig {
        socket: files.socket.clone(),
        tag: tag.into(),
        queue_size: vmm_json::DEFAULT_FS_QUEUE_SIZE,
    };
    let mut fs = vec![device(&layout.fs, SHARED_FS_TAG)];
    if config.rootfs_share().is_some() {
        fs.push(device(&layout.rootfs_fs, ROOTFS_FS_TAG));
    }
    fs
}

/// Writes `vmm` to `path` as JSON.
fn write_vmm_config(path: &Path, vmm: &vmm_json::VmConfig) -> Result<(), Error> {
    let run_dir = |source| Error::RunDir {
        path: path.to_path_buf(),
        source,
    };
    let text = serde_json::to_string_pretty(vmm).map_err(|e| run_dir(e.into()))?;
    std::fs::write(path, text).map_err(run_dir)
}

/// The builtin backend of one sandbox.
pub struct Builtin {
    config: BuiltinConfig,
    logger: Logger,
    /// Refuse to start where KVM cannot run guests at full speed (off only in tests, which
    /// boot tiny guests on an emulated KVM).
    require_full_speed: bool,
}

impl Builtin {
    pub fn new(config: BuiltinConfig, logger: Logger) -> Self {
        Self {
            config,
            logger: logger.new(o!("hypervisor" => "builtin")),
            require_full_speed: true,
        }
    }

    fn check_files(&self) -> Result<(), Error> {
        for (what, file) in [
            ("kernel", &self.config.kernel),
            ("initrd", &self.config.initrd),
        ] {
            if !file.is_file() {
                return Err(Error::Unsupported(format!(
                    "starting kata-vmm failed: the guest {what} {} does not exist",
                    file.display()
                )));
            }
        }
        Ok(())
    }
}

impl Builtin {
    /// Fails unless KVM runs guests at full speed: on an emulated KVM the guest kernel
    /// would crawl until the agent's dial timeout, and the user would learn nothing. Uses
    /// the accelerator probe the QEMU backend uses (cached per boot).
    async fn check_kvm(&self) -> Result<(), Error> {
        let logger = self.logger.clone();
        let choice = tokio::task::spawn_blocking(move || {
            accel::choose(kata_config::Accelerator::Auto, &logger)
        })
        .await
        .map_err(|e| Error::Unsupported(format!("the KVM probe failed: {e}")))?
        .map_err(Error::Unsupported)?;
        if choice.accel == Accel::Kvm {
            return Ok(());
        }
        Err(Error::Unsupported(format!(
            "the builtin VMM needs a KVM that runs guests at full speed, and this host's does \
             not ({}); run `kata-vmm check` for details, or set hypervisor_name = \"qemu\" \
             under [runtime], which falls back to TCG",
            choice.reason
        )))
    }

    /// Starts virtiofsd, then kata-vmm, pushing each pid to `started` as soon as it exists.
    async fn start_processes(
        &self,
        cfg: &VmConfig,
        layout: &BuiltinLayout,
        ids: Option<&SandboxIds>,
        started: &mut Vec<i32>,
    ) -> Result<i32, Error> {
        // kata-vmm runs in the pod's network namespace, where it opens its taps by name.
        let place = Place::new(cfg, true)?;
        if let Some(ids) = ids {
            jail::own_run_dir(&cfg.run_dir, ids)?;
        }
        let (mut share_pids, mut rootfs_pids) = (Vec::new(), Vec::new());
        let shares = Shares {
            program: &self.config.virtio_fs_daemon,
            shared_dir: &cfg.shared_dir,
            share: (self.config.virtio_fs_cache, &layout.fs),
            rootfs: self
                .config
                .rootfs_share()
                .map(|cache| (cache, &layout.rootfs_fs)),
            debug: cfg.debug,
            place: &place,
        }
        .start(&self.logger, &mut share_pids, &mut rootfs_pids)
        .await;
        started.extend(share_pids);
        started.extend(rootfs_pids);
        shares?;
        let mut vmm = vmm_config(&self.config, layout, cfg.debug, &cfg.net)?;
        // Kept open until kata-vmm has started: it opens them through the descriptors.
        let mut files = Vec::new();
        let mut jail = None;
        // Confined, it runs by its real path, which its minimal root holds.
        let mut program = self.config.path.clone();
        if let Some(ids) = ids {
            program = jail::real_path(&self.config.path)?;
            // virtiofsd (root) made them; kata-vmm connects as the sandbox's uid.
            let sockets: Vec<&Path> = vmm.fs.iter().map(|fs| fs.socket.as_path()).collect();
            jail::hand_over(&sockets, ids)?;
            let kernel = ReadOnlyFile::open("kernel", &self.config.kernel)?;
            let initrd = ReadOnlyFile::open("initrd", &self.config.initrd)?;
            vmm.kernel = jail::fd_path(jail::KERNEL_FD);
            vmm.initrd = Some(jail::fd_path(jail::INITRD_FD));
            files.push((kernel, jail::KERNEL_FD));
            files.push((initrd, jail::INITRD_FD));
            // kata-vmm attaches to its taps by name, as their owner.
            let mut devices = vec![DevNode::Kvm];
            if let Some(netns) = &cfg.netns {
                for nic in &cfg.net {
                    jail::own_tap(netns, &nic.tap, ids)?;
                }
                if !cfg.net.is_empty() {
                    devices.push(DevNode::Tun);
                }
            }
            jail = Some(Jail::new(ids, &devices, false)?.with_root(&program, &[&cfg.run_dir])?);
        }
        write_vmm_config(&layout.config, &vmm)?;
        // The console's reader ends once kata-vmm has exited and this launch's copies of
        // the pipe (in `place`) are dropped.
        let mut place = place;
        place.pass_fd(
            console::start(&layout.console_log, CONSOLE_LOG_CAP, &self.logger)?,
            CONSOLE_FD,
        );
        for (file, target) in &files {
            place.pass_fd(file.fd(), *target);
        }
        let place = place.jailed(jail);
        let daemon = Daemon {
            step: "kata-vmm",
            program: &program,
            args: vec!["--config".into(), layout.config.display().to_string()],
            env: Vec::new(),
            log: layout.vmm_log.clone(),
            place,
        };
        log_command(&self.logger, &daemon);
        let pid = daemon.spawn(&self.logger)?;
        started.push(pid);
        drop(files);
        wait_ready(&daemon, pid, layout).await?;
        Ok(pid)
    }
}

/// Waits for the ready file and the agent socket, kata-vmm's death, or the deadline.
async fn wait_ready(d: &Daemon<'_>, pid: i32, layout: &BuiltinLayout) -> Result<(), Error> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if layout.ready_file.exists() && layout.agent_socket.exists() {
            return Ok(());
        }
        if let Some(how) = exit_description(pid) {
            return Err(d.failed(format!("it {how} before the VM was running")));
        }
        if Instant::now() >= deadline {
            return Err(d.failed(format!(
                "{} did not appear within {} s",
                layout.ready_file.display(),
                READY_TIMEOUT.as_secs()
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

#[async_trait]
impl Backend for Builtin {
    type Layout = BuiltinLayout;
    type Launch = ();

    fn logger(&self) -> &Logger {
        &self.logger
    }

    fn host_processes(&self) -> HostProcesses {
        self.config.host_processes
    }

    fn layout(&self, run_dir: &Path) -> BuiltinLayout {
        BuiltinLayout::new(run_dir)
    }

    fn stale_files(&self, layout: &BuiltinLayout) -> Vec<PathBuf> {
        layout.stale_files()
    }

    async fn prepare(&self, _cfg: &VmConfig) -> Result<(), Error> {
        self.check_files()?;
        if self.require_full_speed {
            self.check_kvm().await?;
        }
        Ok(())
    }

    async fn launch(
        &self,
        cfg: &VmConfig,
        layout: &BuiltinLayout,
        _launch: &(),
        ids: Option<&SandboxIds>,
        started: &mut Vec<i32>,
    ) -> Result<i32, Error> {
        self.start_processes(cfg, layout, ids, started).await
    }

    fn info(&self, layout: &BuiltinLayout, _: &(), vmm_pid: i32, helper_pids: Vec<i32>) -> VmInfo {
        VmInfo {
            agent_socket: layout.agent_socket.clone(),
            vmm_pid,
            helper_pids,
            console_log: layout.console_log.clone(),
            vmm_log: layout.vmm_log.clone(),
            accelerator: "kvm".into(),
        }
    }

    async fn add_block_device(
        &mut self,
        _file: std::os::fd::OwnedFd,
        _read_only: bool,
    ) -> Result<crate::AttachedBlock, Error> {
        Err(Error::Unsupported(
            "the builtin VMM (kata-vmm, RuntimeClass kata-builtin) cannot attach devices to a \
             running VM; run pods with raw block volumes (volumeDevices) or block devices with \
             the QEMU backend (RuntimeClass kata)"
                .into(),
        ))
    }
}

#[cfg(test)]
mod tests;
