//! The shim's `start` and its daemon as containerd runs them, without a containerd: the
//! binary from `KATA_TEST_SHIM_DIR` in a bundle of our own, with what each containerd
//! version writes on its stdin (1.6 to 2.2: runtime options or nothing; 2.3+: bootstrap
//! parameters), with garbage, and with a start that must fail. No VM is booted: the
//! daemon only has to listen. The same start under each real containerd is in compat.rs.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use e2e_tests::*;
use nix::sys::signal::Signal;

fn shim_binary() -> PathBuf {
    let dir = std::env::var("KATA_TEST_SHIM_DIR")
        .expect("KATA_TEST_SHIM_DIR is not set: run the end-to-end tests with `make test`");
    Path::new(&dir).join("containerd-shim-kata-v2")
}

/// A bundle directory (with a `config.json` of `annotations`) and the start's flags.
struct Bundle {
    dir: tempfile::TempDir,
    id: String,
    namespace: String,
    /// `-address`: containerd's, which only names the socket here.
    address: String,
    /// Stands in for containerd's ttrpc socket (`<address>.ttrpc`), which the daemon
    /// connects to for its events: accepted, never answered.
    _events: std::os::unix::net::UnixListener,
}

impl Bundle {
    fn new(id: &str, annotations: serde_json::Value) -> Self {
        let dir = tempfile::tempdir().expect("bundle dir");
        let spec = serde_json::json!({ "ociVersion": "1.1.0", "annotations": annotations });
        std::fs::write(dir.path().join("config.json"), spec.to_string()).expect("config.json");
        let address = format!("{}/containerd.sock", dir.path().display());
        let events = std::os::unix::net::UnixListener::bind(format!("{address}.ttrpc"))
            .expect("binding the stand-in for containerd's ttrpc socket");
        Bundle {
            dir,
            id: id.to_string(),
            namespace: "kata-start-test".to_string(),
            address,
            _events: events,
        }
    }

    /// `containerd-shim-kata-v2 ... start` with `stdin`, as containerd runs it.
    fn start(&self, stdin: &[u8]) -> Output {
        let mut child = Command::new(shim_binary())
            .current_dir(self.dir.path())
            .args(["-namespace", &self.namespace, "-address", &self.address])
            .args(["-publish-binary", "/bin/true", "-id", &self.id, "start"])
            .env("TTRPC_ADDRESS", format!("{}.ttrpc", self.address))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running the shim's start");
        let mut input = child.stdin.take().expect("stdin");
        input.write_all(stdin).expect("writing stdin");
        drop(input);
        child.wait_with_output().expect("the start's output")
    }

    fn file(&self, name: &str) -> Option<String> {
        std::fs::read_to_string(self.dir.path().join(name)).ok()
    }
}

/// The shim processes (start or daemon) of `id`.
fn shim_pids(id: &str) -> Vec<i32> {
    sandbox_processes(id)
        .into_iter()
        .filter(|p| p.part == Part::Shim)
        .map(|p| p.pid)
        .collect()
}

/// Ends whatever shim of `id` a failed test left running.
struct ShimReaper(String);

impl Drop for ShimReaper {
    fn drop(&mut self) {
        for pid in shim_pids(&self.0) {
            signal(pid, Signal::SIGKILL);
            let _ = wait_gone(pid, Duration::from_secs(5));
        }
    }
}

/// A length-delimited protobuf field: tag, varint length, bytes.
fn protobuf_bytes(field: u8, bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![(field << 3) | 2];
    let mut len = bytes.len();
    while len >= 0x80 {
        out.push((len as u8 & 0x7f) | 0x80);
        len >>= 7;
    }
    out.push(len as u8);
    out.extend_from_slice(bytes);
    out
}

fn protobuf_string(field: u8, s: &str) -> Vec<u8> {
    protobuf_bytes(field, s.as_bytes())
}

