//! The QEMU backend: `qemu-system-x86_64 -M microvm` with vhost-user helpers.
//!
//! Start order: virtiofsd (virtio-fs, tag `kataShared`; and a second one, tag
//! `kataRootfs`, when the VM has the rootfs share) and the vsock backend (vsock with a
//! hybrid vsock unix socket for the agent) side by side, each waited for until its
//! sockets appear, then QEMU, waited for until its QMP greeting (machine set up, guest
//! running).
//! If a step fails, everything already started is killed and reaped, and the error names
//! the step and quotes its log. All processes log to files in the run directory.
//!
//! Processes are tracked by pid only (see [`crate::process`]); the lifecycle is
//! [`crate::backend`]'s, shared with the builtin backend. Dropping a running
//! [`Vm`](crate::Vm) leaves them running on purpose, so that a crashed shim's `delete` can still
//! find and stop them from persisted pids.
//!
//! Hosts with `/dev/vhost-vsock` could use QEMU's in-kernel `vhost-vsock-device`, but the
//! agent connection would then need AF_VSOCK on the host instead of the hybrid socket;
//! until the shim speaks both, every host uses the vhost-user backend (TODO).

pub mod balloon;
pub mod cmdline;
pub mod hotplug;
pub mod layout;
mod qmp;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use kata_config::{HostProcesses, QemuConfig};
use slog::{debug, o, Logger};

use crate::accel::{self, Accel};
use crate::backend::Backend;
use crate::console::{self, CONSOLE_FD, CONSOLE_LOG_CAP};
use crate::jail::{self, DevNode, Jail, ReadOnlyFile, SandboxIds};
use crate::process::{exit_description, wait_for_sockets, Daemon, Place, Wait, POLL};
use crate::virtiofsd::{log_command, Shares};
use crate::{AttachedBlock, Error, VmConfig, VmInfo};
use cmdline::QemuLaunch;
use hotplug::ScsiDisks;
use layout::RunDirLayout;

/// How long QEMU may take to set up the machine (TCG on a busy host is slow).
const QEMU_READY_TIMEOUT: Duration = Duration::from_secs(20);

/// The QEMU backend of one sandbox.
pub struct Qemu {
    config: QemuConfig,
    logger: Logger,
    /// Disks attached to the running VM (with `block_device_hotplug`).
    disks: Option<ScsiDisks>,
    /// The running VM's QMP socket and the memory its pod is given now (MiB), when it
    /// was booted with room to grow (`pod_resize_memory`).
    balloon: Option<(PathBuf, u32)>,
}

impl Qemu {
    pub fn new(config: QemuConfig, logger: Logger) -> Self {
        Self {
            config,
            logger: logger.new(o!("hypervisor" => "qemu")),
            disks: None,
            balloon: None,
        }
    }

