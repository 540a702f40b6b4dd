//! Per-sandbox Prometheus metrics (issue 31): a sandbox's shim serves `/metrics` on
//! `/run/vc/sbs/<id>/shim-monitor.sock`, root only, with the host's and the guest's
//! figures, as `curl --unix-socket` (or Kata's kata-monitor) gets them; the socket goes
//! with the sandbox.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use e2e_tests::*;

/// The VM's memory the test configures, in MiB.
const VM_MEMORY_MIB: u64 = 384;

fn socket_of(id: &str) -> PathBuf {
    PathBuf::from(format!("/run/vc/sbs/{id}/shim-monitor.sock"))
}

/// `GET /metrics` over the socket, as curl sends it; the answer's status line and body.
fn get_metrics(socket: &Path) -> (String, String) {
    let mut c = UnixStream::connect(socket)
        .unwrap_or_else(|e| panic!("connecting to {}: {e}", socket.display()));
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    c.write_all(
        b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nUser-Agent: curl/8\r\nAccept: */*\r\n\r\n",
    )
    .unwrap();
    let mut answer = String::new();
    c.read_to_string(&mut answer).expect("reading the answer");
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP answer: {answer:?}"));
    let status = head.lines().next().unwrap_or("").to_string();
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4"),
        "not Prometheus text: {head}"
    );
    (status, body.to_string())
}

/// The samples of a scrape by their series (`name{labels}` as written), checking on the
/// way that each family is declared once.
fn samples(body: &str) -> HashMap<String, f64> {
    let mut types = std::collections::HashSet::new();
    let mut out = HashMap::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split(' ').next().unwrap_or("").to_string();
            assert!(types.insert(name.clone()), "family {name} declared twice");
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("malformed sample line {line:?}"));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "NaN" => f64::NAN,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("malformed value in {line:?}")),
        };
        out.insert(series.to_string(), value);
    }
    out
}

fn value(s: &HashMap<String, f64>, series: &str, body: &str) -> f64 {
    *s.get(series)
        .unwrap_or_else(|| panic!("no sample {series} in the scrape:\n{body}"))
}

#[test]
fn a_sandbox_serves_its_metrics_and_the_socket_goes_with_it() {
    let id = "metrics1";
    let _cleanup = SandboxCleanup::new(id);
    let config = RuntimeConfig::qemu().set(
        "hypervisor.qemu",
        "default_memory",
        &VM_MEMORY_MIB.to_string(),
    );
    let c = Containerd::start_configured("metrics", &config);
    start_detached(&c, id, &[], &["sleep", "600"]);
    // 8 MiB of tmpfs, charged to the container's cgroup in the guest.
    let out = exec(
        &c,
        id,
        "fill",
        &[],
        &[
            "sh",
            "-c",
            "head -c 8388608 /dev/zero > /dev/shm/fill && grep ' /dev/shm ' /proc/mounts",
        ],
    );
    assert!(out.status.success(), "filling /dev/shm: {}", stderr(&out));
    let socket = socket_of(id);
    let meta = std::fs::metadata(&socket)
        .unwrap_or_else(|e| panic!("{}: {e}\n{}", socket.display(), c.log_tail()));
    assert!(
        meta.file_type().is_socket(),
        "{} is no socket",
        socket.display()
    );
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o600,
        "the socket is not root's alone"
    );

    let (status, body) = get_metrics(&socket);
    assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    // `KATA_TEST_METRICS_DUMP=FILE` keeps the scrape, to read what a sandbox reports.
    if let Ok(dump) = std::env::var("KATA_TEST_METRICS_DUMP") {
        std::fs::write(dump, &body).expect("writing the scrape");
    }
    let s = samples(&body);

    // The guest's memory is the VM's, less what its kernel keeps for itself.
    let vm = (VM_MEMORY_MIB << 20) as f64;
    assert_eq!(value(&s, "kata_hypervisor_vm_memory_bytes", &body), vm);
    let total = value(&s, "kata_guest_meminfo{item=\"mem_total\"}", &body);
    assert!(
        total <= vm && total > vm * 0.75,
        "guest MemTotal {total} does not match a VM of {vm} bytes"
    );
    // The container's cgroup in the guest, holding the 8 MiB it wrote to /dev/shm.
    let usage = value(
        &s,
        &format!("kata_guest_container_memory{{container_id=\"{id}\",item=\"usage_bytes\"}}"),
        &body,
    );
    assert!(usage >= 8.0 * 1024.0 * 1024.0, "container memory {usage}");
    // The host's processes.
    assert!(value(&s, "kata_shim_process_resident_memory_bytes", &body) > 0.0);
    assert!(value(&s, "kata_hypervisor_threads", &body) >= 1.0);
    assert!(value(&s, "kata_hypervisor_pss_bytes", &body) > 0.0);
    assert!(value(&s, "kata_virtiofsd_fds", &body) > 0.0);
    assert!(s.keys().any(|k| k.starts_with("kata_hypervisor_netdev{")));
    assert!(s
        .keys()
        .any(|k| k.starts_with("kata_guest_cpu_time{cpu=\"total\"")));
    assert!(s.contains_key("kata_guest_load{item=\"load1\"}"));
    assert!(
        s.keys().any(|k| k.starts_with("kata_guest_fsstat{")),
        "{body}"
    );
    // The start-up phases, in order.
    let phase = |p: &str| {
        value(
            &s,
            &format!("kata_shim_sandbox_start_phase_milliseconds{{phase=\"{p}\"}}"),
            &body,
        )
    };
    assert!(phase("vmm_launched") <= phase("agent_reachable"));
    assert!(phase("agent_reachable") <= phase("sandbox_started"));
    assert_eq!(value(&s, "kata_shim_oom_events_total", &body), 0.0);
    // The agent requests the start made.
    assert!(
        value(
            &s,
            "kata_shim_agent_rpc_durations_histogram_milliseconds_count{action=\"grpc.CreateContainerRequest\"}",
            &body
        ) >= 1.0
    );

    // Each Task API request counts.
    let pids_count = "kata_shim_rpc_durations_histogram_milliseconds_count{action=\"pids\"}";
    let before = s.get(pids_count).copied().unwrap_or(0.0);
    for _ in 0..2 {
        let out = c.ctr(&["task", "ps", id]);
        assert!(out.status.success(), "ctr task ps: {}", stderr(&out));
    }
    let (_, body) = get_metrics(&socket);
    let after = value(&samples(&body), pids_count, &body);
    assert_eq!(
        after,
        before + 2.0,
        "two Pids requests, counted {before} -> {after}"
    );

    // Anything but GET /metrics is refused.
    let mut conn = UnixStream::connect(&socket).unwrap();
    conn.write_all(b"GET /debug HTTP/1.1\r\n\r\n").unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");

    remove_detached(&c, id);
    let deadline = Instant::now() + Duration::from_secs(30);
    while socket.exists() {
        assert!(
            Instant::now() < deadline,
            "{} outlived its sandbox",
            socket.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_no_leftovers(id);
}