/// BootstrapParams (containerd 2.3+) for `b`, with `extra` fields appended.
fn bootstrap_params(b: &Bundle, extra: &[u8]) -> Vec<u8> {
    let mut out = protobuf_string(1, &b.id);
    out.extend(protobuf_string(2, &b.namespace));
    out.extend(protobuf_string(4, "2.3.7"));
    out.extend(protobuf_string(5, &format!("{}.ttrpc", b.address)));
    out.extend(protobuf_string(6, &b.address));
    out.extend_from_slice(extra);
    out
}

/// The runtime options containerd sends for `ConfigPath = path`, as an Any.
fn runtime_options(path: &str) -> Vec<u8> {
    let mut out = protobuf_string(1, "runtimeoptions.v1.Options");
    out.extend(protobuf_string(
        2,
        &String::from_utf8(protobuf_string(2, path)).unwrap(),
    ));
    out
}

/// The `unix://` address in a BootstrapResult (version 2, protocol ttrpc).
fn bootstrap_result_address(out: &[u8]) -> String {
    assert_eq!(&out[..2], &[0x08, 0x02], "version 2 first: {out:?}");
    assert_eq!(out[2], 0x12, "then the address: {out:?}");
    let len = out[3] as usize;
    let address = String::from_utf8(out[4..4 + len].to_vec()).expect("utf-8 address");
    assert_eq!(&out[4 + len..], &protobuf_string(3, "ttrpc")[..], "{out:?}");
    address
}

/// Checks that the start handed its runtime options' ConfigPath to the daemon.
fn hands_the_config_path_to_the_daemon(b: &Bundle) {
    let handed = b.file("start-options.json").unwrap_or_default();
    assert!(
        handed.contains("/etc/kata-containers/fast.toml"),
        "{handed:?}"
    );
}

/// Checks that the daemon behind `address` serves the Task API, then ends it with
/// SIGTERM (it has no sandbox) and checks that it left nothing.
fn serves_then_ends_on_sigterm(b: &Bundle, address: &str) {
    assert_eq!(b.file("address").as_deref(), Some(address));
    let pid: i32 = b
        .file("shim.pid")
        .and_then(|p| p.trim().parse().ok())
        .expect("shim.pid");
    assert!(alive(pid), "the daemon {pid} is not running");
    let client = ttrpc::Client::connect(address).expect("connecting to the shim");
    let task = containerd_shim_protos::shim::shim_ttrpc::TaskClient::new(client);
    let reply = task
        .connect(ttrpc_ctx(), &Default::default())
        .expect("Connect on the shim's Task API");
    assert_eq!(reply.shim_pid, pid as u32);

    signal(pid, Signal::SIGTERM);
    assert!(
        wait_gone(pid, Duration::from_secs(10)),
        "the daemon without a sandbox survived SIGTERM"
    );
    let path = address.trim_start_matches("unix://");
    assert!(
        poll(Duration::from_secs(5), Duration::from_millis(50), || {
            (!Path::new(path).exists()).then_some(())
        })
        .is_some(),
        "the socket {path} is left"
    );
    assert!(
        shim_pids(&b.id).is_empty(),
        "shim processes of {} left",
        b.id
    );
}

#[test]
fn containerd_1_6_to_2_2_start_with_runtime_options_or_nothing() {
    for (n, stdin) in [
        Vec::new(),
        runtime_options("/etc/kata-containers/fast.toml"),
    ]
    .into_iter()
    .enumerate()
    {
        let b = Bundle::new(&format!("start-legacy-{n}"), serde_json::json!({}));
        let _reaper = ShimReaper(b.id.clone());
        let out = b.start(&stdin);
        assert!(out.status.success(), "start: {}", stderr(&out));
        assert_eq!(
            stderr(&out),
            "",
            "start printed on stderr, which containerd reads too"
        );
        let address = stdout(&out);
        assert!(
            address.starts_with("unix:///run/containerd/s/"),
            "{address:?}"
        );
        if !stdin.is_empty() {
            hands_the_config_path_to_the_daemon(&b);
        }
        serves_then_ends_on_sigterm(&b, &address);
    }
}

