//! What `/proc` says about a process and the machine, read the same way in the guest (the
//! agent's own figures) and on the host (the shim's VMM and helpers), and written as
//! Prometheus families under Kata's names. [`mounts`]: the mount tables' escapes. [`pid`]: processes by pid (running or how it
//! ended, process group, who names a path), for the hypervisor crate and the shim.

pub mod mounts;
pub mod pid;

use promtext::Exposition;

/// Clock ticks per second of `/proc` figures (`USER_HZ`, 100 on every Linux ABI the
/// runtime supports).
pub const USER_HZ: f64 = 100.0;

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
    let f = pid::stat_fields(text)?;
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
