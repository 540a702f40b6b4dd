//! containerd compatibility: the shim under the system's containerd (Debian bookworm's 1.6)
//! and under 1.7 and 2.1 (Debian trixie's and sid's packages, unpacked by
//! `scripts/containerd-versions.sh` into `KATA_TEST_CONTAINERD_DIR`, never installed) and
//! 2.3 (the LTS) and 2.4 (built by the same script with `go install`), each a private
//! instance driven by its own `ctr`. The rest of the suite runs on the system's
//! containerd; here a short set runs on each version: `ctr run --rm` with its output and
//! exit code, stdin, runtime options (`--runtime-config-path`, containerd's `ConfigPath`),
//! a detached container with `ctr task exec`, kill and removal, the events containerd
//! publishes for all of it, and nothing left on the host; and a CRI pod with its network,
//! a host port and port-forward. A version that is not there fails its test (with how to
//! fetch it); it is never skipped.

use std::io::Write;
use std::time::Duration;

use e2e_tests::*;

fn host_kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .expect("host kernel release")
        .trim()
        .to_string()
}

/// The `Version:` lines of `ctr version`: (client, server).
fn versions(c: &Containerd) -> (String, String) {
    let out = c.ctr(&["version"]);
    assert!(
        out.status.success(),
        "ctr version: {}\n{}",
        stderr(&out),
        c.log_tail()
    );
    let text = stdout(&out);
    let mut found = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Version:"))
        .map(|v| v.trim().trim_start_matches('v').to_string());
    let client = found.next().unwrap_or_default();
    let server = found.next().unwrap_or_default();
    (client, server)
}

