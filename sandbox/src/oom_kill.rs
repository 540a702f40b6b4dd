//! The host kernel's OOM killer in the pod's cgroup: whether it killed the VMM, and the
//! reason the pod's containers end with when it did.
//!
//! The VMM, virtiofsd and kata-vsock run in the sandbox's host cgroup, below the pod's
//! cgroup that kubelet limits to the containers' limits plus the RuntimeClass's
//! `overhead.podFixed.memory`. An overhead below what the VM costs on the host lets the
//! kernel OOM-kill the VMM (SIGKILL) once the guest touches enough memory. The cgroup's
//! own counter says so (v1 `memory.oom_control` / v2 `memory.events`, `oom_kill`: kills
//! of its processes), and the limit that was hit is the smallest one from the cgroup up
//! (v1 `memory.stat` `hierarchical_memory_limit`, v2 each level's `memory.max`).
//!
//! Reads cgroup files only; changes nothing.

use std::path::{Path, PathBuf};

const MIB: u64 = 1 << 20;

/// What QEMU, its TCG translation cache, virtiofsd and kata-vsock take on the host beyond
/// the guest's memory, measured under TCG (deploy/kubernetes/runtimeclass.yaml).
pub const VMM_HOST_OVERHEAD_MIB: u64 = 84;

/// The sandbox's cgroup in the memory hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryCgroup {
    dir: PathBuf,
    unified: bool,
}

/// An OOM kill counted in the sandbox's cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomKill {
    /// The cgroup whose limit was hit (the pod's, normally), as a cgroup path
    /// (`/kubepods/burstable/pod…`), and that limit; None: no limit, the host ran out.
    pub limit: Option<(String, u64)>,
}

/// What the pod asked for, to say what the VM needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PodMemory {
    /// The VM's guest memory.
    pub vm_mib: u64,
    /// The containers' summed memory limits (the CRI's sandbox-memory annotation); 0: none.
    pub limits_bytes: u64,
}

impl MemoryCgroup {
    /// The memory hierarchy's directory among the sandbox cgroup's `dirs`.
    pub fn among(dirs: &[PathBuf]) -> Option<Self> {
        dirs.iter().find_map(|d| {
            if d.join("memory.oom_control").exists() {
                Some(MemoryCgroup {
                    dir: d.clone(),
                    unified: false,
                })
            } else if d.join("memory.events").exists() {
                Some(MemoryCgroup {
                    dir: d.clone(),
                    unified: true,
                })
            } else {
                None
            }
        })
    }

