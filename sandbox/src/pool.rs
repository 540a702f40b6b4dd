//! The pool directory: the only interface between the VM factory and the shims that
//! claim its VMs.
//!
//! ```text
//! <vm_cache_dir>/factory.pid                 the factory daemon's pid
//! <vm_cache_dir>/<key>/ready/<vm-id>.json    a ready VM (written to .<vm-id>.tmp, renamed)
//! <vm_cache_dir>/<key>/netns/<vm-id>         the bind-mounted network namespace of that VM
//! <vm_cache_dir>/<key>/booting/<vm-id>       a VM being booted, naming its factory's pid
//! <vm_cache_dir>/<key>/claimed-<owner>.json  a VM taken by `<owner>` (a sandbox, or the
//!                                            factory itself when it stops a VM)
//! ```
//!
//! `<key>` ([`pool_key`]) names everything that makes two VMs interchangeable. A claim is
//! a `rename` of the ready file: between concurrent claimers exactly one rename of a file
//! succeeds, so exactly one of them gets the VM ([`claim`]).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::mount::{self, SharedDirs};

/// The factory daemon's pid file in the pool directory.
pub const PID_FILE: &str = "factory.pid";
/// The factory's binary, installed beside the shim and kata-runtime.
pub const FACTORY_BINARY: &str = "kata-vm-factory";
/// The directory of ready VMs under `<vm_cache_dir>/<key>`.
pub const READY_DIR: &str = "ready";
/// The directory of the pool VMs' network namespaces under `<vm_cache_dir>/<key>`.
pub const NETNS_DIR: &str = "netns";
/// The directory of the VMs being booted under `<vm_cache_dir>/<key>`.
pub const BOOTING_DIR: &str = "booting";
/// The tap of a pooled VM, in its own network namespace (as a cold start names the
/// first one).
pub const POOL_TAP: &str = "tap0_kata";
/// Every pooled VM's id starts with this.
pub const ID_PREFIX: &str = "pool-";

/// The host side of the share of a pooled VM: the directories and mounts
/// [`SharedDirs::setup`] made for the VM's id (virtiofsd serves `shared`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolShare {
    /// The VM's share directory, holding `mounts` and `shared`.
    pub base: PathBuf,
    /// Where container root filesystems and volumes are bound.
    pub mounts: PathBuf,
    /// What virtiofsd exports.
    pub shared: PathBuf,
    /// The mount points made, in order.
    pub made: Vec<PathBuf>,
}

impl PoolShare {
    /// The shim's handle of the same directories.
    pub fn dirs(&self) -> SharedDirs {
        SharedDirs {
            mounts: self.mounts.clone(),
            shared: self.shared.clone(),
            base: self.base.clone(),
        }
    }
}

/// A booted, idle VM whose agent answered, as its ready file records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PooledVm {
    /// `pool-<16 hex>`; also the VM's sandbox id at boot, its run directory
    /// `/run/vc/vm/<id>` and its share `/run/kata-containers/shared/sandboxes/<id>`.
    pub id: String,
    /// Its [`pool_key`].
    pub key: String,
    /// When its ready file was written (ms since the Unix epoch).
    pub created_unix_ms: u64,
    /// The VM as the hypervisor started it (agent socket, VMM and helper pids, logs).
    pub info: hypervisor::VmInfo,
    /// `/run/vc/vm/<id>`.
    pub run_dir: PathBuf,
    /// Its share on the host.
    pub shared: PoolShare,
    /// The virtiofsd processes serving the share (their mount namespaces get the binds).
    pub virtiofsd_pids: Vec<i32>,
    /// `<vm_cache_dir>/<key>/netns/<id>`: the network namespace the VMM runs in.
    pub netns: PathBuf,
    /// The tap of its one NIC, in `netns` ([`POOL_TAP`]).
    pub tap: String,
    /// The guest NIC's MAC now (random, locally administered).
    pub mac: String,
    /// The uid and gid its contained VMM runs as (None: containment off). The claim of
    /// the uid in [`layout::ID_CLAIMS_DIR`] names `id` and is held by nobody
    /// until a shim takes it over ([`PooledVm::take_over_ids`]).
    pub host_uid: Option<u32>,
    pub host_gid: Option<u32>,
    /// The factory that made it (the VMM's parent, which reaps it).
    #[serde(default)]
    pub factory_pid: u32,
}

