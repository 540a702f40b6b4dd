//! The kata-monitor binary against fake shims (unix sockets in a sandboxes directory of the
//! test's own): series of every answering shim, labelled with their sandbox; a shim that
//! hangs or a dead socket fails only its own sandbox; a sandbox whose directory goes
//! leaves the next scrape; bad flags, an address in use and a missing runtime endpoint
//! are refused with a message and a non-zero exit. The end-to-end test with real shims,
//! containerd's CRI and Prometheus is tests/tests/monitor.rs.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_kata-monitor");

fn shim_body(mem: u64) -> String {
    format!(
        "# HELP kata_guest_meminfo Statistics about memory usage in the guest.\n\
         # TYPE kata_guest_meminfo gauge\n\
         kata_guest_meminfo{{item=\"mem_total\"}} {mem}\n\
         # HELP kata_shim_threads Kata containerd shim v2 process threads.\n\
         # TYPE kata_shim_threads gauge\n\
         kata_shim_threads 12\n"
    )
}

/// A fake shim answering every GET with `body` on `socket`, in a thread of its own.
fn serve(socket: &Path, body: String) {
    let listener = UnixListener::bind(socket).expect("binding a fake shim socket");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                match stream.read(&mut byte) {
                    Ok(1) => head.push(byte[0]),
                    _ => break,
                }
            }
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
}

/// A temporary directory: sandboxes and the fake runtime endpoint.
struct Scene {
    dir: tempfile::TempDir,
    /// Listeners that take connections and never answer (kept open by holding them).
    _hung: Vec<UnixListener>,
}

impl Scene {
    fn new() -> Self {
        Scene {
            dir: tempfile::tempdir().expect("a temp dir"),
            _hung: Vec::new(),
        }
    }

    fn sbs(&self) -> PathBuf {
        self.dir.path().join("sbs")
    }

    fn sandbox(&self, id: &str) -> PathBuf {
        let d = self.sbs().join(id);
        std::fs::create_dir_all(&d).expect("a sandbox dir");
        d.join("shim-monitor.sock")
    }

    /// A runtime endpoint that takes connections (the CRI calls on it fail: no labels).
    fn endpoint(&mut self) -> PathBuf {
        let p = self.dir.path().join("containerd.sock");
        self._hung
            .push(UnixListener::bind(&p).expect("binding the endpoint"));
        p
    }
}

