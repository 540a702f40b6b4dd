//! GetMetrics: the guest's figures as Prometheus text (Kata's `kata_agent_*` and
//! `kata_guest_*` families, and ours in the same style), gathered only when asked.
//!
//! The shim adds them to its own `/metrics`; it trusts nothing here (it keeps only
//! well-formed gauges and counters of these families, see the shim's `metrics` and `promtext::parse_filtered`). Only the
//! host can ask: the agent's API serves the host's CID alone (`host_only`).

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use procinfo::{ProcessFigures, AGENT_IO_ITEMS, USER_HZ};
use promtext::Exposition;
use protocols::agent::StatsContainerResponse;

/// How long the shared file systems may take to answer statvfs (a virtiofsd that hangs
/// must not hold the answer).
const FS_STAT_BOUND: Duration = Duration::from_secs(1);

/// File system types whose usage is reported: the host's shares.
const SHARED_FS_TYPES: [&str; 2] = ["virtiofs", "9p"];

static SCRAPES: AtomicU64 = AtomicU64::new(0);

/// The guest's figures; `containers` are each container's id and cgroup figures.
pub async fn gather(containers: Vec<(String, StatsContainerResponse)>) -> String {
    let scrapes = SCRAPES.fetch_add(1, Ordering::Relaxed) + 1;
    let fs = tokio::time::timeout(FS_STAT_BOUND, tokio::task::spawn_blocking(shared_fs_usage));
    let fs = match fs.await {
        Ok(Ok(fs)) => fs,
        _ => Vec::new(),
    };
    let procfs = tokio::task::spawn_blocking(read_proc)
        .await
        .unwrap_or_default();
    let mut out = Exposition::new();
    out.counter(
        "kata_agent_scrape_count",
        "Metrics scrape count",
        &[],
        scrapes as f64,
    );
    write_agent(&mut out, &procfs);
    write_guest(&mut out, &procfs);
    write_fs(&mut out, &fs);
    for (id, s) in &containers {
        write_container(&mut out, id, s);
    }
    out.render()
}

/// The `/proc` files the figures come from, read in one go.
#[derive(Default)]
struct ProcFiles {
    me: Option<ProcessFigures>,
    stat: String,
    meminfo: String,
    loadavg: String,
    vmstat: String,
    net_dev: String,
    diskstats: String,
}

fn read_proc() -> ProcFiles {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    ProcFiles {
        me: ProcessFigures::read(None),
        stat: read("/proc/stat"),
        meminfo: read("/proc/meminfo"),
        loadavg: read("/proc/loadavg"),
        vmstat: read("/proc/vmstat"),
        net_dev: read("/proc/net/dev"),
        diskstats: read("/proc/diskstats"),
    }
}

fn write_agent(out: &mut Exposition, p: &ProcFiles) {
    let Some(me) = &p.me else {
        return;
    };
    let boot = procinfo::parse_boot_time(&p.stat);
    me.write(out, "kata_agent", "agent", &AGENT_IO_ITEMS, boot);
    out.gauge(
        "kata_agent_total_time",
        "Agent process total time",
        &[],
        (me.utime + me.stime) as f64 / USER_HZ,
    );
    let status = |item: &str| {
        me.status
            .iter()
            .find(|(k, _)| *k == item)
            .map_or(0, |(_, v)| *v)
    };
    out.gauge(
        "kata_agent_total_vm",
        "Agent process total VM size",
        &[],
        status("vmsize") as f64,
    );
    out.gauge(
        "kata_agent_total_rss",
        "Agent process total RSS size",
        &[],
        status("vmrss") as f64,
    );
}

fn write_guest(out: &mut Exposition, p: &ProcFiles) {
    for (item, v) in parse_meminfo(&p.meminfo) {
        out.gauge(
            "kata_guest_meminfo",
            "Statistics about memory usage in the system.",
            &[("item", item)],
            v as f64,
        );
    }
    if let Some((loads, cur, max)) = parse_loadavg(&p.loadavg) {
        for (item, v) in ["load1", "load5", "load15"].iter().zip(loads) {
            out.gauge(
                "kata_guest_load",
                "Guest system load.",
                &[("item", item)],
                v,
            );
        }
        out.gauge(
            "kata_guest_tasks",
            "Guest system tasks.",
            &[("item", "cur")],
            cur,
        );
        out.gauge(
            "kata_guest_tasks",
            "Guest system tasks.",
            &[("item", "max")],
            max,
        );
    }
    for (cpu, values) in parse_cpu_times(&p.stat) {
        for (item, ticks) in CPU_ITEMS.iter().zip(values) {
            out.gauge(
                "kata_guest_cpu_time",
                "Guest CPU statistics (milliseconds).",
                &[("cpu", &cpu), ("item", item)],
                ticks as f64 * 1000.0 / USER_HZ,
            );
        }
    }
    for line in p.vmstat.lines() {
        if let Some((k, v)) = line.split_once(' ') {
            if let Ok(v) = v.trim().parse::<u64>() {
                out.gauge(
                    "kata_guest_vm_stat",
                    "Guest virtual memory statistics.",
                    &[("item", k)],
                    v as f64,
                );
            }
        }
    }
    procinfo::write_net_dev(
        out,
        "kata_guest_netdev_stat",
        "Guest net devices statistics.",
        &p.net_dev,
    );
    for (disk, values) in parse_diskstats(&p.diskstats) {
        for (item, v) in DISK_ITEMS.iter().zip(values) {
            out.gauge(
                "kata_guest_diskstat",
                "Disks statistics in system.",
                &[("disk", &disk), ("item", item)],
                v as f64,
            );
        }
    }
}

