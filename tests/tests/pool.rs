//! Sandboxes started from the VM pool (`[factory] vm_cache_number`, issue 30): a real
//! factory (`kata-runtime factory init`, ended by its pid) keeps VMs ready in a pool
//! directory of the test's own, and a private containerd's shim, reading the same
//! configuration, claims one instead of booting. Cases: `ctr run` takes a ready VM and the
//! factory refills; a CRI pod's network reaches the pooled guest, whose NIC takes the
//! pod's MAC; a pod of another size boots cold; a ready VM killed is replaced and starts
//! go on; a claimed VM killed fails its sandbox alone, with the VMM's death as the cause,
//! and a pooled sandbox's killed shim is cleaned up after; a claimed VM outlives its
//! factory; `kata-runtime exec` finds a pooled sandbox's guest; kubelet's volumes behave
//! on a pooled VM as on a cold one; without a factory,
//! sandboxes boot cold. Each case checks that nothing of its sandboxes
//! or VMs is left.

use std::process::Command;
use std::time::Duration;

use e2e_tests::*;
use nix::sys::signal::Signal;

/// How many VMs the test pools keep ready.
const POOL_SIZE: usize = 2;
/// How long a task may take to stop after its VM died.
const LIMIT: Duration = Duration::from_secs(60);
const HTTP_PORT: u16 = 8080;

/// The shim's log lines of sandbox `id` (containerd's log carries them).
fn shim_lines(log: &str, id: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains(&format!("\"sandbox\":\"{id}\"")))
        .map(str::to_string)
        .collect()
}

/// Whether sandbox `id`'s shim logged `what`.
fn logged(log: &str, id: &str, what: &str) -> bool {
    shim_lines(log, id).iter().any(|l| l.contains(what))
}

/// The pooled VM sandbox `id` runs on (its persist.json says), or a failure naming what
/// the shim logged.
fn pooled_vm(log: &str, id: &str) -> String {
    pooled_vm_of(id).unwrap_or_else(|| {
        panic!(
            "sandbox {id} does not run on a pooled VM; its shim's log:\n{}",
            shim_lines(log, id).join("\n")
        )
    })
}

/// A persisted field of sandbox `id`'s state.
fn persisted(id: &str, pointer: &str) -> Option<serde_json::Value> {
    let text = std::fs::read(format!("/run/vc/sbs/{id}/persist.json")).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&text).ok()?;
    v.pointer(pointer).cloned()
}

#[test]
fn ctr_run_takes_a_ready_vm_and_the_factory_refills_the_pool() {
    let pool = TestPool::new("ctr", RuntimeConfig::qemu(), POOL_SIZE);
    let mut factory = TestFactory::start(&pool);
    let _cleanup = SandboxCleanup::new("pooled1");
    let c = Containerd::start_configured("pool-ctr", &pool.config);
    let before: Vec<String> = pool
        .wait_full(&mut factory, &[])
        .iter()
        .map(vm_id)
        .collect();

    let out = c.run("pooled1", &["--rm"], &["sh", "-c", "echo hi"]);
    assert!(
        out.status.success(),
        "ctr run failed: {}\n{}",
        stderr(&out),
        c.log_tail()
    );
    assert_eq!(stdout(&out), "hi\n");
    let log = c.log();
    assert!(
        logged(&log, "pooled1", "phase: VM claimed from pool"),
        "the sandbox did not start from the pool:\n{}",
        shim_lines(&log, "pooled1").join("\n")
    );
    // One of the ready VMs was taken, and the factory booted another in its place.
    let claimed = shim_lines(&log, "pooled1")
        .iter()
        .find(|l| l.contains("phase: VM claimed from pool"))
        .and_then(|l| {
            before
                .iter()
                .find(|id| l.contains(&format!("\"vm\":\"{id}\"")))
                .cloned()
        })
        .unwrap_or_else(|| panic!("the claimed VM is none of the ready ones {before:?}"));
    let refilled = pool.wait_full(&mut factory, std::slice::from_ref(&claimed));
    assert!(refilled.iter().all(|v| vm_id(v) != claimed));
    // The sandbox and the VM it ran on are gone.
    assert_no_leftovers("pooled1");
    assert_vms_gone(&[claimed, "pooled1".to_string()]);
}

