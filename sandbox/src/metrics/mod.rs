//! The sandbox's Prometheus metrics (issue 31): what the shim counts as it goes (request
//! latencies, start-up phases, OOM kills, exits of the VM's processes), kept in atomics
//! in [`METRICS`], and what it gathers only when scraped (`scrape`): the shim's, the VMM's
//! and the helpers' process figures, the VMM's network devices and the guest's figures
//! (the agent's GetMetrics). [`server`] serves them on `shim-monitor.sock`, where Kata's
//! kata-monitor looks. The families and their labels are listed in the README.

pub mod server;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use procinfo::{ProcessFigures, HOST_IO_ITEMS};
use promtext::{Exposition, Filter, Limits};

use crate::sandbox::Sandbox;

/// Upper bounds of the latency histograms' buckets, in milliseconds: 1 ms to 32.8 s, as a
/// VM's start under TCG takes seconds.
const BOUNDS_MS: [f64; 16] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
    16384.0, 32768.0,
];

/// The Task API's requests, by Kata's action names.
const TASK_ACTIONS: [&str; 17] = [
    "create",
    "start",
    "state",
    "wait",
    "kill",
    "delete",
    "exec",
    "resize_pty",
    "close_io",
    "pids",
    "connect",
    "shutdown",
    "pause",
    "resume",
    "checkpoint",
    "update",
    "stats",
];

/// The agent requests measured (long polls are not: WaitProcess, GetOOMEvent), by the
/// shim's name; the label is Kata's `grpc.<name>Request`.
const AGENT_ACTIONS: [&str; 16] = [
    "Check",
    "CreateSandbox",
    "CreateContainer",
    "StartContainer",
    "RemoveContainer",
    "ExecProcess",
    "SignalProcess",
    "ListProcesses",
    "OpenStdio",
    "TtyWinResize",
    "PauseContainer",
    "ResumeContainer",
    "StatsContainer",
    "UpdateContainer",
    "DestroySandbox",
    "GetMetrics",
];

/// The start-up phases recorded, in order.
pub const PHASES: [&str; 4] = [
    "vmm_launched",
    "agent_reachable",
    "sandbox_created",
    "sandbox_started",
];

struct Histogram {
    /// Observations per bucket (not cumulated); the last is above every bound.
    buckets: [AtomicU64; BOUNDS_MS.len() + 1],
    sum_us: AtomicU64,
}

impl Histogram {
    const fn new() -> Self {
        Histogram {
            buckets: [const { AtomicU64::new(0) }; BOUNDS_MS.len() + 1],
            sum_us: AtomicU64::new(0),
        }
    }

    fn observe(&self, d: Duration) {
        let ms = d.as_secs_f64() * 1000.0;
        let i = BOUNDS_MS
            .iter()
            .position(|b| ms <= *b)
            .unwrap_or(BOUNDS_MS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(
            d.as_micros().min(u64::MAX as u128) as u64,
            Ordering::Relaxed,
        );
    }

    fn write(&self, out: &mut Exposition, name: &str, help: &str, action: &str) {
        let buckets: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        if buckets.iter().all(|b| *b == 0) {
            return;
        }
        let sum_ms = self.sum_us.load(Ordering::Relaxed) as f64 / 1000.0;
        out.histogram(
            name,
            help,
            &[("action", action)],
            &BOUNDS_MS,
            &buckets,
            sum_ms,
        );
    }
}

/// What the shim counts as it goes. One daemon serves one sandbox, so one set.
pub struct Registry {
    task: [Histogram; TASK_ACTIONS.len()],
    agent: [Histogram; AGENT_ACTIONS.len()],
    /// Milliseconds (+1, 0 = not reached) from the sandbox's CreateTask to each phase.
    phases: [AtomicU64; PHASES.len()],
    phase_base: Mutex<Option<Instant>>,
    oom_events: AtomicU64,
    vmm_exits: AtomicU64,
    helper_exits: AtomicU64,
    guest_failures: AtomicU64,
    vm_memory_bytes: AtomicU64,
    vm_vcpus: AtomicU64,
}

pub static METRICS: Registry = Registry::new();

/// Measures one Task API request until dropped.
pub struct TaskTimer {
    index: usize,
    t0: Instant,
    registry: &'static Registry,
}

impl Drop for TaskTimer {
    fn drop(&mut self) {
        self.registry.task[self.index].observe(self.t0.elapsed());
    }
}

/// Starts measuring Task API request `action` (one of Kata's action names).
pub fn task_timer(action: &'static str) -> Option<TaskTimer> {
    METRICS.task_timer(action)
}

impl Registry {
    const fn new() -> Self {
        Registry {
            task: [const { Histogram::new() }; TASK_ACTIONS.len()],
            agent: [const { Histogram::new() }; AGENT_ACTIONS.len()],
            phases: [const { AtomicU64::new(0) }; PHASES.len()],
            phase_base: Mutex::new(None),
            oom_events: AtomicU64::new(0),
            vmm_exits: AtomicU64::new(0),
            helper_exits: AtomicU64::new(0),
            guest_failures: AtomicU64::new(0),
            vm_memory_bytes: AtomicU64::new(0),
            vm_vcpus: AtomicU64::new(0),
        }
    }

