//! Pods sized by their resources, through containerd's CRI as kubelet drives it: the pod's
//! limits (PodSandboxConfig.linux.resources, which containerd annotates on the sandbox)
//! size its VM; a pod without limits gets the defaults; a container past its own limit is
//! OOM-killed in the guest while the pod and its VM live on; a size past the caps fails
//! the pod, naming the limit and the cap, and leaves nothing; and the pod's host cgroup,
//! limited as kubelet limits it (the limits plus the RuntimeClass overhead), holds the VM;
//! one limited below what its VM costs ends its containers with a reason that says so.

use std::time::Duration;

use e2e_tests::cri_api as api;
use e2e_tests::*;

const MIB: i64 = 1 << 20;

fn cri(case: &str) -> CriContainerd {
    CriContainerd::start(&format!("size-{case}"), Handler::Kata)
}

/// A pod configuration with kubelet's pod-level resources.
fn sized_pod(c: &CriContainerd, name: &str, quota: i64, memory: i64) -> api::PodSandboxConfig {
    let mut config = c.pod_config(name);
    if let Some(linux) = config.linux.as_mut() {
        linux.resources = Some(api::LinuxContainerResources {
            cpu_period: if quota > 0 { 100_000 } else { 0 },
            cpu_quota: quota,
            cpu_shares: 1024,
            memory_limit_in_bytes: memory,
            ..Default::default()
        });
    }
    config
}

/// A container of `pod` with its own memory limit (as kubelet sets one per container).
fn limited(
    c: &CriContainerd,
    pod: &Pod,
    name: &str,
    memory: i64,
    cmd: &[&str],
) -> api::ContainerConfig {
    let mut config = c.container_config(pod, name, cmd);
    if let Some(linux) = config.linux.as_mut() {
        linux.resources = Some(api::LinuxContainerResources {
            memory_limit_in_bytes: memory,
            ..Default::default()
        });
    }
    config
}

/// The guest's online CPUs and MemTotal (kB), seen from container `id`.
fn guest_shape(c: &CriContainerd, id: &str) -> (u32, u64) {
    let out = c.exec(
        id,
        &[
            "sh",
            "-c",
            "nproc; grep -E 'MemTotal|MemAvailable' /proc/meminfo",
        ],
    );
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    eprintln!("guest: {}", out.stdout.replace('\n', " "));
    let mut lines = out.stdout.lines();
    let cpus = lines
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(0);
    let mem = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (cpus, mem)
}

/// The RuntimeClass overhead users give the kata handler, in bytes
/// (deploy/kubernetes/runtimeclass.yaml: `memory: "NNNMi"`).
fn runtime_class_overhead() -> i64 {
    let text = include_str!("../../deploy/kubernetes/runtimeclass.yaml");
    let mib = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("memory: \""))
        .and_then(|v| v.trim_end_matches('"').strip_suffix("Mi"))
        .and_then(|v| v.parse::<i64>().ok())
        .expect("the kata RuntimeClass's podFixed memory in Mi");
    mib * MIB
}

/// Container limits of `cpus` CPUs and `memory` bytes, as kubelet sends them.
fn container_limits(cpus: i64, memory: i64) -> api::LinuxContainerResources {
    api::LinuxContainerResources {
        cpu_period: 100_000,
        cpu_quota: cpus * 100_000,
        cpu_shares: cpus * 1024,
        memory_limit_in_bytes: memory,
        ..Default::default()
    }
}

/// The memory limit of container `id`'s cgroup in the guest, as it sees it.
fn guest_memory_limit(c: &CriContainerd, id: &str) -> String {
    let out = c.exec(
        id,
        &[
            "sh",
            "-c",
            "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes",
        ],
    );
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    out.stdout.trim().to_string()
}

/// The pod's host cgroup in the v1 memory hierarchy.
fn memory_cgroup(pod: &Pod) -> std::path::PathBuf {
    std::path::Path::new("/sys/fs/cgroup/memory").join(pod.cgroup_parent.trim_start_matches('/'))
}

