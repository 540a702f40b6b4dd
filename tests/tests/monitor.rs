//! The node monitor as an operator runs it: `kata-monitor` beside a private containerd
//! whose CRI runs kata pods, and a real Prometheus (Debian's `prometheus`) scraping it.
//! A PromQL query over Prometheus' HTTP API answers each pod's guest memory labelled with
//! the pod's name; a removed pod leaves the next scrape; a sandbox whose shim hangs
//! (SIGSTOP) or whose socket is a dead file does not fail the scrape of the others; the
//! dashboard's queries are valid PromQL that answer per pod. And the monitor refuses an
//! address in use and a runtime endpoint that does not exist.
//!
//! `kata-monitor` is taken from `KATA_TEST_SHIM_DIR` (beside the shim: `make build`).
//! Every process the test starts (Prometheus, the monitor) is ended by its pid and every
//! directory it made is removed, also when it fails.

use std::io::Read;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use e2e_tests::*;
use nix::sys::signal::Signal;
use serde_json::Value;

/// How long Prometheus may take to show what a scrape changed (its interval is 5 s; a
/// scrape of VMs under QEMU/TCG on a loaded host takes a few seconds).
const SETTLE: Duration = Duration::from_secs(90);

fn monitor_bin() -> PathBuf {
    let dir = std::env::var("KATA_TEST_SHIM_DIR")
        .expect("KATA_TEST_SHIM_DIR is not set: run the end-to-end tests with `make test`");
    let bin = Path::new(&dir).join("kata-monitor");
    assert!(
        bin.exists(),
        "{} is missing: build it with `make monitor` (cargo build --release -p kata-monitor)",
        bin.display()
    );
    bin
}

/// A process the test started, with its output in a file: killed by its pid and reaped
/// when dropped.
struct Daemon {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Daemon {
    fn spawn(name: &'static str, cmd: &mut Command, log: PathBuf) -> Self {
        let out = std::fs::File::create(&log).expect("creating a daemon log");
        let err = out.try_clone().expect("cloning the log file");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        Daemon { name, child, log }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        format!(
            "--- {} log (last lines) ---\n{}",
            self.name,
            lines[lines.len().saturating_sub(30)..].join("\n")
        )
    }

