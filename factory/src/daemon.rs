//! The factory daemon, `factory init` (see [`super::cli`]).
//!
//! It runs in the foreground and keeps `[factory] vm_cache_number` VMs of its
//! configuration ready in the pool directory ([`super::pool`]): it boots one at a time
//! (at nice 19, which the VMs inherit), publishes each once its agent answered, notices a
//! claim by the ready file's disappearance, replaces a ready VM that died, and reaps every
//! process it started (it is their parent, also after a shim adopted them). SIGTERM or
//! SIGINT stops it: every VM still ready is stopped and removed; adopted VMs belong to
//! their sandboxes and run on.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hypervisor::{NetDevice, VmConfig};
use slog::{error, info, o, warn, Drain, Logger};

use super::pool::{self, Leftovers, PoolShare, PooledVm};
use crate::mount::SharedDirs;
use agent_client::KataAgent;

/// How often the daemon looks at its ready VMs (claims, deaths) between events.
const TICK: Duration = Duration::from_millis(200);
/// The longest wait after a failed boot before the next try.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// The niceness pool VMs boot and idle at, so that refills never slow a real start
/// much (the shim renices an adopted VM to 0).
const POOL_NICE: i32 = 19;

/// The daemon's log: JSON lines on stderr.
fn stderr_logger() -> Logger {
    let json = slog_json::Json::new(crate::log::stderr_lines())
        .add_default_keys()
        .build();
    Logger::root(
        std::sync::Mutex::new(json).fuse(),
        o!("source" => "kata-factory"),
    )
}

pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

pub(super) use pool::{is_factory, pid_file_pid};

pub(super) fn init(cfg: kata_config::Config) -> Result<(), String> {
    if !cfg.factory.enabled() {
        return Err(format!(
            "{}: factory.vm_cache_number is 0, so sandboxes use no pool; set it to how many \
             booted VMs to keep ready",
            cfg.origin.display()
        ));
    }
    cfg.validate_paths().map_err(|e| e.to_string())?;
    let (sized, size) = crate::sizing::apply(cfg, &crate::sizing::PodResources::default())
        .map_err(|e| e.to_string())?;
    let dir = sized.factory.vm_cache_dir.clone();
    std::fs::create_dir_all(&dir)
        .map_err(|e| format!("cannot create the pool directory {}: {e}", dir.display()))?;
    if let Some(pid) = pid_file_pid(&dir) {
        if pid != std::process::id() as i32 && is_factory(pid) {
            return Err(format!(
                "a factory already runs for {} (pid {pid}); stop it with `kata-runtime \
                 factory destroy` first",
                dir.display()
            ));
        }
    }
    // Before any thread exists: every thread, and every process they spawn, inherits it.
    // SAFETY: setpriority takes plain integers and touches no memory of ours.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, POOL_NICE) } != 0 {
        return Err(format!(
            "cannot lower the factory's priority to nice {POOL_NICE}: {}",
            std::io::Error::last_os_error()
        ));
    }
    let pid_file = dir.join(pool::PID_FILE);
    std::fs::write(&pid_file, format!("{}\n", std::process::id()))
        .map_err(|e| format!("cannot write {}: {e}", pid_file.display()))?;
    let log = stderr_logger();
    let key = pool::pool_key(&sized);
    info!(log, "factory started"; "pool_dir" => dir.display(), "key" => &key,
        "vm_cache_number" => sized.factory.vm_cache_number,
        "vcpus" => size.vcpus, "memory_mib" => size.memory_mib);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("starting tokio: {e}"))?;
    let factory = Factory {
        cfg: sized,
        dir: dir.clone(),
        key,
        log: log.clone(),
        ready: Vec::new(),
        handed_over: Vec::new(),
        stopping: Arc::new(AtomicBool::new(false)),
    };
    let result = rt.block_on(factory.run());
    // Only ours: a factory started since (after a crash of ours) keeps its file.
    if pid_file_pid(&dir) == Some(std::process::id() as i32) {
        let _ = std::fs::remove_file(&pid_file);
    }
    info!(log, "factory stopped");
    result
}

struct Factory {
    /// The configuration VMs boot with (sized as a pod without resource limits).
    cfg: kata_config::Config,
    dir: PathBuf,
    key: String,
    log: Logger,
    /// The VMs this factory offers now, oldest first.
    ready: Vec<PooledVm>,
    /// Processes of VMs claimed by shims: still this process's children, reaped here.
    handed_over: Vec<i32>,
    /// Set by SIGTERM or SIGINT.
    stopping: Arc<AtomicBool>,
}

