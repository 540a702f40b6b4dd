//! The sandbox's host cgroup (the VMM and its helpers) read in the terms the agent uses
//! for a container's guest cgroup (`StatsContainerResponse`: cgroup v2's names and
//! units), on cgroup v1 and v2 hosts alike. The shim turns either into containerd's
//! metrics message.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use protocols::agent::StatsContainerResponse;

use crate::cgroup::HostCgroup;

/// The figures of the sandbox's host cgroup, in cgroup v2's names and units : from its one unified cgroup, or from whichever v1 hierarchy
/// holds each controller. None when the sandbox has no host cgroup. A figure whose file
/// is missing (a controller the hierarchy lacks) reads as 0.
pub fn host_figures(cg: &HostCgroup) -> Option<StatsContainerResponse> {
    if cg.dirs.is_empty() {
        return None;
    }
    Some(if cg.unified {
        unified_figures(&cg.dirs[0])
    } else {
        v1_figures(&cg.dirs)
    })
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// A single-value file: a number; "max" (no limit) and anything else read as 0.
fn single(path: &Path) -> u64 {
    read(path).and_then(|t| t.trim().parse().ok()).unwrap_or(0)
}

/// A flat-keyed file ("key value" lines); lines whose value is not a number are skipped.
fn keyed(path: &Path) -> BTreeMap<String, u64> {
    read(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

fn unified_figures(dir: &Path) -> StatsContainerResponse {
    let cpu = keyed(&dir.join("cpu.stat"));
    let events = keyed(&dir.join("memory.events"));
    let get = |m: &BTreeMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0);
    StatsContainerResponse {
        pids_current: single(&dir.join("pids.current")),
        pids_limit: single(&dir.join("pids.max")),
        cpu_usage_usec: get(&cpu, "usage_usec"),
        cpu_user_usec: get(&cpu, "user_usec"),
        cpu_system_usec: get(&cpu, "system_usec"),
        cpu_nr_periods: get(&cpu, "nr_periods"),
        cpu_nr_throttled: get(&cpu, "nr_throttled"),
        cpu_throttled_usec: get(&cpu, "throttled_usec"),
        memory_usage: single(&dir.join("memory.current")),
        memory_usage_limit: single(&dir.join("memory.max")),
        memory_swap_usage: single(&dir.join("memory.swap.current")),
        memory_swap_limit: single(&dir.join("memory.swap.max")),
        memory_stat: keyed(&dir.join("memory.stat")).into_iter().collect(),
        memory_events_low: get(&events, "low"),
        memory_events_high: get(&events, "high"),
        memory_events_max: get(&events, "max"),
        memory_events_oom: get(&events, "oom"),
        memory_events_oom_kill: get(&events, "oom_kill"),
        ..Default::default()
    }
}

/// v1 `memory.stat` keys (totals over the subtree) and their v2 names.
const V1_MEMORY_STAT: &[(&str, &str)] = &[
    ("total_rss", "anon"),
    ("total_cache", "file"),
    ("total_shmem", "shmem"),
    ("total_mapped_file", "file_mapped"),
    ("total_dirty", "file_dirty"),
    ("total_writeback", "file_writeback"),
    ("total_rss_huge", "anon_thp"),
    ("total_inactive_anon", "inactive_anon"),
    ("total_active_anon", "active_anon"),
    ("total_inactive_file", "inactive_file"),
    ("total_active_file", "active_file"),
    ("total_unevictable", "unevictable"),
    ("total_pgfault", "pgfault"),
    ("total_pgmajfault", "pgmajfault"),
];

/// A v1 memory limit: "unlimited" is the largest page-aligned i64, read as 0 as v2's "max".
fn v1_limit(bytes: u64) -> u64 {
    if bytes >= 1 << 62 {
        0
    } else {
        bytes
    }
}

fn v1_figures(dirs: &[PathBuf]) -> StatsContainerResponse {
    // The hierarchy of each controller: the one whose cgroup has its files.
    let with = |file: &str| dirs.iter().find(|d| d.join(file).exists());
    let mut s = StatsContainerResponse::default();
    if let Some(d) = with("cpuacct.usage") {
        s.cpu_usage_usec = single(&d.join("cpuacct.usage")) / 1000;
        s.cpu_user_usec = single(&d.join("cpuacct.usage_user")) / 1000;
        s.cpu_system_usec = single(&d.join("cpuacct.usage_sys")) / 1000;
    }
    if let Some(d) = with("cpu.cfs_period_us") {
        let cpu = keyed(&d.join("cpu.stat"));
        let get = |k: &str| cpu.get(k).copied().unwrap_or(0);
        s.cpu_nr_periods = get("nr_periods");
        s.cpu_nr_throttled = get("nr_throttled");
        s.cpu_throttled_usec = get("throttled_time") / 1000;
    }
    if let Some(d) = with("memory.usage_in_bytes") {
        s.memory_usage = single(&d.join("memory.usage_in_bytes"));
        s.memory_usage_limit = v1_limit(single(&d.join("memory.limit_in_bytes")));
        let stat = keyed(&d.join("memory.stat"));
        for (v1, v2) in V1_MEMORY_STAT {
            if let Some(v) = stat.get(*v1) {
                s.memory_stat.insert(v2.to_string(), *v);
            }
        }
        let oom = keyed(&d.join("memory.oom_control"));
        s.memory_events_oom_kill = oom.get("oom_kill").copied().unwrap_or(0);
        s.memory_events_max = single(&d.join("memory.failcnt"));
    }
    if let Some(d) = with("pids.current") {
        s.pids_current = single(&d.join("pids.current"));
        s.pids_limit = single(&d.join("pids.max"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn write_files(dir: &Path, files: &[(&str, &str)]) {
        std::fs::create_dir_all(dir).expect("mkdir");
        for (name, text) in files {
            std::fs::write(dir.join(name), text).expect("write");
        }
    }

    #[test]
    fn a_v2_host_cgroup_is_read_from_its_unified_files() {
        let tree = tempfile::tempdir().expect("tempdir");
        let dir = tree.path().join("kubepods/pod1/sb");
        write_files(
            &dir,
            &[
                ("cgroup.procs", "42\n"),
                ("cpu.stat", "usage_usec 2500\nuser_usec 2000\nsystem_usec 500\nnr_periods 4\nnr_throttled 1\nthrottled_usec 9\n"),
                ("memory.current", "1048576\n"),
                ("memory.max", "max\n"),
                ("memory.stat", "anon 4096\nfile 8192\npgfault 3\n"),
                ("memory.events", "low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\n"),
                ("pids.current", "3\n"),
                ("pids.max", "1024\n"),
            ],
        );
        let cg = HostCgroup {
            dirs: vec![dir],
            created: Vec::new(),
            unified: true,
        };
        let f = host_figures(&cg).expect("figures");
        let stat = |key: &str| f.memory_stat.get(key).copied().unwrap_or(0);
        assert_eq!(
            (f.cpu_usage_usec, f.cpu_user_usec, f.cpu_system_usec),
            (2500, 2000, 500)
        );
        assert_eq!(
            (f.cpu_nr_periods, f.cpu_nr_throttled, f.cpu_throttled_usec),
            (4, 1, 9)
        );
        assert_eq!((f.memory_usage, f.memory_usage_limit), (1048576, 0));
        assert_eq!(
            (stat("anon"), stat("file"), stat("pgfault")),
            (4096, 8192, 3)
        );
        assert_eq!((f.memory_events_max, f.memory_events_oom_kill), (2, 1));
        assert_eq!((f.pids_current, f.pids_limit), (3, 1024));
    }

    #[test]
    fn a_v2_host_cgroup_without_controllers_still_has_its_cpu_usage() {
        // What a cgroup of a hierarchy with no controller enabled holds.
        let tree = tempfile::tempdir().expect("tempdir");
        write_files(
            tree.path(),
            &[("cpu.stat", "usage_usec 70\nuser_usec 50\nsystem_usec 20\n")],
        );
        let cg = HostCgroup {
            dirs: vec![tree.path().to_path_buf()],
            created: Vec::new(),
            unified: true,
        };
        let f = host_figures(&cg).expect("figures");
        assert_eq!(
            (f.cpu_usage_usec, f.memory_usage, f.pids_current),
            (70, 0, 0)
        );
        assert!(host_figures(&HostCgroup::default()).is_none());
    }

    #[test]
    fn a_v1_host_cgroup_is_read_from_each_controllers_hierarchy() {
        let tree = tempfile::tempdir().expect("tempdir");
        let at = |h: &str| tree.path().join(h).join("kubepods/pod1/sb");
        write_files(
            &at("cpu"),
            &[
                ("tasks", ""),
                ("cpu.cfs_period_us", "100000\n"),
                (
                    "cpu.stat",
                    "nr_periods 5\nnr_throttled 2\nthrottled_time 7000\n",
                ),
            ],
        );
        write_files(
            &at("cpuacct"),
            &[
                ("tasks", ""),
                ("cpuacct.usage", "3000000\n"),
                ("cpuacct.usage_user", "2000000\n"),
                ("cpuacct.usage_sys", "1000000\n"),
            ],
        );
        write_files(
            &at("memory"),
            &[
                ("tasks", ""),
                ("memory.usage_in_bytes", "2097152\n"),
                ("memory.limit_in_bytes", "9223372036854771712\n"),
                ("memory.failcnt", "0\n"),
                (
                    "memory.oom_control",
                    "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
                ),
                (
                    "memory.stat",
                    "cache 1\nrss 2\ntotal_cache 8192\ntotal_rss 4096\ntotal_pgfault 11\n",
                ),
            ],
        );
        write_files(
            &at("pids"),
            &[
                ("tasks", ""),
                ("pids.current", "4\n"),
                ("pids.max", "max\n"),
            ],
        );
        write_files(&at("systemd"), &[("tasks", "")]);
        let cg = HostCgroup {
            dirs: ["systemd", "pids", "memory", "cpuacct", "cpu"]
                .iter()
                .map(|h| at(h))
                .collect(),
            created: Vec::new(),
            unified: false,
        };
        let f = host_figures(&cg).expect("figures");
        let stat = |key: &str| f.memory_stat.get(key).copied().unwrap_or(0);
        assert_eq!(
            (f.cpu_usage_usec, f.cpu_user_usec, f.cpu_system_usec),
            (3000, 2000, 1000)
        );
        assert_eq!(
            (f.cpu_nr_periods, f.cpu_nr_throttled, f.cpu_throttled_usec),
            (5, 2, 7)
        );
        assert_eq!((f.memory_usage, f.memory_usage_limit), (2097152, 0));
        // The subtree's totals under their v2 names.
        assert_eq!(
            (stat("anon"), stat("file"), stat("pgfault")),
            (4096, 8192, 11)
        );
        assert_eq!(f.memory_events_oom_kill, 1);
        assert_eq!((f.pids_current, f.pids_limit), (4, 0));

        std::fs::write(at("memory").join("memory.limit_in_bytes"), "536870912\n").expect("w");
        let f = host_figures(&cg).expect("figures");
        assert_eq!(f.memory_usage_limit, 536870912);
    }
}
