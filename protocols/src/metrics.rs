//! Prometheus text exposition (format 0.0.4) for the sandbox's metrics, shared by the
//! agent (which answers GetMetrics with the guest's families in this format) and the shim
//! (which serves `/metrics` on `shim-monitor.sock`, its own families plus the guest's).
//!
//! - [`Exposition`] collects samples by family, in any order, and renders each family
//!   once: `# HELP`, `# TYPE`, then its samples together, as the format requires.
//! - [`parse_guest`] reads the guest's text back. The guest is not trusted: only
//!   well-formed gauge and counter samples of allowed families pass, bounded in number
//!   and size, so that nothing the guest writes can break (or forge) the host's figures.
//! - The `/proc` readers ([`ProcessFigures`], [`parse_net_dev`]) serve both sides.

use std::collections::HashMap;
use std::fmt::Write as _;

/// The `Content-Type` of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Clock ticks per second of `/proc` figures (`USER_HZ`, 100 on every Linux ABI the
/// runtime supports).
pub const USER_HZ: f64 = 100.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Sample {
    /// The full sample name: the family's, or with `_bucket`/`_sum`/`_count`.
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

#[derive(Debug, Clone)]
struct Family {
    name: String,
    help: String,
    kind: Kind,
    samples: Vec<Sample>,
}

/// Families of samples, rendered in the order they were first named.
#[derive(Debug, Default, Clone)]
pub struct Exposition {
    families: Vec<Family>,
    index: HashMap<String, usize>,
}

impl Exposition {
    pub fn new() -> Self {
        Self::default()
    }

    fn family(&mut self, name: &str, help: &str, kind: Kind) -> &mut Family {
        let i = match self.index.get(name) {
            Some(&i) => i,
            None => {
                self.families.push(Family {
                    name: name.to_string(),
                    help: help.to_string(),
                    kind,
                    samples: Vec::new(),
                });
                self.index.insert(name.to_string(), self.families.len() - 1);
                self.families.len() - 1
            }
        };
        &mut self.families[i]
    }

    fn push(&mut self, family: &str, help: &str, kind: Kind, sample: Sample) {
        self.family(family, help, kind).samples.push(sample);
    }

    /// Declares a family with no sample yet (it renders only once it has one).
    pub fn declare(&mut self, name: &str, help: &str, kind: Kind) {
        self.family(name, help, kind);
    }

    pub fn gauge(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: f64) {
        self.push(name, help, Kind::Gauge, sample(name, labels, value));
    }

    pub fn counter(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: f64) {
        self.push(name, help, Kind::Counter, sample(name, labels, value));
    }

    /// A histogram's samples: `bounds` are the buckets' upper bounds (ascending) and
    /// `buckets[i]` the observations at most `bounds[i]`, not cumulated; `buckets` has one
    /// more entry, for the observations above the last bound.
    pub fn histogram(
        &mut self,
        name: &str,
        help: &str,
        labels: &[(&str, &str)],
        bounds: &[f64],
        buckets: &[u64],
        sum: f64,
    ) {
        let mut cumulated = 0u64;
        let mut samples = Vec::with_capacity(bounds.len() + 3);
        for (i, bound) in bounds.iter().enumerate() {
            cumulated += buckets.get(i).copied().unwrap_or(0);
            let le = format_value(*bound);
            let mut with_le = labels.to_vec();
            with_le.push(("le", &le));
            samples.push(sample(
                &format!("{name}_bucket"),
                &with_le,
                cumulated as f64,
            ));
        }
        cumulated += buckets.get(bounds.len()).copied().unwrap_or(0);
        let mut with_le = labels.to_vec();
        with_le.push(("le", "+Inf"));
        samples.push(sample(
            &format!("{name}_bucket"),
            &with_le,
            cumulated as f64,
        ));
        samples.push(sample(&format!("{name}_sum"), labels, sum));
        samples.push(sample(&format!("{name}_count"), labels, cumulated as f64));
        self.family(name, help, Kind::Histogram)
            .samples
            .extend(samples);
    }

    /// Adds `other`'s families that this one does not have (a family already here keeps
    /// its own samples alone).
    pub fn merge(&mut self, other: Exposition) {
        for f in other.families {
            if self.index.contains_key(&f.name) {
                continue;
            }
            self.index.insert(f.name.clone(), self.families.len());
            self.families.push(f);
        }
    }

    /// Whether a family of that name has samples.
    pub fn has(&self, name: &str) -> bool {
        self.index
            .get(name)
            .is_some_and(|&i| !self.families[i].samples.is_empty())
    }

    /// The value of the sample `name` with exactly `labels` (in any order), if any.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.families.iter().find_map(|f| {
            f.samples.iter().find_map(|s| {
                (s.name == name
                    && s.labels.len() == labels.len()
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.iter().any(|(sk, sv)| sk == k && sv == v)))
                .then_some(s.value)
            })
        })
    }

    /// The text format: every family with samples, once.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for f in self.families.iter().filter(|f| !f.samples.is_empty()) {
            let _ = writeln!(out, "# HELP {} {}", f.name, escape_help(&f.help));
            let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind.as_str());
            for s in &f.samples {
                out.push_str(&s.name);
                if !s.labels.is_empty() {
                    out.push('{');
                    for (i, (k, v)) in s.labels.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        let _ = write!(out, "{k}=\"{}\"", escape_label(v));
                    }
                    out.push('}');
                }
                out.push(' ');
                out.push_str(&format_value(s.value));
                out.push('\n');
            }
        }
        out
    }
}

