//! Churn soak through the CRI, as kubelet drives a node (issue 40, item 6): 200 pod
//! lifecycles, 4 at a time, on a private containerd 2.3 with the `kata` handler. Each:
//! RunPodSandbox, CreateContainer, StartContainer, ExecSync, the container's log read,
//! StopPodSandbox, RemovePodSandbox, and the pod's own leak check (processes, mounts,
//! `/run/vc` entries, uid claims, network namespace, cgroups). No lifecycle may fail.
//!
//! Host-wide, measured after a warm-up and again at the end once settled: MemAvailable,
//! containerd's open files and RSS, mounts, `/run/vc` entries, shim sockets, uid claims,
//! network namespaces, cgroups. None may grow beyond noise. The figures and the rate (cycles per
//! minute) go to stderr and to `target/e2e-figures/cri-soak.txt`, which `make e2e` and
//! `make test` print.
//!
//! One test only: the host-wide counts must not see another test's pods from this binary.
//! Other runs on the host (another worker's suite) may still add noise, hence the slack
//! on the host-wide counts; each pod's own entries are checked exactly.
//!
//!     cargo test -p e2e-tests --test cri_soak -- --nocapture
//!
//! Cost: about 6 minutes on a 2-core TCG host (see the README's test section).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use e2e_tests::*;

/// Pod lifecycles in all, the warm-up's included.
const CYCLES: usize = 200;
/// Pod lifecycles at once.
const PARALLEL: usize = 4;
/// Lifecycles before the reference measurement (containerd's caches and Go heap, the
/// page cache of the images and binaries).
const WARM_UP: usize = 8;

/// Slack on host-wide counts that other runs on the host may move (a sandbox of another
/// suite holds a dozen mounts and cgroups); a leak of one per lifecycle is ~190.
const HOST_NOISE: usize = 60;
/// containerd's open files vary a little with its connections and caches.
const FD_NOISE: usize = 12;
/// MemAvailable may drop this much (KiB) for reasons of its own (page cache, another
/// suite's VMs); a leaked shim or helper per lifecycle would be several times more.
const MEM_NOISE_KIB: u64 = 1024 * 1024;

/// Sets `failed` if the worker that owns it panics, so that the others stop early.
struct FailFlag<'a>(&'a AtomicBool);

impl Drop for FailFlag<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}

/// One pod lifecycle, number `n`; panics (with containerd's log) on any failure or
/// anything the pod left.
fn cycle(c: &CriContainerd, n: usize) {
    let pod = c.run_pod(c.pod_config(&format!("soak-{n}")));
    let greeting = format!("started-{n}");
    let script = format!("echo {greeting}; exec sleep 1000");
    let config = c.container_config(&pod, "app", &["sh", "-c", &script]);
    let id = c.start_container(&pod, config);

    let marker = format!("exec-{n}");
    let out = c.exec(&id, &["echo", &marker]);
    assert_eq!(
        (out.exit_code, out.stdout.trim()),
        (0, marker.as_str()),
        "cycle {n}: ExecSync answered {out:?}"
    );
    let logged = poll(Duration::from_secs(20), Duration::from_millis(100), || {
        c.container_log(&id)
            .iter()
            .any(|l| l.content == greeting)
            .then_some(())
    });
    assert!(
        logged.is_some(),
        "cycle {n}: the container's log lacks {greeting:?}: {:?}",
        c.container_log(&id)
    );

    c.stop_and_remove_pod(&pod);
    c.assert_pod_removed_cleanly(&pod);
    let claims = uid_claims_of(&pod.id);
    assert!(claims.is_empty(), "cycle {n}: uid claims left: {claims:?}");
}

/// Lifecycles `range`, [`PARALLEL`] at a time; panics when one failed (after the others
/// in flight finished).
fn run_cycles(c: &CriContainerd, range: std::ops::Range<usize>) {
    let next = AtomicUsize::new(range.start);
    let failed = AtomicBool::new(false);
    std::thread::scope(|s| {
        for _ in 0..PARALLEL {
            s.spawn(|| {
                let _flag = FailFlag(&failed);
                while !failed.load(Ordering::SeqCst) {
                    let n = next.fetch_add(1, Ordering::SeqCst);
                    if n >= range.end {
                        break;
                    }
                    cycle(c, n);
                }
            });
        }
    });
}