impl Factory {
    async fn run(mut self) -> Result<(), String> {
        let wake = Arc::new(tokio::sync::Notify::new());
        self.watch_signals(wake.clone())?;
        self.clean_leftovers();
        let mut backoff = Duration::ZERO;
        let mut next_boot = Instant::now();
        while !self.stopping.load(Ordering::SeqCst) {
            self.reap();
            self.check_ready();
            let want = self.cfg.factory.vm_cache_number as usize;
            if self.ready.len() < want && Instant::now() >= next_boot {
                match self.boot_one().await {
                    Ok(vm) => {
                        backoff = Duration::ZERO;
                        self.ready.push(vm);
                        continue;
                    }
                    Err(why) if self.stopping.load(Ordering::SeqCst) => {
                        info!(self.log, "boot abandoned: the factory is stopping"; "why" => why);
                        break;
                    }
                    Err(why) => {
                        backoff = (backoff * 2).clamp(Duration::from_secs(1), MAX_BACKOFF);
                        next_boot = Instant::now() + backoff;
                        error!(self.log, "booting a pool VM failed; trying again later";
                            "error" => why, "retry_in_ms" => backoff.as_millis() as u64);
                    }
                }
            }
            tokio::select! {
                _ = wake.notified() => {}
                _ = tokio::time::sleep(TICK) => {}
            }
        }
        self.shutdown();
        Ok(())
    }

