//! A create whose caller goes away completes or is undone, never half-done (issue 40).
//!
//! - containerd killed with SIGKILL while four sandboxes are being created, then started
//!   again (systemd after a crash or an upgrade), on the system's 1.6 and on 2.3: every
//!   sandbox is then either listed (and `ctr task rm -f` and `ctr c rm` remove it) or
//!   gone, and afterwards nothing of it is left: processes, mounts, `/run/vc` entries,
//!   uid claims, cgroups.
//! - The shim's caller killed between `start` and `create`, and mid-create, driving the
//!   shim binary as containerd does (`start`, then Create over ttrpc, then the
//!   connection dropped): the create finishes and a client that comes back finds the
//!   task CREATED and removes it; a shim nobody comes back to ends on its own, with its
//!   sandbox, after its limit (`shim/src/task/reach.rs`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use containerd_shim_protos::shim::shim::{
    CreateTaskRequest, DeleteRequest, KillRequest, ShutdownRequest, StateRequest,
};
use containerd_shim_protos::shim::shim_ttrpc::TaskClient;
use e2e_tests::*;
use nix::sys::signal::Signal;

/// The workload of the reproduction.
const BUSY_LOOP: [&str; 3] = ["sh", "-c", "while :; do sleep 0.2; done"];

/// How long a shim nobody reaches may live: the shim's limits (30 s without a task, 60 s
/// after an abandoned request finished), its check interval, and a boot under TCG.
const UNREACHED_END: Duration = Duration::from_secs(150);

/// How long four sandboxes booting at once may take here (QEMU/TCG, 2 cores).
const BOOT: Duration = Duration::from_secs(120);

fn refs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// The container's `linux.cgroupsPath`, from containerd's record.
fn cgroups_path(c: &Containerd, id: &str) -> Option<String> {
    let out = c.ctr(&["containers", "info", id]);
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let spec = info.get("Spec")?;
    spec.pointer("/linux/cgroupsPath")
        .and_then(|p| p.as_str())
        .map(str::to_string)
}

/// The sequence on containerd `c`: four `ctr run -d` at once, SIGKILL of
/// containerd 1.5 s later while the sandboxes boot, containerd started again; then each
/// sandbox is listed and removable, or gone, and nothing of it is left.
fn killed_mid_create(c: Containerd, prefix: &str) {
    let ids: Vec<String> = (1..=4).map(|i| format!("{prefix}-{i}")).collect();
    let _cleanup: Vec<SandboxCleanup> = ids.iter().map(|id| SandboxCleanup::new(id)).collect();
    let mut runs: Vec<Background> = ids
        .iter()
        .map(|id| c.ctr_background(&refs(&c.run_args(id, &["-d"], &BUSY_LOOP))))
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    let booting: Vec<&String> = ids
        .iter()
        .filter(|id| pid_of(id, Part::Shim).is_some())
        .collect();
    eprintln!("shims at the kill: {booting:?}");
    let pid = c.pid();
    assert!(signal(pid, Signal::SIGKILL), "kill -9 containerd {pid}");
    assert!(
        wait_gone(pid, Duration::from_secs(5)),
        "containerd survived SIGKILL"
    );
    for r in &mut runs {
        // ctr loses its connection and ends with an error.
        let _ = r.wait_within(Duration::from_secs(10));
    }
    let cgroups: Vec<Option<String>> = {
        c.start_daemon();
        ids.iter().map(|id| cgroups_path(&c, id)).collect()
    };
    let restarted = Instant::now();
    for (id, cgroup) in ids.iter().zip(&cgroups) {
        // Listed (State answers once the create has finished), or gone: the shim ended
        // (containerd ran its `delete`) or was never started.
        let outcome = poll(BOOT, Duration::from_millis(500), || {
            match c.task_status(id) {
                Some(s) => Some(format!("listed {s}")),
                None if pid_of(id, Part::Shim).is_none() && pid_of(id, Part::Vmm).is_none() => {
                    Some("gone".to_string())
                }
                None => None,
            }
        })
        .unwrap_or_else(|| {
            panic!(
                "{id}: neither listed nor gone {}s after containerd's restart: {:?}\n{}",
                BOOT.as_secs(),
                sandbox_processes(id),
                c.log_tail()
            )
        });
        eprintln!(
            "{id}: {outcome} {:.1}s after containerd's restart",
            restarted.elapsed().as_secs_f64()
        );
        if outcome.starts_with("listed") {
            let out = c
                .ctr_within(&["task", "rm", "-f", id], Duration::from_secs(60))
                .unwrap_or_else(|e| panic!("{e}\n{}", c.log_tail()));
            assert!(
                out.status.success(),
                "{id}: ctr task rm -f: {}\n{}",
                stderr(&out),
                c.log_tail()
            );
        }
        let out = c.ctr(&["containers", "rm", id]);
        assert!(
            out.status.success(),
            "{id}: ctr c rm: {}\n{}",
            stderr(&out),
            c.log_tail()
        );
        assert_nothing_left(id, cgroup.as_deref());
    }
}

