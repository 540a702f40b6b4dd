use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier};

use super::*;

fn config(text: &str) -> kata_config::Config {
    kata_config::Config::from_str(text, "test.toml").unwrap()
}

#[test]
fn pool_key_is_stable_and_names_everything_that_makes_vms_interchangeable() {
    let base = config("");
    let key = pool_key(&base);
    assert_eq!(key.len(), 32);
    assert!(key.chars().all(|c| c.is_ascii_hexdigit()), "{key}");
    assert_eq!(key, pool_key(&config("")), "same configuration, same key");
    // The file it came from is no part of the VM.
    assert_eq!(
        key,
        pool_key(&kata_config::Config::from_str("", "other.toml").unwrap())
    );
    let differing = [
        "[hypervisor.qemu]\ndefault_memory = 1024",
        "[hypervisor.qemu]\ndefault_vcpus = 2",
        "[hypervisor.qemu]\nkernel = \"/other/vmlinux\"",
        "[hypervisor.qemu]\ninitrd = \"/other/initrd\"",
        "[hypervisor.qemu]\nkernel_params = \"quiet\"",
        "[hypervisor.qemu]\naccelerator = \"tcg\"",
        "[hypervisor.qemu]\nsandbox_host_processes = false",
        "[hypervisor.qemu]\nvirtio_fs_rootfs_cache = \"auto\"",
        "[runtime]\nenable_debug = true",
        "[runtime]\nhypervisor_name = \"builtin\"",
        // The agent's words on the kernel command line.
        "[agent.kata]\ndebug_console_enabled = true",
    ];
    for text in differing {
        assert_ne!(key, pool_key(&config(text)), "{text}");
    }
    // A section the configured hypervisor does not use changes nothing.
    assert_eq!(
        key,
        pool_key(&config("[hypervisor.builtin]\ndefault_memory = 1024"))
    );
}

#[test]
fn the_factory_and_a_pod_without_limits_size_vms_of_the_same_key() {
    let cfg = config("[hypervisor.qemu]\ndefault_memory = 256");
    let (unsized_pod, _) =
        crate::sizing::apply(cfg.clone(), &crate::sizing::PodResources::default()).unwrap();
    assert_eq!(pool_key(&cfg), pool_key(&unsized_pod));
    let limited = crate::sizing::PodResources {
        memory: Some((512u64 << 20).to_string()),
        ..Default::default()
    };
    let (limited_pod, _) = crate::sizing::apply(cfg.clone(), &limited).unwrap();
    assert_ne!(
        pool_key(&cfg),
        pool_key(&limited_pod),
        "a pod with a memory limit needs a VM of another size"
    );
}

/// A stand-in VMM: a process whose command line names the VM's run directory, as a
/// real one's does; killed by pid when dropped.
struct FakeVmm(Child);

impl FakeVmm {
    fn start(run_dir: &Path) -> FakeVmm {
        // `read` waits on the pipe for ever; SIGTERM ends it with nothing left behind.
        let child = Command::new("sh")
            .args(["-c", "read x"])
            .arg(format!("{}/", run_dir.display()))
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let vmm = FakeVmm(child);
        // Until it has exec'd, its command line is this test's.
        let marker = format!("{}/", run_dir.display());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !procinfo::pid::mentions(vmm.pid(), &marker) {
            assert!(std::time::Instant::now() < deadline, "sh did not start");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        vmm
    }

    fn pid(&self) -> i32 {
        self.0.id() as i32
    }
}

impl Drop for FakeVmm {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A pooled VM of `key` in `pool` with its run directory, share and netns file under
/// `root`, published as ready.
fn ready_vm(pool: &Path, root: &Path, key: &str, id: &str, vmm_pid: i32) -> PooledVm {
    let run_dir = root.join("vm").join(id);
    std::fs::create_dir_all(&run_dir).unwrap();
    let base = root.join("share").join(id);
    std::fs::create_dir_all(base.join("mounts")).unwrap();
    let netns = netns_path(pool, key, id);
    std::fs::create_dir_all(netns.parent().unwrap()).unwrap();
    std::fs::write(&netns, b"").unwrap();
    let vm = PooledVm {
        id: id.to_string(),
        key: key.to_string(),
        created_unix_ms: 1,
        info: hypervisor::VmInfo {
            agent_socket: run_dir.join("kata.hvsock"),
            vmm_pid,
            helper_pids: Vec::new(),
            console_log: run_dir.join("console.log"),
            vmm_log: run_dir.join("qemu.log"),
            accelerator: "tcg".into(),
        },
        run_dir,
        shared: PoolShare {
            mounts: base.join("mounts"),
            shared: base.join("shared"),
            base,
            made: Vec::new(),
        },
        virtiofsd_pids: Vec::new(),
        netns,
        tap: POOL_TAP.into(),
        mac: "02:00:00:00:00:01".into(),
        host_uid: None,
        host_gid: None,
        factory_pid: std::process::id(),
    };
    publish(pool, &vm).unwrap();
    vm
}

#[test]
fn of_two_concurrent_claimers_exactly_one_gets_the_vm() {
    let tmp = tempfile::tempdir().unwrap();
    let pool = tmp.path().join("pool");
    let root = tmp.path();
    let key = "k1";
    let id = "pool-00000000000000a1";
    let vmm = FakeVmm::start(&root.join("vm").join(id));
    let vm = ready_vm(&pool, root, key, id, vmm.pid());

    let barrier = Arc::new(Barrier::new(2));
    let claimers: Vec<_> = ["sandbox-a", "sandbox-b"]
        .into_iter()
        .map(|owner| {
            let pool = pool.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                (owner, claim(&pool, key, owner))
            })
        })
        .collect();
    let results: Vec<_> = claimers.into_iter().map(|c| c.join().unwrap()).collect();
    let winners: Vec<_> = results.iter().filter(|(_, got)| got.is_some()).collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    let (winner, got) = winners[0];
    assert_eq!(got.as_ref(), Some(&vm));
    assert!(!ready_file(&pool, key, id).exists(), "no longer offered");
    assert!(claimed_file(&pool, key, winner).exists());
    // The winner's VM is left running for it.
    assert!(procinfo::pid::is_running(vmm.pid()));
    assert!(vm.run_dir.exists());
    assert_eq!(
        claim(&pool, key, "sandbox-c"),
        None,
        "the pool is empty now"
    );
}

