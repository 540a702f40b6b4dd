//! One lifecycle for every backend: [`Vm`] implements [`Hypervisor`] over a [`Backend`],
//! which says only what differs (its run directory's files, its checks, its launch).
//!
//! Start: the backend's checks and probes ([`Backend::prepare`]), stale files of an
//! earlier run removed, the sandbox's uid claimed when host processes are sandboxed, the
//! launch; a failed launch stops by pid everything it started, removes its files and
//! releases the uid. Stop: every process by pid, the files, then the uid (kept while a
//! process survives as it).

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

use async_trait::async_trait;
use kata_config::HostProcesses;
use slog::{info, Logger};

use crate::jail::{self, SandboxIds};
use crate::process::{live_helpers, remove_files, stop_started, RunningVm};
use crate::{AttachedBlock, Error, Hypervisor, VmConfig, VmInfo};

/// What a VMM backend knows: its files, its checks, how it launches.
#[async_trait]
pub trait Backend: Send + Sync {
    /// The files of a sandbox in its run directory.
    type Layout: Send + Sync;
    /// What the checks found that the launch needs (QEMU: the accelerator).
    type Launch: Send + Sync;

    fn logger(&self) -> &Logger;
    /// Whether and how the VMM and its helpers run as a uid of their own.
    fn host_processes(&self) -> HostProcesses;
    fn layout(&self, run_dir: &Path) -> Self::Layout;
    /// Files a previous run may have left that a new run must not find; removed again
    /// when the VM stops or its start fails.
    fn stale_files(&self, layout: &Self::Layout) -> Vec<PathBuf>;
    /// Checks and probes before anything is started.
    async fn prepare(&self, cfg: &VmConfig) -> Result<Self::Launch, Error>;
    /// Starts the helpers and the VMM, as `ids` when given; pushes each pid to `started`
    /// as soon as it exists (also on error); the VMM's pid once the VM runs.
    async fn launch(
        &self,
        cfg: &VmConfig,
        layout: &Self::Layout,
        launch: &Self::Launch,
        ids: Option<&SandboxIds>,
        started: &mut Vec<i32>,
    ) -> Result<i32, Error>;
    /// What the shim learns of the running VM.
    fn info(
        &self,
        layout: &Self::Layout,
        launch: &Self::Launch,
        vmm_pid: i32,
        helper_pids: Vec<i32>,
    ) -> VmInfo;
    /// The VM runs (QEMU: its disks can be attached).
    fn running(&mut self, _layout: &Self::Layout) {}
    /// The VM is about to stop.
    fn stopping(&mut self) {}
    async fn add_block_device(
        &mut self,
        file: OwnedFd,
        read_only: bool,
    ) -> Result<AttachedBlock, Error>;
    async fn remove_block_device(&mut self, _id: &str) -> Result<(), Error> {
        Ok(())
    }
    /// As [`Hypervisor::resize_memory`].
    async fn resize_memory(&mut self, _memory_mib: u32) -> Result<(), Error> {
        Err(Error::Unsupported(
            "this VMM cannot change a running VM's memory".into(),
        ))
    }
}

/// A sandbox's VM on backend `B`.
pub struct Vm<B> {
    pub(crate) backend: B,
    running: Option<RunningVm>,
    /// The uid and gid the VMM (and, with QEMU, the vsock backend) runs as, claimed while
    /// the VM runs.
    ids: Option<SandboxIds>,
}

impl<B: Backend> Vm<B> {
    pub fn new(backend: B) -> Self {
        Self {
            backend,
            running: None,
            ids: None,
        }
    }
}

#[async_trait]
impl<B: Backend> Hypervisor for Vm<B> {
    async fn start_vm(&mut self, cfg: &VmConfig) -> Result<VmInfo, Error> {
        if let Some(r) = &self.running {
            return Err(Error::AlreadyRunning(r.vmm_pid));
        }
        let launch = self.backend.prepare(cfg).await?;
        let started_at = Instant::now();
        let layout = self.backend.layout(&cfg.run_dir);
        remove_files(self.backend.stale_files(&layout))?;
        let host = self.backend.host_processes();
        if host.sandboxed && self.ids.is_none() {
            self.ids = Some(jail::claim_async(host, &cfg.sandbox_id).await?);
        }
        let mut started = Vec::new();
        let launched = self
            .backend
            .launch(cfg, &layout, &launch, self.ids.as_ref(), &mut started)
            .await;
        let logger = self.backend.logger().clone();
        match launched {
            Ok(vmm_pid) => {
                let helper_pids = live_helpers(started, vmm_pid);
                let info = self
                    .backend
                    .info(&layout, &launch, vmm_pid, helper_pids.clone());
                info!(logger, "VM started";
                    "vmm_pid" => vmm_pid,
                    "helper_pids" => format!("{helper_pids:?}"),
                    "accelerator" => &info.accelerator,
                    "elapsed_ms" => started_at.elapsed().as_millis() as u64);
                self.running = Some(RunningVm {
                    vmm_pid,
                    helper_pids,
                    files: self.backend.stale_files(&layout),
                });
                self.backend.running(&layout);
                Ok(info)
            }
            Err(e) => {
                stop_started(&logger, &e, started, self.backend.stale_files(&layout)).await;
                if let Some(ids) = self.ids.take() {
                    ids.release();
                }
                Err(e)
            }
        }
    }

    async fn stop_vm(&mut self) -> Result<(), Error> {
        self.backend.stopping();
        let logger = self.backend.logger().clone();
        let stopped = match self.running.take() {
            Some(running) => running.stop(&logger).await,
            None => Ok(()),
        };
        // While a process survives as the uid, the id stays claimed.
        if stopped.is_ok() {
            if let Some(ids) = self.ids.take() {
                ids.release();
            }
        }
        stopped
    }

    fn pids(&self) -> Vec<i32> {
        self.running
            .as_ref()
            .map(RunningVm::pids)
            .unwrap_or_default()
    }

    async fn add_block_device(
        &mut self,
        file: OwnedFd,
        read_only: bool,
    ) -> Result<AttachedBlock, Error> {
        self.backend.add_block_device(file, read_only).await
    }

    async fn remove_block_device(&mut self, id: &str) -> Result<(), Error> {
        self.backend.remove_block_device(id).await
    }

    async fn resize_memory(&mut self, memory_mib: u32) -> Result<(), Error> {
        self.backend.resize_memory(memory_mib).await
    }
}
