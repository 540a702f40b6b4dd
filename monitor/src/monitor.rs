//! One scrape of the node: find the sandboxes (`<sandboxes-dir>/<id>/shim-monitor.sock`,
//! read afresh every time, so sandboxes come and go with their directories), GET each
//! shim's `/metrics` concurrently, each within the shim deadline, label every series with
//! the sandbox and its pod, merge the families, and add the monitor's own `kata_monitor_*`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;

use crate::cri::{Cri, PodMeta};
use promtext::{Exposition, Kind, Limits, Sample};

use crate::log::{debug, warning};

/// The most a shim's answer may hold.
const MAX_BODY: usize = 16 << 20;

/// The upper bounds (ms) of the scrape duration histogram: Kata's 1, 2, 4, ... 512.
const BUCKETS_MS: [f64; 10] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];

/// The sandboxes in `dir`: the names of its directories that hold a metrics socket (or a
/// file by its name: a dead socket is a sandbox whose scrape fails), in name order.
pub fn sandboxes(dir: &Path) -> Vec<String> {
    let mut ids: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| std::fs::symlink_metadata(e.path().join(layout::METRICS_SOCKET)).is_ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    ids.sort();
    ids
}

/// Why one shim's scrape failed.
#[derive(Debug)]
pub enum Failure {
    /// The socket does not take connections (its shim is gone).
    Connect(String),
    /// No whole answer within the shim deadline (the shim hangs or is overloaded).
    Timeout(Duration),
    /// The HTTP exchange failed or the status was not 200.
    Http(String),
    /// The answer is not the Prometheus text format.
    Parse(String),
}

impl Failure {
    /// The `reason` label of `kata_monitor_shim_scrape_failed_count`.
    pub fn reason(&self) -> &'static str {
        match self {
            Failure::Connect(_) => "connect",
            Failure::Timeout(_) => "timeout",
            Failure::Http(_) => "http",
            Failure::Parse(_) => "parse",
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Connect(e) => write!(f, "connecting: {e}"),
            Failure::Timeout(d) => write!(f, "no answer within {:.1}s", d.as_secs_f64()),
            Failure::Http(e) => write!(f, "HTTP: {e}"),
            Failure::Parse(e) => write!(f, "not the Prometheus text format: {e}"),
        }
    }
}

/// GET /metrics over the unix socket `socket` (HTTP/1.1, one request).
async fn fetch(socket: &Path) -> Result<String, Failure> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| Failure::Connect(e.to_string()))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| Failure::Http(e.to_string()))?;
    let request = hyper::Request::get("/metrics")
        .header(hyper::header::HOST, "localhost")
        .header(hyper::header::ACCEPT, "text/plain")
        .body(Empty::<Bytes>::new())
        .map_err(|e| Failure::Http(e.to_string()))?;
    let exchange = async move {
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| Failure::Http(e.to_string()))?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| Failure::Http(format!("reading the answer: {e}")))?
            .to_bytes();
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            let text: String = text.chars().take(200).collect();
            return Err(Failure::Http(format!("status {status}: {}", text.trim())));
        }
        String::from_utf8(body.to_vec()).map_err(|_| Failure::Parse("not UTF-8".into()))
    };
    // The connection is driven here, not spawned: when the deadline drops this future,
    // the socket goes with it.
    let mut conn = std::pin::pin!(conn);
    let mut exchange = std::pin::pin!(exchange);
    tokio::select! {
        biased;
        answer = &mut exchange => answer,
        _ = &mut conn => exchange.await,
    }
}

/// One shim's families, parsed and labelled, or why not.
async fn scrape_shim(socket: PathBuf, deadline: Duration) -> Result<Exposition, Failure> {
    let text = tokio::time::timeout(deadline, fetch(&socket))
        .await
        .map_err(|_| Failure::Timeout(deadline))??;
    let mut parsed =
        promtext::parse(&text, &Limits::GENEROUS).map_err(|e| Failure::Parse(e.to_string()))?;
    // A shim written with Prometheus' Go client exposes go_* and process_*: Kata's monitor
    // names them kata_shim_*, and so does this one.
    let go_client: Vec<String> = parsed
        .families()
        .iter()
        .map(|f| f.name.clone())
        .filter(|n| n.starts_with("go_") || n.starts_with("process_"))
        .collect();
    for name in go_client {
        parsed.prefix_family(&name, "kata_shim_");
    }
    Ok(parsed)
}