    /// Starts the helpers, side by side, then QEMU; every pid started is in `started` when
    /// this returns, also on error.
    async fn start_processes(
        &self,
        cfg: &VmConfig,
        layout: &RunDirLayout,
        (accel, tcg_clock): &QemuLaunchChoice,
        ids: Option<&SandboxIds>,
        started: &mut Vec<i32>,
    ) -> Result<i32, Error> {
        let (accel, tcg_clock) = (*accel, tcg_clock.as_deref());
        // QEMU runs in the pod's network namespace, where its taps are.
        let place = Place::new(cfg, true)?;
        if let Some(ids) = ids {
            jail::own_run_dir(&cfg.run_dir, ids)?;
        }
        // The helpers start side by side: QEMU needs every socket, and each daemon spends
        // most of its start-up on its own (virtiofsd on its sandbox).
        // Each keeps its own pids: when one fails, try_join drops the others midway.
        let (mut fs_pids, mut rootfs_fs_pids, mut vsock_pids) =
            (Vec::new(), Vec::new(), Vec::new());
        let helpers = tokio::try_join!(
            self.start_virtiofsd(cfg, layout, &place, &mut fs_pids, &mut rootfs_fs_pids),
            self.start_vsock_backend(cfg, layout, &place, ids, &mut vsock_pids),
        );
        started.extend(fs_pids);
        started.extend(rootfs_fs_pids);
        started.extend(vsock_pids);
        helpers?;
        if let Some(ids) = ids {
            // virtiofsd (root) made them; QEMU connects as the sandbox's uid.
            let mut sockets = vec![layout.fs.socket.as_path()];
            if self.config.rootfs_share().is_some() {
                sockets.push(layout.rootfs_fs.socket.as_path());
            }
            jail::hand_over(&sockets, ids)?;
        }

        // The console's reader ends once QEMU has exited and this launch's copies of the
        // pipe (in `place`) are dropped.
        let mut place = place;
        place.pass_fd(
            console::start(&layout.console_log, CONSOLE_LOG_CAP, &self.logger)?,
            CONSOLE_FD,
        );
        // Kept open until QEMU has started: it opens them through the descriptors.
        let mut files = Vec::new();
        // Confined, it runs by its real path, which its minimal root holds.
        let mut program = self.config.path.clone();
        if let Some(ids) = ids {
            program = jail::real_path(&self.config.path)?;
            let kernel = ReadOnlyFile::open("kernel", &self.config.kernel)?;
            let initrd = ReadOnlyFile::open("initrd", &self.config.initrd)?;
            place.pass_fd(kernel.fd(), jail::KERNEL_FD);
            place.pass_fd(initrd.fd(), jail::INITRD_FD);
            files.extend([kernel, initrd]);
            if let Some(netns) = &cfg.netns {
                for (i, nic) in cfg.net.iter().enumerate() {
                    let tap = jail::open_tap(netns, &nic.tap, None)?;
                    place.pass_fd(Arc::new(tap), jail::FIRST_TAP_FD + i as i32);
                }
            }
            let devices: &[DevNode] = if accel == Accel::Kvm {
                &[DevNode::Kvm]
            } else {
                &[]
            };
            place = place.jailed(Some(
                Jail::new(ids, devices, false)?.with_root(&program, &[&cfg.run_dir])?,
            ));
        }
        let qemu = Daemon {
            step: "qemu",
            program: &program,
            args: cmdline::qemu_args(&QemuLaunch {
                config: &self.config,
                layout,
                accel,
                sandbox_id: &cfg.sandbox_id,
                debug: cfg.debug,
                net: &cfg.net,
                tcg_clock,
                confined: ids.is_some(),
            }),
            env: Vec::new(),
            log: layout.qemu_log.clone(),
            place,
        };
        self.log_command(&qemu);
        let pid = qemu.spawn(&self.logger)?;
        started.push(pid);
        drop(files);
        wait_for_qmp(&qemu, pid, &layout.qmp_socket).await?;
        let ceiling = self.config.sizing.resize_memory;
        if ceiling > 0 {
            // Before the guest's balloon driver starts: it takes the ceiling at once.
            let bytes = balloon::guest_bytes(self.config.default_memory, ceiling);
            balloon::set(layout.qmp_socket.clone(), bytes, false).await?;
        }
        Ok(pid)
    }

    async fn start_virtiofsd(
        &self,
        cfg: &VmConfig,
        layout: &RunDirLayout,
        place: &Place,
        share_pids: &mut Vec<i32>,
        rootfs_pids: &mut Vec<i32>,
    ) -> Result<(), Error> {
        let rootfs = self.config.rootfs_share();
        Shares {
            program: &self.config.virtio_fs_daemon,
            shared_dir: &cfg.shared_dir,
            share: (self.config.virtio_fs_cache, &layout.fs),
            rootfs: rootfs.map(|cache| (cache, &layout.rootfs_fs)),
            debug: cfg.debug,
            place,
        }
        .start(&self.logger, share_pids, rootfs_pids)
        .await
    }