#[test]
fn a_cri_pod_on_a_pooled_vm_is_on_the_pod_network_and_a_sized_pod_boots_cold() {
    let pool = TestPool::new("cri", RuntimeConfig::qemu(), POOL_SIZE);
    let mut factory = TestFactory::start(&pool);
    let c = CriContainerd::start_configured("pool-cri", Handler::Kata, &pool.config);
    pool.wait_full(&mut factory, &[]);

    let pod = c.run_pod(c.pod_config("pooled-web"));
    let log = c.containerd().log();
    let vm = pooled_vm(&log, &pod.id);
    assert!(!pod.ip.is_empty(), "no pod IP\n{}", c.log_tail());
    let web = {
        let script = format!(
            "mkdir -p /www && echo pooled-pod > /www/index.html && exec httpd -f -p {HTTP_PORT} -h /www"
        );
        let config = c.container_config(&pod, "web", &["sh", "-c", &script]);
        c.start_container(&pod, config)
    };
    wait_http(
        &pod.ip,
        HTTP_PORT,
        "/index.html",
        "pooled-pod",
        Duration::from_secs(30),
    )
    .unwrap_or_else(|e| panic!("pod IP {}:{HTTP_PORT} from the host: {e}", pod.ip));
    // The guest's NIC has the pod's veth's MAC, not the one it was booted with.
    let netns = persisted(&pod.id, "/network/netns")
        .and_then(|v| v.as_str().map(str::to_string))
        .expect("the pod's network namespace in persist.json");
    // (`ip`, not /sys/class/net: sysfs shows the namespace of whoever mounted it.)
    let veth = Command::new("nsenter")
        .arg(format!("--net={netns}"))
        .args(["ip", "-o", "link", "show", "eth0"])
        .output()
        .expect("running nsenter");
    let veth_mac = stdout(&veth)
        .split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    assert!(!veth_mac.is_empty(), "{}{}", stdout(&veth), stderr(&veth));
    let guest = c.exec(&web, &["cat", "/sys/class/net/eth0/address"]);
    assert_eq!(guest.stdout.trim(), veth_mac, "{}", guest.stderr);

    // A pod with its own size has no VM of that size in the pool: it boots cold.
    let mut sized = c.pod_config("sized");
    if let Some(linux) = sized.linux.as_mut() {
        linux.resources = Some(cri_api::LinuxContainerResources {
            memory_limit_in_bytes: 256 << 20,
            cpu_shares: 1024,
            ..Default::default()
        });
    }
    let ready_before: Vec<String> = pool.ready().iter().map(vm_id).collect();
    let cold = c.run_pod(sized);
    let log = c.containerd().log();
    assert!(
        pooled_vm_of(&cold.id).is_none()
            && logged(&log, &cold.id, "booting cold: no ready VM in the pool"),
        "the sized pod did not boot cold; its shim's log:\n{}",
        shim_lines(&log, &cold.id).join("\n")
    );
    let ready_after: Vec<String> = pool.ready().iter().map(vm_id).collect();
    assert!(
        ready_before.iter().all(|id| ready_after.contains(id)),
        "the sized pod took a ready VM: before {ready_before:?}, after {ready_after:?}"
    );

    c.remove_pod_checked(cold);
    c.remove_pod_checked(pod);
    assert_vms_gone(&[vm]);
}

/// A pooled VM takes its pod's kubelet volumes as a cold boot does: emptyDirs in the
/// guest (a unix socket between containers, a tmpfs of the sizeLimit), ConfigMap updates
/// raising inotify events.
#[test]
fn kubelet_volumes_on_a_pooled_vm_behave_as_on_a_cold_one() {
    let pool = TestPool::new("volumes", RuntimeConfig::qemu(), POOL_SIZE);
    let mut factory = TestFactory::start(&pool);
    let c = CriContainerd::start_configured("pool-volumes", Handler::Kata, &pool.config);
    pool.wait_full(&mut factory, &[]);
    let mut vm = String::new();
    assert_kubelet_volumes_behave(&c, |pod| {
        vm = pooled_vm(&c.containerd().log(), &pod.id);
    });
    assert_vms_gone(&[vm]);
}

