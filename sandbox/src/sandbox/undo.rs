//! Taking back what a sandbox's creation made, after a failure, at teardown, and by
//! `delete` after a crashed shim: the VM by its handle, then everything
//! [`SandboxState`] records (mounts, processes by pid, the uid claim, directories).

use std::path::Path;
use std::time::Duration;

use hypervisor::Hypervisor;
use slog::{warn, Logger};

use super::SandboxError;
use crate::cgroup;
use crate::mount::{self, SharedDirs};
use crate::network;
use crate::persist::SandboxState;

/// What `create` has done so far, for undoing it.
pub(super) struct Progress {
    pub(super) state: SandboxState,
    pub(super) vm: Option<Box<dyn Hypervisor>>,
    pub(super) host_cgroup: cgroup::HostCgroup,
}

impl Progress {
    /// Creates the pod's host cgroup at `path` (containerd's `cgroupsPath`) and records
    /// it, for the VM to run in and for undoing.
    pub(super) fn enter_host_cgroup(&mut self, path: &str) -> Result<(), SandboxError> {
        let host_cgroup = cgroup::create(path)?;
        self.state.cgroups = host_cgroup.created.clone();
        self.host_cgroup = host_cgroup;
        self.state.save().map_err(SandboxError::Persist)
    }

    pub(super) async fn undo(mut self, log: &Logger) {
        if let Some(mut vm) = self.vm.take() {
            stop_vm(vm.as_mut(), &mut self.state, log).await;
        }
        cleanup_host(&self.state, log).await;
    }
}

/// Stops the VM through its hypervisor. Once that has reaped the processes, their pids
/// are dropped from `state`, so cleanup never signals a pid the system has reused since.
pub(super) async fn stop_vm(vm: &mut dyn Hypervisor, state: &mut SandboxState, log: &Logger) {
    match vm.stop_vm().await {
        Ok(()) => {
            state.vmm_pid = 0;
            state.helper_pids.clear();
        }
        Err(e) => warn!(log, "stopping the VM"; "error" => %e),
    }
}

/// Unmounts, kills and removes everything `state` records. Used after a failed create,
/// at sandbox teardown, and by `delete` after a crashed shim.
pub async fn cleanup_host(state: &SandboxState, log: &Logger) {
    let mut recorded: Vec<i32> = state.helper_pids.clone();
    if state.vmm_pid > 0 {
        recorded.insert(0, state.vmm_pid);
    }
    // A shim killed while the VM started had no time to record their pids; they all
    // name the sandbox's run directory.
    let run_dir = format!("{}/", layout::vm_run_root().join(state.vm_id()).display());
    // A recorded pid whose process has ended since (a VMM that crashed with its shim) may
    // have been given to a stranger by now: only a process that still names the sandbox's
    // run directory is stopped.
    let (mut pids, strangers) = procinfo::pid::ours_and_strangers(&recorded, &run_dir);
    if !strangers.is_empty() {
        warn!(log, "pids the sandbox recorded run other programs now; leaving them alone";
            "pids" => format!("{strangers:?}"));
    }
    for pid in procinfo::pid::pids_mentioning(&run_dir) {
        if !pids.contains(&pid) {
            warn!(log, "stopping a process of the sandbox that was not recorded"; "pid" => pid);
            pids.push(pid);
        }
    }
    // First, while the VMM may still hold the pod's network namespace open: containerd
    // may have removed its path already.
    if let Some(net) = &state.network {
        // Through the VMM's pid only while it still is the VMM's: a stranger's namespace
        // is not the pod's.
        let vmm_pid = if pids.contains(&state.vmm_pid) {
            state.vmm_pid
        } else {
            0
        };
        if let Err(e) = network::teardown(net, vmm_pid).await {
            warn!(log, "undoing the pod's network wiring"; "error" => %e);
        }
    }
    let survivors = if pids.is_empty() {
        Vec::new()
    } else {
        hypervisor::kill_and_reap(&pids, Duration::from_secs(2))
    };
    // The uid its VMM ran as, which a crashed shim could not give back; kept while one
    // of them survives.
    if survivors.is_empty() {
        let claims = Path::new(layout::ID_CLAIMS_DIR);
        hypervisor::jail::release_claims_of(claims, &state.sandbox_id);
        // A pooled VM's claim names the VM until the sandbox has taken it over.
        if let Some(pooled) = &state.pooled {
            hypervisor::jail::release_claims_of(claims, &pooled.vm_id);
        }
    } else {
        warn!(log, "processes of the sandbox survived SIGKILL"; "pids" => format!("{survivors:?}"));
    }
    cgroup::remove(&state.cgroups);
    if let Some(pooled) = &state.pooled {
        let mut left = crate::pool::Leftovers::default();
        crate::pool::remove_netns(&pooled.netns, &mut left);
        if !left.is_empty() {
            warn!(log, "removing the pooled VM's network namespace"; "error" => %left);
        }
        let _ = std::fs::remove_file(&pooled.claimed);
    }
    mount::unmount_all(&state.mounts);
    let share = SharedDirs::for_sandbox(state.vm_id());
    for m in mount::mounts_under(&share.base) {
        mount::unmount(&m);
    }
    let mut dirs = state.dirs.clone();
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    for d in dirs {
        if let Err(e) = mount::remove_dir_if_unmounted(&d) {
            warn!(log, "removing sandbox directory"; "path" => d.display(), "error" => %e);
        }
    }
    if let Err(e) = SandboxState::remove(&state.sandbox_id) {
        warn!(log, "removing sandbox state"; "error" => %e);
    }
}

