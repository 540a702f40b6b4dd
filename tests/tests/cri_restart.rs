//! containerd restarted under running and starting pods, through the CRI (issue 40, item
//! 2), on containerd 1.7 and 2.3, with SIGTERM (systemd's stop, an upgrade) and SIGKILL
//! (a crash, the OOM killer):
//!
//! - a pod that runs keeps running: afterwards its container answers ExecSync, its log
//!   goes on growing, ContainerStats and PodSandboxStats answer;
//! - two pods whose RunPodSandbox is in flight (the second one's shim just started, the
//!   first one's VM further into its boot) are afterwards either listed, and then removed as kubelet removes a sandbox it did
//!   not ask for (StopPodSandbox, RemovePodSandbox), or not listed at all;
//! - and then nothing of any of them is left on the host: processes, mounts, `/run/vc`
//!   entries, uid claims, the pods' network (CNI IPAM allocations, network namespaces),
//!   cgroups.
//!
//! Each case prints what became of the pods caught mid-start (`--nocapture`).
//!
//!     cargo test -p e2e-tests --test cri_restart -- --test-threads=1 --nocapture
//!
//! Cost: about a minute per case on a 2-core TCG host.

use std::time::{Duration, Instant};

use e2e_tests::cri_api::{ContainerState, PodSandboxState};
use e2e_tests::*;
use nix::sys::signal::Signal;

/// Pods whose RunPodSandbox is in flight when containerd goes.
const STARTING: usize = 2;

/// How long a shim of a pod nobody lists may take to end on its own (the shim's limits
/// without a client, `shim/src/task/reach.rs`, and a boot under TCG) or to be deleted
/// by containerd's recovery.
const SETTLE: Duration = Duration::from_secs(150);

/// The sandbox id in a shim's command line (`... -id <id> ...`).
fn shim_id(cmdline: &str) -> Option<String> {
    let mut words = cmdline.split_whitespace();
    words.find(|w| *w == "-id")?;
    words.next().map(str::to_string)
}

/// The ticks a ticker container logged so far.
fn ticks(c: &CriContainerd, id: &str) -> usize {
    c.container_log(id)
        .iter()
        .filter(|l| l.content.starts_with("tick "))
        .count()
}

/// The running pod's container answers exec, logs and stats after the restart.
fn assert_still_serves(c: &CriContainerd, pod: &Pod, app: &str) {
    assert_eq!(
        c.cri().container_state(app).ok(),
        Some(ContainerState::ContainerRunning),
        "the running pod's container after containerd's restart\n{}",
        c.log_tail()
    );
    let out = c.exec(app, &["cat", "/proc/1/cmdline"]);
    assert_eq!(out.exit_code, 0, "ExecSync after the restart: {out:?}");
    assert!(
        out.stdout.starts_with("sh"),
        "ExecSync after the restart: {out:?}"
    );
    let seen = ticks(c, app);
    let more = poll(Duration::from_secs(30), Duration::from_millis(200), || {
        (ticks(c, app) > seen + 2).then_some(())
    });
    assert!(
        more.is_some(),
        "the running container's log stopped at {seen} ticks after containerd's restart\n{}",
        c.log_tail()
    );
    let stats = c
        .cri()
        .container_stats(app)
        .unwrap_or_else(|e| panic!("ContainerStats after the restart: {e}\n{}", c.log_tail()));
    assert!(
        stats.memory.is_some_and(|m| m.working_set_bytes.is_some()),
        "ContainerStats after the restart lacks memory: {stats:?}"
    );
    c.cri()
        .pod_sandbox_stats(&pod.id)
        .unwrap_or_else(|e| panic!("PodSandboxStats after the restart: {e}\n{}", c.log_tail()));
}

/// What became of a pod caught mid-start, found by its uid among the listed sandboxes:
/// listed ones are adopted (so that they are stopped, removed and checked), and the
/// outcome said.
fn outcome(c: &CriContainerd, config: &cri_api::PodSandboxConfig) -> (String, Vec<Pod>) {
    let uid = Some(pod_uid(config));
    let listed = c
        .cri()
        .list_pod_sandbox()
        .unwrap_or_else(|e| panic!("ListPodSandbox after the restart: {e}\n{}", c.log_tail()));
    let mine: Vec<_> = listed
        .into_iter()
        .filter(|p| p.metadata.as_ref().map(|m| m.uid.clone()) == uid)
        .collect();
    if mine.is_empty() {
        return ("not listed".to_string(), Vec::new());
    }
    let mut said = Vec::new();
    let mut pods = Vec::new();
    for p in mine {
        let state = if p.state == PodSandboxState::SandboxReady as i32 {
            "READY"
        } else {
            "NOTREADY"
        };
        said.push(format!("listed {state}"));
        let pod = c
            .adopt_pod(&p.id, config.clone())
            .unwrap_or_else(|e| panic!("PodSandboxStatus {}: {e}\n{}", p.id, c.log_tail()));
        pods.push(pod);
    }
    (said.join(", "), pods)
}