#[test]
fn containerd_2_3_start_answers_a_bootstrap_result_in_its_socket_dir() {
    let b = Bundle::new("start-bootstrap", serde_json::json!({}));
    let _reaper = ShimReaper(b.id.clone());
    let socket_dir = b.dir.path().join("s");
    // extensions (8): Extension { value (1): Any(runtime options) }
    let any = runtime_options("/etc/kata-containers/fast.toml");
    let mut extra = protobuf_bytes(8, &protobuf_bytes(1, &any));
    extra.extend(protobuf_string(9, socket_dir.to_str().expect("utf-8 path")));
    let out = b.start(&bootstrap_params(&b, &extra));
    assert!(out.status.success(), "start: {}", stderr(&out));
    let address = bootstrap_result_address(&out.stdout);
    assert!(
        address.starts_with(&format!("unix://{}/", socket_dir.display())),
        "{address} is not in the socket_dir {}",
        socket_dir.display()
    );
    hands_the_config_path_to_the_daemon(&b);
    serves_then_ends_on_sigterm(&b, &address);
}

/// containerd may end a daemon it no longer needs as soon as its start has answered: a
/// SIGTERM in the first moments of the daemon's life (before it waits for its end) ends it
/// as one later does.
#[test]
fn a_sigterm_right_after_the_start_ends_the_daemon() {
    for n in 0..20 {
        let b = Bundle::new(&format!("start-term-{n}"), serde_json::json!({}));
        let _reaper = ShimReaper(b.id.clone());
        let out = b.start(&[]);
        assert!(out.status.success(), "start: {}", stderr(&out));
        let pid: i32 = b
            .file("shim.pid")
            .and_then(|p| p.trim().parse().ok())
            .expect("shim.pid");
        signal(pid, Signal::SIGTERM);
        assert!(
            wait_gone(pid, Duration::from_secs(10)),
            "start {n}: the daemon without a sandbox survived a SIGTERM sent as its start answered"
        );
    }
}

#[test]
fn garbage_on_stdin_is_ignored_and_the_start_works() {
    let b = Bundle::new("start-garbage", serde_json::json!({}));
    let _reaper = ShimReaper(b.id.clone());
    let out = b.start(b"{\"ConfigPath\": \"/x\"}\n\xff\xfe");
    assert!(out.status.success(), "start: {}", stderr(&out));
    let address = stdout(&out);
    assert!(address.starts_with("unix://"), "{address:?}");
    assert_eq!(b.file("start-options.json"), None);
    serves_then_ends_on_sigterm(&b, &address);
}

#[test]
fn a_failed_start_leaves_no_daemon_socket_or_files() {
    let b = Bundle::new("start-fails", serde_json::json!({}));
    let _reaper = ShimReaper(b.id.clone());
    // A socket directory so deep that no unix socket fits in it: the daemon cannot listen.
    let deep = b.dir.path().join("d".repeat(60)).join("e".repeat(60));
    let extra = protobuf_string(9, deep.to_str().expect("utf-8 path"));
    let out = b.start(&bootstrap_params(&b, &extra));
    assert!(!out.status.success(), "start succeeded: {}", stdout(&out));
    let err = stderr(&out);
    assert!(err.contains("shim daemon"), "{err}");
    assert!(
        shim_pids(&b.id).is_empty(),
        "a shim daemon of {} is left",
        b.id
    );
    for f in ["address", "shim.pid", "start-options.json"] {
        assert_eq!(b.file(f), None, "{f} left in the bundle");
    }
    let sockets: Vec<_> = std::fs::read_dir(&deep)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(sockets.is_empty(), "left in the socket dir: {sockets:?}");
}

#[test]
fn a_pod_container_without_its_sandbox_fails_clearly() {
    let b = Bundle::new(
        "start-orphan",
        serde_json::json!({
            "io.kubernetes.cri.container-type": "container",
            "io.kubernetes.cri.sandbox-id": "start-no-such-sandbox",
        }),
    );
    let _reaper = ShimReaper(b.id.clone());
    let out = b.start(b"");
    assert!(!out.status.success(), "start succeeded: {}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains("start-no-such-sandbox") && err.contains("start the sandbox container first"),
        "{err}"
    );
    assert!(shim_pids(&b.id).is_empty());
    assert_eq!(b.file("address"), None);
}