    /// SIGTERM and SIGINT set `stopping`; they and SIGCHLD wake the loop.
    fn watch_signals(&self, wake: Arc<tokio::sync::Notify>) -> Result<(), String> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
        let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
        let mut chld = signal(SignalKind::child()).map_err(|e| e.to_string())?;
        let stopping = self.stopping.clone();
        let log = self.log.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = term.recv() => {
                        info!(log, "SIGTERM: stopping the ready VMs");
                        stopping.store(true, Ordering::SeqCst);
                    }
                    _ = int.recv() => {
                        info!(log, "SIGINT: stopping the ready VMs");
                        stopping.store(true, Ordering::SeqCst);
                    }
                    _ = chld.recv() => {}
                }
                wake.notify_one();
            }
        });
        Ok(())
    }

    /// Removes what a crashed factory of this pool left: ready VMs whose factory is gone,
    /// and VMs it was booting when it died.
    fn clean_leftovers(&self) {
        let me = std::process::id();
        for (path, vm) in pool::list_ready(&self.dir) {
            if vm.factory_pid == me || is_factory(vm.factory_pid as i32) {
                continue;
            }
            if let Some(taken) = self.take(&path, &vm) {
                warn!(self.log, "removing a ready VM a stopped factory left";
                    "vm" => &vm.id, "factory_pid" => vm.factory_pid);
                self.remove(&taken, &vm);
            }
        }
        for (key, id) in orphan_boots(&self.dir) {
            warn!(self.log, "removing an unfinished pool VM a stopped factory left"; "vm" => &id);
            log_leftovers(&self.log, &id, &pool::cleanup_by_id(&self.dir, &key, &id));
            let _ = std::fs::remove_file(pool::booting_file(&self.dir, &key, &id));
        }
    }

    /// Takes a ready VM out of the offer (claims it for this factory); None when a shim
    /// claimed it first.
    fn take(&self, ready: &Path, vm: &PooledVm) -> Option<PathBuf> {
        let owner = format!("factory-{}-{}", std::process::id(), vm.id);
        let taken = pool::claimed_file(&self.dir, &vm.key, &owner);
        std::fs::rename(ready, &taken).ok().map(|()| taken)
    }

    /// Stops a VM taken with [`Factory::take`] and removes its traces.
    fn remove(&self, taken: &Path, vm: &PooledVm) {
        log_leftovers(&self.log, &vm.id, &pool::cleanup(vm));
        let _ = std::fs::remove_file(taken);
    }

    /// Reaps the exited processes this factory started (never other children: a
    /// command's own wait must find its child).
    fn reap(&mut self) {
        let mut children: Vec<i32> = std::mem::take(&mut self.handed_over);
        for vm in &self.ready {
            children.extend(vm.pids());
        }
        // `exit_description` reaps an exited child; a pid that is gone is forgotten.
        let still: Vec<i32> = children
            .into_iter()
            .filter(|&pid| procinfo::pid::exit_description(pid).is_none())
            .collect();
        let ready_pids: Vec<i32> = self.ready.iter().flat_map(PooledVm::pids).collect();
        self.handed_over = still
            .into_iter()
            .filter(|p| !ready_pids.contains(p))
            .collect();
    }

    /// Forgets the VMs a shim claimed (their ready file is gone) and replaces the dead.
    fn check_ready(&mut self) {
        let mut kept = Vec::new();
        for vm in std::mem::take(&mut self.ready) {
            let ready = pool::ready_file(&self.dir, &vm.key, &vm.id);
            if !ready.exists() {
                info!(self.log, "pool VM claimed"; "vm" => &vm.id, "vmm_pid" => vm.info.vmm_pid);
                self.handed_over.extend(vm.pids());
                continue;
            }
            if vm.is_alive() {
                kept.push(vm);
                continue;
            }
            match self.take(&ready, &vm) {
                Some(taken) => {
                    warn!(self.log, "a ready pool VM died; replacing it"; "vm" => &vm.id,
                        "vmm_pid" => vm.info.vmm_pid);
                    self.remove(&taken, &vm);
                }
                // A shim claimed it just now; it finds it dead and cleans it up.
                None => self.handed_over.extend(vm.pids()),
            }
        }
        self.ready = kept;
    }

    /// Boots one VM as a cold sandbox would boot, in a network namespace of its own with
    /// one tap, waits for its agent, lets go of its uid claim and offers it.
    async fn boot_one(&self) -> Result<PooledVm, String> {
        let id = format!("{}{}", pool::ID_PREFIX, random_hex(8));
        let log = self.log.new(o!("vm" => id.clone()));
        let t0 = Instant::now();
        let shared = SharedDirs::for_sandbox(&id);
        let run_dir = layout::vm_run_root().join(&id);
        let netns = pool::netns_path(&self.dir, &self.key, &id);
        let mac = random_mac();
        let booting = pool::booting_file(&self.dir, &self.key, &id);
        if let Some(parent) = booting.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("creating {}: {e}", parent.display()))?;
        }
        std::fs::write(&booting, std::process::id().to_string())
            .map_err(|e| format!("writing {}: {e}", booting.display()))?;
        let result = self
            .boot_marked(&id, &log, &shared, &run_dir, &netns, &mac)
            .await;
        let _ = std::fs::remove_file(&booting);
        if let Ok(vm) = &result {
            info!(log, "pool VM ready"; "elapsed_ms" => t0.elapsed().as_millis() as u64,
                "vmm_pid" => vm.info.vmm_pid, "uid" => vm.host_uid);
        }
        result
    }

    /// [`Factory::boot_one`] once the VM is marked as booting.
    async fn boot_marked(
        &self,
        id: &str,
        log: &Logger,
        shared: &SharedDirs,
        run_dir: &Path,
        netns: &Path,
        mac: &str,
    ) -> Result<PooledVm, String> {
        let (id, run_dir, netns, mac) = (
            id.to_string(),
            run_dir.to_path_buf(),
            netns.to_path_buf(),
            mac.to_string(),
        );
        let mut vm = hypervisor::new_hypervisor(&self.cfg, log.clone());
        let booted = self
            .boot_steps(&id, shared, &run_dir, &netns, &mac, vm.as_mut(), log)
            .await;
        let (made, info) = match booted {
            Ok(b) => b,
            Err(why) => {
                if let Err(e) = vm.stop_vm().await {
                    warn!(log, "stopping the failed pool VM"; "error" => %e);
                }
                log_leftovers(log, &id, &pool::cleanup_by_id(&self.dir, &self.key, &id));
                return Err(why);
            }
        };
        // Let go of the uid claim (the file stays, naming the VM, and the uid stays taken
        // while the VM runs as it), so the shim that claims the VM can take it over; the
        // processes run on.
        drop(vm);
        let host_uid =
            hypervisor::jail::SandboxIds::claimed_by(Path::new(layout::ID_CLAIMS_DIR), &id);
        let virtiofsd_pids = info
            .helper_pids
            .iter()
            .copied()
            .filter(|&p| comm(p) == "virtiofsd")
            .collect();
        let pooled = PooledVm {
            id: id.clone(),
            key: self.key.clone(),
            created_unix_ms: now_ms(),
            info,
            run_dir,
            shared: PoolShare {
                base: shared.base.clone(),
                mounts: shared.mounts.clone(),
                shared: shared.shared.clone(),
                made,
            },
            virtiofsd_pids,
            netns,
            tap: pool::POOL_TAP.to_string(),
            mac,
            host_uid,
            host_gid: host_uid,
            factory_pid: std::process::id(),
        };
        if let Err(e) = pool::publish(&self.dir, &pooled) {
            log_leftovers(log, &id, &pool::cleanup(&pooled));
            return Err(format!(
                "cannot write the ready file in {}: {e}",
                self.dir.display()
            ));
        }
        Ok(pooled)
    }

    #[allow(clippy::too_many_arguments)]
    async fn boot_steps(
        &self,
        id: &str,
        shared: &SharedDirs,
        run_dir: &Path,
        netns: &Path,
        mac: &str,
        vm: &mut dyn hypervisor::Hypervisor,
        log: &Logger,
    ) -> Result<(Vec<PathBuf>, hypervisor::VmInfo), String> {
        let made = shared
            .setup()
            .map_err(|e| format!("preparing the shared directory: {e}"))?;
        std::fs::create_dir_all(run_dir)
            .map_err(|e| format!("creating {}: {e}", run_dir.display()))?;
        let ns = netns.to_path_buf();
        tokio::task::spawn_blocking(move || make_netns_with_tap(&ns, pool::POOL_TAP))
            .await
            .map_err(|e| format!("making the network namespace: {e}"))??;
        let vm_cfg = VmConfig {
            sandbox_id: id.to_string(),
            run_dir: run_dir.to_path_buf(),
            shared_dir: shared.shared.clone(),
            debug: self.cfg.runtime.enable_debug,
            netns: Some(netns.to_path_buf()),
            net: vec![NetDevice {
                tap: pool::POOL_TAP.to_string(),
                mac: mac.to_string(),
            }],
            cgroup: Vec::new(),
        };
        let info = vm
            .start_vm(&vm_cfg)
            .await
            .map_err(|e| format!("starting the VM: {e}"))?;
        let mut watched = vec![crate::watchdog::Watched::vmm(info.vmm_pid)];
        watched.extend(
            info.helper_pids
                .iter()
                .map(|&p| crate::watchdog::Watched::helper(p)),
        );
        let timeout = self.cfg.agent.kata.dial_timeout.max(Duration::from_secs(1));
        let stopping = self.stopping.clone();
        let dialed = KataAgent::dial(
            &info.agent_socket,
            protocols::AGENT_VSOCK_PORT,
            timeout,
            || {
                if stopping.load(Ordering::SeqCst) {
                    return Some("the factory is stopping".into());
                }
                crate::watchdog::exited(&watched)
            },
        )
        .await;
        match dialed {
            Ok((agent, check)) => {
                slog::debug!(log, "agent reachable"; "guest_kernel" => &check.kernel_release);
                // The connection closes; the shim that claims the VM dials its own.
                drop(agent);
            }
            Err(e) => {
                return Err(format!(
                    "{e}; last lines of the guest console:\n{}",
                    hypervisor::process::log_tail(&info.console_log)
                ))
            }
        }
        Ok((made, info))
    }

    /// Stops and removes every VM this factory made that is still offered (also one a
    /// claimer put back); those claimed meanwhile run on.
    fn shutdown(&mut self) {
        let me = std::process::id();
        let mut offered: Vec<(PathBuf, PooledVm)> = std::mem::take(&mut self.ready)
            .into_iter()
            .map(|vm| (pool::ready_file(&self.dir, &vm.key, &vm.id), vm))
            .collect();
        for (path, vm) in pool::list_ready(&self.dir) {
            if vm.factory_pid == me && !offered.iter().any(|(_, o)| o.id == vm.id) {
                offered.push((path, vm));
            }
        }
        for (ready, vm) in offered {
            match self.take(&ready, &vm) {
                Some(taken) => self.remove(&taken, &vm),
                None => {
                    info!(self.log, "pool VM claimed"; "vm" => &vm.id);
                    self.handed_over.extend(vm.pids());
                }
            }
        }
        self.reap();
        remove_empty_dirs(&self.dir, &self.key);
    }
}