/// One shared file system's usage.
#[derive(Debug, Clone, PartialEq)]
struct FsUsage {
    mountpoint: String,
    fstype: String,
    size: u64,
    free: u64,
    avail: u64,
    files: u64,
    files_free: u64,
}

/// Each shared file system once (by device: bind mounts of a share into containers are
/// the same file system), under the first mount point of it.
fn shared_fs_usage() -> Vec<FsUsage> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for (mountpoint, fstype) in shared_mounts(&mounts) {
        let Ok(meta) = std::fs::metadata(&mountpoint) else {
            continue;
        };
        if seen.contains(&meta.dev()) {
            continue;
        }
        seen.push(meta.dev());
        let Ok(st) = nix::sys::statvfs::statvfs(Path::new(&mountpoint)) else {
            continue;
        };
        let frag = st.fragment_size();
        out.push(FsUsage {
            mountpoint,
            fstype,
            size: st.blocks() * frag,
            free: st.blocks_free() * frag,
            avail: st.blocks_available() * frag,
            files: st.files(),
            files_free: st.files_free(),
        });
    }
    out
}

/// The mount points and types of shared file systems in `/proc/self/mounts` text.
fn shared_mounts(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split_ascii_whitespace();
            let (_src, mp, fstype) = (f.next()?, f.next()?, f.next()?);
            SHARED_FS_TYPES
                .contains(&fstype)
                .then(|| (procinfo::mounts::unescape(mp), fstype.to_string()))
        })
        .collect()
}

fn write_fs(out: &mut Exposition, fs: &[FsUsage]) {
    for f in fs {
        for (item, v) in [
            ("size_bytes", f.size),
            ("free_bytes", f.free),
            ("avail_bytes", f.avail),
            ("files", f.files),
            ("files_free", f.files_free),
        ] {
            out.gauge(
                "kata_guest_fsstat",
                "Usage of the file systems the host shares with the guest.",
                &[
                    ("mountpoint", &f.mountpoint),
                    ("fstype", &f.fstype),
                    ("item", item),
                ],
                v as f64,
            );
        }
    }
}

fn write_container(out: &mut Exposition, id: &str, s: &StatsContainerResponse) {
    let mut put = |family: &str, help: &str, item: &str, v: u64| {
        out.gauge(
            family,
            help,
            &[("container_id", id), ("item", item)],
            v as f64,
        );
    };
    let memory = "The container's cgroup memory (bytes; a limit of 0 is none).";
    put(
        "kata_guest_container_memory",
        memory,
        "usage_bytes",
        s.memory_usage,
    );
    put(
        "kata_guest_container_memory",
        memory,
        "limit_bytes",
        s.memory_usage_limit,
    );
    put(
        "kata_guest_container_memory",
        memory,
        "swap_usage_bytes",
        s.memory_swap_usage,
    );
    put(
        "kata_guest_container_memory",
        memory,
        "swap_limit_bytes",
        s.memory_swap_limit,
    );
    for (k, v) in &s.memory_stat {
        put(
            "kata_guest_container_memory_stat",
            "The container's cgroup memory.stat.",
            k,
            *v,
        );
    }
    let events = "The container's cgroup memory.events.";
    for (item, v) in [
        ("low", s.memory_events_low),
        ("high", s.memory_events_high),
        ("max", s.memory_events_max),
        ("oom", s.memory_events_oom),
        ("oom_kill", s.memory_events_oom_kill),
    ] {
        put("kata_guest_container_memory_events", events, item, v);
    }
    let cpu = "The container's cgroup cpu.stat (microseconds, counts).";
    for (item, v) in [
        ("usage_usec", s.cpu_usage_usec),
        ("user_usec", s.cpu_user_usec),
        ("system_usec", s.cpu_system_usec),
        ("nr_periods", s.cpu_nr_periods),
        ("nr_throttled", s.cpu_nr_throttled),
        ("throttled_usec", s.cpu_throttled_usec),
    ] {
        put("kata_guest_container_cpu", cpu, item, v);
    }
    let pids = "The container's cgroup pids (a limit of 0 is none).";
    put("kata_guest_container_pids", pids, "current", s.pids_current);
    put("kata_guest_container_pids", pids, "limit", s.pids_limit);
}