#[test]
fn killed_vms_fail_only_the_sandboxes_that_need_them() {
    let pool = TestPool::new("kill", RuntimeConfig::qemu(), POOL_SIZE);
    let mut factory = TestFactory::start(&pool);
    let _cleanup = (
        SandboxCleanup::new("pool-victim"),
        SandboxCleanup::new("pool-bystander"),
    );
    let c = Containerd::start_configured("pool-kill", &pool.config);

    // A ready VM killed with kill -9: the factory replaces it, and starts go on.
    let ready = pool.wait_full(&mut factory, &[]);
    let dead = vm_id(&ready[0]);
    assert!(signal(vm_pid(&ready[0]), Signal::SIGKILL));
    pool.wait_full(&mut factory, std::slice::from_ref(&dead));
    start_detached(&c, "pool-victim", &[], &["sleep", "1000"]);
    pool.wait_full(&mut factory, &[]);
    start_detached(&c, "pool-bystander", &[], &["sleep", "1000"]);
    let log = c.log();
    let victim_vm = pooled_vm(&log, "pool-victim");
    let bystander_vm = pooled_vm(&log, "pool-bystander");
    assert!(
        victim_vm != dead && bystander_vm != dead,
        "a sandbox took the killed VM"
    );
    // The uid the victim's VMM runs as (when contained) is claimed in the sandbox's name
    // now, no longer in the pooled VM's.
    let vmm = persisted("pool-victim", "/vmm_pid")
        .and_then(|v| v.as_i64())
        .expect("the victim's VMM pid in persist.json") as i32;
    let uid = std::fs::read_to_string(format!("/proc/{vmm}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next().map(str::to_string))
        .expect("the VMM's uid");
    if uid != "0" {
        let owner = std::fs::read_to_string(format!("/run/vc/ids/{uid}"));
        assert_eq!(
            owner.ok().as_deref(),
            Some("pool-victim"),
            "uid {uid}'s claim"
        );
    }

    // The claimed VM killed: its sandbox stops, with the VMM's death as the cause.
    let offset = c.log_len();
    assert!(signal(vmm, Signal::SIGKILL));
    assert!(wait_gone(vmm, Duration::from_secs(5)), "VMM {vmm} survived");
    let stopped = poll(LIMIT, Duration::from_millis(100), || {
        matches!(
            c.task_status("pool-victim").as_deref(),
            Some("STOPPED") | None
        )
        .then_some(())
    });
    assert!(
        stopped.is_some(),
        "the victim's task did not stop after its VMM was killed:\n{}",
        c.log_since(offset)
    );
    let since = c.log_since(offset);
    assert!(
        since
            .lines()
            .any(|l| l.contains("the VMM") && l.contains(&format!("(pid {vmm})"))),
        "the shim did not say the VMM {vmm} died:\n{since}"
    );
    // The other sandbox runs on.
    assert_eq!(c.task_status("pool-bystander").as_deref(), Some("RUNNING"));
    let out = exec(&c, "pool-bystander", "e1", &[], &["echo", "still here"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "still here\n");

    let _ = c.ctr(&["task", "rm", "pool-victim"]);
    let out = c.ctr(&["container", "rm", "pool-victim"]);
    assert!(out.status.success(), "container rm: {}", stderr(&out));

    // The bystander's shim killed: containerd's `delete` cleans up its pooled VM from
    // what persist.json records.
    let shim = pid_of("pool-bystander", Part::Shim).expect("the bystander's shim");
    assert!(signal(shim, Signal::SIGKILL));
    let stopped = poll(LIMIT, Duration::from_millis(100), || {
        matches!(
            c.task_status("pool-bystander").as_deref(),
            Some("STOPPED") | None
        )
        .then_some(())
    });
    assert!(stopped.is_some(), "{}", c.log_tail());
    let _ = c.ctr(&["task", "rm", "pool-bystander"]);
    let out = c.ctr(&["container", "rm", "pool-bystander"]);
    assert!(out.status.success(), "container rm: {}", stderr(&out));
    assert_no_leftovers("pool-victim");
    assert_no_leftovers("pool-bystander");
    assert_vms_gone(&[
        dead,
        victim_vm,
        bystander_vm,
        "pool-victim".to_string(),
        "pool-bystander".to_string(),
    ]);
}

#[test]
fn a_claimed_vm_outlives_the_factory_that_booted_it() {
    let pool = TestPool::new("outlive", RuntimeConfig::qemu(), 1);
    let mut factory = TestFactory::start(&pool);
    let _cleanup = SandboxCleanup::new("pool-orphan");
    let c = Containerd::start_configured("pool-outlive", &pool.config);
    pool.wait_full(&mut factory, &[]);
    start_detached(&c, "pool-orphan", &[], &["sleep", "1000"]);
    let vm = pooled_vm(&c.log(), "pool-orphan");

    // The factory stops (its ready VMs with it); the sandbox's VM is not its any more.
    factory.stop();
    assert_eq!(c.task_status("pool-orphan").as_deref(), Some("RUNNING"));
    // The guest still answers.
    let out = exec(&c, "pool-orphan", "e1", &[], &["echo", "alive"]);
    assert!(out.status.success(), "{}\n{}", stderr(&out), c.log_tail());
    assert_eq!(stdout(&out), "alive\n");

    remove_detached(&c, "pool-orphan");
    assert_no_leftovers("pool-orphan");
    assert_vms_gone(&[vm, "pool-orphan".to_string()]);
}

#[test]
fn kata_runtime_exec_reaches_the_guest_of_a_pooled_sandbox() {
    let initrd = std::env::var("KATA_TEST_DEBUG_INITRD")
        .expect("KATA_TEST_DEBUG_INITRD is not set: run the end-to-end tests with `make test`");
    let config = RuntimeConfig::qemu()
        .set("agent.kata", "debug_console_enabled", "true")
        .set("hypervisor.qemu", "initrd", &toml_str(&initrd));
    let pool = TestPool::new("exec", config, 1);
    let mut factory = TestFactory::start(&pool);
    let _cleanup = SandboxCleanup::new("pool-dbg");
    let c = Containerd::start_configured("pool-exec", &pool.config);
    pool.wait_full(&mut factory, &[]);
    start_detached(&c, "pool-dbg", &[], &["sleep", "600"]);
    let vm = pooled_vm(&c.log(), "pool-dbg");

    // The VM's sockets are in the pooled VM's run directory, which persist.json names.
    let out = finish_shell(
        debug_shell("pool-dbg", "echo in-the-pooled-guest; exit\n"),
        Duration::from_secs(60),
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "kata-runtime exec failed: {}\n{text}",
        stderr(&out)
    );
    assert!(
        text.lines().any(|l| l.trim() == "in-the-pooled-guest"),
        "{text:?}"
    );

    remove_detached(&c, "pool-dbg");
    assert_no_leftovers("pool-dbg");
    assert_vms_gone(&[vm, "pool-dbg".to_string()]);
}

/// A block device (`ctr run --device`) reaches a sandbox on a pooled VM: the adopted
/// VM's QEMU takes the disk over its QMP socket as a VM the shim booted does.
#[test]
fn a_pooled_sandbox_gets_its_block_device() {
    let pool = TestPool::new("block", RuntimeConfig::qemu(), 1);
    let mut factory = TestFactory::start(&pool);
    let _cleanup = SandboxCleanup::new("pool-blk");
    let disk = LoopDevice::new(1 << 20);
    let c = Containerd::start_configured("pool-block", &pool.config);
    pool.wait_full(&mut factory, &[]);
    let dev = disk.path().display().to_string();
    let script = format!(
        "stat -c %t {dev} && printf pooled-disk > /tmp/b && \
         dd if=/tmp/b of={dev} conv=fsync 2>/dev/null && dd if={dev} bs=11 count=1 2>/dev/null"
    );
    let out = c.run(
        "pool-blk",
        &["--rm", "--device", &dev],
        &["sh", "-c", &script],
    );
    assert!(
        out.status.success(),
        "ctr run --device failed: {}\n{}",
        stderr(&out),
        c.log_tail()
    );
    let log = c.log();
    assert!(
        logged(&log, "pool-blk", "phase: VM claimed from pool"),
        "the sandbox did not start from the pool:\n{}",
        shim_lines(&log, "pool-blk").join("\n")
    );
    // The guest's SCSI disk (sd, major 8), not the host's loop device (7).
    assert_eq!(stdout(&out), "8\npooled-disk", "{}", stderr(&out));
    assert_no_leftovers("pool-blk");
    assert_eq!(&disk.detach_and_read()[..11], b"pooled-disk");
}

#[test]
fn without_a_running_factory_sandboxes_boot_cold() {
    let pool = TestPool::new("nofactory", RuntimeConfig::qemu(), POOL_SIZE);
    let _cleanup = SandboxCleanup::new("pool-cold");
    let c = Containerd::start_configured("pool-nofactory", &pool.config);
    let out = c.run("pool-cold", &["--rm"], &["echo", "cold"]);
    assert!(
        out.status.success(),
        "ctr run failed: {}\n{}",
        stderr(&out),
        c.log_tail()
    );
    assert_eq!(stdout(&out), "cold\n");
    let log = c.log();
    assert!(
        logged(&log, "pool-cold", "booting cold: no ready VM in the pool")
            && logged(&log, "pool-cold", "phase: VMM launched"),
        "{}",
        shim_lines(&log, "pool-cold").join("\n")
    );
    assert_no_leftovers("pool-cold");
    assert!(pool.leftovers().is_empty(), "{:?}", pool.leftovers());
}