/// The VMs (key, id) that a factory no longer running was booting when it stopped.
pub(super) fn orphan_boots(dir: &Path) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for key in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let key_name = key.file_name().to_string_lossy().into_owned();
        let booting = key.path().join(pool::BOOTING_DIR);
        for marker in std::fs::read_dir(&booting).into_iter().flatten().flatten() {
            let owner = std::fs::read_to_string(marker.path())
                .ok()
                .and_then(|t| t.trim().parse::<i32>().ok());
            if owner.is_some_and(|pid| pid == std::process::id() as i32 || is_factory(pid)) {
                continue;
            }
            found.push((
                key_name.clone(),
                marker.file_name().to_string_lossy().into_owned(),
            ));
        }
    }
    found
}

/// Removes the key's directories if nothing is left in them.
pub(super) fn remove_empty_dirs(dir: &Path, key: &str) {
    let k = pool::key_dir(dir, key);
    let _ = std::fs::remove_dir(k.join(pool::READY_DIR));
    let _ = std::fs::remove_dir(k.join(pool::NETNS_DIR));
    let _ = std::fs::remove_dir(k.join(pool::BOOTING_DIR));
    let _ = std::fs::remove_dir(&k);
}

fn log_leftovers(log: &Logger, id: &str, left: &Leftovers) {
    if !left.is_empty() {
        warn!(log, "a pool VM left traces behind"; "vm" => id, "left" => %left);
    }
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim().to_string())
        .unwrap_or_default()
}