    /// Panics with its log if it has exited.
    fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("{} exited: {status}\n{}", self.name, self.log_tail());
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let pid = self.child.id() as i32;
        signal(pid, Signal::SIGTERM);
        if !wait_gone(pid, Duration::from_secs(10)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// Sends SIGCONT to a stopped process when dropped (before the pod is removed).
struct Stopped(i32);

impl Drop for Stopped {
    fn drop(&mut self) {
        signal(self.0, Signal::SIGCONT);
    }
}

/// A sandbox directory in the runtime's state directory whose socket is a dead file (as
/// a shim that died leaves it), removed when dropped.
struct DeadSandbox(PathBuf);

impl DeadSandbox {
    fn make(id: &str) -> Self {
        let dir = Path::new("/run/vc/sbs").join(id);
        std::fs::create_dir_all(&dir).expect("creating a sandbox directory");
        let guard = DeadSandbox(dir.clone());
        drop(UnixListener::bind(dir.join("shim-monitor.sock")).expect("binding a socket"));
        guard
    }
}

impl Drop for DeadSandbox {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn body(response: &str) -> &str {
    response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or("")
}

/// `s` percent-encoded for a query string.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

struct Prometheus {
    daemon: Daemon,
    port: u16,
}

impl Prometheus {
    /// Prometheus scraping the monitor on `target` every 5 s, storing in `dir`. Its scrape
    /// timeout (5 s) is above the monitor's shim deadline (3 s): a hung shim costs the
    /// monitor's scrape that deadline, not the scrape.
    fn start(dir: &Path, target: &str) -> Self {
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 5s\n  scrape_timeout: 5s\n\
                 scrape_configs:\n  - job_name: kata-monitor\n    static_configs:\n      \
                 - targets: [\"{target}\"]\n"
            ),
        )
        .expect("writing prometheus.yml");
        assert!(
            Path::new("/usr/bin/prometheus").exists(),
            "prometheus is not installed: `make setup` installs Debian's package"
        );
        let port = free_tcp_port();
        let daemon = Daemon::spawn(
            "prometheus",
            Command::new("/usr/bin/prometheus")
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join("data").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{port}")),
            dir.join("prometheus.log"),
        );
        let mut p = Prometheus { daemon, port };
        let ready = wait_http(
            "127.0.0.1",
            port,
            "/-/ready",
            "200 OK",
            Duration::from_secs(60),
        );
        p.daemon.assert_running();
        if let Err(e) = ready {
            panic!("Prometheus is not ready: {e}\n{}", p.daemon.log_tail());
        }
        p
    }

    /// The `data.result` of an instant query, or the error Prometheus answered.
    fn query(&self, promql: &str) -> Result<Vec<Value>, String> {
        let path = format!("/api/v1/query?query={}", encode(promql));
        let response = http_get("127.0.0.1", self.port, &path)?;
        let v: Value =
            serde_json::from_str(body(&response)).map_err(|e| format!("{e}: {response}"))?;
        if v["status"] != "success" {
            return Err(format!("{promql}: {}", v["error"]));
        }
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    /// Queries `promql` until `ok` accepts the result (within [`SETTLE`]).
    fn wait_for(&mut self, promql: &str, what: &str, ok: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let mut last = Err(String::new());
        let found = poll(SETTLE, Duration::from_millis(500), || {
            last = self.query(promql);
            match &last {
                Ok(r) if ok(r) => Some(r.clone()),
                _ => None,
            }
        });
        self.daemon.assert_running();
        found.unwrap_or_else(|| {
            panic!(
                "{what}: {promql} answered {last:?}\n{}",
                self.daemon.log_tail()
            )
        })
    }
}

fn label<'a>(series: &'a Value, name: &str) -> &'a str {
    series["metric"][name].as_str().unwrap_or("")
}

fn value(series: &Value) -> f64 {
    series["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

fn series_of<'a>(result: &'a [Value], pod: &Pod) -> Option<&'a Value> {
    result.iter().find(|s| label(s, "sandbox_id") == pod.id)
}

fn start_monitor(dir: &Path, endpoint: &Path) -> (Daemon, u16) {
    let port = free_tcp_port();
    let mut d = Daemon::spawn(
        "kata-monitor",
        Command::new(monitor_bin())
            .arg("--listen-address")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--runtime-endpoint")
            .arg(endpoint),
        dir.join("kata-monitor.log"),
    );
    let up = wait_http(
        "127.0.0.1",
        port,
        "/sandboxes",
        "200 OK",
        Duration::from_secs(30),
    );
    d.assert_running();
    if let Err(e) = up {
        panic!("kata-monitor does not answer: {e}\n{}", d.log_tail());
    }
    (d, port)
}

/// Waits until the shim of `pod` serves its metrics socket.
fn wait_socket(pod: &Pod) {
    let sock = Path::new("/run/vc/sbs")
        .join(&pod.id)
        .join("shim-monitor.sock");
    poll(Duration::from_secs(60), Duration::from_millis(200), || {
        sock.exists().then_some(())
    })
    .unwrap_or_else(|| panic!("{} did not appear", sock.display()));
}

#[test]
fn prometheus_scrapes_each_pods_guest_memory_through_the_monitor() {
    let c = CriContainerd::start("monitor", Handler::Kata);
    let web = c.run_pod(c.pod_config("web"));
    let db = c.run_pod(c.pod_config("db"));
    wait_socket(&web);
    wait_socket(&db);

    let tmp = tempfile::tempdir().expect("a temp dir");
    let (mut monitor, port) = start_monitor(tmp.path(), &c.containerd().socket);
    let mut prom = Prometheus::start(tmp.path(), &format!("127.0.0.1:{port}"));

    // Each pod's guest memory, labelled with the pod's name, namespace and uid.
    let query =
        format!("kata_guest_meminfo{{item=\"mem_total\",cri_namespace=\"{POD_NAMESPACE}\"}}");
    let result = prom.wait_for(&query, "both pods' guest memory", |r| {
        series_of(r, &web).is_some() && series_of(r, &db).is_some()
    });
    eprintln!(
        "{query} ->\n{}",
        serde_json::to_string_pretty(&result).unwrap_or_default()
    );
    for pod in [&web, &db] {
        let s = series_of(&result, pod).expect("the pod's series");
        assert_eq!(label(s, "cri_name"), pod.name(), "{s}");
        assert_eq!(label(s, "cri_uid"), pod.uid(), "{s}");
        assert_eq!(label(s, "cri_namespace"), POD_NAMESPACE, "{s}");
        // The default VM has 512 MiB: the guest's MemTotal is a little below it.
        let mem = value(s);
        assert!(
            mem > 256.0 * 1048576.0 && mem <= 512.0 * 1048576.0,
            "{}'s guest MemTotal is {mem}",
            pod.name()
        );
    }
    // The README's query of the guest memory used per pod.
    let used = "kata_guest_meminfo{item=\"mem_total\"} - ignoring(item) kata_guest_meminfo{item=\"mem_available\"}";
    let result = prom.wait_for(used, "the README's guest memory used", |r| {
        series_of(r, &web).is_some() && series_of(r, &db).is_some()
    });
    for pod in [&web, &db] {
        let s = series_of(&result, pod).expect("the pod's series");
        assert!(value(s) > 0.0 && label(s, "cri_name") == pod.name(), "{s}");
    }
    // What one pod's scrape looks like through the monitor (trimmed), for the record.
    let text = http_get(
        "127.0.0.1",
        port,
        "/metrics?filter_family=kata_guest_meminfo,kata_hypervisor_vm,kata_shim_sandbox_start,kata_monitor_shim",
    )
    .expect("GET /metrics");
    let wanted = [
        "item=\"mem_total\"",
        "item=\"mem_available\"",
        "kata_hypervisor_vm_",
        "kata_shim_sandbox_start",
        "kata_monitor_shim",
    ];
    let web_lines: Vec<&str> = body(&text)
        .lines()
        .filter(|l| l.contains(&web.id) && wanted.iter().any(|w| l.contains(w)))
        .collect();
    eprintln!(
        "one pod's series through the monitor (trimmed):\n{}",
        web_lines.join("\n")
    );

    // The monitor's own families, and its view of the sandboxes.
    let sandboxes = http_get("127.0.0.1", port, "/sandboxes").expect("GET /sandboxes");
    assert!(
        body(&sandboxes).lines().any(|l| l == web.id)
            && body(&sandboxes).lines().any(|l| l == db.id),
        "{sandboxes}"
    );
    prom.wait_for(
        "kata_monitor_scrape_count{job=\"kata-monitor\"}",
        "the monitor's scrape count",
        |r| r.first().is_some_and(|s| value(s) >= 1.0),
    );

    // The dashboard's queries are valid PromQL; its guest memory panel answers per pod.
    let dashboard: Value =
        serde_json::from_str(include_str!("../../deploy/monitor/grafana-dashboard.json"))
            .expect("the dashboard is JSON");
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_string))
        .collect();
    assert!(exprs.len() >= 10, "the dashboard's queries: {exprs:?}");
    for expr in &exprs {
        let e = expr
            .replace("$namespace", ".*")
            .replace("$__rate_interval", "1m")
            .replace("$__range", "5m");
        if let Err(err) = prom.query(&e) {
            panic!("the dashboard's query {expr} is refused: {err}");
        }
    }
    let used = exprs
        .iter()
        .find(|e| e.contains("mem_available") && !e.starts_with("100"))
        .expect("the guest memory panel")
        .replace("$namespace", POD_NAMESPACE);
    prom.wait_for(&used, "the dashboard's guest memory used per pod", |r| {
        [&web, &db].iter().all(|p| {
            series_of(r, p).is_some_and(|s| label(s, "cri_name") == p.name() && value(s) > 0.0)
        })
    });