    fn task_timer(&'static self, action: &'static str) -> Option<TaskTimer> {
        Some(TaskTimer {
            index: TASK_ACTIONS.iter().position(|a| *a == action)?,
            t0: Instant::now(),
            registry: self,
        })
    }

    /// Records how long agent request `op` took (ops not in the list are not measured).
    pub fn agent_request(&self, op: &str, took: Duration) {
        if let Some(i) = AGENT_ACTIONS.iter().position(|a| *a == op) {
            self.agent[i].observe(took);
        }
    }

    /// The sandbox's CreateTask arrived: phases are measured from now.
    pub fn start_phases(&self) {
        *self.phase_base.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        for p in &self.phases {
            p.store(0, Ordering::Relaxed);
        }
    }

    /// The sandbox reached `phase` (one of [`PHASES`]).
    pub fn phase(&self, phase: &str) {
        let base = *self.phase_base.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(base), Some(i)) = (base, PHASES.iter().position(|p| *p == phase)) {
            let ms = base.elapsed().as_millis().min(u64::MAX as u128 - 1) as u64;
            self.phases[i].store(ms + 1, Ordering::Relaxed);
        }
    }

    pub fn oom_event(&self) {
        self.oom_events.fetch_add(1, Ordering::Relaxed);
    }

    /// The sandbox's VM ended on its own; `cause` is the watchdog's sentence
    /// (`the VMM ...` or `helper ...`).
    pub fn vm_ended(&self, cause: &str) {
        if cause.starts_with("helper") {
            self.helper_exits.fetch_add(1, Ordering::Relaxed);
        } else if cause.starts_with("the VMM") {
            self.vmm_exits.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn set_vm_size(&self, vcpus: u32, memory_mib: u32) {
        self.vm_vcpus.store(vcpus.into(), Ordering::Relaxed);
        self.vm_memory_bytes
            .store(u64::from(memory_mib) << 20, Ordering::Relaxed);
    }

    fn guest_failed(&self) {
        self.guest_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Writes what was counted.
    fn write(&self, out: &mut Exposition) {
        for (h, action) in self.task.iter().zip(TASK_ACTIONS) {
            h.write(
                out,
                "kata_shim_rpc_durations_histogram_milliseconds",
                "RPC latency distributions.",
                action,
            );
        }
        for (h, op) in self.agent.iter().zip(AGENT_ACTIONS) {
            h.write(
                out,
                "kata_shim_agent_rpc_durations_histogram_milliseconds",
                "RPC latency distributions.",
                &format!("grpc.{op}Request"),
            );
        }
        for (p, phase) in self.phases.iter().zip(PHASES) {
            let v = p.load(Ordering::Relaxed);
            if v > 0 {
                out.gauge(
                    "kata_shim_sandbox_start_phase_milliseconds",
                    "Milliseconds from the sandbox's CreateTask reaching the shim to each start-up phase.",
                    &[("phase", phase)],
                    (v - 1) as f64,
                );
            }
        }
        let counter = |out: &mut Exposition, name: &str, help: &str, v: &AtomicU64| {
            out.counter(name, help, &[], v.load(Ordering::Relaxed) as f64)
        };
        counter(
            out,
            "kata_shim_oom_events_total",
            "OOM kills the guest reported.",
            &self.oom_events,
        );
        counter(
            out,
            "kata_shim_vmm_exits_total",
            "Times the VMM ended while its sandbox ran (which ends the sandbox).",
            &self.vmm_exits,
        );
        counter(
            out,
            "kata_shim_helper_exits_total",
            "Times a helper of the VM (virtiofsd, the vsock backend) ended while its sandbox ran (which ends the sandbox).",
            &self.helper_exits,
        );
        counter(
            out,
            "kata_shim_agent_scrape_failures_total",
            "Scrapes whose guest part failed (the agent did not answer GetMetrics in time).",
            &self.guest_failures,
        );
        let vcpus = self.vm_vcpus.load(Ordering::Relaxed);
        if vcpus > 0 {
            out.gauge(
                "kata_hypervisor_vm_vcpus",
                "vCPUs of the sandbox's VM.",
                &[],
                vcpus as f64,
            );
            out.gauge(
                "kata_hypervisor_vm_memory_bytes",
                "Memory of the sandbox's VM in bytes.",
                &[],
                self.vm_memory_bytes.load(Ordering::Relaxed) as f64,
            );
        }
    }
}

/// How long the guest's part of a scrape may take.
pub const GUEST_SCRAPE_BOUND: Duration = Duration::from_secs(5);
/// The most of the guest's text read.
const GUEST_TEXT_MAX: usize = 4 << 20;
/// What the shim keeps of the guest's text: the families the guest may report, without the
/// labels the monitor adds (which the guest must not forge).
const GUEST_FILTER: Filter<'static> = Filter {
    prefixes: &["kata_guest_", "kata_agent_"],
    reserved_labels: &["sandbox_id", "cri_uid", "cri_name", "cri_namespace"],
    default_help: "Reported by the guest.",
};

/// What a scrape needs of the sandbox, read under the Task service's lock.
pub type SandboxSource = Arc<dyn Fn() -> Option<Arc<Sandbox>> + Send + Sync>;

/// The namespace of a helper's families, by its command name; None for one not reported.
fn helper_namespace(comm: &str) -> Option<&'static str> {
    if comm.starts_with("virtiofsd") {
        Some("kata_virtiofsd")
    } else if comm.starts_with("kata-vsock") || comm.starts_with("vhost-device-vs") {
        Some("kata_vsock")
    } else {
        None
    }
}

/// The only child of `pid`, if it has exactly one.
fn worker_of(pid: i32) -> Option<i32> {
    match procinfo::pid::children(pid)[..] {
        [child] => Some(child),
        _ => None,
    }
}

/// The host's figures: the shim's, the VMM's (`vmm`) and the helpers'.
fn host_figures(vmm: Option<i32>, helpers: &[i32]) -> Exposition {
    let mut out = Exposition::new();
    let boot = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|t| procinfo::parse_boot_time(&t));
    if let Some(me) = ProcessFigures::read(None) {
        me.write(&mut out, "kata_shim", "shim", &HOST_IO_ITEMS, boot);
    }
    if let Ok(t) = std::fs::read_to_string("/proc/self/net/dev") {
        procinfo::write_net_dev(
            &mut out,
            "kata_shim_netdev",
            "Kata containerd shim v2 network devices statistics.",
            &t,
        );
    }
    if let Some(pid) = vmm.filter(|p| *p > 0) {
        if let Some(f) = ProcessFigures::read(Some(pid)) {
            f.write(
                &mut out,
                "kata_hypervisor",
                "hypervisor",
                &HOST_IO_ITEMS,
                boot,
            );
        }
        if let Ok(t) = std::fs::read_to_string(format!("/proc/{pid}/net/dev")) {
            procinfo::write_net_dev(
                &mut out,
                "kata_hypervisor_netdev",
                "Net devices statistics of the VMM's network namespace.",
                &t,
            );
        }
    }
    let mut done: Vec<&str> = Vec::new();
    for &pid in helpers.iter().filter(|p| **p > 0) {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        // One process per namespace: the first (a second virtiofsd serves the rootfs
        // share only).
        let Some(ns) = helper_namespace(comm.trim()).filter(|ns| !done.contains(ns)) else {
            continue;
        };
        // virtiofsd (`--sandbox namespace`) works in a child of its own; the parent only
        // waits for it.
        let worker = worker_of(pid).unwrap_or(pid);
        if let Some(f) = ProcessFigures::read(Some(worker)) {
            let what = if ns == "kata_virtiofsd" {
                "virtiofsd"
            } else {
                "vsock backend"
            };
            f.write(&mut out, ns, what, &HOST_IO_ITEMS, boot);
            done.push(ns);
        }
    }
    out
}