fn sample(name: &str, labels: &[(&str, &str)], value: f64) -> Sample {
    Sample {
        name: name.to_string(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        value,
    }
}

fn escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A sample value as the format writes it: integers without a fraction, `NaN`, `+Inf`.
pub fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if v.fract() == 0.0 && v.abs() < 9.007_199_254_740_992e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// Whether `name` is a valid metric name.
pub fn valid_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Whether `name` is a valid label name (`__` names are reserved).
pub fn valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with("__")
}

/// Bounds on what [`parse_guest`] accepts.
#[derive(Debug, Clone, Copy)]
pub struct GuestLimits {
    /// Samples kept at most; the rest are dropped.
    pub max_samples: usize,
    /// Labels a sample may carry.
    pub max_labels: usize,
    /// Longest metric or label name.
    pub max_name: usize,
    /// Longest label value.
    pub max_label_value: usize,
}

impl Default for GuestLimits {
    fn default() -> Self {
        GuestLimits {
            max_samples: 20_000,
            max_labels: 8,
            max_name: 128,
            max_label_value: 256,
        }
    }
}

/// What [`parse_guest`] kept, and how many lines it dropped.
#[derive(Debug, Default)]
pub struct Parsed {
    pub exposition: Exposition,
    pub dropped: usize,
}

/// Reads the guest's exposition text, keeping only: samples whose family name starts with
/// one of `prefixes`, is declared (if at all) as a gauge or counter, and is not one the
/// host adds itself (`reserved_labels`, e.g. `sandbox_id`); well-formed names, labels and
/// values; at most `limits`. Timestamps are dropped. Families are regrouped, so samples
/// the guest interleaved still render as one family each.
pub fn parse_guest(
    text: &str,
    prefixes: &[&str],
    reserved_labels: &[&str],
    limits: GuestLimits,
) -> Parsed {
    let mut parsed = Parsed::default();
    let mut types: HashMap<String, Kind> = HashMap::new();
    let mut helps: HashMap<String, String> = HashMap::new();
    let mut refused: std::collections::HashSet<String> = Default::default();
    let mut kept = 0usize;
    for line in text.lines() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('#') {
            let mut words = rest.trim_start().splitn(3, ' ');
            match (words.next(), words.next(), words.next()) {
                (Some("TYPE"), Some(name), Some(kind)) => match kind.trim() {
                    "gauge" => {
                        types.insert(name.to_string(), Kind::Gauge);
                    }
                    "counter" => {
                        types.insert(name.to_string(), Kind::Counter);
                    }
                    _ => {
                        refused.insert(name.to_string());
                    }
                },
                (Some("HELP"), Some(name), help) => {
                    let help = unescape_help(help.unwrap_or(""));
                    let help: String = help.chars().take(256).collect();
                    helps.insert(name.to_string(), help);
                }
                _ => {}
            }
            continue;
        }
        let Some(s) = parse_sample(line, limits) else {
            parsed.dropped += 1;
            continue;
        };
        let allowed = prefixes.iter().any(|p| s.name.starts_with(p))
            && !refused.contains(&s.name)
            && !s
                .labels
                .iter()
                .any(|(k, _)| reserved_labels.contains(&k.as_str()));
        if !allowed || kept >= limits.max_samples {
            parsed.dropped += 1;
            continue;
        }
        let kind = types.get(&s.name).copied().unwrap_or(Kind::Gauge);
        if let Some(&i) = parsed.exposition.index.get(&s.name) {
            if parsed.exposition.families[i].kind != kind {
                parsed.dropped += 1;
                continue;
            }
        }
        let help = helps
            .get(&s.name)
            .cloned()
            .unwrap_or_else(|| "Reported by the guest.".into());
        let name = s.name.clone();
        parsed.exposition.push(&name, &help, kind, s);
        kept += 1;
    }
    parsed
}