#[test]
fn a_pod_gets_the_cpus_and_memory_of_its_limits_and_its_cgroup_holds_the_vm() {
    let c = cri("limits");
    let limit = 1536 * MIB;
    let pod = c.run_pod(sized_pod(&c, "sized", 200_000, limit));
    let vmm = pid_of(&pod.id, Part::Vmm).expect("the pod's VMM");
    // kubelet limits the pod's cgroup to its limits plus the RuntimeClass overhead.
    let cg = memory_cgroup(&pod);
    let cap = limit + runtime_class_overhead();
    std::fs::write(cg.join("memory.limit_in_bytes"), cap.to_string())
        .expect("limiting the pod's host cgroup as kubelet does");

    let app = limited(&c, &pod, "app", limit, &["sleep", "100000"]);
    let id = c.start_container(&pod, app);
    let (cpus, mem_kb) = guest_shape(&c, &id);
    assert!(cpus >= 2, "a 2-CPU pod sees {cpus} CPUs");
    assert!(
        mem_kb as i64 * 1024 > limit,
        "a pod with a 1536 MiB limit sees MemTotal {mem_kb} kB"
    );
    // 1200 MiB allocated and touched (dd's buffer, filled from /dev/zero).
    let out = c.exec(
        &id,
        &["dd", "if=/dev/zero", "of=/dev/null", "bs=1200M", "count=1"],
    );
    assert_eq!(out.exit_code, 0, "dd of 1200 MiB failed: {}", out.stderr);

    let peak: i64 = std::fs::read_to_string(cg.join("memory.max_usage_in_bytes"))
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    eprintln!(
        "pod host cgroup: peak {} MiB of {} MiB (limit {} MiB + RuntimeClass overhead)",
        peak / MIB,
        cap / MIB,
        limit / MIB
    );
    let oom = std::fs::read_to_string(cg.join("memory.oom_control")).unwrap_or_default();
    assert!(
        oom.lines().any(|l| l == "oom_kill 0") || !oom.contains("oom_kill"),
        "the pod's host cgroup OOM-killed: {oom}"
    );
    assert!(alive(vmm), "the VMM died under the pod's host cgroup");
    c.remove_pod_checked(pod);
}

#[test]
fn a_pod_without_limits_gets_the_defaults() {
    let c = cri("defaults");
    let pod = c.run_pod(c.pod_config("plain"));
    let config = c.container_config(&pod, "app", &["sleep", "100000"]);
    let id = c.start_container(&pod, config);
    let (cpus, mem_kb) = guest_shape(&c, &id);
    assert_eq!(cpus, 1, "default_vcpus is 1");
    assert!(
        mem_kb > 400 * 1024 && mem_kb <= 512 * 1024,
        "default_memory is 512 MiB; MemTotal {mem_kb} kB"
    );
    c.remove_pod_checked(pod);
}

#[test]
fn a_container_past_its_limit_is_oom_killed_and_the_pod_lives_on() {
    let c = cri("oom");
    let pod = c.run_pod(sized_pod(&c, "oom", 100_000, 512 * MIB));
    let vmm = pid_of(&pod.id, Part::Vmm).expect("the pod's VMM");
    let keeper = limited(&c, &pod, "keeper", 256 * MIB, &["sleep", "100000"]);
    let keeper = c.start_container(&pod, keeper);
    let hog = limited(
        &c,
        &pod,
        "hog",
        64 * MIB,
        &["dd", "if=/dev/zero", "of=/dev/null", "bs=200M", "count=1"],
    );
    let hog = c
        .create_container(&pod, &hog)
        .unwrap_or_else(|e| panic!("CreateContainer: {e}\n{}", c.log_tail()));
    c.cri().start_container(&hog).expect("StartContainer");
    assert!(
        c.wait_container_state(
            &hog,
            api::ContainerState::ContainerExited,
            Duration::from_secs(60)
        ),
        "the hog did not end: {:?}",
        c.cri().container_status(&hog)
    );
    let status = c.cri().container_status(&hog).expect("ContainerStatus");
    assert_eq!(status.exit_code, 137, "{status:?}");
    assert_eq!(status.reason, "OOMKilled", "{status:?}");
    // The pod and its VM live on.
    assert!(alive(vmm), "the VMM is gone");
    let out = c.exec(&keeper, &["echo", "still here"]);
    assert_eq!(out.stdout, "still here\n", "{}", out.stderr);
    c.remove_pod_checked(pod);
}

#[test]
fn a_pod_past_the_caps_fails_naming_its_limit_and_leaves_nothing() {
    let c = cri("caps");
    // 64 GiB: more than this host's memory, the default cap.
    let config = sized_pod(&c, "huge", 0, 64 << 30);
    match c.try_run_pod(config) {
        Ok(pod) => {
            let id = pod.id.clone();
            c.remove_pod_checked(pod);
            panic!("a 64 GiB pod started ({id}) on a host with less");
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains("io.kubernetes.cri.sandbox-memory=68719476736")
                    && msg.contains("hypervisor.qemu.default_maxmemory"),
                "the error names neither the limit nor the cap: {msg}"
            );
        }
    }
    let shims = poll(Duration::from_secs(15), Duration::from_millis(200), || {
        c.shims_left().is_empty().then_some(())
    });
    assert!(shims.is_some(), "shims left: {:?}", c.shims_left());
}

/// kubelet's termination-message file of container `name` of `pod`
/// (`<kubelet root>/pods/<uid>/containers/<name>/<id>`), empty as kubelet makes it.
fn termination_message_file(c: &CriContainerd, pod: &Pod, name: &str) -> std::path::PathBuf {
    let dir = c
        .containerd()
        .dir
        .join("kubelet/pods")
        .join(pod.uid())
        .join("containers")
        .join(name);
    std::fs::create_dir_all(&dir).expect("creating kubelet's container dir");
    let file = dir.join("0a1b2c3d");
    std::fs::write(&file, "").expect("creating the termination-message file");
    file
}

/// About 10 s: one boot, the guest filling 200 MiB under TCG until QEMU is killed.
#[test]
fn a_pod_cgroup_too_small_for_its_vm_ends_its_containers_saying_so() {
    pod_cgroup_too_small(&cri("small-cgroup"));
}