/// The short set on containerd `c`, whose ctr and daemon must both be `version` (a prefix
/// such as "2.1.9"); container ids start with `tag`, unique to the test, since sandboxes
/// share host paths (/run/vc/vm/<id>) across containerd instances.
fn short_set(c: &Containerd, version: &str, tag: &str) {
    let (client, server) = versions(c);
    assert!(
        client.starts_with(version) && server.starts_with(version),
        "expected ctr and containerd {version}, got ctr {client} and containerd {server}"
    );
    let events = EventWatch::start(c);

    // ctr run --rm: output on both streams, the guest's kernel, the exit code.
    let run_id = format!("{tag}-run");
    let out = c.run(
        &run_id,
        &["--rm"],
        &["sh", "-c", "uname -r; echo to-err >&2; exit 7"],
    );
    assert_eq!(
        out.status.code(),
        Some(7),
        "ctr run --rm on containerd {version}: {}\n{}",
        stderr(&out),
        c.log_tail()
    );
    let guest = stdout(&out).trim().to_string();
    assert!(!guest.is_empty(), "no output; stderr: {}", stderr(&out));
    assert_ne!(guest, host_kernel(), "the container saw the host kernel");
    assert_eq!(stderr(&out), "to-err\n");
    assert_eq!(
        events.exit_status(&run_id, &run_id, Duration::from_secs(30)),
        Some(7),
        "no /tasks/exit with status 7 for {run_id}:\n{}",
        events.text()
    );
    for topic in ["/tasks/create", "/tasks/start", "/tasks/delete"] {
        assert!(
            events.wait_for(topic, &run_id),
            "no {topic} event for {run_id}:\n{}",
            events.text()
        );
    }
    assert_no_leftovers(&run_id);

    // stdin reaches the container. ctr 1.6 never closes it (no CloseIO), so the container
    // reads one line rather than to EOF.
    let in_id = format!("{tag}-in");
    let mut child = c.spawn_run(&in_id, &["--rm"], &["head", "-n", "1"]);
    let stdin = child.stdin.take();
    // From here on ctr is killed (by pid) if the test fails.
    let mut ctr = Background::new(child);
    if let Some(mut stdin) = stdin {
        stdin
            .write_all(b"line from the host\nsecond\n")
            .expect("writing ctr's stdin");
    }
    let out = ctr
        .wait_within(Duration::from_secs(120))
        .unwrap_or_else(|| {
            panic!(
                "ctr run with stdin on containerd {version}: no exit in 120 s\n{}",
                c.log_tail()
            )
        });
    assert!(
        out.status.success(),
        "ctr run with stdin on containerd {version}: {}\n{}",
        stderr(&out),
        c.log_tail()
    );
    assert_eq!(stdout(&out), "line from the host\n");
    assert_no_leftovers(&in_id);

    // Runtime options: `--runtime-config-path FILE` is the ConfigPath a runtime entry sets;
    // the file's VM size (256 MiB, the default being 512) shows in the guest.
    let rcp_id = format!("{tag}-rcp");
    assert_runtime_config_path_used(c, &rcp_id, &format!("containerd {version}"));
    assert_no_leftovers(&rcp_id);

    // A detached container, an exec into it, kill, task rm and container rm.
    let det = format!("{tag}-det");
    start_detached(c, &det, &[], &["sleep", "1000"]);
    let out = exec(
        c,
        &det,
        "e1",
        &[],
        &["sh", "-c", "echo from-exec; echo exec-err >&2; exit 5"],
    );
    assert_eq!(
        out.status.code(),
        Some(5),
        "ctr task exec on containerd {version}: {}\n{}",
        stderr(&out),
        c.log_tail()
    );
    assert_eq!(stdout(&out), "from-exec\n");
    assert_eq!(stderr(&out), "exec-err\n");
    assert_eq!(
        events.exit_status(&det, "e1", Duration::from_secs(30)),
        Some(5),
        "no /tasks/exit with status 5 for exec e1 of {det}:\n{}",
        events.text()
    );
    for topic in ["/tasks/exec-added", "/tasks/exec-started"] {
        assert!(
            events.wait_for(topic, &det),
            "no {topic} event for {det}:\n{}",
            events.text()
        );
    }
    let out = c.ctr(&["task", "ps", &det]);
    assert!(out.status.success(), "task ps: {}", stderr(&out));

    let out = c.ctr(&["task", "kill", "-s", "SIGKILL", &det]);
    assert!(out.status.success(), "kill: {}", stderr(&out));
    wait_status(c, &det, "STOPPED");
    assert_eq!(
        events.exit_status(&det, &det, Duration::from_secs(30)),
        Some(137),
        "no /tasks/exit with status 137 for {det}:\n{}",
        events.text()
    );
    remove_detached(c, &det);
    for topic in ["/tasks/delete", "/containers/delete"] {
        assert!(
            events.wait_for(topic, &det),
            "no {topic} event for {det}:\n{}",
            events.text()
        );
    }
    assert_no_leftovers(&det);

    // containerd itself holds nothing of them any more.
    for what in [["task", "ls", "-q"], ["container", "ls", "-q"]] {
        let out = c.ctr(&what);
        assert!(
            out.status.success(),
            "ctr {}: {}",
            what.join(" "),
            stderr(&out)
        );
        assert_eq!(stdout(&out).trim(), "", "ctr {} lists", what.join(" "));
    }
}

/// The system's containerd (Debian bookworm's 1.6), for the same matrix.
#[test]
fn containerd_1_6_system() {
    let _run = SandboxCleanup::new("c16-run");
    let _in = SandboxCleanup::new("c16-in");
    let _rcp = SandboxCleanup::new("c16-rcp");
    let _det = SandboxCleanup::new("c16-det");
    let c = Containerd::start("c16");
    short_set(&c, "1.6.", "c16");
}

/// Debian trixie's containerd 1.7.24.
#[test]
fn containerd_1_7() {
    let _run = SandboxCleanup::new("c17-run");
    let _in = SandboxCleanup::new("c17-in");
    let _rcp = SandboxCleanup::new("c17-rcp");
    let _det = SandboxCleanup::new("c17-det");
    let c = Containerd::start_version("c17", "1.7");
    short_set(&c, "1.7.24", "c17");
}