fn unescape_help(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('n') => out.push('\n'),
                Some(other) => out.push(other),
                None => out.push('\\'),
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// One sample line: `name{label="value",...} value [timestamp]`.
fn parse_sample(line: &str, limits: GuestLimits) -> Option<Sample> {
    let name_end = line
        .find(|c: char| c == '{' || c.is_ascii_whitespace())
        .unwrap_or(line.len());
    let name = &line[..name_end];
    if name.len() > limits.max_name || !valid_metric_name(name) {
        return None;
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        let (parsed, tail) = parse_labels(after, limits)?;
        labels = parsed;
        rest = tail;
    }
    let mut fields = rest.split_ascii_whitespace();
    let value = parse_value(fields.next()?)?;
    // An optional timestamp (dropped); anything more is malformed.
    if let Some(ts) = fields.next() {
        ts.parse::<i64>().ok()?;
    }
    if fields.next().is_some() {
        return None;
    }
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// The labels after `{`, up to and including `}`; returns them and what follows.
fn parse_labels(mut s: &str, limits: GuestLimits) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels: Vec<(String, String)> = Vec::new();
    loop {
        s = s.trim_start();
        if let Some(tail) = s.strip_prefix('}') {
            return Some((labels, tail));
        }
        let eq = s.find('=')?;
        let key = s[..eq].trim();
        if key.len() > limits.max_name || !valid_label_name(key) {
            return None;
        }
        if labels.iter().any(|(k, _)| k == key) || labels.len() >= limits.max_labels {
            return None;
        }
        s = s[eq + 1..].trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '"' => break i,
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    '\\' => value.push('\\'),
                    '"' => value.push('"'),
                    _ => return None,
                },
                '\n' => return None,
                c => value.push(c),
            }
            if value.len() > limits.max_label_value {
                return None;
            }
        };
        labels.push((key.to_string(), value));
        s = s[end + 1..].trim_start();
        if let Some(tail) = s.strip_prefix(',') {
            s = tail;
        } else if !s.starts_with('}') {
            return None;
        }
    }
}

fn parse_value(s: &str) -> Option<f64> {
    match s {
        "NaN" => Some(f64::NAN),
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ if s
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E')) =>
        {
            s.parse().ok()
        }
        _ => None,
    }
}

/// The figures of one process from `/proc/<pid>`.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ProcessFigures {
    pub threads: u64,
    pub utime: u64,
    pub stime: u64,
    pub cutime: u64,
    pub cstime: u64,
    /// Ticks after boot.
    pub starttime: u64,
    /// `/proc/<pid>/status` fields, by Kata's item name; sizes in bytes.
    pub status: Vec<(&'static str, u64)>,
    /// `/proc/<pid>/io` fields, by their file name (`read_bytes`).
    pub io: Vec<(String, u64)>,
    pub open_fds: u64,
    pub max_fds: Option<u64>,
    pub pss_bytes: Option<u64>,
}

