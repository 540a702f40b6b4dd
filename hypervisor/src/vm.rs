//! What every backend is asked for (the [`Hypervisor`] trait) and what it hands back.

use std::path::PathBuf;

use async_trait::async_trait;

use crate::Error;

/// What the shim asks of a sandbox VM.
#[derive(Debug, Clone, Default)]
pub struct VmConfig {
    /// The sandbox id; names the VM in logs and process titles.
    pub sandbox_id: String,
    /// Per-sandbox directory (existing) for sockets and logs.
    pub run_dir: PathBuf,
    /// Host directory exported over virtio-fs with tag [`SHARED_FS_TAG`](crate::SHARED_FS_TAG).
    pub shared_dir: PathBuf,
    /// Debug logging in the helpers and guest boot messages on the console.
    pub debug: bool,
    /// The pod's network namespace on the host, where the VMM runs so that it reaches the
    /// taps of [`VmConfig::net`]; None: the VM has no network but its `lo`.
    pub netns: Option<PathBuf>,
    /// One virtio-net NIC per tap (in `netns`), in order.
    pub net: Vec<NetDevice>,
    /// The sandbox's host cgroup, one directory per hierarchy (the pod's, from the
    /// sandbox spec's `cgroupsPath`): the VMM and every helper start in it, so the node
    /// accounts for them. Empty: they stay in the shim's.
    pub cgroup: Vec<PathBuf>,
}

/// A virtio-net NIC on a host tap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetDevice {
    /// The tap's name in the pod's network namespace (it exists before the VM starts).
    pub tap: String,
    /// The NIC's MAC, `aa:bb:cc:dd:ee:ff`: the pod's veth's, which the guest finds it by.
    pub mac: String,
}

/// What a started VM looks like from the host (serialized in a pooled VM's ready file).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VmInfo {
    /// Hybrid vsock unix socket: connect, write `CONNECT 1024\n`, read `OK <n>\n`, then the
    /// stream reaches guest port 1024.
    pub agent_socket: PathBuf,
    /// The VMM process.
    pub vmm_pid: i32,
    /// Helper daemons (virtiofsd, vsock backend).
    pub helper_pids: Vec<i32>,
    /// The guest's serial console output, its newest
    /// [`CONSOLE_LOG_CAP`](crate::console::CONSOLE_LOG_CAP) bytes at most.
    pub console_log: PathBuf,
    /// The VMM's own stdout and stderr (why it exited, if it did).
    pub vmm_log: PathBuf,
    /// `kvm` or `tcg`, as chosen.
    pub accelerator: String,
}

/// A host block device attached to the running VM: a SCSI disk the guest finds at
/// address `<host>:0:<scsi_target>:<scsi_lun>` (its one virtio-scsi controller's host).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachedBlock {
    /// What [`Hypervisor::remove_block_device`] takes.
    pub id: String,
    pub scsi_target: u16,
    pub scsi_lun: u16,
}

impl AttachedBlock {
    /// `<target>:<lun>`, as the agent's `BlockDevice.scsi_address` carries it.
    pub fn scsi_address(&self) -> String {
        format!("{}:{}", self.scsi_target, self.scsi_lun)
    }
}

/// A VMM backend. Implementations spawn processes and must leave none behind when
/// `start_vm` fails or `stop_vm` returns.
#[async_trait]
pub trait Hypervisor: Send + Sync {
    /// Starts the VM and its helpers; returns once the VMM is running the guest.
    async fn start_vm(&mut self, cfg: &VmConfig) -> Result<VmInfo, Error>;

    /// Stops the VM and its helpers and reaps them. Stopping a stopped VM is a no-op.
    async fn stop_vm(&mut self) -> Result<(), Error>;

    /// Every process this backend started and has not stopped yet, VMM first; what the
    /// shim persists so that `delete` can clean up after a crashed shim.
    fn pids(&self) -> Vec<i32>;

    /// Attaches the host block device open as `file` to the running VM, read-only when
    /// `read_only` (`file` is opened likewise). The backend keeps the descriptor only as
    /// long as the device is attached. Backends that cannot add devices to a running VM
    /// refuse, saying so.
    async fn add_block_device(
        &mut self,
        file: std::os::fd::OwnedFd,
        read_only: bool,
    ) -> Result<AttachedBlock, Error> {
        let _ = (file, read_only);
        Err(Error::Unsupported(
            "this VMM cannot attach block devices to a running VM".into(),
        ))
    }

    /// Detaches a device [`Hypervisor::add_block_device`] attached; an id it does not
    /// know is no error.
    async fn remove_block_device(&mut self, id: &str) -> Result<(), Error> {
        let _ = id;
        Ok(())
    }

    /// Gives the running VM's pod `memory_mib` of the VM's memory: a VM booted with
    /// room to grow (`pod_resize_memory`) keeps the rest in its balloon. Growing returns
    /// once the guest has the memory. Backends without a balloon refuse, saying so.
    async fn resize_memory(&mut self, memory_mib: u32) -> Result<(), Error> {
        let _ = memory_mib;
        Err(Error::Unsupported(
            "this VMM cannot change a running VM's memory".into(),
        ))
    }
}