/// `/proc/meminfo` keys and Kata's item names; all in kB but the huge page counts.
const MEMINFO_ITEMS: [(&str, &str); 58] = [
    ("MemTotal", "mem_total"),
    ("MemFree", "mem_free"),
    ("MemAvailable", "mem_available"),
    ("Buffers", "buffers"),
    ("Cached", "cached"),
    ("SwapCached", "swap_cached"),
    ("Active", "active"),
    ("Inactive", "inactive"),
    ("Active(anon)", "active_anon"),
    ("Inactive(anon)", "inactive_anon"),
    ("Active(file)", "active_file"),
    ("Inactive(file)", "inactive_file"),
    ("Unevictable", "unevictable"),
    ("Mlocked", "mlocked"),
    ("HighTotal", "high_total"),
    ("HighFree", "high_free"),
    ("LowTotal", "low_total"),
    ("LowFree", "low_free"),
    ("MmapCopy", "mmap_copy"),
    ("SwapTotal", "swap_total"),
    ("SwapFree", "swap_free"),
    ("Dirty", "dirty"),
    ("Writeback", "writeback"),
    ("AnonPages", "anon_pages"),
    ("Mapped", "mapped"),
    ("Shmem", "shmem"),
    ("KReclaimable", "k_reclaimable"),
    ("Slab", "slab"),
    ("SReclaimable", "s_reclaimable"),
    ("SUnreclaim", "s_unreclaim"),
    ("KernelStack", "kernel_stack"),
    ("PageTables", "page_tables"),
    ("Quicklists", "quicklists"),
    ("NFS_Unstable", "nfs_unstable"),
    ("Bounce", "bounce"),
    ("WritebackTmp", "writeback_tmp"),
    ("CommitLimit", "commit_limit"),
    ("Committed_AS", "committed_as"),
    ("VmallocTotal", "vmalloc_total"),
    ("VmallocUsed", "vmalloc_used"),
    ("VmallocChunk", "vmalloc_chunk"),
    ("Percpu", "per_cpu"),
    ("HardwareCorrupted", "hardware_corrupted"),
    ("AnonHugePages", "anon_hugepages"),
    ("ShmemHugePages", "shmem_hugepages"),
    ("ShmemPmdMapped", "shmem_pmd_mapped"),
    ("CmaTotal", "cma_total"),
    ("CmaFree", "cma_free"),
    ("HugePages_Total", "hugepages_total"),
    ("HugePages_Free", "hugepages_free"),
    ("HugePages_Rsvd", "hugepages_rsvd"),
    ("HugePages_Surp", "hugepages_surp"),
    ("Hugepagesize", "hugepagesize"),
    ("Hugetlb", "hugetlb"),
    ("DirectMap4k", "direct_map_4k"),
    ("DirectMap4M", "direct_map_4M"),
    ("DirectMap2M", "direct_map_2M"),
    ("DirectMap1G", "direct_map_1G"),
];

/// `/proc/meminfo` as Kata's items, in bytes (huge page counts as counts).
fn parse_meminfo(text: &str) -> Vec<(&'static str, u64)> {
    text.lines()
        .filter_map(|line| {
            let (key, rest) = line.split_once(':')?;
            let &(_, item) = MEMINFO_ITEMS.iter().find(|(k, _)| *k == key)?;
            let mut words = rest.split_ascii_whitespace();
            let n: u64 = words.next()?.parse().ok()?;
            let bytes = if words.next() == Some("kB") {
                n * 1024
            } else {
                n
            };
            Some((item, bytes))
        })
        .collect()
}

/// `/proc/loadavg`: the three loads, and the runnable and existing tasks.
fn parse_loadavg(text: &str) -> Option<([f64; 3], f64, f64)> {
    let f: Vec<&str> = text.split_ascii_whitespace().collect();
    let load = |i: usize| -> Option<f64> { f.get(i)?.parse().ok() };
    let (cur, max) = f.get(3)?.split_once('/')?;
    Some((
        [load(0)?, load(1)?, load(2)?],
        cur.parse().ok()?,
        max.parse().ok()?,
    ))
}

const CPU_ITEMS: [&str; 10] = [
    "user",
    "nice",
    "system",
    "idle",
    "iowait",
    "irq",
    "softirq",
    "steal",
    "guest",
    "guest_nice",
];