    // A removed pod leaves the next scrape: the monitor's, then Prometheus' answers.
    let db_id = db.id.clone();
    c.remove_pod_checked(db);
    let text = http_get("127.0.0.1", port, "/metrics").expect("GET /metrics");
    assert!(
        !text.contains(&format!("sandbox_id=\"{db_id}\"")),
        "the removed pod is still scraped"
    );
    assert!(
        text.contains(&format!("sandbox_id=\"{}\"", web.id)),
        "web is no longer scraped:\n{text}"
    );
    prom.wait_for(&query, "the removed pod gone from Prometheus", |r| {
        r.iter().all(|s| label(s, "sandbox_id") != db_id) && series_of(r, &web).is_some()
    });

    // A shim that hangs and a dead socket fail their own sandboxes only.
    let stuck = c.run_pod(c.pod_config("stuck"));
    wait_socket(&stuck);
    prom.wait_for(&query, "the new pod's guest memory", |r| {
        series_of(r, &stuck).is_some()
    });
    let dead = DeadSandbox::make(&format!("kata-e2e-monitor-dead-{}", std::process::id()));
    let shim = pid_of(&stuck.id, Part::Shim).expect("the stuck pod's shim");
    assert!(signal(shim, Signal::SIGSTOP), "stopping the shim {shim}");
    let stopped = Stopped(shim);
    let down = format!("kata_monitor_shim_up{{sandbox_id=\"{}\"}} == 0", stuck.id);
    prom.wait_for(&down, "the hung shim reported down", |r| !r.is_empty());
    let dead_down = format!(
        "kata_monitor_shim_up{{sandbox_id=\"{}\"}} == 0",
        dead.0.file_name().and_then(|n| n.to_str()).unwrap_or("")
    );
    prom.wait_for(&dead_down, "the dead socket reported down", |r| {
        !r.is_empty()
    });
    // And in one and the same scrape (the latest samples of one target): web's shim
    // answered, with its guest memory, while the hung and the dead one did not.
    let dead_id = dead.0.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let same_scrape = format!(
        "kata_guest_meminfo{{item=\"mem_total\",sandbox_id=\"{web}\"}} \
         and on() kata_monitor_shim_up{{sandbox_id=\"{web}\"}} == 1 \
         and on() kata_monitor_shim_up{{sandbox_id=\"{stuck}\"}} == 0 \
         and on() kata_monitor_shim_up{{sandbox_id=\"{dead_id}\"}} == 0",
        web = web.id,
        stuck = stuck.id
    );
    prom.wait_for(
        &same_scrape,
        "web scraped beside the hung and the dead shim",
        |r| series_of(r, &web).is_some_and(|s| label(s, "cri_name") == "web"),
    );
    let failed = prom
        .query("kata_monitor_shim_scrape_failed_count{reason=~\"timeout|connect\"}")
        .expect("querying the monitor's failures");
    assert!(
        failed
            .iter()
            .any(|s| label(s, "reason") == "timeout" && value(s) >= 1.0)
            && failed
                .iter()
                .any(|s| label(s, "reason") == "connect" && value(s) >= 1.0),
        "the monitor's failure counts: {failed:?}"
    );
    monitor.assert_running();