fn restart_under_running_and_starting_pods(version: &str, sig: Signal) {
    let name = format!(
        "cri-restart-{}-{}",
        version.replace('.', ""),
        if sig == Signal::SIGKILL {
            "kill"
        } else {
            "term"
        }
    );
    let c = CriContainerd::start_version(&name, Handler::Kata, version);
    let running = c.run_pod(c.pod_config("running"));
    let ticker = c.container_config(
        &running,
        "ticker",
        &[
            "sh",
            "-c",
            "i=0; while true; do echo \"tick $i\"; i=$((i+1)); sleep 0.2; done",
        ],
    );
    let app = c.start_container(&running, ticker);

    let configs: Vec<_> = (0..STARTING)
        .map(|i| c.pod_config(&format!("starting-{i}")))
        .collect();
    let mut caught = Vec::new();
    let started: Vec<Result<Pod, CriError>> = std::thread::scope(|s| {
        // One after the other, each once the one before has its shim (its VM booting):
        // containerd goes as soon as the last one's shim is up, catching the pods at
        // different points of their start.
        let mut runs = Vec::new();
        for config in &configs {
            runs.push(s.spawn(|| c.try_run_pod(config.clone())));
            // A shim is listed twice while its `start` runs: count sandbox ids.
            let up = poll(Duration::from_secs(60), Duration::from_millis(20), || {
                let mut ids: Vec<String> = c
                    .shims_left()
                    .iter()
                    .filter_map(|s| shim_id(s))
                    .filter(|id| *id != running.id)
                    .collect();
                ids.sort();
                ids.dedup();
                (ids.len() >= runs.len()).then_some(ids)
            });
            caught = up.unwrap_or_default();
        }
        let pid = c.containerd().pid();
        assert!(signal(pid, sig), "{sig} to containerd {pid}");
        if !wait_gone(pid, Duration::from_secs(20)) {
            panic!("containerd {pid} did not end within 20 s of {sig}");
        }
        runs.into_iter()
            .map(|r| r.join().expect("a RunPodSandbox thread panicked"))
            .collect()
    });
    eprintln!("{name}: shims of the pods starting at the {sig}: {caught:?}");
    let mut adopted = Vec::new();
    for (i, r) in started.into_iter().enumerate() {
        match r {
            // RunPodSandbox answered before containerd went: a plain pod.
            Ok(pod) => {
                eprintln!("{name}: starting-{i}: RunPodSandbox answered before the {sig}");
                adopted.push(pod);
            }
            Err(e) => eprintln!("{name}: starting-{i}: RunPodSandbox: {e}"),
        }
    }

    let restarted = Instant::now();
    c.containerd().start_daemon();
    c.wait_ready();
    assert_still_serves(&c, &running, &app);

    for (i, config) in configs.iter().enumerate() {
        if adopted.iter().any(|p| p.uid() == pod_uid(config)) {
            continue;
        }
        let (said, pods) = outcome(&c, config);
        eprintln!("{name}: starting-{i} after containerd {version} restarted from {sig}: {said}");
        adopted.extend(pods);
    }
    for pod in adopted {
        // A pod caught mid-start may be one whose shim the restarted containerd never
        // reached (its task was not created yet): Stop and Remove do not reach it, and it
        // ends on its own (no task for 30 s, or no caller for 60 s): checked below.
        if caught.contains(&pod.id) {
            c.stop_and_remove_pod(&pod);
        } else {
            c.remove_pod_checked(pod);
        }
    }
    c.remove_pod_checked(running);

    // Nothing left of the pods caught mid-start, listed or not: a shim nobody lists ends
    // on its own; then kubelet removes the pod's cgroup.
    for id in &caught {
        let gone = poll(SETTLE, Duration::from_millis(500), || {
            let mut left = leftovers(id);
            left.extend(uid_claims_of(id).iter().map(|p| p.display().to_string()));
            left.is_empty().then_some(())
        });
        assert!(
            gone.is_some(),
            "sandbox {id}, caught mid-start, left after {}s:\n{}\n{}",
            SETTLE.as_secs(),
            leftovers(id).join("\n"),
            c.log_tail()
        );
        eprintln!(
            "{name}: nothing left of {id} {:.0}s after the restart",
            restarted.elapsed().as_secs_f64()
        );
    }
    for config in &configs {
        if let Err(e) = c.remove_pod_cgroup(config) {
            panic!("the cgroup of a pod caught mid-start: {e}");
        }
    }
    let allocated = c.ipam_allocations();
    assert!(
        allocated.is_empty(),
        "pod addresses still allocated (a pod network never torn down): {allocated:?}"
    );
    assert!(
        c.shims_left().is_empty(),
        "shims left: {:?}",
        c.shims_left()
    );
}

#[test]
fn containerd_1_7_sigterm_under_running_and_starting_pods() {
    restart_under_running_and_starting_pods("1.7", Signal::SIGTERM);
}

#[test]
fn containerd_1_7_sigkill_under_running_and_starting_pods() {
    restart_under_running_and_starting_pods("1.7", Signal::SIGKILL);
}

#[test]
fn containerd_2_3_sigterm_under_running_and_starting_pods() {
    restart_under_running_and_starting_pods("2.3", Signal::SIGTERM);
}

#[test]
fn containerd_2_3_sigkill_under_running_and_starting_pods() {
    restart_under_running_and_starting_pods("2.3", Signal::SIGKILL);
}

#[test]
fn the_sandbox_id_is_read_from_a_shim_command_line() {
    let cmdline = "/x/containerd-shim-kata-v2 -namespace k8s.io -address /run/c.sock \
                   -publish-binary /x/containerd -id 4f2a -start";
    assert_eq!(shim_id(cmdline).as_deref(), Some("4f2a"));
    assert_eq!(shim_id("/x/containerd-shim-kata-v2 -id"), None);
}