    /// Starts the vhost-user vsock backend and waits until it listens on its two sockets.
    async fn start_vsock_backend(
        &self,
        cfg: &VmConfig,
        layout: &RunDirLayout,
        place: &Place,
        ids: Option<&SandboxIds>,
        started: &mut Vec<i32>,
    ) -> Result<(), Error> {
        // Confined, it runs by its real path, which its minimal root holds.
        let program = match ids {
            Some(_) => jail::real_path(&self.config.vsock_backend)?,
            None => self.config.vsock_backend.clone(),
        };
        let vsock = Daemon {
            step: "the vsock backend",
            program: &program,
            args: cmdline::vsock_backend_args(layout),
            env: debug_env(cfg.debug),
            log: layout.vsock_log.clone(),
            // It needs no network: unix sockets only.
            place: match ids {
                Some(ids) => place.without_netns().jailed(Some(
                    Jail::new(ids, &[], true)?.with_root(&program, &[&cfg.run_dir])?,
                )),
                None => place.without_netns(),
            },
        };
        self.log_command(&vsock);
        let pid = vsock.spawn(&self.logger)?;
        started.push(pid);
        wait_for_sockets(&vsock, pid, &[&layout.vsock_socket, &layout.agent_socket])
            .await
            .map_err(Wait::into_error)
    }

    fn log_command(&self, d: &Daemon<'_>) {
        log_command(&self.logger, d);
    }
}

/// What QEMU's launch needs from the checks: the accelerator and, under TCG, the guest's
/// clock parameters.
type QemuLaunchChoice = (Accel, Option<String>);

#[async_trait]
impl Backend for Qemu {
    type Layout = RunDirLayout;
    type Launch = QemuLaunchChoice;

    fn logger(&self) -> &Logger {
        &self.logger
    }

    fn host_processes(&self) -> HostProcesses {
        self.config.host_processes
    }

    fn layout(&self, run_dir: &Path) -> RunDirLayout {
        RunDirLayout::new(run_dir)
    }

    fn stale_files(&self, layout: &RunDirLayout) -> Vec<PathBuf> {
        layout.stale_files()
    }

    async fn prepare(&self, cfg: &VmConfig) -> Result<QemuLaunchChoice, Error> {
        for (what, dir) in [("run_dir", &cfg.run_dir), ("shared_dir", &cfg.shared_dir)] {
            if dir.to_str().is_none() {
                return Err(Error::Unsupported(format!(
                    "{what} {} is not valid UTF-8, which QEMU's options cannot carry",
                    dir.display()
                )));
            }
        }
        // Checked up front: QEMU reports a missing kernel only after it has started, which
        // races with the readiness check.
        for (what, file) in [
            ("kernel", &self.config.kernel),
            ("initrd", &self.config.initrd),
        ] {
            if !file.is_file() {
                return Err(Error::Unsupported(format!(
                    "starting qemu failed: the guest {what} {} does not exist",
                    file.display()
                )));
            }
        }
        if Path::new("/dev/vhost-vsock").exists() {
            debug!(
                self.logger,
                "/dev/vhost-vsock exists but the vhost-user vsock backend is used (hybrid vsock)"
            );
        }
        let configured = self.config.accelerator;
        let logger = self.logger.clone();
        let (choice, tcg_clock) = tokio::task::spawn_blocking(move || {
            let choice = accel::choose(configured, &logger)?;
            let clock = (choice.accel == Accel::Tcg)
                .then(accel::tsc::tcg_clock_params)
                .flatten();
            Ok((choice, clock))
        })
        .await
        .unwrap_or_else(|_| Err("the accelerator probe panicked".into()))
        .map_err(Error::Unsupported)?;

        Ok((choice.accel, tcg_clock))
    }

    async fn launch(
        &self,
        cfg: &VmConfig,
        layout: &RunDirLayout,
        launch: &QemuLaunchChoice,
        ids: Option<&SandboxIds>,
        started: &mut Vec<i32>,
    ) -> Result<i32, Error> {
        self.start_processes(cfg, layout, launch, ids, started)
            .await
    }