    /// How many of the cgroup's processes the OOM killer has killed so far.
    pub fn oom_kills(&self) -> u64 {
        let file = if self.unified {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        std::fs::read_to_string(self.dir.join(file))
            .ok()
            .and_then(|t| field(&t, "oom_kill"))
            .unwrap_or(0)
    }

    /// An OOM kill since `before` kills were counted, with the limit that was hit.
    pub fn kill_since(&self, before: u64) -> Option<OomKill> {
        (self.oom_kills() > before).then(|| OomKill {
            limit: self.limit(),
        })
    }

    /// The smallest memory limit from this cgroup up, and the cgroup that sets it.
    fn limit(&self) -> Option<(String, u64)> {
        let mut best: Option<(PathBuf, u64)> = None;
        let mut dir = self.dir.clone();
        loop {
            let file = if self.unified {
                "memory.max"
            } else {
                "memory.limit_in_bytes"
            };
            let Ok(text) = std::fs::read_to_string(dir.join(file)) else {
                break;
            };
            if let Ok(v) = text.trim().parse::<u64>() {
                // v1 says "no limit" with a huge page-rounded number.
                if v < (1 << 62) && best.as_ref().is_none_or(|(_, b)| v <= *b) {
                    best = Some((dir.clone(), v));
                }
            }
            if !dir.pop() {
                break;
            }
        }
        let (dir, v) = best?;
        Some((cgroup_path(&dir, self.unified), v))
    }
}

/// `/sys/fs/cgroup/memory/kubepods/pod1` → `/kubepods/pod1`: below the hierarchy's mount,
/// which is `/sys/fs/cgroup/<controllers>` on v1 and `/sys/fs/cgroup` on v2.
fn cgroup_path(dir: &Path, unified: bool) -> String {
    let Ok(rel) = dir.strip_prefix("/sys/fs/cgroup") else {
        return dir.display().to_string();
    };
    let mut parts = rel.components();
    if !unified {
        parts.next();
    }
    format!("/{}", parts.as_path().display())
}

/// The number after `key ` in a flat-keyed cgroup file.
fn field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

fn mib(bytes: u64) -> u64 {
    bytes.div_ceil(MIB)
}

/// Why the pod's containers ended, for the shim's log, each container's termination
/// message and the exit kubelet shows. `victim` names the killed process
/// (`the VMM qemu-system-x86 (pid 812)`).
pub fn reason(kill: &OomKill, victim: &str, pod: &PodMemory) -> String {
    let needed = pod.vm_mib + VMM_HOST_OVERHEAD_MIB;
    let vm = format!(
        "the VM needs about {needed} MiB on the host ({} MiB of guest memory + about \
         {VMM_HOST_OVERHEAD_MIB} MiB for the VMM and its helpers)",
        pod.vm_mib
    );
    let limits = mib(pod.limits_bytes);
    let overhead = needed.saturating_sub(limits);
    match &kill.limit {
        Some((cgroup, limit)) => {
            let limit = mib(*limit);
            let now = match limit.checked_sub(limits) {
                Some(now) => format!("it is {now} MiB"),
                None => "the limit is below even the containers' limits".into(),
            };
            format!(
                "the pod's cgroup {cgroup} is too small for its VM: the host kernel's OOM killer \
                 killed {victim} at the cgroup's memory limit of {limit} MiB; {vm}, and the \
                 containers' memory limits add up to {limits} MiB, so the pod's overhead must \
                 be at least {overhead} MiB ({now}): set the RuntimeClass's \
                 overhead.podFixed.memory to {overhead}Mi or more"
            )
        }
        None => format!(
            "the host ran out of memory and its OOM killer killed {victim} (the pod's cgroup has \
             no memory limit); {vm}: give the pod memory limits and the RuntimeClass \
             overhead.podFixed.memory of at least {overhead}Mi, so that the node reserves it"
        ),
    }
}

/// Who the OOM killer killed, from the watchdog's `cause`: the process it names when
/// that was killed by SIGKILL (`the VMM qemu (pid 7)`), else a process of the sandbox,
/// with the cause (the killed one may not have been the first to end).
pub fn victim(cause: &str) -> String {
    match cause.strip_suffix(" was killed by signal 9") {
        Some(killed) => killed.to_string(),
        None => format!("a process of the sandbox (then {cause})"),
    }
}

/// The host file of kubelet's termination message among a container's OCI `spec` mounts:
/// a bind of `<kubelet root>/pods/<uid>/containers/<container name>/<file>`.
pub fn termination_log(spec: &serde_json::Value) -> Option<PathBuf> {
    spec.get("mounts")?.as_array()?.iter().find_map(|m| {
        let source = Path::new(m.get("source")?.as_str()?);
        let parts: Vec<&std::ffi::OsStr> = source.iter().collect();
        let n = parts.len();
        (n >= 5 && parts[n - 3] == "containers" && parts[n - 5] == "pods")
            .then(|| source.to_path_buf())
    })
}

/// Writes `text` as the container's termination message when it has not written one.
pub fn write_termination_log(path: &Path, text: &str) -> std::io::Result<bool> {
    if std::fs::metadata(path)?.len() > 0 {
        return Ok(false);
    }
    std::fs::write(path, text)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kill_counter_is_read_from_the_flat_keyed_file() {
        assert_eq!(
            field("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", "oom_kill"),
            Some(3)
        );
        assert_eq!(
            field(
                "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\noom_group_kill 0\n",
                "oom_kill"
            ),
            Some(1)
        );
        assert_eq!(field("under_oom 0\n", "oom_kill"), None);
    }

    #[test]
    fn a_v1_cgroup_counts_kills_and_finds_the_limit_above_it() {
        let root = tempfile::tempdir().unwrap();
        let pod = root.path().join("kubepods/pod1");
        let sb = pod.join("sb1");
        std::fs::create_dir_all(&sb).unwrap();
        std::fs::write(
            root.path().join("kubepods/memory.limit_in_bytes"),
            "9223372036854771712\n",
        )
        .unwrap();
        std::fs::write(
            pod.join("memory.limit_in_bytes"),
            format!("{}\n", 300 * MIB),
        )
        .unwrap();
        std::fs::write(sb.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        std::fs::write(
            sb.join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
        )
        .unwrap();
        let cg = MemoryCgroup::among(&[root.path().join("cpu"), sb.clone()]).unwrap();
        assert!(!cg.unified);
        assert_eq!(cg.kill_since(0), None, "no kill yet");
        std::fs::write(
            sb.join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
        )
        .unwrap();
        let kill = cg.kill_since(0).expect("a kill");
        let (cgroup, limit) = kill.limit.expect("the pod's limit");
        assert_eq!(limit, 300 * MIB);
        assert!(cgroup.ends_with("/kubepods/pod1"), "{cgroup}");
        assert_eq!(
            cgroup_path(Path::new("/sys/fs/cgroup/memory/kubepods/pod1"), false),
            "/kubepods/pod1"
        );
        assert_eq!(
            cgroup_path(Path::new("/sys/fs/cgroup/kubepods/pod1"), true),
            "/kubepods/pod1"
        );
        assert_eq!(
            cg.kill_since(1),
            None,
            "kills before the sandbox ran do not count"
        );
    }

    #[test]
    fn the_reason_names_the_cgroup_the_limit_the_need_and_the_overhead_to_set() {
        let kill = OomKill {
            limit: Some(("/kubepods/burstable/pod1".into(), 300 * MIB)),
        };
        let pod = PodMemory {
            vm_mib: 325,
            limits_bytes: 224 * MIB,
        };
        let text = reason(&kill, "the VMM qemu-system-x86 (pid 7)", &pod);
        for want in [
            "cgroup /kubepods/burstable/pod1",
            "killed the VMM qemu-system-x86 (pid 7)",
            "memory limit of 300 MiB",
            "about 409 MiB on the host (325 MiB of guest memory + about 84 MiB",
            "add up to 224 MiB",
            "at least 185 MiB (it is 76 MiB)",
            "overhead.podFixed.memory to 185Mi or more",
        ] {
            assert!(text.contains(want), "{want:?} missing from: {text}");
        }
        let host = reason(&OomKill { limit: None }, "the VMM q (pid 7)", &pod);
        assert!(host.contains("the host ran out of memory"), "{host}");
    }

    #[test]
    fn the_victim_is_the_process_killed_by_sigkill() {
        assert_eq!(
            victim("the VMM qemu (pid 7) was killed by signal 9"),
            "the VMM qemu (pid 7)"
        );
        assert_eq!(
            victim("helper virtiofsd (pid 8) exited with status 0"),
            "a process of the sandbox (then helper virtiofsd (pid 8) exited with status 0)"
        );
    }

    #[test]
    fn kubelets_termination_message_file_is_found_among_the_mounts() {
        let spec = serde_json::json!({"mounts": [
            {"destination": "/etc/hosts", "source": "/var/lib/kubelet/pods/u1/etc-hosts", "type": "bind"},
            {"destination": "/dev/termination-log", "type": "bind",
             "source": "/var/lib/kubelet/pods/u1/containers/c/0a1b2c3d"},
        ]});
        assert_eq!(
            termination_log(&spec),
            Some(PathBuf::from(
                "/var/lib/kubelet/pods/u1/containers/c/0a1b2c3d"
            ))
        );
        assert_eq!(termination_log(&serde_json::json!({"mounts": []})), None);
    }

    #[test]
    fn a_termination_message_the_container_wrote_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("msg");
        std::fs::write(&f, "").unwrap();
        assert!(write_termination_log(&f, "ours").unwrap());
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "ours");
        assert!(!write_termination_log(&f, "again").unwrap());
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "ours");
    }
}
