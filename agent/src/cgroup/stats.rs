//! A container cgroup's figures for StatsContainer: pids, cpu.stat, memory and its
//! events. "max" reads as 0 (no limit). A file whose controller the guest kernel lacks
//! (e.g. `memory.swap.*` without swap support) reads as 0 too.

use std::collections::BTreeMap;
use std::path::Path;

use protocols::agent::StatsContainerResponse;

use super::{read_optional, CgroupError};

/// Reads every figure of the cgroup at `dir`.
pub fn read(dir: &Path) -> Result<StatsContainerResponse, CgroupError> {
    if !dir.is_dir() {
        return Err(CgroupError::Read {
            path: dir.to_path_buf(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        });
    }
    let single = |file: &str| -> Result<u64, CgroupError> {
        Ok(read_optional(dir, file)?.map_or(0, |t| parse_single(&t)))
    };
    let keyed = |file: &str| -> Result<BTreeMap<String, u64>, CgroupError> {
        Ok(read_optional(dir, file)?.map_or_else(BTreeMap::new, |t| parse_keyed(&t)))
    };

    let cpu = keyed("cpu.stat")?;
    let events = keyed("memory.events")?;
    let get = |map: &BTreeMap<String, u64>, key: &str| map.get(key).copied().unwrap_or(0);
    Ok(StatsContainerResponse {
        pids_current: single("pids.current")?,
        pids_limit: single("pids.max")?,
        cpu_usage_usec: get(&cpu, "usage_usec"),
        cpu_user_usec: get(&cpu, "user_usec"),
        cpu_system_usec: get(&cpu, "system_usec"),
        cpu_nr_periods: get(&cpu, "nr_periods"),
        cpu_nr_throttled: get(&cpu, "nr_throttled"),
        cpu_throttled_usec: get(&cpu, "throttled_usec"),
        memory_usage: single("memory.current")?,
        memory_usage_limit: single("memory.max")?,
        memory_swap_usage: single("memory.swap.current")?,
        memory_swap_limit: single("memory.swap.max")?,
        memory_stat: keyed("memory.stat")?.into_iter().collect(),
        memory_events_low: get(&events, "low"),
        memory_events_high: get(&events, "high"),
        memory_events_max: get(&events, "max"),
        memory_events_oom: get(&events, "oom"),
        memory_events_oom_kill: get(&events, "oom_kill"),
        ..Default::default()
    })
}

/// A single-value file such as `memory.max`: a number, or "max" (= 0, no limit).
pub fn parse_single(text: &str) -> u64 {
    text.trim().parse().unwrap_or(0)
}

/// A flat-keyed file such as `cpu.stat` or `memory.stat`: "key value" lines. Lines
/// whose value is not a number are skipped.
pub fn parse_keyed(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|line| {
            let (key, value) = line.split_once(' ')?;
            Some((key.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_single_values() {
        assert_eq!(parse_single("33554432\n"), 33_554_432);
        assert_eq!(parse_single("max\n"), 0);
    }

    #[test]
    fn parses_keyed_files() {
        let cpu = "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nnr_periods 3\n\
                   nr_throttled 1\nthrottled_usec 42\n";
        let map = parse_keyed(cpu);
        assert_eq!(map["usage_usec"], 1500);
        assert_eq!(map["throttled_usec"], 42);
        assert_eq!(map.len(), 6);
        assert!(parse_keyed("weird line\nanon 4096\n").contains_key("anon"));
    }

    #[test]
    fn reads_a_cgroup_dir() {
        let dir = std::env::temp_dir().join(format!("cg-stats-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let files = [
            ("pids.current", "2\n"),
            ("pids.max", "max\n"),
            ("cpu.stat", "usage_usec 10\nuser_usec 7\nsystem_usec 3\n"),
            ("memory.current", "4096\n"),
            ("memory.max", "33554432\n"),
            ("memory.stat", "anon 1024\nfile 2048\npgfault 9\n"),
            (
                "memory.events",
                "low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\n",
            ),
        ];
        for (f, text) in files {
            std::fs::write(dir.join(f), text).expect("seed");
        }
        let s = read(&dir).expect("stats");
        assert_eq!((s.pids_current, s.pids_limit), (2, 0));
        assert_eq!(
            (s.cpu_usage_usec, s.cpu_user_usec, s.cpu_system_usec),
            (10, 7, 3)
        );
        assert_eq!((s.memory_usage, s.memory_usage_limit), (4096, 33_554_432));
        assert_eq!((s.memory_swap_usage, s.memory_swap_limit), (0, 0));
        assert_eq!(s.memory_stat.get("file"), Some(&2048));
        assert_eq!(s.memory_stat.len(), 3);
        assert_eq!(
            (
                s.memory_events_max,
                s.memory_events_oom,
                s.memory_events_oom_kill
            ),
            (12, 2, 1)
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
        assert!(read(&dir).is_err());
    }
}