/// `/proc/<pid>/status` keys and their item names (Kata's); sizes there are in kB.
const STATUS_ITEMS: [(&str, &str, bool); 19] = [
    ("VmPeak", "vmpeak", true),
    ("VmSize", "vmsize", true),
    ("VmLck", "vmlck", true),
    ("VmPin", "vmpin", true),
    ("VmHWM", "vmhwm", true),
    ("VmRSS", "vmrss", true),
    ("RssAnon", "rssanon", true),
    ("RssFile", "rssfile", true),
    ("RssShmem", "rssshmem", true),
    ("VmData", "vmdata", true),
    ("VmStk", "vmstk", true),
    ("VmExe", "vmexe", true),
    ("VmLib", "vmlib", true),
    ("VmPTE", "vmpte", true),
    ("VmPMD", "vmpmd", true),
    ("VmSwap", "vmswap", true),
    ("HugetlbPages", "hugetlbpages", true),
    ("voluntary_ctxt_switches", "voluntary_ctxt_switches", false),
    (
        "nonvoluntary_ctxt_switches",
        "nonvoluntary_ctxt_switches",
        false,
    ),
];

/// Parses `/proc/<pid>/stat`: (threads, utime, stime, cutime, cstime, starttime).
pub fn parse_proc_stat(text: &str) -> Option<(u64, u64, u64, u64, u64, u64)> {
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    // f[0] is field 3 (state): field n is f[n - 3].
    let field = |n: usize| -> Option<u64> { f.get(n - 3)?.parse().ok() };
    Some((
        field(20)?,
        field(14)?,
        field(15)?,
        field(16).unwrap_or(0),
        field(17).unwrap_or(0),
        field(22)?,
    ))
}

/// Parses `/proc/<pid>/status` into Kata's items (sizes in bytes).
pub fn parse_proc_status(text: &str) -> Vec<(&'static str, u64)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let Some(&(_, item, kb)) = STATUS_ITEMS.iter().find(|(k, _, _)| *k == key) else {
            continue;
        };
        let Some(n) = value
            .split_ascii_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
        else {
            continue;
        };
        out.push((item, if kb { n * 1024 } else { n }));
    }
    out
}

/// Parses a `key: value` file such as `/proc/<pid>/io` or `/proc/<pid>/smaps_rollup`
/// (the first number of each line).
pub fn parse_colon_keyed(text: &str) -> Vec<(String, u64)> {
    text.lines()
        .filter_map(|line| {
            let (k, v) = line.split_once(':')?;
            let n = v.split_ascii_whitespace().next()?.parse().ok()?;
            Some((k.trim().to_string(), n))
        })
        .collect()
}

/// The soft `Max open files` of `/proc/<pid>/limits`.
pub fn parse_max_fds(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_ascii_whitespace()
        .next()?
        .parse()
        .ok()
}

