//! The sandbox's cgroup on the host.
//!
//! The sandbox container's `linux.cgroupsPath` names the pod's cgroup on the node (under
//! kubelet's `cgroup_parent`). The VMM and its helpers start in it (see
//! `hypervisor::VmConfig::cgroup`), so the node accounts for what the pod really costs
//! and containerd's PodSandboxStats reads it from the pod's cgroup. On a host with cgroup
//! v1 hierarchies (hybrid included) the cgroup is made in every v1 hierarchy, as runc
//! does; on a pure v2 host, in the unified one. Directories the shim made are removed at
//! teardown, deepest first; those it found (kubelet's) stay.
//!
//! `cgroupsPath` comes in two spellings: a path (`/kubepods/burstable/pod…/ID`, cgroupfs
//! driver) or systemd's `slice:prefix:name` (`kubepods-burstable-pod….slice:cri-containerd:ID`),
//! which maps to `/kubepods.slice/kubepods-burstable.slice/…/cri-containerd-ID.scope`.
//! The shim makes that directory itself; it does not ask systemd for a scope.

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error(
        "linux.cgroupsPath {path:?} is not a cgroup path: {why}; expected an absolute \
         path such as /kubepods/pod1234/ID or systemd's slice:prefix:name"
    )]
    BadPath { path: String, why: &'static str },
    #[error("cannot read the host's cgroup mounts from /proc/self/mountinfo: {0}")]
    Mounts(#[source] std::io::Error),
    #[error("the host has no cgroup hierarchy mounted")]
    NoHierarchy,
    #[error("cannot create the sandbox's cgroup {}: {source}", path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The sandbox's cgroup, one directory per hierarchy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostCgroup {
    /// Where the VMM and helpers go, one per hierarchy.
    pub dirs: Vec<PathBuf>,
    /// The directories made here, parents first (removed in reverse).
    pub created: Vec<PathBuf>,
}

/// The relative cgroup path `cgroups_path` names.
pub fn relative_path(cgroups_path: &str) -> Result<PathBuf, CgroupError> {
    let bad = |why| CgroupError::BadPath {
        path: cgroups_path.to_string(),
        why,
    };
    let rel = if cgroups_path.starts_with('/') {
        PathBuf::from(cgroups_path.trim_start_matches('/'))
    } else {
        let parts: Vec<&str> = cgroups_path.split(':').collect();
        let [slice, prefix, name] = parts[..] else {
            return Err(bad("a relative path must be systemd's slice:prefix:name"));
        };
        if !slice.ends_with(".slice") || name.is_empty() {
            return Err(bad("the systemd form needs a .slice and a name"));
        }
        let mut rel = expand_slice(slice);
        let unit = if name.ends_with(".slice") {
            name.to_string()
        } else if prefix.is_empty() {
            format!("{name}.scope")
        } else {
            format!("{prefix}-{name}.scope")
        };
        rel.push(unit);
        rel
    };
    if rel.as_os_str().is_empty() {
        return Err(bad("it names the root cgroup"));
    }
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(bad("it holds `.` or `..`"));
    }
    Ok(rel)
}

/// `a-b-c.slice` → `a.slice/a-b.slice/a-b-c.slice` (systemd nests slices by dashes).
fn expand_slice(slice: &str) -> PathBuf {
    let stem = slice.trim_end_matches(".slice");
    if stem.is_empty() || stem == "-" {
        return PathBuf::new();
    }
    let mut out = PathBuf::new();
    let mut acc = String::new();
    for part in stem.split('-') {
        if !acc.is_empty() {
            acc.push('-');
        }
        acc.push_str(part);
        out.push(format!("{acc}.slice"));
    }
    out
}

/// The hierarchies to use: every v1 mount if there is one, else the v2 mount.
pub fn hierarchies() -> Result<Vec<PathBuf>, CgroupError> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").map_err(CgroupError::Mounts)?;
    Ok(hierarchies_in(&text))
}

fn hierarchies_in(mountinfo: &str) -> Vec<PathBuf> {
    let mut v1 = Vec::new();
    let mut v2 = Vec::new();
    for line in mountinfo.lines() {
        // "... MOUNT_POINT OPTIONS [optional fields] - FSTYPE SOURCE SUPER_OPTIONS"
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let fstype = right.split_whitespace().next().unwrap_or("");
        let Some(mount_point) = left.split_whitespace().nth(4) else {
            continue;
        };
        let path = PathBuf::from(mount_point.replace("\\040", " "));
        match fstype {
            "cgroup" if !v1.contains(&path) => v1.push(path),
            "cgroup2" if !v2.contains(&path) => v2.push(path),
            _ => {}
        }
    }
    if v1.is_empty() {
        v2
    } else {
        v1
    }
}

