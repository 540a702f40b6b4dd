//! The guest's CPUs brought online and offline as its pod is resized in place (issue 43).
//! A VM that may grow boots with every vCPU it may be given; the kernel brings up only the
//! boot size (`maxcpus=`), and the shim asks for the count the pod is given now. CPU 0
//! stays online; a count past the VM's CPUs is refused, not rounded.
//!
//! Tasks follow on their own: PID 1's affinity is every possible CPU, so containers
//! (started by it) run on whatever is online, and cgroup v2 cpusets left empty take the
//! new CPUs as their parent's.

use std::path::{Path, PathBuf};

use crate::error::{AgentError, Result};

/// Where the kernel lists the CPUs and takes `cpuN/online`.
pub const CPU_DIR: &str = "/sys/devices/system/cpu";

/// Parses a kernel CPU list (`0-3,5,7-8`, possibly empty) into its numbers.
pub fn parse_list(text: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (a.parse::<u32>().ok()?, b.parse::<u32>().ok()?);
                if b < a || b - a > 4096 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    Some(cpus)
}

fn read_list(dir: &Path, name: &str) -> Result<Vec<u32>> {
    let path = dir.join(name);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| AgentError::Internal(format!("read {}: {e}", path.display())))?;
    parse_list(&text).ok_or_else(|| {
        AgentError::Internal(format!("{} is not a CPU list: {text:?}", path.display()))
    })
}

/// The changes that make CPUs `0..count` the online ones: `(cpu, online)`, offlining
/// first (highest first), then onlining (lowest first). CPU 0 is never touched.
pub fn changes(present: &[u32], online: &[u32], count: u32) -> Vec<(u32, bool)> {
    let mut off: Vec<_> = online
        .iter()
        .filter(|&&c| c != 0 && c >= count)
        .map(|&c| (c, false))
        .collect();
    off.sort_by_key(|c| std::cmp::Reverse(c.0));
    let mut on: Vec<_> = present
        .iter()
        .filter(|&&c| c < count && !online.contains(&c))
        .map(|&c| (c, true))
        .collect();
    on.sort_by_key(|c| c.0);
    off.extend(on);
    off
}

/// Makes CPUs `0..count` of `dir` (the sysfs CPU directory) the online ones; returns how
/// many are online after.
pub fn set_online(dir: &Path, count: u32) -> Result<u32> {
    let present = read_list(dir, "present")?;
    if count == 0 || count as usize > present.len() {
        return Err(AgentError::InvalidArgument(format!(
            "cannot bring {count} CPUs online: the VM has {} (its vCPUs at boot, ceiling included)",
            present.len()
        )));
    }
    let online = read_list(dir, "online")?;
    for (cpu, up) in changes(&present, &online, count) {
        let path: PathBuf = dir.join(format!("cpu{cpu}/online"));
        std::fs::write(&path, if up { "1" } else { "0" }).map_err(|e| {
            AgentError::Internal(format!(
                "bring CPU {cpu} {}: write {}: {e}",
                if up { "online" } else { "offline" },
                path.display()
            ))
        })?;
    }
    Ok(read_list(dir, "online")?.len() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_as_the_kernel_writes_them() {
        assert_eq!(parse_list("0-3\n"), Some(vec![0, 1, 2, 3]));
        assert_eq!(parse_list("0,2-3,5"), Some(vec![0, 2, 3, 5]));
        assert_eq!(parse_list("0"), Some(vec![0]));
        assert_eq!(parse_list("\n"), Some(vec![]));
        assert_eq!(parse_list("3-1"), None);
        assert_eq!(parse_list("x"), None);
    }

    #[test]
    fn offline_from_the_top_online_from_the_bottom_never_cpu0() {
        let present = [0, 1, 2, 3];
        assert_eq!(changes(&present, &[0], 3), vec![(1, true), (2, true)]);
        assert_eq!(
            changes(&present, &[0, 1, 2, 3], 1),
            vec![(3, false), (2, false), (1, false)]
        );
        assert_eq!(changes(&present, &[0, 1], 2), vec![]);
        // A hole (CPU 1 offlined by hand) is filled before anything above is kept.
        assert_eq!(
            changes(&present, &[0, 2, 3], 2),
            vec![(3, false), (2, false), (1, true)]
        );
    }

    #[test]
    fn counts_past_the_vm_or_zero_are_refused_and_a_fake_sysfs_follows() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("present"), "0-2\n").unwrap();
        std::fs::write(dir.path().join("online"), "0\n").unwrap();
        for c in 1..=2 {
            std::fs::create_dir(dir.path().join(format!("cpu{c}"))).unwrap();
        }
        let e = set_online(dir.path(), 4).unwrap_err().to_string();
        assert!(e.contains("the VM has 3"), "{e}");
        assert!(set_online(dir.path(), 0).is_err());
        // sysfs would update `online` itself; the fake does not, so only the writes count.
        set_online(dir.path(), 3).unwrap();
        for c in 1..=2 {
            let v = std::fs::read_to_string(dir.path().join(format!("cpu{c}/online"))).unwrap();
            assert_eq!(v, "1");
        }
    }
}