impl ProcessFigures {
    /// Reads `/proc/<pid>` (`pid` None: this process). None once the process is gone.
    pub fn read(pid: Option<i32>) -> Option<Self> {
        let dir = match pid {
            Some(p) => format!("/proc/{p}"),
            None => "/proc/self".to_string(),
        };
        let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).ok();
        let (threads, utime, stime, cutime, cstime, starttime) = parse_proc_stat(&read("stat")?)?;
        let pss_bytes = read("smaps_rollup").and_then(|t| {
            parse_colon_keyed(&t)
                .into_iter()
                .find(|(k, _)| k == "Pss")
                .map(|(_, v)| v * 1024)
        });
        let open_fds = std::fs::read_dir(format!("{dir}/fd"))
            .map(|d| d.count() as u64)
            .unwrap_or(0);
        Some(ProcessFigures {
            threads,
            utime,
            stime,
            cutime,
            cstime,
            starttime,
            status: read("status")
                .map(|t| parse_proc_status(&t))
                .unwrap_or_default(),
            io: read("io")
                .map(|t| parse_colon_keyed(&t))
                .unwrap_or_default(),
            open_fds,
            max_fds: read("limits").and_then(|t| parse_max_fds(&t)),
            pss_bytes,
        })
    }

    fn status(&self, item: &str) -> Option<u64> {
        self.status
            .iter()
            .find(|(k, _)| *k == item)
            .map(|(_, v)| *v)
    }

    /// Writes the figures as families `<ns>_*` (see the README's list). `io_items` maps
    /// `/proc/<pid>/io` keys to the item names of this namespace (Kata spells them
    /// differently for the agent and for the host processes). `boot_time` is the boot's
    /// unix time, for the start time.
    pub fn write(
        &self,
        out: &mut Exposition,
        ns: &str,
        what: &str,
        io_items: &[(&str, &str)],
        boot_time: Option<u64>,
    ) {
        let g = |out: &mut Exposition, suffix: &str, help: &str, v: f64| {
            out.gauge(&format!("{ns}_{suffix}"), help, &[], v)
        };
        g(
            out,
            "threads",
            &format!("Threads of the {what} process."),
            self.threads as f64,
        );
        g(
            out,
            "fds",
            &format!("Open FDs of the {what} process."),
            self.open_fds as f64,
        );
        let status = format!("{ns}_proc_status");
        for (item, v) in &self.status {
            out.gauge(
                &status,
                &format!("Status of the {what} process (/proc/<pid>/status)."),
                &[("item", item)],
                *v as f64,
            );
        }
        let stat = format!("{ns}_proc_stat");
        for (item, v) in [
            ("utime", self.utime),
            ("stime", self.stime),
            ("cutime", self.cutime),
            ("cstime", self.cstime),
        ] {
            out.gauge(
                &stat,
                &format!("Statistics of the {what} process (/proc/<pid>/stat, clock ticks)."),
                &[("item", item)],
                v as f64,
            );
        }
        let io = format!("{ns}_io_stat");
        for (key, v) in &self.io {
            if let Some((_, item)) = io_items.iter().find(|(k, _)| k == key) {
                out.gauge(
                    &io,
                    &format!("IO statistics of the {what} process (/proc/<pid>/io)."),
                    &[("item", item)],
                    *v as f64,
                );
            }
        }
        if let Some(pss) = self.pss_bytes {
            g(
                out,
                "pss_bytes",
                &format!("Proportional set size of the {what} process in bytes."),
                pss as f64,
            );
        }
        out.counter(
            &format!("{ns}_process_cpu_seconds_total"),
            "Total user and system CPU time spent in seconds.",
            &[],
            (self.utime + self.stime) as f64 / USER_HZ,
        );
        if let Some(rss) = self.status("vmrss") {
            g(
                out,
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                rss as f64,
            );
        }
        if let Some(vsz) = self.status("vmsize") {
            g(
                out,
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                vsz as f64,
            );
        }
        g(
            out,
            "process_open_fds",
            "Number of open file descriptors.",
            self.open_fds as f64,
        );
        if let Some(max) = self.max_fds {
            g(
                out,
                "process_max_fds",
                "Maximum number of open file descriptors.",
                max as f64,
            );
        }
        if let Some(boot) = boot_time {
            g(
                out,
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                boot as f64 + self.starttime as f64 / USER_HZ,
            );
        }
    }
}

/// `/proc/<pid>/io` keys and Kata's item names for the host processes.
pub const HOST_IO_ITEMS: [(&str, &str); 7] = [
    ("rchar", "rchar"),
    ("wchar", "wchar"),
    ("syscr", "syscr"),
    ("syscw", "syscw"),
    ("read_bytes", "readbytes"),
    ("write_bytes", "writebytes"),
    ("cancelled_write_bytes", "cancelledwritebytes"),
];

/// `/proc/<pid>/io` keys and Kata's item names for the agent.
pub const AGENT_IO_ITEMS: [(&str, &str); 7] = [
    ("rchar", "rchar"),
    ("wchar", "wchar"),
    ("syscr", "syscr"),
    ("syscw", "syscw"),
    ("read_bytes", "read_bytes"),
    ("write_bytes", "write_bytes"),
    ("cancelled_write_bytes", "cancelled_write_bytes"),
];