    fn info(
        &self,
        layout: &RunDirLayout,
        (accel, _): &QemuLaunchChoice,
        vmm_pid: i32,
        helper_pids: Vec<i32>,
    ) -> VmInfo {
        VmInfo {
            agent_socket: layout.agent_socket.clone(),
            vmm_pid,
            helper_pids,
            console_log: layout.console_log.clone(),
            vmm_log: layout.qemu_log.clone(),
            accelerator: accel.as_str().into(),
        }
    }

    fn running(&mut self, layout: &RunDirLayout) {
        self.balloon = (self.config.sizing.resize_memory > 0)
            .then(|| (layout.qmp_socket.clone(), self.config.default_memory));
        self.disks = self
            .config
            .block_device_hotplug
            .then(|| ScsiDisks::new(layout.qmp_socket.clone()));
    }

    fn stopping(&mut self) {
        // The VM's end detaches its disks, and QEMU's closes their descriptors.
        self.disks = None;
        self.balloon = None;
    }

    async fn resize_memory(&mut self, memory_mib: u32) -> Result<(), Error> {
        let ceiling = self.config.sizing.resize_memory;
        let most = self.config.default_memory + ceiling;
        let Some((socket, now)) = &mut self.balloon else {
            return Err(Error::Unsupported(
                "this VM cannot change its memory: it was booted without room to grow \
                 ([hypervisor.qemu] pod_resize_memory = 0)"
                    .into(),
            ));
        };
        if memory_mib > most {
            return Err(Error::Unsupported(format!(
                "the VM can give its pod at most {most} MiB (boot size {} + pod_resize_memory \
                 {ceiling}), not {memory_mib}",
                self.config.default_memory
            )));
        }
        // Growing waits for the memory to be there; shrinking lets the guest give it back
        // as it frees it.
        let grows = memory_mib > *now;
        balloon::set(
            socket.clone(),
            balloon::guest_bytes(memory_mib, ceiling),
            grows,
        )
        .await?;
        *now = memory_mib;
        Ok(())
    }

    async fn add_block_device(
        &mut self,
        file: std::os::fd::OwnedFd,
        read_only: bool,
    ) -> Result<AttachedBlock, Error> {
        if !self.config.block_device_hotplug {
            return Err(Error::Unsupported(
                "block devices cannot be attached to this sandbox's VM: it has no SCSI \
                 controller, as [hypervisor.qemu] block_device_hotplug = false in the \
                 configuration; set it to true (the default) for pods with raw block volumes"
                    .into(),
            ));
        }
        match &mut self.disks {
            Some(disks) => disks.add(file, read_only).await,
            None => Err(Error::Unsupported(
                "the VM is not running; no device can be attached".into(),
            )),
        }
    }

    async fn remove_block_device(&mut self, id: &str) -> Result<(), Error> {
        match &mut self.disks {
            Some(disks) => disks.remove(id).await,
            None => Ok(()),
        }
    }
}

fn debug_env(debug: bool) -> Vec<(&'static str, String)> {
    if debug {
        vec![("RUST_LOG", "debug".into())]
    } else {
        Vec::new()
    }
}

/// Waits for QEMU's QMP greeting, QEMU's death, or the deadline.
async fn wait_for_qmp(d: &Daemon<'_>, pid: i32, socket: &Path) -> Result<(), Wait> {
    let deadline = Instant::now() + QEMU_READY_TIMEOUT;
    let mut pause = Duration::from_millis(2);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if let Ok(qmp::Greeting::Ready) =
            tokio::time::timeout(left, qmp::read_greeting(socket)).await
        {
            return Ok(());
        }
        if let Some(how) = exit_description(pid) {
            return Err(Wait::Died(
                d.failed(format!("it {how} before the VM was running")),
            ));
        }
        if Instant::now() >= deadline {
            return Err(Wait::Timeout(d.failed(format!(
                "it did not answer on {} within {} s",
                socket.display(),
                QEMU_READY_TIMEOUT.as_secs()
            ))));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(POLL);
    }
}
