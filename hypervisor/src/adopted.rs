//! A VM someone else started (the VM factory's pool), adopted by a sandbox.
//!
//! Its VMM and helpers are not the adopting process's children: their parent (the
//! factory, or init once the factory is gone) reaps them. [`Adopted::stop_vm`] stops them
//! by pid, the VMM first (a helper that goes first would make the guest see its device
//! vanish), then the helpers, and waits until each is gone or a zombie (see
//! [`kill_and_reap`](crate::kill_and_reap): a zombie of another parent runs nothing).
//! Then it gives back the uid claim the adopter took over and removes the files of the
//! VM's run directory.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use slog::{info, o, warn, Logger};

use crate::jail::SandboxIds;
use crate::process::{kill_and_reap_async, STOP_GRACE};
use crate::qemu::hotplug::ScsiDisks;
use crate::qemu::layout::RunDirLayout;
use crate::{AttachedBlock, Error, Hypervisor, VmConfig, VmInfo};

/// A running VM handed over by its starter; stopped like any other.
pub struct Adopted {
    logger: Logger,
    /// None once stopped.
    info: Option<VmInfo>,
    run_dir: PathBuf,
    /// The uid claim of the VM's contained processes, taken over from the starter.
    ids: Option<SandboxIds>,
    /// Disks attached over QMP, when the VM is QEMU's (it has a QMP socket).
    disks: Option<ScsiDisks>,
}

impl Adopted {
    /// Adopts the VM `info` describes, whose sockets and logs are in `run_dir`; `ids`
    /// is its uid claim, taken over by the caller (None: the VM runs uncontained).
    pub fn new(info: VmInfo, run_dir: PathBuf, ids: Option<SandboxIds>, logger: Logger) -> Self {
        let qmp_socket = RunDirLayout::new(&run_dir).qmp_socket;
        let disks = qmp_socket.exists().then(|| ScsiDisks::new(qmp_socket));
        Adopted {
            logger: logger.new(o!("hypervisor" => "adopted")),
            info: Some(info),
            run_dir,
            ids,
            disks,
        }
    }
}

/// Removes every file (not directory) directly in `dir`; what is gone already is fine.
fn remove_files_in(dir: &Path) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries.flatten() {
        // Not followed: a link is removed itself.
        let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
        if !is_dir {
            match std::fs::remove_file(entry.path()) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
    }
    Ok(())
}

#[async_trait]
impl Hypervisor for Adopted {
    async fn start_vm(&mut self, _cfg: &VmConfig) -> Result<VmInfo, Error> {
        match &self.info {
            Some(info) => Err(Error::AlreadyRunning(info.vmm_pid)),
            None => Err(Error::Unsupported(
                "an adopted VM cannot be started again once stopped; start a new sandbox".into(),
            )),
        }
    }

    async fn stop_vm(&mut self) -> Result<(), Error> {
        let Some(info) = self.info.take() else {
            return Ok(());
        };
        info!(self.logger, "stopping the adopted VM";
            "vmm_pid" => info.vmm_pid, "helper_pids" => format!("{:?}", info.helper_pids));
        let mut survivors = kill_and_reap_async(vec![info.vmm_pid], STOP_GRACE).await;
        survivors.extend(kill_and_reap_async(info.helper_pids.clone(), STOP_GRACE).await);
        if let Err(e) = remove_files_in(&self.run_dir) {
            warn!(self.logger, "cannot remove the VM's run directory files";
                "dir" => self.run_dir.display(), "error" => e.to_string());
        }
        if !survivors.is_empty() {
            // The uid stays claimed while they run; a later delete tries again.
            return Err(Error::Survivors { pids: survivors });
        }
        if let Some(ids) = self.ids.take() {
            ids.release();
        }
        Ok(())
    }

    fn pids(&self) -> Vec<i32> {
        self.info
            .as_ref()
            .map(|i| {
                let mut pids = vec![i.vmm_pid];
                pids.extend(&i.helper_pids);
                pids
            })
            .unwrap_or_default()
    }

    async fn add_block_device(
        &mut self,
        file: std::os::fd::OwnedFd,
        read_only: bool,
    ) -> Result<AttachedBlock, Error> {
        match &mut self.disks {
            Some(disks) => disks.add(file, read_only).await,
            None => Err(Error::Unsupported(
                "the builtin VMM (kata-vmm, RuntimeClass kata-builtin) cannot attach devices \
                 to a running VM; run pods with raw block volumes (volumeDevices) or block \
                 devices with the QEMU backend (RuntimeClass kata)"
                    .into(),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A process of another parent (a `sh` that reaps it), in a group of its own as the
    /// factory's daemons are, and the `sh`.
    fn grandchild(cmd: &str) -> (std::process::Child, i32) {
        crate::process::spawn_grandchild(&format!("setsid {cmd}"))
    }

    fn running(pid: i32) -> bool {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
            && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .unwrap_or_default()
                .contains(") Z ")
    }

    #[tokio::test]
    async fn stopping_ends_processes_of_another_parent_and_removes_the_run_files() {
        let (mut vmm_parent, vmm) = grandchild("sleep 100");
        let (mut helper_parent, helper) = grandchild("sleep 101");
        let run = tempfile::tempdir().unwrap();
        std::fs::write(run.path().join("console.log"), "booted\n").unwrap();
        std::fs::create_dir(run.path().join("keep")).unwrap();
        let info = VmInfo {
            agent_socket: run.path().join("agent.sock"),
            vmm_pid: vmm,
            helper_pids: vec![helper],
            console_log: run.path().join("console.log"),
            vmm_log: run.path().join("qemu.log"),
            accelerator: "tcg".into(),
        };
        let mut vm = Adopted::new(
            info,
            run.path().to_path_buf(),
            None,
            crate::discard_logger(),
        );
        assert_eq!(vm.pids(), vec![vmm, helper]);
        assert!(matches!(
            vm.start_vm(&VmConfig::default()).await,
            Err(Error::AlreadyRunning(p)) if p == vmm
        ));
        vm.stop_vm().await.expect("stopped");
        assert!(!running(vmm) && !running(helper));
        assert!(!run.path().join("console.log").exists());
        assert!(run.path().join("keep").is_dir(), "directories are left");
        assert!(vm.pids().is_empty());
        vm.stop_vm().await.expect("stopping twice is a no-op");
        vmm_parent.wait().unwrap();
        helper_parent.wait().unwrap();
    }
}