impl PooledVm {
    /// The VMM first, then the helpers.
    pub fn pids(&self) -> Vec<i32> {
        let mut pids = vec![self.info.vmm_pid];
        pids.extend(self.info.helper_pids.iter().copied());
        pids.retain(|&p| p > 0);
        pids
    }

    /// Whether every process of the VM still runs (and the VMM is still this VM's: its
    /// command line names the run directory, so a reused pid does not pass).
    pub fn is_alive(&self) -> bool {
        if self.info.vmm_pid <= 0 {
            return false;
        }
        let run_dir = format!("{}/", self.run_dir.display());
        if !procinfo::pid::mentions(self.info.vmm_pid, &run_dir) {
            return false;
        }
        self.pids()
            .iter()
            .all(|&pid| procinfo::pid::is_running(pid))
    }

    /// Takes over the VM's uid claim for `sandbox_id` (see
    /// [`hypervisor::jail::SandboxIds::take_over`]); None when the VM runs uncontained.
    /// Hold the result while the VM runs; `release` it once the VM is stopped.
    pub fn take_over_ids(
        &self,
        sandbox_id: &str,
    ) -> Result<Option<hypervisor::jail::SandboxIds>, hypervisor::Error> {
        let Some(uid) = self.host_uid else {
            return Ok(None);
        };
        hypervisor::jail::SandboxIds::take_over(
            Path::new(layout::ID_CLAIMS_DIR),
            uid,
            &self.id,
            sandbox_id,
        )
        .map(Some)
    }
}

/// The pid the pool's pid file names, if the file is there and holds one.
pub fn pid_file_pid(dir: &Path) -> Option<i32> {
    std::fs::read_to_string(dir.join(PID_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Whether `pid` runs a factory (`kata-vm-factory init`).
pub fn is_factory(pid: i32) -> bool {
    let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = raw.split(|&b| b == 0).collect();
    // `kata-vm-factory init`, or a factory an older shim started as `... factory init`.
    let named = args
        .first()
        .is_some_and(|a| a.ends_with(FACTORY_BINARY.as_bytes()));
    procinfo::pid::is_running(pid)
        && (named || args.iter().any(|a| *a == b"factory"))
        && args.iter().any(|a| *a == b"init")
}

/// The pool key of the VMs `cfg` boots: a hex digest of the hypervisor chosen, its
/// section as the VM boots with it (binaries, kernel, initrd, kernel command line with
/// the agent's words, memory, vCPUs, accelerator, containment, shares), debug, and this
/// shim's version. Call it with the configuration after sizing (`sizing::apply`): the
/// factory sizes as for a pod without resource annotations.
pub fn pool_key(cfg: &kata_config::Config) -> String {
    let section = match cfg.runtime.hypervisor_name {
        kata_config::HypervisorName::Qemu => {
            let mut q = cfg.hypervisor.qemu.clone();
            q.kernel_params =
                hypervisor::agent_params::with_agent_params(&cfg.agent, &q.kernel_params);
            format!("{q:?}")
        }
        kata_config::HypervisorName::Builtin => {
            let mut b = cfg.hypervisor.builtin.clone();
            b.kernel_params =
                hypervisor::agent_params::with_agent_params(&cfg.agent, &b.kernel_params);
            format!("{b:?}")
        }
    };
    let text = format!(
        "hypervisor={:?}\nsection={section}\ndebug={}\nshim={}\n",
        cfg.runtime.hypervisor_name,
        cfg.runtime.enable_debug,
        env!("CARGO_PKG_VERSION"),
    );
    format!("{:032x}", fnv1a_128(text.as_bytes()))
}

/// FNV-1a, 128 bits: stable across builds and Rust versions (std's hasher is not).
fn fnv1a_128(bytes: &[u8]) -> u128 {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    bytes
        .iter()
        .fold(OFFSET, |h, &b| (h ^ u128::from(b)).wrapping_mul(PRIME))
}

/// `<dir>/<key>`.
pub fn key_dir(dir: &Path, key: &str) -> PathBuf {
    dir.join(key)
}

/// `<dir>/<key>/ready`.
pub fn ready_dir(dir: &Path, key: &str) -> PathBuf {
    key_dir(dir, key).join(READY_DIR)
}

/// `<dir>/<key>/ready/<id>.json`.
pub fn ready_file(dir: &Path, key: &str, id: &str) -> PathBuf {
    ready_dir(dir, key).join(format!("{id}.json"))
}

/// `<dir>/<key>/booting/<id>`: marks VM `id` as being booted by the factory whose pid it
/// holds, so that what a factory killed mid-boot left is found by id.
pub fn booting_file(dir: &Path, key: &str, id: &str) -> PathBuf {
    key_dir(dir, key).join(BOOTING_DIR).join(id)
}

/// `<dir>/<key>/netns/<id>`.
pub fn netns_path(dir: &Path, key: &str, id: &str) -> PathBuf {
    key_dir(dir, key).join(NETNS_DIR).join(id)
}

/// `<dir>/<key>/claimed-<owner>.json`: where [`claim`] moves the ready file of the VM
/// `owner` took. The claimer deletes it once it has recorded the VM elsewhere (the
/// shim: in its persist.json).
pub fn claimed_file(dir: &Path, key: &str, owner: &str) -> PathBuf {
    key_dir(dir, key).join(format!("claimed-{owner}.json"))
}

/// Reads a ready or claimed file.
pub fn read(path: &Path) -> std::io::Result<PooledVm> {
    let mut text = Vec::new();
    std::fs::File::open(path)?.read_to_end(&mut text)?;
    serde_json::from_slice(&text).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: {e}", path.display()),
        )
    })
}