/// Makes the cgroup `cgroups_path` in every hierarchy. All or nothing.
pub fn create(cgroups_path: &str) -> Result<HostCgroup, CgroupError> {
    let rel = relative_path(cgroups_path)?;
    let roots = hierarchies()?;
    if roots.is_empty() {
        return Err(CgroupError::NoHierarchy);
    }
    let mut cg = HostCgroup::default();
    for root in &roots {
        if let Err(e) = make_path(root, &rel, &mut cg.created) {
            remove(&cg.created);
            return Err(e);
        }
        cg.dirs.push(root.join(&rel));
    }
    Ok(cg)
}

/// Makes `root/rel` one level at a time, recording each directory it made.
fn make_path(root: &Path, rel: &Path, created: &mut Vec<PathBuf>) -> Result<(), CgroupError> {
    let mut dir = root.to_path_buf();
    for part in rel.components() {
        let parent = dir.clone();
        dir.push(part);
        if dir.is_dir() {
            continue;
        }
        match std::fs::create_dir(&dir) {
            Ok(()) => {
                created.push(dir.clone());
                inherit_cpuset(&parent, &dir);
            }
            // Another sandbox made it at the same moment.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(source) => {
                return Err(CgroupError::Create {
                    path: dir.clone(),
                    source,
                })
            }
        }
    }
    Ok(())
}

/// A new v1 cpuset cgroup starts with no CPUs and no memory nodes, and takes no task
/// until given some: it gets its parent's.
fn inherit_cpuset(parent: &Path, dir: &Path) {
    for file in ["cpuset.cpus", "cpuset.mems"] {
        let mine = dir.join(file);
        let empty = std::fs::read_to_string(&mine).is_ok_and(|v| v.trim().is_empty());
        if empty {
            if let Ok(v) = std::fs::read_to_string(parent.join(file)) {
                let _ = std::fs::write(&mine, v.trim());
            }
        }
    }
}

/// Removes the directories made by [`create`] (deepest first). A directory that still
/// holds processes (they were just killed and may not have left yet) is retried for a
/// moment; one another sandbox uses as a parent stays.
pub fn remove(created: &[PathBuf]) {
    for dir in created.iter().rev() {
        for attempt in 0..20 {
            match std::fs::remove_dir(dir) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && attempt < 19 => {
                    std::thread::sleep(Duration::from_millis(25));
                }
                Err(_) => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroupfs_paths_are_taken_as_they_are() {
        assert_eq!(
            relative_path("/kubepods/besteffort/pod12/abc").expect("path"),
            PathBuf::from("kubepods/besteffort/pod12/abc")
        );
        assert_eq!(
            relative_path("/default/x").expect("path"),
            PathBuf::from("default/x")
        );
    }

    #[test]
    fn systemd_paths_expand_their_slices() {
        assert_eq!(
            relative_path("kubepods-besteffort-pod12.slice:cri-containerd:abc").expect("path"),
            PathBuf::from(
                "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod12.slice/cri-containerd-abc.scope"
            )
        );
        assert_eq!(
            relative_path("system.slice:docker:abc").expect("path"),
            PathBuf::from("system.slice/docker-abc.scope")
        );
    }

    #[test]
    fn bad_paths_say_what_is_expected() {
        for bad in ["/", "x/y", "a.slice:b", "/a/../b", "nope:cri:abc"] {
            let e = relative_path(bad).expect_err(bad).to_string();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
            assert!(e.contains("expected an absolute path"), "{e}");
        }
    }

    #[test]
    fn v1_hierarchies_win_over_the_unified_one() {
        let hybrid = "\
30 24 0:26 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw
31 24 0:27 / /sys/fs/cgroup/memory rw,nosuid shared:9 - cgroup cgroup rw,memory
32 24 0:28 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
33 24 0:29 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
";
        assert_eq!(
            hierarchies_in(hybrid),
            vec![
                PathBuf::from("/sys/fs/cgroup/memory"),
                PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"),
                PathBuf::from("/sys/fs/cgroup/pids"),
            ]
        );
        let v2 = "30 24 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n";
        assert_eq!(hierarchies_in(v2), vec![PathBuf::from("/sys/fs/cgroup")]);
    }
}