#[test]
fn a_dead_ready_vm_is_cleaned_up_and_the_next_one_claimed() {
    let tmp = tempfile::tempdir().unwrap();
    let pool = tmp.path().join("pool");
    let root = tmp.path();
    let key = "k2";
    // Sorted first, so tried first: its VMM has exited.
    let dead_id = "pool-00000000000000b1";
    let dead_pid = {
        let mut gone = Command::new("true").spawn().unwrap();
        let pid = gone.id() as i32;
        gone.wait().unwrap();
        pid
    };
    let dead = ready_vm(&pool, root, key, dead_id, dead_pid);
    let live_id = "pool-00000000000000b2";
    let vmm = FakeVmm::start(&root.join("vm").join(live_id));
    let live = ready_vm(&pool, root, key, live_id, vmm.pid());

    assert!(!dead.is_alive());
    assert!(live.is_alive());
    let got = claim(&pool, key, "sandbox-x");
    assert_eq!(got.as_ref().map(|v| v.id.as_str()), Some(live_id));
    // The dead one's traces are gone: offer, claim file, run directory, share, netns.
    assert!(!ready_file(&pool, key, dead_id).exists());
    assert!(!dead.run_dir.exists());
    assert!(!dead.shared.base.exists());
    assert!(!dead.netns.exists());
    assert!(claimed_file(&pool, key, "sandbox-x").exists());
    assert_eq!(claim(&pool, key, "sandbox-y"), None);
}

#[test]
fn a_vmm_pid_reused_by_another_process_is_not_taken_for_the_vm() {
    let tmp = tempfile::tempdir().unwrap();
    let pool = tmp.path().join("pool");
    // A live process that is not this VM's (its command line names another directory).
    let other = FakeVmm::start(&tmp.path().join("elsewhere"));
    let vm = ready_vm(
        &pool,
        tmp.path(),
        "k3",
        "pool-00000000000000c1",
        other.pid(),
    );
    assert!(!vm.is_alive());
    assert_eq!(claim(&pool, "k3", "sandbox-z"), None);
    // Cleaning up the VM left the unrelated process alone.
    assert!(procinfo::pid::is_running(other.pid()));
}

#[test]
fn cleanup_stops_the_vm_and_removes_its_traces() {
    let tmp = tempfile::tempdir().unwrap();
    let pool = tmp.path().join("pool");
    let id = "pool-00000000000000d1";
    let vmm = FakeVmm::start(&tmp.path().join("vm").join(id));
    let vm = ready_vm(&pool, tmp.path(), "k4", id, vmm.pid());
    let left = cleanup(&vm);
    assert!(left.is_empty(), "{left}");
    assert!(!procinfo::pid::is_running(vmm.pid()));
    assert!(!vm.run_dir.exists() && !vm.shared.base.exists() && !vm.netns.exists());
    assert!(cleanup(&vm).is_empty(), "idempotent");
}

#[test]
fn ready_vms_are_listed_oldest_first() {
    let tmp = tempfile::tempdir().unwrap();
    let pool = tmp.path().join("pool");
    let mut a = ready_vm(&pool, tmp.path(), "k5", "pool-00000000000000e1", 0);
    a.created_unix_ms = 20;
    publish(&pool, &a).unwrap();
    let mut b = ready_vm(&pool, tmp.path(), "k6", "pool-00000000000000e2", 0);
    b.created_unix_ms = 10;
    publish(&pool, &b).unwrap();
    let ids: Vec<_> = list_ready(&pool).into_iter().map(|(_, v)| v.id).collect();
    assert_eq!(ids, ["pool-00000000000000e2", "pool-00000000000000e1"]);
}