/// Writes `vm`'s ready file atomically (`.<id>.tmp`, then renamed), making it claimable.
pub fn publish(dir: &Path, vm: &PooledVm) -> std::io::Result<PathBuf> {
    let ready = ready_dir(dir, &vm.key);
    std::fs::create_dir_all(&ready)?;
    let tmp = ready.join(format!(".{}.tmp", vm.id));
    let text = serde_json::to_vec_pretty(vm).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, text)?;
    let path = ready_file(dir, &vm.key, &vm.id);
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Claims a ready VM of pool `key` under `dir` for `owner` (a sandbox id): the first
/// ready file whose rename to [`claimed_file`] succeeds is this caller's, whatever other
/// claimers do at the same time. A claimed VM that is no longer alive is cleaned up
/// ([`cleanup`]) and the next one tried. None: no live ready VM (the caller boots cold).
///
/// Blocking (it may stop a dead VM's leftovers): async callers run it with
/// `spawn_blocking`.
pub fn claim(dir: &Path, key: &str, owner: &str) -> Option<PooledVm> {
    let ready = ready_dir(dir, key);
    let mut candidates: Vec<PathBuf> = std::fs::read_dir(&ready)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "json")
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(ID_PREFIX))
        })
        .collect();
    // The oldest first (ids are random; names sort the same for every claimer, which
    // spreads nothing but keeps the order stable).
    candidates.sort();
    let target = claimed_file(dir, key, owner);
    for path in candidates {
        if std::fs::rename(&path, &target).is_err() {
            // Taken by another claimer (or the factory) first.
            continue;
        }
        match read(&target) {
            Ok(vm) if vm.key == key && vm.is_alive() => return Some(vm),
            Ok(vm) => {
                cleanup(&vm);
            }
            Err(_) => {
                // Unreadable: whatever its id names is stopped by id.
                if let Some(id) = path
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .filter(|s| s.starts_with(ID_PREFIX))
                {
                    cleanup_by_id(dir, key, id);
                }
            }
        }
        let _ = std::fs::remove_file(&target);
    }
    None
}

/// What [`cleanup`] could not undo, said for a log (empty: everything is gone).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Leftovers(pub Vec<String>);

impl Leftovers {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Display for Leftovers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.join("; "))
    }
}