pub(super) fn mkdir(path: &Path) -> Result<(), SandboxError> {
    std::fs::create_dir_all(path).map_err(|source| SandboxError::Dir {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;
    use hypervisor::process::KilledOnDrop;

    /// `delete` after a crashed shim reads pids from persist.json. The process of one of
    /// them ended long ago and its number went to a stranger: that stranger runs on, while
    /// what names the sandbox's run directory is stopped.
    #[tokio::test]
    async fn cleanup_stops_the_sandboxs_processes_and_leaves_a_reused_pid_alone() {
        let id = format!("undo-test-{}", std::process::id());
        let run_dir = layout::vm_run_root().join(&id);
        std::fs::create_dir_all(&run_dir).unwrap();
        let console = run_dir.join("console.log");
        std::fs::write(&console, "").unwrap();
        let vmm = KilledOnDrop(
            Command::new("tail")
                .arg("-f")
                .arg(&console)
                .spawn()
                .unwrap(),
        );
        let vmm_pid = vmm.0.id() as i32;
        // As a VMM that has run for a while does, it shows its arguments (a process that
        // has just called execve shows none yet).
        let marker = format!("{}/", run_dir.display());
        for _ in 0..1000 {
            if procinfo::pid::mentions(vmm_pid, &marker) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(
            procinfo::pid::mentions(vmm_pid, &marker),
            "the VMM's stand-in did not start"
        );
        let mut stranger = KilledOnDrop(Command::new("sleep").arg("100").spawn().unwrap());
        let state = SandboxState {
            sandbox_id: id.clone(),
            vmm_pid,
            helper_pids: vec![stranger.0.id() as i32],
            dirs: vec![run_dir.clone()],
            ..Default::default()
        };
        cleanup_host(&state, &Logger::root(slog::Discard, slog::o!())).await;
        let _ = std::fs::remove_dir_all(&run_dir);
        let runs_on = procinfo::pid::is_running(vmm_pid);
        if !runs_on {
            // The clean-up reaped it: its pid is no longer ours to signal.
            std::mem::forget(vmm);
        }
        assert!(!runs_on, "the process naming the run directory still runs");
        assert!(
            stranger.0.try_wait().unwrap().is_none(),
            "a stranger holding a recorded pid was killed"
        );
    }
}