#[test]
fn containerd_killed_mid_create_leaves_sandboxes_listed_or_gone_on_1_6() {
    killed_mid_create(Containerd::start("restart-16"), "lk16");
}

#[test]
fn containerd_killed_mid_create_leaves_sandboxes_listed_or_gone_on_2_3() {
    killed_mid_create(Containerd::start_version("restart-23", "2.3"), "lk23");
}

#[test]
fn containerd_killed_mid_create_leaves_sandboxes_listed_or_gone_on_1_7() {
    killed_mid_create(Containerd::start_version("restart-17", "1.7"), "lk17");
}

fn shim_binary() -> PathBuf {
    Path::new(&std::env::var("KATA_TEST_SHIM_DIR").expect("KATA_TEST_SHIM_DIR is not set"))
        .join("containerd-shim-kata-v2")
}

/// A bundle of our own for the shim, as containerd makes one: `config.json` (ctr's
/// default spec running [`BUSY_LOOP`] in a busybox rootfs, in cgroup `/kata-e2e-<id>`),
/// and the runtime configuration the other tests use.
struct Bundle {
    dir: tempfile::TempDir,
    id: String,
    address: String,
    /// Stands in for containerd's ttrpc socket (events): accepted, never answered.
    _events: std::os::unix::net::UnixListener,
    /// The shim's log, read from the bundle's `log` fifo as containerd reads it.
    log: ShimLog,
}

impl Bundle {
    fn new(id: &str) -> Self {
        let dir = tempfile::tempdir().expect("bundle dir");
        let out = Command::new("ctr")
            .args(["oci", "spec"])
            .output()
            .expect("ctr oci spec");
        let mut spec: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("ctr's default spec");
        spec["process"]["args"] = serde_json::json!(BUSY_LOOP);
        spec["process"]["env"] = serde_json::json!(["PATH=/bin"]);
        spec["linux"]["cgroupsPath"] = serde_json::json!(format!("/kata-e2e-{id}"));
        std::fs::write(dir.path().join("config.json"), spec.to_string()).expect("config.json");
        let bin = dir.path().join("rootfs/bin");
        std::fs::create_dir_all(&bin).expect("rootfs");
        std::fs::copy("/bin/busybox", bin.join("busybox")).expect("busybox-static");
        for applet in ["sh", "sleep"] {
            std::os::unix::fs::symlink("busybox", bin.join(applet)).expect("applet link");
        }
        std::fs::write(
            dir.path().join("configuration.toml"),
            RuntimeConfig::for_backend(Backend::Qemu).render(),
        )
        .expect("configuration.toml");
        let address = format!("{}/containerd.sock", dir.path().display());
        let events = std::os::unix::net::UnixListener::bind(format!("{address}.ttrpc"))
            .expect("binding the stand-in for containerd's ttrpc socket");
        let log = ShimLog::open(&dir.path().join("log"));
        Bundle {
            dir,
            id: id.to_string(),
            address,
            _events: events,
            log,
        }
    }

    /// The end of what the shim logged, for a failure's message.
    fn log_tail(&self) -> String {
        self.log.tail(40)
    }

    fn cgroup(&self) -> String {
        format!("/kata-e2e-{}", self.id)
    }