/// Debian sid's containerd 2.1.9: it serves our task-v2 shim through its bridge.
#[test]
fn containerd_2_1() {
    let _run = SandboxCleanup::new("c21-run");
    let _in = SandboxCleanup::new("c21-in");
    let _rcp = SandboxCleanup::new("c21-rcp");
    let _det = SandboxCleanup::new("c21-det");
    let c = Containerd::start_version("c21", "2.1");
    short_set(&c, "2.1.9", "c21");
}

/// containerd 2.3.7, the LTS series (`go install` from the Go module proxy): it writes
/// `BootstrapParams` on the shim's stdin at `start`.
#[test]
fn containerd_2_3() {
    let _run = SandboxCleanup::new("c23-run");
    let _in = SandboxCleanup::new("c23-in");
    let _rcp = SandboxCleanup::new("c23-rcp");
    let _det = SandboxCleanup::new("c23-det");
    let c = Containerd::start_version("c23", "2.3");
    short_set(&c, "2.3.7", "c23");
}

/// containerd 2.4.2 (`go install` from the Go module proxy).
#[test]
fn containerd_2_4() {
    let _run = SandboxCleanup::new("c24-run");
    let _in = SandboxCleanup::new("c24-in");
    let _rcp = SandboxCleanup::new("c24-rcp");
    let _det = SandboxCleanup::new("c24-det");
    let c = Containerd::start_version("c24", "2.4");
    short_set(&c, "2.4.2", "c24");
}

/// A Kubernetes pod through containerd `version`'s CRI (RuntimeClass handler `kata`): its
/// IP answers from the host, a host port through portmap, exec, port-forward, and removal
/// leaves nothing. The full CRI set runs on the system's 1.6 (tests/cri.rs).
fn cri_short_set(version: &str, tag: &str) {
    let c = CriContainerd::start_version(&format!("{tag}-cri"), Handler::Kata, version);
    let host_port = free_tcp_port();
    let mut config = c.pod_config(&format!("{tag}-pod"));
    config.port_mappings.push(tcp_port_mapping(8080, host_port));
    let pod = c.run_pod(config);
    let script =
        "mkdir -p /www && echo hello-cri > /www/index.html && exec httpd -f -p 8080 -h /www";
    let web = c.container_config(&pod, "web", &["sh", "-c", script]);
    let id = c.start_container(&pod, web);

    for (host, port) in [(pod.ip.clone(), 8080), (host_ip(), host_port)] {
        wait_http(
            &host,
            port,
            "/index.html",
            "hello-cri",
            Duration::from_secs(30),
        )
        .unwrap_or_else(|e| panic!("containerd {version}: {host}:{port}: {e}"));
    }
    let out = c.exec(&id, &["hostname"]);
    assert_eq!(out.stdout.trim(), format!("{tag}-pod"), "{}", out.stderr);

    let session = c
        .cri()
        .port_forward_stream(&pod.id, 8080)
        .unwrap_or_else(|e| panic!("containerd {version}: PortForward: {e}\n{}", c.log_tail()));
    session
        .send(b"GET /index.html HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .expect("sending the request");
    let (data, error) = session
        .finish(Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log_tail()));
    assert!(
        String::from_utf8_lossy(&data).contains("hello-cri"),
        "containerd {version}: port-forward gave {:?}, error channel {error:?}",
        String::from_utf8_lossy(&data)
    );
    c.remove_pod_checked(pod);
}

#[test]
fn containerd_1_7_cri_pod() {
    cri_short_set("1.7", "c17");
}

#[test]
fn containerd_2_1_cri_pod() {
    cri_short_set("2.1", "c21");
}

#[test]
fn containerd_2_3_cri_pod() {
    cri_short_set("2.3", "c23");
}

#[test]
fn containerd_2_4_cri_pod() {
    cri_short_set("2.4", "c24");
}