/// The same through containerd 2.3's CRI, the one kubelet drives in the Kubernetes
/// suite. About 10 s.
#[test]
fn a_pod_cgroup_too_small_for_its_vm_ends_its_containers_saying_so_on_containerd_2_3() {
    pod_cgroup_too_small(&CriContainerd::start_version(
        "size-small-cgroup-23",
        Handler::Kata,
        "2.3",
    ));
}

fn pod_cgroup_too_small(c: &CriContainerd) {
    let limit = 256 * MIB;
    let pod = c.run_pod(sized_pod(c, "small", 100_000, limit));
    let vmm = pid_of(&pod.id, Part::Vmm).expect("the pod's VMM");
    // kubelet's limit with an overhead far below the VM's cost: what the booted VM uses
    // now and 40 MiB more, which the guest passes as soon as it fills its memory.
    let cg = memory_cgroup(&pod);
    let usage: i64 = std::fs::read_to_string(cg.join("memory.usage_in_bytes"))
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .expect("the pod cgroup's usage");
    let cap = usage + 40 * MIB;
    std::fs::write(cg.join("memory.limit_in_bytes"), cap.to_string())
        .expect("limiting the pod's host cgroup as kubelet does");

    let message = termination_message_file(c, &pod, "hog");
    let mut hog = limited(
        c,
        &pod,
        "hog",
        limit,
        &[
            "sh",
            "-c",
            "dd if=/dev/zero of=/dev/null bs=200M count=1; sleep 100000",
        ],
    );
    hog.mounts.push(api::Mount {
        container_path: "/dev/termination-log".into(),
        host_path: message.display().to_string(),
        ..Default::default()
    });
    let hog = c.start_container(&pod, hog);
    assert!(
        c.wait_container_state(
            &hog,
            api::ContainerState::ContainerExited,
            Duration::from_secs(120)
        ),
        "the container outlived its VM's cgroup: {:?}\n{}",
        c.cri().container_status(&hog),
        c.log_tail()
    );
    assert!(wait_gone(vmm, Duration::from_secs(10)), "the VMM lives on");
    let status = c.cri().container_status(&hog).expect("ContainerStatus");
    assert_eq!(status.exit_code, 137, "{status:?}");
    assert_eq!(status.reason, "OOMKilled", "{status:?}");
    // What kubelet shows as the container's message.
    let text = std::fs::read_to_string(&message).expect("the termination message");
    eprintln!("termination message: {text}");
    let pod_cgroup = pod.cgroup_parent.clone();
    for want in [
        format!("the pod's cgroup {pod_cgroup} is too small for its VM"),
        format!("memory limit of {} MiB", (cap as u64).div_ceil(MIB as u64)),
        "the VM needs about".to_string(),
        "overhead.podFixed.memory to".to_string(),
    ] {
        assert!(text.contains(&want), "{want:?} missing from: {text}");
    }
    let log = c.containerd().log();
    assert!(
        log.contains("the host's OOM killer ended the sandbox's VM"),
        "the shim's log does not say so:\n{}",
        c.log_tail()
    );
    c.remove_pod_checked(pod);
}

/// In-place resize (issue 43) within the VM lands in the guest; one that grows the pod past
/// its VM (no resize ceiling yet) is refused with a message naming the ask and the VM, and
/// changes nothing. One pod, about 15 s.
#[test]
fn a_resize_past_the_vm_is_refused_and_one_within_lands() {
    let c = cri("resize");
    let pod = c.run_pod(sized_pod(&c, "resize", 100_000, 256 * MIB));
    let mut app = c.container_config(&pod, "app", &["sleep", "100000"]);
    if let Some(linux) = app.linux.as_mut() {
        linux.resources = Some(container_limits(1, 256 * MIB));
    }
    let id = c.start_container(&pod, app);
    assert_eq!(guest_memory_limit(&c, &id), (256 * MIB).to_string());

    // Within the VM: shrink to 128 MiB.
    c.cri()
        .update_container_resources(&id, container_limits(1, 128 * MIB))
        .unwrap_or_else(|e| panic!("a resize within the VM: {e}\n{}", c.log_tail()));
    assert_eq!(guest_memory_limit(&c, &id), (128 * MIB).to_string());

    // Past it: 2 CPUs / 512 MiB.
    let err = c
        .cri()
        .update_container_resources(&id, container_limits(2, 512 * MIB))
        .expect_err("a resize past the VM must be refused")
        .to_string();
    eprintln!("refused: {err}");
    for want in [
        "asks for 2 CPU / 512 MiB",
        "booted with 1 vCPUs / 358 MiB and cannot grow past its boot size",
    ] {
        assert!(err.contains(want), "{want:?} missing from {err}");
    }
    assert_eq!(guest_memory_limit(&c, &id), (128 * MIB).to_string());
    let (cpus, _) = guest_shape(&c, &id);
    assert_eq!(cpus, 1);
    c.remove_pod_checked(pod);
}