    /// `containerd-shim-kata-v2 ... start`, as containerd 1.6 runs it; the address.
    fn start(&self) -> String {
        let mut child = Command::new(shim_binary())
            .current_dir(self.dir.path())
            .args(["-namespace", "kata-restart-test", "-address", &self.address])
            .args(["-publish-binary", "/bin/true", "-id", &self.id, "start"])
            .env("TTRPC_ADDRESS", format!("{}.ttrpc", self.address))
            .env("KATA_CONF_FILE", self.dir.path().join("configuration.toml"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running the shim's start");
        drop(child.stdin.take());
        let out = child.wait_with_output().expect("the start's output");
        assert!(out.status.success(), "start: {}", stderr(&out));
        stdout(&out).trim().to_string()
    }

    /// Create over ttrpc, given up after `limit`; the connection is then dropped.
    fn create_and_hang_up(&self, address: &str, limit: Duration) {
        let client = client(address);
        let req = CreateTaskRequest {
            id: self.id.clone(),
            bundle: self.dir.path().display().to_string(),
            ..Default::default()
        };
        let ctx = ttrpc::context::with_timeout(limit.as_nanos() as i64);
        let answered = client.create(ctx, &req);
        assert!(
            answered.is_err(),
            "the create finished within {limit:?}: nothing was cut short"
        );
        // Dropping the client closes the connection: the shim's handler is dropped.
    }
}

fn client(address: &str) -> TaskClient {
    let c = ttrpc::Client::connect(address).expect("connecting to the shim");
    TaskClient::new(c)
}

/// Ends whatever of sandbox `id` a failed test left: the shim and the sandbox's processes,
/// mounts and directories ([`SandboxCleanup`]), and its cgroup.
struct Leftovers {
    _sandbox: SandboxCleanup,
    cgroup: String,
}

impl Leftovers {
    fn new(id: &str, cgroup: String) -> Self {
        Leftovers {
            _sandbox: SandboxCleanup::new(id),
            cgroup,
        }
    }
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        for d in cgroup_dirs(&self.cgroup) {
            let _ = std::fs::remove_dir(d);
        }
    }
}

#[test]
fn a_create_whose_caller_hangs_up_finishes_and_a_returning_client_removes_it() {
    let b = Bundle::new("rs-back");
    let _left = Leftovers::new(&b.id, b.cgroup());
    let address = b.start();
    b.create_and_hang_up(&address, Duration::from_millis(300));
    // A client that comes back: State waits for the create and finds the task CREATED.
    let c = client(&address);
    let state = c
        .state(
            ttrpc::context::with_timeout(BOOT.as_nanos() as i64),
            &StateRequest {
                id: b.id.clone(),
                ..Default::default()
            },
        )
        .unwrap_or_else(|e| {
            panic!(
                "state after the caller hung up: {e}\n{:?}\n{}\n{}",
                sandbox_processes(&b.id),
                pid_of(&b.id, Part::Shim)
                    .map(thread_states)
                    .unwrap_or_default(),
                b.log_tail()
            )
        });
    assert_eq!(
        state.status.enum_value_or_default(),
        containerd_shim_protos::api::Status::CREATED,
        "{state:?}"
    );
    assert!(
        pid_of(&b.id, Part::Vmm).is_some(),
        "no VM: {:?}\n{}",
        sandbox_processes(&b.id),
        b.log_tail()
    );
    c.kill(
        ttrpc_ctx(),
        &KillRequest {
            id: b.id.clone(),
            signal: 9,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("kill: {e}\n{}", b.log_tail()));
    c.delete(
        ttrpc_ctx(),
        &DeleteRequest {
            id: b.id.clone(),
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("delete: {e}\n{}", b.log_tail()));
    let _ = c.shutdown(ttrpc_ctx(), &ShutdownRequest::default());
    assert_nothing_left(&b.id, Some(&b.cgroup()));
}

#[test]
fn a_shim_nobody_comes_back_to_ends_on_its_own() {
    // Its caller killed between start and create: no Create ever comes.
    let idle = Bundle::new("rs-idle");
    let _left_idle = Leftovers::new(&idle.id, idle.cgroup());
    idle.start();
    // Its caller killed mid-create: the create finishes, and nobody comes back.
    let cut = Bundle::new("rs-cut");
    let _left_cut = Leftovers::new(&cut.id, cut.cgroup());
    let address = cut.start();
    let t0 = Instant::now();
    cut.create_and_hang_up(&address, Duration::from_millis(300));
    assert!(
        poll(BOOT, Duration::from_millis(200), || pid_of(
            &cut.id,
            Part::Vmm
        ))
        .is_some(),
        "the cut-short create booted no VM: {:?}\n{}",
        sandbox_processes(&cut.id),
        cut.log_tail()
    );
    for (b, what) in [(&idle, "no task"), (&cut, "abandoned create")] {
        let ended = poll(UNREACHED_END, Duration::from_millis(500), || {
            pid_of(&b.id, Part::Shim).is_none().then_some(())
        });
        assert!(
            ended.is_some(),
            "{}: the shim ({what}) still runs {}s after its start: {:?}\n{}",
            b.id,
            t0.elapsed().as_secs(),
            sandbox_processes(&b.id),
            b.log_tail()
        );
        eprintln!(
            "{}: ({what}) ended {:.1}s after start",
            b.id,
            t0.elapsed().as_secs_f64()
        );
        assert_nothing_left(&b.id, Some(&b.cgroup()));
        let socket = address_path(&b.file_address());
        assert!(
            !socket.exists(),
            "{} left its socket {}",
            b.id,
            socket.display()
        );
    }
}

impl Bundle {
    fn file_address(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("address"))
            .unwrap_or_default()
            .trim()
            .to_string()
    }
}

fn address_path(address: &str) -> PathBuf {
    PathBuf::from(address.trim_start_matches("unix://"))
}