#[derive(Default)]
struct Stats {
    scrapes: u64,
    failed_scrapes: u64,
    buckets: [u64; BUCKETS_MS.len()],
    duration_sum_ms: f64,
    durations: u64,
    shim_failures: BTreeMap<&'static str, u64>,
}

/// The node monitor: where the sandboxes are, the CRI, and the figures of its scrapes.
pub struct Monitor {
    sandboxes_dir: PathBuf,
    shim_timeout: Duration,
    cri: Cri,
    stats: Mutex<Stats>,
}

fn sample(name: &str, labels: &[(&str, &str)], value: f64) -> Sample {
    Sample::new(name, labels, value)
}

fn pod_labels<'a>(id: &'a str, meta: &'a PodMeta) -> [(&'static str, &'a str); 4] {
    [
        ("sandbox_id", id),
        ("cri_uid", &meta.uid),
        ("cri_name", &meta.name),
        ("cri_namespace", &meta.namespace),
    ]
}

/// The monitor's own process: CPU seconds, resident bytes, open fds.
fn own_process() -> Option<(f64, u64, usize)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields = procinfo::pid::stat_fields(&stat)?;
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    // SAFETY: as above.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let rss_pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    let fds = std::fs::read_dir("/proc/self/fd").ok()?.count();
    Some((
        ticks as f64 / hz.max(1) as f64,
        rss_pages * page.max(1) as u64,
        fds,
    ))
}

impl Monitor {
    pub fn new(sandboxes_dir: PathBuf, shim_timeout: Duration, cri: Cri) -> Self {
        Monitor {
            sandboxes_dir,
            shim_timeout,
            cri,
            stats: Mutex::new(Stats::default()),
        }
    }

    /// The sandboxes of the node now.
    pub fn sandboxes(&self) -> Vec<String> {
        sandboxes(&self.sandboxes_dir)
    }

    /// The node's metrics in the text format; only the families whose names start with
    /// one of `prefixes` if any are given (Kata's `filter_family`).
    pub async fn scrape(&self, prefixes: &[String]) -> String {
        let start = Instant::now();
        let ids = self.sandboxes();
        let mut shims = tokio::task::JoinSet::new();
        for (i, id) in ids.iter().enumerate() {
            let socket = self.sandboxes_dir.join(id).join(layout::METRICS_SOCKET);
            let deadline = self.shim_timeout;
            shims.spawn(async move {
                let t = Instant::now();
                let result = scrape_shim(socket, deadline).await;
                (i, result, t.elapsed())
            });
        }
        let collect = async {
            let mut results: Vec<Option<(Result<Exposition, Failure>, Duration)>> =
                (0..ids.len()).map(|_| None).collect();
            while let Some(joined) = shims.join_next().await {
                if let Ok((i, result, took)) = joined {
                    if let Some(slot) = results.get_mut(i) {
                        *slot = Some((result, took));
                    }
                }
            }
            results
        };
        let (metadata, results) = tokio::join!(self.cri.metadata(&ids), collect);

        let mut all = Exposition::new();
        let mut up = Vec::new();
        let mut took = Vec::new();
        let mut failures: Vec<&'static str> = Vec::new();
        let none = PodMeta::default();
        for (id, result) in ids.iter().zip(results) {
            let meta = metadata.get(id).unwrap_or(&none);
            let labels = pod_labels(id, meta);
            let (result, elapsed) = result.unwrap_or_else(|| {
                (
                    Err(Failure::Http(
                        "the scrape task ended without an answer".into(),
                    )),
                    Duration::ZERO,
                )
            });
            took.push(sample(
                "kata_monitor_shim_scrape_duration_seconds",
                &labels,
                elapsed.as_secs_f64(),
            ));
            match result {
                Ok(mut families) => {
                    families.add_labels(&labels);
                    for c in all.merge(families) {
                        warning!(
                            "sandbox {id}: family {} is a {} here but a {} in other shims: left out",
                            c.family, c.dropped, c.kept
                        );
                    }
                    up.push(sample("kata_monitor_shim_up", &labels, 1.0));
                }
                Err(e) => {
                    warning!("sandbox {id}: scraping its shim failed: {e}");
                    failures.push(e.reason());
                    up.push(sample("kata_monitor_shim_up", &labels, 0.0));
                }
            }
        }
        debug!(
            "scraped {} sandboxes, {} failed, in {:?}",
            ids.len(),
            failures.len(),
            start.elapsed()
        );

        let own = self.own_families(ids.len(), &failures, start.elapsed(), up, took);
        for c in all.merge(own) {
            warning!(
                "a shim's family {} collides with the monitor's own",
                c.family
            );
        }
        if !prefixes.is_empty() {
            all.retain(|f| prefixes.iter().any(|p| f.name.starts_with(p.as_str())));
        }
        all.sort_by_name();
        all.render()
    }