/// Host-wide usage once the instance's shims are gone and containerd has settled.
fn settled(c: &CriContainerd) -> HostUsage {
    let quiet = poll(Duration::from_secs(30), Duration::from_millis(200), || {
        c.shims_left().is_empty().then_some(())
    });
    assert!(quiet.is_some(), "shims left: {:?}", c.shims_left());
    std::thread::sleep(Duration::from_secs(3));
    HostUsage::take(c.containerd().pid())
}

/// One figure: its name, its value after the warm-up and at the end, the growth allowed.
struct Figure {
    what: &'static str,
    before: u64,
    after: u64,
    slack: u64,
    /// A figure that must not drop (MemAvailable) rather than not grow.
    falls: bool,
}

impl Figure {
    fn grew(what: &'static str, before: usize, after: usize, slack: usize) -> Self {
        Figure {
            what,
            before: before as u64,
            after: after as u64,
            slack: slack as u64,
            falls: false,
        }
    }

    fn exceeded(&self) -> bool {
        if self.falls {
            self.after + self.slack < self.before
        } else {
            self.after > self.before + self.slack
        }
    }

    fn line(&self) -> String {
        let change = self.after as i64 - self.before as i64;
        format!(
            "  {:<28} {:>10} -> {:>10}  ({change:+}, allowed {}{})",
            self.what,
            self.before,
            self.after,
            if self.falls { "-" } else { "+" },
            self.slack
        )
    }
}

#[test]
fn pod_churn_through_the_cri_leaves_nothing_and_grows_nothing() {
    let c = CriContainerd::start_version("cri-soak", Handler::Kata, "2.3");
    let t = Instant::now();
    run_cycles(&c, 0..WARM_UP);
    let before = settled(&c);
    let warm = Instant::now();
    run_cycles(&c, WARM_UP..CYCLES);
    let churn = warm.elapsed();
    let after = settled(&c);

    let measured = CYCLES - WARM_UP;
    let figures = [
        Figure {
            what: "MemAvailable (KiB)",
            before: before.mem_available_kib,
            after: after.mem_available_kib,
            slack: MEM_NOISE_KIB,
            falls: true,
        },
        Figure::grew(
            "containerd open files",
            before.containerd_fds,
            after.containerd_fds,
            FD_NOISE,
        ),
        Figure {
            what: "containerd RSS (KiB)",
            before: before.containerd_rss_kib,
            after: after.containerd_rss_kib,
            // Go's heap settles after the warm-up; a leak per lifecycle keeps growing.
            slack: (before.containerd_rss_kib / 2).max(32 * 1024),
            falls: false,
        },
        Figure::grew("mounts", before.mounts, after.mounts, HOST_NOISE),
        Figure::grew(
            "/run/vc entries",
            before.sandbox_dirs,
            after.sandbox_dirs,
            HOST_NOISE,
        ),
        Figure::grew(
            "shim sockets",
            before.shim_sockets,
            after.shim_sockets,
            HOST_NOISE,
        ),
        Figure::grew(
            "uid claims",
            before.uid_claims,
            after.uid_claims,
            HOST_NOISE,
        ),
        Figure::grew("network namespaces", before.netns, after.netns, HOST_NOISE),
        Figure::grew("cgroups", before.cgroups, after.cgroups, HOST_NOISE),
    ];
    let mut text = format!(
        "cri-soak: {CYCLES} pod lifecycles ({PARALLEL} at a time) through the CRI of \
         containerd 2.3 with the kata handler in {:.0}s; after a warm-up of {WARM_UP}, \
         {measured} in {:.0}s = {:.1} per minute\n\
         cri-soak: host figures after the warm-up -> at the end (settled):\n",
        t.elapsed().as_secs_f64(),
        churn.as_secs_f64(),
        measured as f64 * 60.0 / churn.as_secs_f64()
    );
    for f in &figures {
        text.push_str(&f.line());
        text.push('\n');
    }
    publish_figures("cri-soak", &text);
    let over: Vec<String> = figures
        .iter()
        .filter(|f| f.exceeded())
        .map(Figure::line)
        .collect();
    assert!(
        over.is_empty(),
        "grew beyond noise over {measured} pod lifecycles:\n{}",
        over.join("\n")
    );
}