/// The boot's unix time (`btime` of `/proc/stat`).
pub fn parse_boot_time(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The item names of `/proc/net/dev`'s columns, in order.
pub const NET_DEV_ITEMS: [&str; 16] = [
    "recv_bytes",
    "recv_packets",
    "recv_errs",
    "recv_drop",
    "recv_fifo",
    "recv_frame",
    "recv_compressed",
    "recv_multicast",
    "sent_bytes",
    "sent_packets",
    "sent_errs",
    "sent_drop",
    "sent_fifo",
    "sent_colls",
    "sent_carrier",
    "sent_compressed",
];

/// Parses `/proc/net/dev`: each interface and its 16 figures ([`NET_DEV_ITEMS`]).
pub fn parse_net_dev(text: &str) -> Vec<(String, [u64; 16])> {
    text.lines()
        .filter_map(|line| {
            let (name, rest) = line.split_once(':')?;
            let values: Vec<u64> = rest
                .split_ascii_whitespace()
                .map(|v| v.parse().ok())
                .collect::<Option<_>>()?;
            let values: [u64; 16] = values.try_into().ok()?;
            Some((name.trim().to_string(), values))
        })
        .collect()
}

/// Writes `/proc/net/dev` figures as family `name{interface,item}`.
pub fn write_net_dev(out: &mut Exposition, name: &str, help: &str, text: &str) {
    for (iface, values) in parse_net_dev(text) {
        for (item, v) in NET_DEV_ITEMS.iter().zip(values) {
            out.gauge(
                name,
                help,
                &[("interface", &iface), ("item", item)],
                v as f64,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_render_once_with_their_samples_together() {
        let mut e = Exposition::new();
        e.gauge("a_b", "A b.", &[("item", "x")], 1.0);
        e.counter("c_total", "C.", &[], 2.0);
        e.gauge("a_b", "A b.", &[("item", "y")], 2.5);
        e.declare("empty", "Never set.", Kind::Gauge);
        assert_eq!(
            e.render(),
            "# HELP a_b A b.\n# TYPE a_b gauge\na_b{item=\"x\"} 1\na_b{item=\"y\"} 2.5\n\
             # HELP c_total C.\n# TYPE c_total counter\nc_total 2\n"
        );
    }

    #[test]
    fn label_values_and_help_are_escaped() {
        let mut e = Exposition::new();
        e.gauge("m", "line\\one\ntwo", &[("l", "a\"b\\c\nd")], f64::NAN);
        let text = e.render();
        assert!(text.contains("# HELP m line\\\\one\\ntwo\n"), "{text}");
        assert!(text.contains("m{l=\"a\\\"b\\\\c\\nd\"} NaN\n"), "{text}");
        // And reads back as it was.
        let back = parse_guest(&text, &["m"], &[], GuestLimits::default());
        assert_eq!(back.dropped, 0);
        assert_eq!(
            back.exposition.families[0].samples[0].labels[0].1,
            "a\"b\\c\nd"
        );
    }

    #[test]
    fn histograms_are_cumulative_with_sum_and_count() {
        let mut e = Exposition::new();
        e.histogram(
            "h_ms",
            "H.",
            &[("action", "create")],
            &[1.0, 2.0],
            &[3, 0, 2],
            9.5,
        );
        let text = e.render();
        assert!(text.contains("# TYPE h_ms histogram\n"), "{text}");
        assert!(
            text.contains("h_ms_bucket{action=\"create\",le=\"1\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("h_ms_bucket{action=\"create\",le=\"2\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("h_ms_bucket{action=\"create\",le=\"+Inf\"} 5\n"),
            "{text}"
        );
        assert!(text.contains("h_ms_sum{action=\"create\"} 9.5\n"), "{text}");
        assert!(text.contains("h_ms_count{action=\"create\"} 5\n"), "{text}");
    }

    #[test]
    fn the_guests_text_is_regrouped_and_filtered() {
        let text = "# HELP kata_guest_load Guest load.\n# TYPE kata_guest_load gauge\n\
            kata_guest_load{item=\"load1\"} 0.5\n\
            kata_agent_threads 3 1700000000000\n\
            kata_guest_load{item=\"load5\"} 0.25\n\
            kata_shim_threads 99\n\
            kata_guest_meminfo{item=\"mem_total\",sandbox_id=\"forged\"} 1\n\
            kata_guest_x{item=\"a\"} 1 2 3\n\
            kata_guest_y{item=\"unterminated} 1\n\
            kata_guest_z{item=\"a\",item=\"b\"} 1\n\
            kata_guest_w{0bad=\"a\"} 1\n\
            kata_guest_v notanumber\n\
            # TYPE kata_guest_h histogram\n\
            kata_guest_h 1\n";
        let p = parse_guest(
            text,
            &["kata_guest_", "kata_agent_"],
            &["sandbox_id"],
            GuestLimits::default(),
        );
        assert_eq!(p.dropped, 8, "{:?}", p.exposition.render());
        assert_eq!(
            p.exposition.render(),
            "# HELP kata_guest_load Guest load.\n# TYPE kata_guest_load gauge\n\
             kata_guest_load{item=\"load1\"} 0.5\nkata_guest_load{item=\"load5\"} 0.25\n\
             # HELP kata_agent_threads Reported by the guest.\n# TYPE kata_agent_threads gauge\n\
             kata_agent_threads 3\n"
        );
    }

    #[test]
    fn the_guest_cannot_exceed_its_limits() {
        let text: String = (0..50)
            .map(|i| format!("kata_guest_a{{n=\"{i}\"}} 1\n"))
            .collect();
        let limits = GuestLimits {
            max_samples: 10,
            ..Default::default()
        };
        let p = parse_guest(&text, &["kata_guest_"], &[], limits);
        assert_eq!(
            (p.exposition.families[0].samples.len(), p.dropped),
            (10, 40)
        );
        let long = format!("kata_guest_a{{n=\"{}\"}} 1\n", "x".repeat(1000));
        let p = parse_guest(&long, &["kata_guest_"], &[], GuestLimits::default());
        assert_eq!(p.dropped, 1);
    }

    #[test]
    fn merge_keeps_the_hosts_family_when_both_have_it() {
        let mut host = Exposition::new();
        host.gauge("kata_shim_threads", "Host.", &[], 4.0);
        let mut guest = Exposition::new();
        guest.gauge("kata_shim_threads", "Forged.", &[], 1000.0);
        guest.gauge("kata_guest_load", "Load.", &[("item", "load1")], 1.0);
        host.merge(guest);
        assert_eq!(host.value("kata_shim_threads", &[]), Some(4.0));
        assert_eq!(
            host.value("kata_guest_load", &[("item", "load1")]),
            Some(1.0)
        );
    }

    #[test]
    fn proc_files_parse() {
        let stat = "812 (qemu (x) y) S 1 812 812 0 -1 4194560 100 0 0 0 250 75 3 4 20 0 7 0 \
                    12345 1000000 500 18446744073709551615";
        assert_eq!(parse_proc_stat(stat), Some((7, 250, 75, 3, 4, 12345)));
        let status = "Name:\tqemu\nVmRSS:\t    2048 kB\nVmSwap:\t0 kB\n\
                      voluntary_ctxt_switches:\t15\nThreads:\t7\n";
        assert_eq!(
            parse_proc_status(status),
            vec![
                ("vmrss", 2048 * 1024),
                ("vmswap", 0),
                ("voluntary_ctxt_switches", 15)
            ]
        );
        assert_eq!(
            parse_colon_keyed("rchar: 10\nread_bytes: 4096\n"),
            vec![("rchar".to_string(), 10), ("read_bytes".to_string(), 4096)]
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(parse_max_fds(limits), Some(1024));
        assert_eq!(
            parse_boot_time("cpu 1 2\nbtime 1700000000\n"),
            Some(1_700_000_000)
        );
    }

    #[test]
    fn net_dev_parses_every_interface() {
        let text = "Inter-|   Receive                                                |  Transmit\n \
             face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
             lo:    100       2    0    0    0     0          0         0      100       2    0    0    0     0       0          0\n  \
             eth0: 5000      40    1    2    0     0          0         3     6000      50    0    0    0     0       0          0\n";
        let devs = parse_net_dev(text);
        assert_eq!(devs.len(), 2);
        assert_eq!(devs[1].0, "eth0");
        assert_eq!(devs[1].1[0], 5000);
        assert_eq!(devs[1].1[8], 6000);
        let mut e = Exposition::new();
        write_net_dev(&mut e, "kata_hypervisor_netdev", "Net.", text);
        assert_eq!(
            e.value(
                "kata_hypervisor_netdev",
                &[("interface", "eth0"), ("item", "recv_errs")]
            ),
            Some(1.0)
        );
    }

    #[test]
    fn this_process_has_figures() {
        let me = ProcessFigures::read(None).expect("/proc/self");
        assert!(me.threads >= 1 && me.open_fds >= 3);
        assert!(me.status.iter().any(|(k, v)| *k == "vmrss" && *v > 0));
        let mut e = Exposition::new();
        me.write(&mut e, "kata_shim", "shim", &HOST_IO_ITEMS, Some(1));
        assert!(
            e.value("kata_shim_process_resident_memory_bytes", &[])
                .unwrap()
                > 0.0
        );
        assert!(e.has("kata_shim_proc_stat"));
    }
}