/// Removes every trace of a pooled VM that no sandbox uses: stops (SIGTERM, then
/// SIGKILL) and reaps its processes (and any other naming its run directory), gives
/// back its uid claim (still naming the VM's id), unmounts and removes its share, its
/// network namespace bind (the tap goes with the namespace) and its run directory.
/// Idempotent. Blocking.
///
/// Not for a VM a shim has adopted: that one's uid claim names the sandbox, and the
/// sandbox's teardown releases it.
pub fn cleanup(vm: &PooledVm) -> Leftovers {
    let mut left = Leftovers::default();
    let mut pids = vm.pids();
    let run_dir = format!("{}/", vm.run_dir.display());
    for pid in procinfo::pid::pids_mentioning(&run_dir) {
        if !pids.contains(&pid) {
            pids.push(pid);
        }
    }
    // A pid that no longer runs this VM (gone, or reused since) is left alone.
    pids.retain(|&p| procinfo::pid::mentions(p, &run_dir));
    let survivors = if pids.is_empty() {
        Vec::new()
    } else {
        hypervisor::kill_and_reap(&pids, Duration::from_secs(2))
    };
    if survivors.is_empty() {
        hypervisor::jail::release_claims_of(Path::new(layout::ID_CLAIMS_DIR), &vm.id);
    } else {
        left.0.push(format!(
            "processes {survivors:?} of pooled VM {} survived SIGKILL; its uid stays claimed",
            vm.id
        ));
    }
    remove_share(&vm.shared.dirs(), &vm.shared.made, &mut left);
    remove_netns(&vm.netns, &mut left);
    remove_run_dir(&vm.run_dir, &mut left);
    left
}

/// [`cleanup`] for a VM known by id only (its ready file was unreadable).
pub fn cleanup_by_id(dir: &Path, key: &str, id: &str) -> Leftovers {
    let shared = SharedDirs::for_sandbox(id);
    let vm = PooledVm {
        id: id.to_string(),
        key: key.to_string(),
        created_unix_ms: 0,
        info: hypervisor::VmInfo {
            agent_socket: PathBuf::new(),
            vmm_pid: 0,
            helper_pids: Vec::new(),
            console_log: PathBuf::new(),
            vmm_log: PathBuf::new(),
            accelerator: String::new(),
        },
        run_dir: layout::vm_run_root().join(id),
        shared: PoolShare {
            made: vec![shared.mounts.clone(), shared.shared.clone()],
            base: shared.base,
            mounts: shared.mounts,
            shared: shared.shared,
        },
        virtiofsd_pids: Vec::new(),
        netns: netns_path(dir, key, id),
        tap: POOL_TAP.to_string(),
        mac: String::new(),
        host_uid: None,
        host_gid: None,
        factory_pid: 0,
    };
    cleanup(&vm)
}

fn remove_share(share: &SharedDirs, made: &[PathBuf], left: &mut Leftovers) {
    mount::unmount_all(made);
    for m in mount::mounts_under(&share.base) {
        mount::unmount(&m);
    }
    if let Err(e) = mount::remove_dir_if_unmounted(&share.base) {
        left.0.push(format!("share {}: {e}", share.base.display()));
    }
}

/// Unmounts and removes a pool network namespace's bind (the namespace, and the tap in
/// it, go once nothing else holds it).
pub fn remove_netns(netns: &Path, left: &mut Leftovers) {
    for _ in 0..4 {
        if nix::mount::umount2(netns, nix::mount::MntFlags::MNT_DETACH).is_err() {
            break;
        }
    }
    match std::fs::remove_file(netns) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => left
            .0
            .push(format!("network namespace {}: {e}", netns.display())),
    }
}

fn remove_run_dir(run_dir: &Path, left: &mut Leftovers) {
    match std::fs::remove_dir_all(run_dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => left
            .0
            .push(format!("run directory {}: {e}", run_dir.display())),
    }
}

/// Every ready VM of every key under `dir`, with its ready file, oldest first.
pub fn list_ready(dir: &Path) -> Vec<(PathBuf, PooledVm)> {
    let mut found = Vec::new();
    let Ok(keys) = std::fs::read_dir(dir) else {
        return found;
    };
    for key in keys.flatten() {
        let Ok(files) = std::fs::read_dir(key.path().join(READY_DIR)) else {
            continue;
        };
        for f in files.flatten() {
            let path = f.path();
            if path.extension().is_some_and(|x| x == "json") {
                if let Ok(vm) = read(&path) {
                    found.push((path, vm));
                }
            }
        }
    }
    found.sort_by_key(|(_, vm)| vm.created_unix_ms);
    found
}

#[cfg(test)]
mod tests;