    drop(stopped);
    drop(dead);
    c.remove_pod_checked(stuck);
    c.remove_pod_checked(web);
    drop(prom);
    drop(monitor);
}

fn run_monitor(args: &[&str]) -> (i32, String) {
    let mut child = Command::new(monitor_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting kata-monitor");
    let done = poll(Duration::from_secs(20), Duration::from_millis(50), || {
        child.try_wait().ok().flatten()
    });
    let Some(status) = done else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("kata-monitor {args:?} kept running instead of refusing its input");
    };
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    (status.code().unwrap_or(-1), stderr)
}

#[test]
fn the_monitor_refuses_an_address_in_use_and_a_missing_runtime_endpoint() {
    let tmp = tempfile::tempdir().expect("a temp dir");
    let endpoint = tmp.path().join("containerd.sock");
    let _endpoint = UnixListener::bind(&endpoint).expect("binding an endpoint");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let addr = taken.local_addr().expect("its address").to_string();
    let (code, stderr) = run_monitor(&[
        "--listen-address",
        &addr,
        "--runtime-endpoint",
        &endpoint.display().to_string(),
    ]);
    assert_ne!(code, 0, "{stderr}");
    assert!(
        stderr.contains(&addr) && stderr.contains("in use"),
        "{stderr}"
    );

    let missing = tmp.path().join("missing/containerd.sock");
    let (code, stderr) = run_monitor(&[
        "--listen-address",
        "127.0.0.1:0",
        "--runtime-endpoint",
        &missing.display().to_string(),
    ]);
    assert_ne!(code, 0, "{stderr}");
    assert!(
        stderr.contains(&missing.display().to_string()) && stderr.contains("does not exist"),
        "{stderr}"
    );
}