/// `n` random bytes as hex.
fn random_hex(n: usize) -> String {
    random_bytes(n).iter().map(|b| format!("{b:02x}")).collect()
}

fn random_bytes(n: usize) -> Vec<u8> {
    let mut buf = vec![0u8; n];
    let mut filled = 0;
    while filled < n {
        // SAFETY: getrandom writes at most `n - filled` bytes into the live buffer at
        // that offset.
        let got = unsafe { libc::getrandom(buf[filled..].as_mut_ptr().cast(), n - filled, 0) };
        if got > 0 {
            filled += got as usize;
        } else if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            // No entropy source at all: the time still makes ids unlikely to repeat.
            let t = now_ms().to_le_bytes();
            for (i, b) in buf.iter_mut().enumerate() {
                *b ^= t[i % t.len()] ^ (std::process::id() as u8);
            }
            break;
        }
    }
    buf
}

/// A random unicast, locally administered MAC.
fn random_mac() -> String {
    let mut b = random_bytes(6);
    b[0] = (b[0] & 0xfe) | 0x02;
    b.iter()
        .map(|x| format!("{x:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Makes a network namespace bind-mounted at `path` (an empty file made here) with the
/// persistent tap `tap` in it. On failure nothing is left.
fn make_netns_with_tap(path: &Path, tap: &str) -> Result<(), String> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("creating {}: {e}", parent.display()))?;
    }
    std::fs::File::create(path).map_err(|e| format!("creating {}: {e}", path.display()))?;
    let target = path.to_path_buf();
    let tap = tap.to_string();
    // A thread of its own enters the new namespace and ends with the work, so no other
    // thread of the factory changes namespace.
    let made = std::thread::Builder::new()
        .name("pool-netns".into())
        .spawn(move || -> Result<(), String> {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| format!("unshare a network namespace: {e}"))?;
            let none: Option<&str> = None;
            nix::mount::mount(
                Some("/proc/thread-self/ns/net"),
                &target,
                none,
                nix::mount::MsFlags::MS_BIND,
                none,
            )
            .map_err(|e| format!("bind the network namespace at {}: {e}", target.display()))?;
            crate::network::tap::create_persistent(&tap).map_err(|e| e.to_string())?;
            Ok(())
        })
        .map_err(|e| format!("starting a thread: {e}"))?
        .join()
        .map_err(|_| "the network namespace thread panicked".to_string())
        .and_then(|r| r);
    if made.is_err() {
        let mut left = Leftovers::default();
        pool::remove_netns(path, &mut left);
    }
    made
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_macs_are_unicast_and_locally_administered() {
        for _ in 0..32 {
            let mac = random_mac();
            let first = u8::from_str_radix(&mac[..2], 16).unwrap();
            assert_eq!(first & 0x01, 0, "{mac}");
            assert_eq!(first & 0x02, 0x02, "{mac}");
            assert_eq!(mac.len(), 17);
        }
        assert_ne!(random_hex(8), random_hex(8));
    }
}