/// One scrape: everything, as the text format. Never fails: what cannot be read is left
/// out (a guest that does not answer in [`GUEST_SCRAPE_BOUND`] leaves its families out and
/// counts in `kata_shim_agent_scrape_failures_total`).
pub async fn scrape(source: &SandboxSource) -> String {
    let sandbox = source();
    let (vmm, helpers) = match &sandbox {
        Some(sb) if sb.end_cause().is_none() => (Some(sb.task_pid() as i32), sb.helper_pids()),
        _ => (None, Vec::new()),
    };
    let host = tokio::task::spawn_blocking(move || host_figures(vmm, &helpers));
    let guest = async {
        let sb = sandbox.as_ref().filter(|sb| sb.end_cause().is_none())?;
        let agent = sb.agent();
        match tokio::time::timeout(GUEST_SCRAPE_BOUND, agent.get_metrics()).await {
            Ok(Ok(t)) if t.len() <= GUEST_TEXT_MAX => Some(t),
            _ => {
                METRICS.guest_failed();
                None
            }
        }
    };
    let (host, guest) = tokio::join!(host, guest);
    let mut out = host.unwrap_or_default();
    METRICS.write(&mut out);
    if let Some(t) = guest {
        let parsed = promtext::parse_filtered(&t, &GUEST_FILTER, &Limits::GUEST);
        out.add_new_families(parsed.exposition);
    }
    out.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_land_in_their_bucket_and_only_measured_ones_render() {
        static R: Registry = Registry::new();
        R.agent_request("CreateContainer", Duration::from_millis(3));
        R.agent_request("CreateContainer", Duration::from_millis(5000));
        R.agent_request("WaitProcess", Duration::from_secs(100));
        drop(R.task_timer("pids"));
        assert!(R.task_timer("no-such-action").is_none());
        let mut out = Exposition::new();
        R.write(&mut out);
        let name = "kata_shim_agent_rpc_durations_histogram_milliseconds_bucket";
        let create = "grpc.CreateContainerRequest";
        assert_eq!(
            out.value(name, &[("action", create), ("le", "2")]),
            Some(0.0)
        );
        assert_eq!(
            out.value(name, &[("action", create), ("le", "4")]),
            Some(1.0)
        );
        assert_eq!(
            out.value(name, &[("action", create), ("le", "8192")]),
            Some(2.0)
        );
        assert_eq!(
            out.value(name, &[("action", create), ("le", "+Inf")]),
            Some(2.0)
        );
        let sum = out
            .value(
                "kata_shim_agent_rpc_durations_histogram_milliseconds_sum",
                &[("action", create)],
            )
            .unwrap();
        assert!((sum - 5003.0).abs() < 1.0, "{sum}");
        let rendered = out.render();
        assert!(!rendered.contains("WaitProcess"), "{rendered}");
        assert!(!rendered.contains("action=\"state\""), "{rendered}");
        assert_eq!(
            out.value(
                "kata_shim_rpc_durations_histogram_milliseconds_count",
                &[("action", "pids")]
            ),
            Some(1.0)
        );
    }

    #[test]
    fn phases_count_from_the_sandboxs_create_and_exits_by_kind() {
        static R: Registry = Registry::new();
        R.phase("vmm_launched");
        let mut out = Exposition::new();
        R.write(&mut out);
        assert!(!out.has("kata_shim_sandbox_start_phase_milliseconds"));
        R.start_phases();
        R.phase("vmm_launched");
        R.vm_ended("helper virtiofsd (pid 5) was killed by signal 9");
        R.vm_ended("the VMM qemu-system-x86 (pid 4) exited with status 0");
        R.set_vm_size(2, 2048);
        let mut out = Exposition::new();
        R.write(&mut out);
        let ms = out
            .value(
                "kata_shim_sandbox_start_phase_milliseconds",
                &[("phase", "vmm_launched")],
            )
            .unwrap();
        assert!((0.0..60_000.0).contains(&ms));
        assert_eq!(out.value("kata_shim_helper_exits_total", &[]), Some(1.0));
        assert_eq!(out.value("kata_shim_vmm_exits_total", &[]), Some(1.0));
        assert_eq!(
            out.value("kata_hypervisor_vm_memory_bytes", &[]),
            Some(2048.0 * 1024.0 * 1024.0)
        );
    }

    #[test]
    fn the_host_part_names_each_process_by_its_kind() {
        // A child standing in for the VMM: its figures are read like any process's.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let out = host_figures(Some(child.id() as i32), &[child.id() as i32]);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(
            out.value("kata_shim_process_resident_memory_bytes", &[])
                .unwrap()
                > 0.0
        );
        assert!(out.value("kata_hypervisor_threads", &[]).unwrap() >= 1.0);
        assert!(out.has("kata_shim_netdev") && out.has("kata_hypervisor_netdev"));
        // `sleep` is no known helper: it is left out.
        assert!(!out.has("kata_virtiofsd_threads") && !out.has("kata_vsock_threads"));
        assert_eq!(helper_namespace("virtiofsd"), Some("kata_virtiofsd"));
        assert_eq!(helper_namespace("kata-vsock"), Some("kata_vsock"));
    }
}
