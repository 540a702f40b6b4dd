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
        // Not our children, so not our zombies: a process that ended may have left its
        // pid to a stranger already. Only one that names the VM's run directory is ours.
        let run_dir = format!("{}/", self.run_dir.display());
        let ours = |pids: &[i32]| -> Vec<i32> {
            let (ours, strangers) = procinfo::pid::ours_and_strangers(pids, &run_dir);
            if !strangers.is_empty() {
                warn!(self.logger, "pids the VM had run other programs now; leaving them alone";
                    "pids" => format!("{strangers:?}"));
            }
            ours
        };
        let mut survivors = kill_and_reap_async(ours(&[info.vmm_pid]), STOP_GRACE).await;
        survivors.extend(kill_and_reap_async(ours(&info.helper_pids), STOP_GRACE).await);
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
    use crate::process::KilledOnDrop;

    /// A process of another parent (a `sh` that reaps it), in a group of its own as the
    /// factory's daemons are, and the `sh`.
    fn grandchild(cmd: &str) -> (std::process::Child, i32) {
        crate::process::spawn_grandchild(&format!("setsid {cmd}"))
    }

    /// A stand-in for a VM's process: `tail -f` of a file in its run directory, as a
    /// [`grandchild`]. Dropped, it is killed if it still runs (and still is the stand-in)
    /// and its `sh` reaped, also when the test fails.
    struct Grandchild {
        sh: std::process::Child,
        pid: i32,
        marker: String,
    }

    impl Grandchild {
        /// Returns once `tail` runs: `setsid`, then `tail`, each exec, and between the two
        /// the process shows no arguments (so neither a VM's process nor anything else).
        fn start(cmd: &str, marker: &str) -> Grandchild {
            let (sh, pid) = grandchild(cmd);
            let started = Grandchild {
                sh,
                pid,
                marker: marker.to_string(),
            };
            for _ in 0..1000 {
                let argv0 = procinfo::pid::cmdline(pid).and_then(|a| a.into_iter().next());
                if argv0.as_deref() == Some("tail") && procinfo::pid::mentions(pid, marker) {
                    return started;
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            panic!("{cmd} did not start");
        }
    }

    impl Drop for Grandchild {
        fn drop(&mut self) {
            if procinfo::pid::mentions(self.pid, &self.marker) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(self.pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            let _ = self.sh.wait();
        }
    }

    fn running(pid: i32) -> bool {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
            && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .unwrap_or_default()
                .contains(") Z ")
    }

    #[tokio::test]
    async fn stopping_ends_processes_of_another_parent_and_removes_the_run_files() {
        let run = tempfile::tempdir().unwrap();
        std::fs::write(run.path().join("console.log"), "booted\n").unwrap();
        std::fs::create_dir(run.path().join("keep")).unwrap();
        // A VM's processes name its run directory in their arguments.
        let log = run.path().join("console.log");
        // (Their output goes nowhere: the pipe `grandchild` reads the pid from closes.)
        let tail = format!("tail -f {} >/dev/null", log.display());
        let marker = format!("{}/", run.path().display());
        let vmm_proc = Grandchild::start(&tail, &marker);
        let helper_proc = Grandchild::start(&tail, &marker);
        let (vmm, helper) = (vmm_proc.pid, helper_proc.pid);
        // A helper that ended, its pid given to a stranger since.
        let stranger = KilledOnDrop(
            std::process::Command::new("sleep")
                .arg("100")
                .spawn()
                .unwrap(),
        );
        let stranger_pid = stranger.0.id() as i32;
        let info = VmInfo {
            agent_socket: run.path().join("agent.sock"),
            vmm_pid: vmm,
            helper_pids: vec![helper, stranger_pid],
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
        assert_eq!(vm.pids(), vec![vmm, helper, stranger_pid]);
        assert!(matches!(
            vm.start_vm(&VmConfig::default()).await,
            Err(Error::AlreadyRunning(p)) if p == vmm
        ));
        vm.stop_vm().await.expect("stopped");
        assert!(!running(vmm) && !running(helper));
        assert!(
            running(stranger_pid),
            "a stranger with a recorded pid was killed"
        );
        drop(stranger);
        assert!(!run.path().join("console.log").exists());
        assert!(run.path().join("keep").is_dir(), "directories are left");
        assert!(vm.pids().is_empty());
        vm.stop_vm().await.expect("stopping twice is a no-op");
        drop((vmm_proc, helper_proc));
    }
}