    fn own_families(
        &self,
        running: usize,
        failures: &[&'static str],
        elapsed: Duration,
        up: Vec<Sample>,
        took: Vec<Sample>,
    ) -> Exposition {
        let mut stats = match self.stats.lock() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        };
        stats.scrapes += 1;
        if !failures.is_empty() {
            stats.failed_scrapes += 1;
        }
        for reason in failures {
            *stats.shim_failures.entry(reason).or_default() += 1;
        }
        let ms = elapsed.as_secs_f64() * 1000.0;
        for (i, le) in BUCKETS_MS.iter().enumerate() {
            if ms <= *le {
                stats.buckets[i] += 1;
            }
        }
        stats.duration_sum_ms += ms;
        stats.durations += 1;

        let mut f = Exposition::new();
        f.gauge(
            "kata_monitor_running_shim_count",
            "Running shim count (running sandboxes).",
            &[],
            running as f64,
        );
        f.counter(
            "kata_monitor_scrape_count",
            "Scrape count.",
            &[],
            stats.scrapes as f64,
        );
        f.counter(
            "kata_monitor_scrape_failed_count",
            "Failed scrape count: scrapes in which at least one shim did not answer.",
            &[],
            stats.failed_scrapes as f64,
        );
        // The buckets are cumulative already (each counts the scrapes at most its bound).
        let hist = "kata_monitor_scrape_durations_histogram_milliseconds";
        let bucket = format!("{hist}_bucket");
        let mut samples = Vec::new();
        for (i, le) in BUCKETS_MS.iter().enumerate() {
            let le = promtext::format_value(*le);
            samples.push(sample(&bucket, &[("le", &le)], stats.buckets[i] as f64));
        }
        samples.push(sample(&bucket, &[("le", "+Inf")], stats.durations as f64));
        samples.push(sample(&format!("{hist}_sum"), &[], stats.duration_sum_ms));
        samples.push(sample(
            &format!("{hist}_count"),
            &[],
            stats.durations as f64,
        ));
        f.family_mut(
            hist,
            Some("Time used to scrape from shims"),
            Some(Kind::Histogram),
        )
        .samples
        .extend(samples);
        for r in ["connect", "timeout", "http", "parse"] {
            f.counter(
                "kata_monitor_shim_scrape_failed_count",
                "Shim scrapes that failed, by reason: connect (the socket takes no connection), \
                 timeout (no answer within the shim deadline), http, parse.",
                &[("reason", r)],
                stats.shim_failures.get(r).copied().unwrap_or(0) as f64,
            );
        }
        f.family_mut(
            "kata_monitor_shim_up",
            Some("Whether the last scrape of the sandbox's shim succeeded (1) or not (0)."),
            Some(Kind::Gauge),
        )
        .samples
        .extend(up);
        f.family_mut(
            "kata_monitor_shim_scrape_duration_seconds",
            Some("How long the last scrape of the sandbox's shim took."),
            Some(Kind::Gauge),
        )
        .samples
        .extend(took);
        f.counter(
            "kata_monitor_cri_list_count",
            "ListPodSandbox calls made to the runtime endpoint for the pods' names.",
            &[],
            self.cri.calls.load(std::sync::atomic::Ordering::Relaxed) as f64,
        );
        f.counter(
            "kata_monitor_cri_list_failed_count",
            "ListPodSandbox calls that failed or did not answer in time.",
            &[],
            self.cri.failures.load(std::sync::atomic::Ordering::Relaxed) as f64,
        );
        if let Some((cpu, rss, fds)) = own_process() {
            f.counter(
                "kata_monitor_process_cpu_seconds_total",
                "Total user and system CPU time of the monitor in seconds.",
                &[],
                cpu,
            );
            f.gauge(
                "kata_monitor_process_resident_memory_bytes",
                "Resident memory size of the monitor in bytes.",
                &[],
                rss as f64,
            );
            f.gauge(
                "kata_monitor_process_open_fds",
                "Number of open file descriptors of the monitor.",
                &[],
                fds as f64,
            );
        }
        f
    }
}