/// The `cpu` lines of `/proc/stat`: "total" and each CPU's number, with their ticks.
fn parse_cpu_times(text: &str) -> Vec<(String, Vec<u64>)> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split_ascii_whitespace();
            let name = f.next()?.strip_prefix("cpu")?;
            let cpu = if name.is_empty() {
                "total".to_string()
            } else {
                name.parse::<u32>().ok()?.to_string()
            };
            let values: Vec<u64> = f
                .take(CPU_ITEMS.len())
                .filter_map(|v| v.parse().ok())
                .collect();
            Some((cpu, values))
        })
        .collect()
}

const DISK_ITEMS: [&str; 17] = [
    "reads",
    "merged",
    "sectors_read",
    "time_reading",
    "writes",
    "writes_merged",
    "sectors_written",
    "time_writing",
    "in_progress",
    "time_in_progress",
    "weighted_time_in_progress",
    "discards",
    "discards_merged",
    "sectors_discarded",
    "time_discarding",
    "flushes",
    "time_flushing",
];

/// `/proc/diskstats`: each disk and its figures (as many as the kernel gives).
fn parse_diskstats(text: &str) -> Vec<(String, Vec<u64>)> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split_ascii_whitespace().skip(2);
            let name = f.next()?.to_string();
            let values: Vec<u64> = f
                .take(DISK_ITEMS.len())
                .filter_map(|v| v.parse().ok())
                .collect();
            Some((name, values))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_items_are_katas_in_bytes() {
        let text = "MemTotal:        2012345 kB\nMemAvailable:    1000 kB\n\
                    HugePages_Total:       4\nDirectMap2M:     2048 kB\nNewField:  1 kB\n";
        assert_eq!(
            parse_meminfo(text),
            vec![
                ("mem_total", 2_012_345 * 1024),
                ("mem_available", 1000 * 1024),
                ("hugepages_total", 4),
                ("direct_map_2M", 2048 * 1024),
            ]
        );
    }

    #[test]
    fn loadavg_and_cpu_lines_parse() {
        assert_eq!(
            parse_loadavg("0.50 0.25 0.10 2/87 1234\n"),
            Some(([0.5, 0.25, 0.1], 2.0, 87.0))
        );
        let stat = "cpu  10 0 5 100 1 0 2 0 0 0\ncpu0 10 0 5 100 1 0 2 0 0 0\nintr 5\nbtime 17\n";
        let cpus = parse_cpu_times(stat);
        assert_eq!(cpus.len(), 2);
        assert_eq!(cpus[0].0, "total");
        assert_eq!(cpus[1].0, "0");
        assert_eq!(cpus[0].1[3], 100);
    }

    #[test]
    fn shared_mounts_are_the_virtiofs_ones() {
        let mounts = "kataShared /run/kata-containers/shared/containers virtiofs rw 0 0\n\
                      proc /proc proc rw 0 0\n\
                      kataShared /run/kata\\040x/rootfs virtiofs rw 0 0\n";
        assert_eq!(
            shared_mounts(mounts),
            vec![
                (
                    "/run/kata-containers/shared/containers".to_string(),
                    "virtiofs".to_string()
                ),
                ("/run/kata x/rootfs".to_string(), "virtiofs".to_string()),
            ]
        );
    }

    #[test]
    fn a_containers_figures_are_labelled_with_its_id() {
        let mut out = Exposition::new();
        let s = StatsContainerResponse {
            memory_usage: 4096,
            pids_current: 2,
            ..Default::default()
        };
        write_container(&mut out, "web", &s);
        assert_eq!(
            out.value(
                "kata_guest_container_memory",
                &[("container_id", "web"), ("item", "usage_bytes")]
            ),
            Some(4096.0)
        );
        assert_eq!(
            out.value(
                "kata_guest_container_pids",
                &[("container_id", "web"), ("item", "current")]
            ),
            Some(2.0)
        );
    }

    #[tokio::test]
    async fn the_answer_is_what_the_shim_accepts() {
        let text = gather(Vec::new()).await;
        let filter = promtext::Filter {
            prefixes: &["kata_guest_", "kata_agent_"],
            reserved_labels: &["sandbox_id"],
            default_help: "Reported by the guest.",
        };
        let parsed = promtext::parse_filtered(&text, &filter, &promtext::Limits::GUEST);
        assert_eq!(parsed.dropped, 0, "{text}");
        let e = parsed.exposition;
        assert!(
            e.value("kata_guest_meminfo", &[("item", "mem_total")])
                .unwrap()
                > 0.0
        );
        assert!(e.value("kata_agent_total_rss", &[]).unwrap() > 0.0);
        assert!(e.has("kata_guest_cpu_time") && e.has("kata_guest_load"));
    }
}