/// The monitor, killed by its pid when dropped.
struct Monitor {
    child: Child,
    port: u16,
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn start(sbs: &Path, endpoint: &Path) -> Monitor {
    let port = free_port();
    let child = Command::new(BIN)
        .arg("--listen-address")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--runtime-endpoint")
        .arg(endpoint)
        .arg("--sandboxes-dir")
        .arg(sbs)
        .args(["--shim-timeout", "1", "--log-level", "error"])
        .stdin(Stdio::null())
        .spawn()
        .expect("starting kata-monitor");
    let mut m = Monitor { child, port };
    let until = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = m.child.try_wait() {
            panic!("kata-monitor exited: {status}");
        }
        assert!(Instant::now() < until, "kata-monitor does not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    m
}

/// GET `path`: the status line and the body.
fn get(m: &Monitor, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", m.port)).expect("connecting to the monitor");
    s.set_read_timeout(Some(Duration::from_secs(60))).ok();
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").expect("sending");
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("reading the answer");
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

fn value_of(text: &str, series: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .map(str::to_string)
}

#[test]
fn answering_shims_are_merged_and_a_hung_or_dead_one_fails_alone() {
    let mut scene = Scene::new();
    serve(&scene.sandbox("pod-a"), shim_body(536_870_912));
    serve(&scene.sandbox("pod-b"), shim_body(1_073_741_824));
    // A shim that hangs: the connection is taken, the answer never comes.
    let hung = UnixListener::bind(scene.sandbox("pod-hung")).expect("a hung socket");
    scene._hung.push(hung);
    // A dead socket: its listener is gone, the file stays.
    drop(UnixListener::bind(scene.sandbox("pod-dead")).expect("a dead socket"));
    // A sandbox directory without a socket (starting): not a sandbox yet.
    std::fs::create_dir_all(scene.sbs().join("pod-starting")).expect("a dir");
    let endpoint = scene.endpoint();
    let m = start(&scene.sbs(), &endpoint);

    let (status, sandboxes) = get(&m, "/sandboxes");
    assert!(status.contains("200"), "{status}");
    assert_eq!(sandboxes, "pod-a\npod-b\npod-dead\npod-hung\n");

    let (status, text) = get(&m, "/metrics");
    assert!(status.contains("200"), "{status}");
    let a = "kata_guest_meminfo{item=\"mem_total\",sandbox_id=\"pod-a\",cri_uid=\"\",cri_name=\"\",cri_namespace=\"\"}";
    let b = a.replace("pod-a", "pod-b");
    assert_eq!(value_of(&text, a).as_deref(), Some("536870912"), "{text}");
    assert_eq!(value_of(&text, &b).as_deref(), Some("1073741824"), "{text}");
    assert_eq!(
        text.matches("# TYPE kata_guest_meminfo gauge").count(),
        1,
        "{text}"
    );
    assert_eq!(
        text.matches("# HELP kata_shim_threads ").count(),
        1,
        "{text}"
    );
    let up = |id: &str| {
        value_of(
            &text,
            &format!("kata_monitor_shim_up{{sandbox_id=\"{id}\",cri_uid=\"\",cri_name=\"\",cri_namespace=\"\"}}"),
        )
    };
    assert_eq!(up("pod-a").as_deref(), Some("1"));
    assert_eq!(up("pod-hung").as_deref(), Some("0"));
    assert_eq!(up("pod-dead").as_deref(), Some("0"));
    assert_eq!(
        value_of(
            &text,
            "kata_monitor_shim_scrape_failed_count{reason=\"timeout\"}"
        )
        .as_deref(),
        Some("1")
    );
    assert_eq!(
        value_of(
            &text,
            "kata_monitor_shim_scrape_failed_count{reason=\"connect\"}"
        )
        .as_deref(),
        Some("1")
    );
    assert_eq!(
        value_of(&text, "kata_monitor_running_shim_count").as_deref(),
        Some("4")
    );
    assert_eq!(
        value_of(&text, "kata_monitor_scrape_count").as_deref(),
        Some("1")
    );
    assert_eq!(
        value_of(&text, "kata_monitor_scrape_failed_count").as_deref(),
        Some("1")
    );

    // filter_family keeps only the families asked for.
    let (_, only) = get(&m, "/metrics?filter_family=kata_guest");
    assert!(only.contains("kata_guest_meminfo{") && !only.contains("kata_shim_threads"));

    // A sandbox that goes leaves the next scrape.
    std::fs::remove_dir_all(scene.sbs().join("pod-b")).expect("removing pod-b");
    let (_, text) = get(&m, "/metrics");
    assert!(!text.contains("pod-b"), "{text}");
    assert!(text.contains("sandbox_id=\"pod-a\""), "{text}");
    let (_, sandboxes) = get(&m, "/sandboxes");
    assert_eq!(sandboxes, "pod-a\npod-dead\npod-hung\n");

    let (status, _) = get(&m, "/nothing");
    assert!(status.contains("404"), "{status}");
}

fn run_bad(args: &[&str]) -> (i32, String) {
    let out = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running kata-monitor");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn an_address_in_use_is_refused_with_a_message() {
    let mut scene = Scene::new();
    let endpoint = scene.endpoint();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let addr = taken.local_addr().expect("its address").to_string();
    let (code, stderr) = run_bad(&[
        "--listen-address",
        &addr,
        "--runtime-endpoint",
        &endpoint.display().to_string(),
    ]);
    assert_ne!(code, 0);
    assert!(
        stderr.contains(&addr) && stderr.contains("in use"),
        "{stderr}"
    );
}

#[test]
fn a_runtime_endpoint_that_does_not_exist_is_refused_with_a_message() {
    let scene = Scene::new();
    let missing = scene.dir.path().join("no-containerd.sock");
    let (code, stderr) = run_bad(&[
        "--listen-address",
        "127.0.0.1:0",
        "--runtime-endpoint",
        &missing.display().to_string(),
    ]);
    assert_ne!(code, 0);
    assert!(
        stderr.contains(&missing.display().to_string()) && stderr.contains("does not exist"),
        "{stderr}"
    );
    // A file that is not a socket, and a socket nobody listens on.
    let file = scene.dir.path().join("file");
    std::fs::write(&file, "").expect("a file");
    let (code, stderr) = run_bad(&["--runtime-endpoint", &file.display().to_string()]);
    assert_ne!(code, 0);
    assert!(stderr.contains("not a unix socket"), "{stderr}");
    let dead = scene.dir.path().join("dead.sock");
    drop(UnixListener::bind(&dead).expect("a socket"));
    let (code, stderr) = run_bad(&["--runtime-endpoint", &dead.display().to_string()]);
    assert_ne!(code, 0);
    assert!(stderr.contains("nothing answers"), "{stderr}");
}

#[test]
fn a_bad_flag_is_refused_with_usage_exit_code() {
    let (code, stderr) = run_bad(&["--log-level", "loud"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("--log-level") && stderr.contains("--help"),
        "{stderr}"
    );
}
