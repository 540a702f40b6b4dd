//! Soak: many container lifecycles through one containerd leave nothing behind and make
//! nothing grow: 10 sequential `ctr run --rm ... true` (the warm-up), then 20 at once.
//! The long churn (200 pod lifecycles) is the CRI's, in `cri_soak.rs`; this one keeps
//! what that one lacks: the task API alone (no pod), 20 VMs booting at once, and the
//! shim socket of each lifecycle. Checked: every sandbox's processes, mounts, directories
//! and shim socket are gone, and the host-wide counts (sandbox directories, shim sockets,
//! mounts) and containerd's open files and memory do not grow with the lifecycles.
//!
//! One test only: the host-wide counts must not see another test's sandboxes from this
//! binary. Other runs on the host (another suite) may still add noise, hence the
//! tolerances on the host-wide counts; this test's own entries are checked exactly.

use std::time::{Duration, Instant};

use e2e_tests::*;

const SEQUENTIAL: usize = 10;
/// Sequential lifecycles before the reference measurement (caches, Go heap, ...).
const WARM_UP: usize = 10;
const PARALLEL: usize = 20;

/// Hang guard of one lifecycle (20 boot at once on two cores under QEMU/TCG).
const LIMIT: Duration = Duration::from_secs(300);

/// Host-wide slack for entries other runs on the host may hold at the moment of a
/// measurement; a leak of one per lifecycle would be 31.
const HOST_NOISE: usize = 20;
/// containerd's open files vary a little with its connections and caches.
const FD_NOISE: usize = 8;

/// `ctr run --rm ID true`, checked to succeed and to leave nothing.
fn lifecycle(c: &Containerd, id: &str) {
    let args = c.run_args(id, &["--rm"], &["true"]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = c
        .ctr_within(&refs, LIMIT)
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log_tail()));
    assert!(
        out.status.success(),
        "lifecycle {id}: {}\n{}",
        stderr(&out),
        c.log_tail()
    );
}

/// Entries of this test's sandboxes (ids starting with `soak-`) still on the host.
fn own_entries(c: &Containerd) -> Vec<String> {
    let mut found = Vec::new();
    for root in SANDBOX_ROOTS {
        if let Ok(dir) = std::fs::read_dir(root) {
            for e in dir.flatten() {
                if e.file_name().to_string_lossy().starts_with("soak-") {
                    found.push(e.path().display().to_string());
                }
            }
        }
    }
    let state = c.dir.display().to_string();
    for m in mount_points() {
        if m.starts_with(&state) || m.contains("/sandboxes/soak-") {
            found.push(format!("mount {m}"));
        }
    }
    found
}

fn report(when: &str, u: &HostUsage) {
    eprintln!(
        "soak {when}: sandbox dirs {}, shim sockets {}, mounts {}, containerd fds {}, \
         containerd RSS {} KiB",
        u.sandbox_dirs, u.shim_sockets, u.mounts, u.containerd_fds, u.containerd_rss_kib
    );
}

/// Usage once containerd has settled after a batch (its shims gone, connections closed).
fn settled_usage(c: &Containerd) -> HostUsage {
    std::thread::sleep(Duration::from_secs(2));
    HostUsage::take(c.pid())
}

#[test]
fn lifecycles_leave_nothing_and_grow_nothing() {
    let all_ids: Vec<String> = (0..SEQUENTIAL)
        .map(|i| format!("soak-s{i}"))
        .chain((0..PARALLEL).map(|i| format!("soak-p{i}")))
        .collect();
    let _cleanup: Vec<SandboxCleanup> = all_ids.iter().map(|id| SandboxCleanup::new(id)).collect();
    // Twenty agents dialled at once on two emulated cores need more than the default.
    let config = RuntimeConfig::qemu().set("agent.kata", "dial_timeout", "240");
    let c = Containerd::start_configured("soak", &config);
    let before = settled_usage(&c);
    report("before", &before);

    // The shim's socket is where the harness computes it, so its removal can be checked.
    start_detached(&c, "soak-s0", &[], &["sleep", "1000"]);
    let address = std::fs::read_to_string(c.bundle("soak-s0").join("address")).expect("address");
    assert_eq!(
        address.trim().trim_start_matches("unix://"),
        c.shim_socket("soak-s0").display().to_string(),
        "the harness computes the shim socket differently from containerd"
    );
    remove_detached(&c, "soak-s0");
    assert_no_leftovers("soak-s0");

    let t = Instant::now();
    let mut warm = None;
    for (i, id) in all_ids[..SEQUENTIAL].iter().enumerate() {
        lifecycle(&c, id);
        if i + 1 == WARM_UP {
            let u = settled_usage(&c);
            report("after the warm-up", &u);
            warm = Some(u);
        }
    }
    let warm = warm.expect("warm-up measurement");
    eprintln!(
        "soak: {SEQUENTIAL} sequential lifecycles in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    let sequential = settled_usage(&c);
    report("after the sequential lifecycles", &sequential);

    let t = Instant::now();
    let runs: Vec<_> = all_ids[SEQUENTIAL..]
        .iter()
        .map(|id| {
            let args = c.run_args(id, &["--rm"], &["true"]);
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            (id.clone(), c.ctr_background(&refs))
        })
        .collect();
    let mut failures = Vec::new();
    for (id, mut run) in runs {
        match run.wait_within(LIMIT) {
            Some(out) if out.status.success() => {}
            Some(out) => failures.push(format!("{id}: {}", stderr(&out).trim())),
            None => failures.push(format!("{id}: still running after {LIMIT:?}")),
        }
    }
    eprintln!(
        "soak: {PARALLEL} parallel lifecycles in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "parallel lifecycles failed:\n{}\n{}",
        failures.join("\n"),
        c.log_tail()
    );

    for id in &all_ids {
        assert_no_leftovers(id);
        let socket = c.shim_socket(id);
        assert!(
            !socket.exists(),
            "the shim socket of {id} is left: {socket:?}"
        );
    }
    let own = own_entries(&c);
    assert!(own.is_empty(), "left on the host:\n{}", own.join("\n"));

    let end = settled_usage(&c);
    report("at the end", &end);
    let grew = |what: &str, from: usize, to: usize, slack: usize| {
        assert!(
            to <= from + slack,
            "{what} grew from {from} to {to} over {} lifecycles",
            SEQUENTIAL + PARALLEL
        );
    };
    grew(
        "sandbox directories",
        before.sandbox_dirs,
        end.sandbox_dirs,
        HOST_NOISE,
    );
    grew(
        "shim sockets",
        before.shim_sockets,
        end.shim_sockets,
        HOST_NOISE,
    );
    grew("mounts", before.mounts, end.mounts, HOST_NOISE);
    grew(
        "containerd's open files (from the warm-up on)",
        warm.containerd_fds,
        end.containerd_fds,
        FD_NOISE,
    );
    // Go's heap settles after the warm-up; a leak per lifecycle keeps growing past it.
    let rss_slack = (warm.containerd_rss_kib / 2).max(32 * 1024);
    assert!(
        end.containerd_rss_kib <= warm.containerd_rss_kib + rss_slack,
        "containerd's RSS grew from {} KiB after the warm-up to {} KiB",
        warm.containerd_rss_kib,
        end.containerd_rss_kib
    );
}
