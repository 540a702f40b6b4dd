//! The sandbox's cgroup on the host.
//!
//! The sandbox container's `linux.cgroupsPath` names the pod's cgroup on the node (under
//! kubelet's `cgroup_parent`). The VMM and its helpers start in it (see
//! `hypervisor::VmConfig::cgroup`), so the node accounts for what the pod really costs
//! and containerd's PodSandboxStats, which reads the pod's cgroup (the sandbox's parent)
//! itself, counts the VM. On a host with cgroup v1 hierarchies (hybrid included) the
//! cgroup is made in every v1 hierarchy, as runc does; on a pure v2 host, in the unified
//! one, where it must stay a leaf (processes live only in leaves there) and the cgroups
//! the shim makes above it pass their parent's controllers down. Directories the shim
//! made are removed at teardown, deepest first; those it found (kubelet's) stay. The
//! hierarchies come from a mountinfo text ([`Hierarchies::from_mountinfo`]), which the
//! tests point at trees of their own.
//!
//! `cgroupsPath` comes in two spellings: a path (`/kubepods/burstable/pod…/ID`, cgroupfs
//! driver) or systemd's `slice:prefix:name` (`kubepods-burstable-pod….slice:cri-containerd:ID`),
//! which maps to `/kubepods.slice/kubepods-burstable.slice/…/cri-containerd-ID.scope`.
//! The shim makes that directory itself; it does not ask systemd for a scope.

use std::io::Write;
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
    #[error(
        "the sandbox's cgroup {} passes controllers to cgroups below it ({controllers}); \
         on cgroup v2 processes can only join a cgroup without (a leaf): name a cgroup of \
         its own in linux.cgroupsPath",
        path.display()
    )]
    NotLeaf { path: PathBuf, controllers: String },
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
    /// Whether `dirs` is the one cgroup of the unified hierarchy (else v1 hierarchies).
    pub unified: bool,
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

/// Where the host's cgroup mounts are listed.
const MOUNTINFO: &str = "/proc/self/mountinfo";

/// The kind of a cgroup hierarchy, which decides its files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A cgroup v1 hierarchy (one or a few controllers, or a named one such as systemd's).
    V1,
    /// The unified hierarchy (cgroup v2): every controller, processes only in leaves.
    Unified,
}

/// One mounted cgroup hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    /// Where its root cgroup is mounted.
    pub root: PathBuf,
    pub kind: Kind,
}

/// The hierarchies the sandbox's cgroup is made in: every v1 hierarchy if the host has
/// one (a hybrid host's unified mount only tracks processes for systemd), else the
/// unified one.
///
/// Read from a mountinfo text, so that tests can describe a host whose cgroupfs is a
/// directory tree of their own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hierarchies(pub Vec<Hierarchy>);

impl Hierarchies {
    /// The host's, from `/proc/self/mountinfo`.
    pub fn of_host() -> Result<Hierarchies, CgroupError> {
        let text = std::fs::read_to_string(MOUNTINFO).map_err(CgroupError::Mounts)?;
        Ok(Hierarchies::from_mountinfo(&text))
    }

    /// The hierarchies a mountinfo text lists. A hierarchy mounted more than once (the
    /// same device) counts once, at a mount of its root if there is one.
    pub fn from_mountinfo(mountinfo: &str) -> Hierarchies {
        // (device, mount root is the hierarchy's root, hierarchy)
        let mut v1: Vec<(String, bool, Hierarchy)> = Vec::new();
        let mut v2: Vec<(String, bool, Hierarchy)> = Vec::new();
        for line in mountinfo.lines() {
            // "ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [optional fields] - FSTYPE SOURCE SUPER_OPTIONS"
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let fields: Vec<&str> = left.split_whitespace().collect();
            let (Some(device), Some(mount_root), Some(mount_point)) =
                (fields.get(2), fields.get(3), fields.get(4))
            else {
                continue;
            };
            let (kind, list) = match right.split_whitespace().next() {
                Some("cgroup") => (Kind::V1, &mut v1),
                Some("cgroup2") => (Kind::Unified, &mut v2),
                _ => continue,
            };
            let hierarchy = Hierarchy {
                root: PathBuf::from(procinfo::mounts::unescape(mount_point)),
                kind,
            };
            let whole = *mount_root == "/";
            match list.iter_mut().find(|(d, _, _)| d == device) {
                // A bind mount of a sub-cgroup gives way to a mount of the root.
                Some(seen) if whole && !seen.1 => *seen = (device.to_string(), whole, hierarchy),
                Some(_) => {}
                None => list.push((device.to_string(), whole, hierarchy)),
            }
        }
        let chosen = if v1.is_empty() { v2 } else { v1 };
        Hierarchies(chosen.into_iter().map(|(_, _, h)| h).collect())
    }

    /// Makes the cgroup `cgroups_path` in every hierarchy. All or nothing.
    pub fn create(&self, cgroups_path: &str) -> Result<HostCgroup, CgroupError> {
        let rel = relative_path(cgroups_path)?;
        if self.0.is_empty() {
            return Err(CgroupError::NoHierarchy);
        }
        let mut cg = HostCgroup::default();
        for h in &self.0 {
            if let Err(e) = make_path(h, &rel, &mut cg.created) {
                remove(&cg.created);
                return Err(e);
            }
            let dir = h.root.join(&rel);
            if h.kind == Kind::Unified {
                let given = std::fs::read_to_string(dir.join("cgroup.subtree_control"));
                if let Some(controllers) = given.ok().filter(|c| !c.trim().is_empty()) {
                    remove(&cg.created);
                    return Err(CgroupError::NotLeaf {
                        path: dir,
                        controllers: controllers.trim().to_string(),
                    });
                }
                cg.unified = true;
            }
            cg.dirs.push(dir);
        }
        Ok(cg)
    }
}

/// Makes the cgroup `cgroups_path` in the host's hierarchies. All or nothing.
pub fn create(cgroups_path: &str) -> Result<HostCgroup, CgroupError> {
    Hierarchies::of_host()?.create(cgroups_path)
}

/// Makes `root/rel` one level at a time, recording each directory it made.
fn make_path(h: &Hierarchy, rel: &Path, created: &mut Vec<PathBuf>) -> Result<(), CgroupError> {
    let mut dir = h.root.clone();
    let depth = rel.components().count();
    for (level, part) in rel.components().enumerate() {
        let parent = dir.clone();
        dir.push(part);
        if dir.is_dir() {
            continue;
        }
        match std::fs::create_dir(&dir) {
            Ok(()) => {
                created.push(dir.clone());
                match h.kind {
                    Kind::V1 => inherit_cpuset(&parent, &dir),
                    // The leaf holds the processes: a v2 cgroup with controllers
                    // enabled for its children can hold none.
                    Kind::Unified if level + 1 < depth => enable_controllers(&parent, &dir),
                    Kind::Unified => {}
                }
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

/// Writes `value` to a cgroup file the kernel made (never creates one).
fn write_existing(path: &Path, value: &str) -> std::io::Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)?
        .write_all(value.as_bytes())
}

/// A new v1 cpuset cgroup starts with no CPUs and no memory nodes, and takes no task
/// until given some: it gets its parent's. (A v2 cpuset with none uses its parent's.)
fn inherit_cpuset(parent: &Path, dir: &Path) {
    for file in ["cpuset.cpus", "cpuset.mems"] {
        let mine = dir.join(file);
        let empty = std::fs::read_to_string(&mine).is_ok_and(|v| v.trim().is_empty());
        if empty {
            if let Ok(v) = std::fs::read_to_string(parent.join(file)) {
                let _ = write_existing(&mine, v.trim());
            }
        }
    }
}

/// On the unified hierarchy, a cgroup the shim made between the existing ones and the
/// sandbox's passes on the controllers its parent gives it (the parent's
/// `cgroup.subtree_control`), so that the sandbox's cgroup accounts memory, CPU and pids
/// as kubelet's own cgroups do. Best effort: without them the figures still add up in
/// the nearest cgroup that has the controller.
fn enable_controllers(parent: &Path, dir: &Path) {
    let Ok(given) = std::fs::read_to_string(parent.join("cgroup.subtree_control")) else {
        return;
    };
    let controllers: Vec<String> = given
        .split_whitespace()
        .map(|c| format!("+{}", c.trim_start_matches('+')))
        .collect();
    if controllers.is_empty() {
        return;
    }
    let file = dir.join("cgroup.subtree_control");
    // One write enables all or none; if one is refused, the others one by one.
    if write_existing(&file, &controllers.join(" ")).is_err() {
        for c in &controllers {
            let _ = write_existing(&file, c);
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
        let v1 = |p: &str| Hierarchy {
            root: PathBuf::from(p),
            kind: Kind::V1,
        };
        assert_eq!(
            Hierarchies::from_mountinfo(hybrid),
            Hierarchies(vec![
                v1("/sys/fs/cgroup/memory"),
                v1("/sys/fs/cgroup/cpu,cpuacct"),
                v1("/sys/fs/cgroup/pids"),
            ])
        );
        let v2 = "30 24 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n";
        assert_eq!(
            Hierarchies::from_mountinfo(v2),
            Hierarchies(vec![Hierarchy {
                root: PathBuf::from("/sys/fs/cgroup"),
                kind: Kind::Unified,
            }])
        );
    }

    #[test]
    fn a_hierarchy_mounted_twice_counts_once_at_its_root() {
        // A container runtime's bind of a sub-cgroup first, then the host's mount; and
        // a mount point with a space in it.
        let text = "\
40 24 0:26 /kubepods/pod1 /run/x rw - cgroup2 cgroup2 rw
41 24 0:26 / /sys/fs/my\\040cgroup rw - cgroup2 cgroup2 rw
42 24 0:26 / /mnt/again rw - cgroup2 cgroup2 rw
";
        assert_eq!(
            Hierarchies::from_mountinfo(text),
            Hierarchies(vec![Hierarchy {
                root: PathBuf::from("/sys/fs/my cgroup"),
                kind: Kind::Unified,
            }])
        );
        assert_eq!(
            Hierarchies::from_mountinfo("1 2 0:3 / /proc rw - proc proc rw\n"),
            Hierarchies::default()
        );
        assert!(matches!(
            Hierarchies::default().create("/a/b"),
            Err(CgroupError::NoHierarchy)
        ));
    }

    /// A directory laid out like a host's cgroupfs, described by a mountinfo of its own.
    struct FakeHost {
        tree: tempfile::TempDir,
        mountinfo: String,
    }

    impl FakeHost {
        /// `mounts`: (directory under the tree, fstype, super options).
        fn new(mounts: &[(&str, &str, &str)]) -> FakeHost {
            let tree = tempfile::tempdir().expect("tempdir");
            let mut mountinfo = String::new();
            for (i, (dir, fstype, opts)) in mounts.iter().enumerate() {
                let root = tree.path().join(dir);
                std::fs::create_dir_all(&root).expect("mkdir");
                let files: &[&str] = if *fstype == "cgroup" {
                    &["tasks", "cgroup.procs"]
                } else {
                    &["cgroup.procs", "cgroup.controllers", "cpu.stat"]
                };
                for f in files {
                    std::fs::write(root.join(f), "").expect("write");
                }
                mountinfo.push_str(&format!(
                    "{} 24 0:{} / {} rw,relatime - {fstype} {fstype} {opts}\n",
                    30 + i,
                    50 + i,
                    root.display()
                ));
            }
            FakeHost { tree, mountinfo }
        }

        fn v1() -> FakeHost {
            FakeHost::new(&[
                ("cpu,cpuacct", "cgroup", "rw,cpu,cpuacct"),
                ("memory", "cgroup", "rw,memory"),
                ("pids", "cgroup", "rw,pids"),
                ("systemd", "cgroup", "rw,name=systemd"),
                ("unified", "cgroup2", "rw"),
            ])
        }

        fn v2() -> FakeHost {
            FakeHost::new(&[("", "cgroup2", "rw,nsdelegate")])
        }

        fn path(&self, rel: &str) -> PathBuf {
            self.tree.path().join(rel)
        }

        fn hierarchies(&self) -> Hierarchies {
            Hierarchies::from_mountinfo(&self.mountinfo)
        }
    }

    #[test]
    fn on_a_v1_host_the_pod_cgroup_is_made_in_every_v1_hierarchy_parents_first() {
        let host = FakeHost::v1();
        for h in ["cpu,cpuacct", "memory", "pids", "systemd"] {
            std::fs::create_dir(host.path(&format!("{h}/kubepods"))).expect("kubelet's");
        }
        let cg = host
            .hierarchies()
            .create("/kubepods/burstable/pod1/sb")
            .expect("create");
        assert!(!cg.unified);
        let each = |rel: &str| -> Vec<PathBuf> {
            ["cpu,cpuacct", "memory", "pids", "systemd"]
                .iter()
                .map(|h| host.path(&format!("{h}/{rel}")))
                .collect()
        };
        // The hybrid host's unified mount is left alone.
        assert_eq!(cg.dirs, each("kubepods/burstable/pod1/sb"));
        assert!(!host.path("unified/kubepods").exists());
        let mut made = Vec::new();
        for h in ["cpu,cpuacct", "memory", "pids", "systemd"] {
            for rel in ["burstable", "burstable/pod1", "burstable/pod1/sb"] {
                made.push(host.path(&format!("{h}/kubepods/{rel}")));
            }
        }
        assert_eq!(
            cg.created, made,
            "made parents first, kubelet's not counted"
        );
        assert!(cg.dirs.iter().all(|d| d.is_dir()));

        remove(&cg.created);
        assert!(made.iter().all(|d| !d.exists()), "deepest first, all gone");
        assert!(
            each("kubepods").iter().all(|d| d.is_dir()),
            "kubelet's stay"
        );
    }

    #[test]
    fn on_a_v2_host_the_pod_cgroup_is_one_directory_in_the_unified_hierarchy() {
        let host = FakeHost::v2();
        std::fs::create_dir(host.path("kubepods.slice")).expect("kubelet's");
        let cg = host
            .hierarchies()
            .create("kubepods-besteffort-pod1.slice:cri-containerd:sb")
            .expect("create");
        assert!(cg.unified);
        let pod =
            host.path("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice");
        assert_eq!(cg.dirs, vec![pod.join("cri-containerd-sb.scope")]);
        assert_eq!(
            cg.created,
            vec![
                host.path("kubepods.slice/kubepods-besteffort.slice"),
                pod.clone(),
                pod.join("cri-containerd-sb.scope"),
            ]
        );
        // Nothing written into what a real cgroupfs fills itself: no file appears.
        for d in &cg.created {
            let files: Vec<_> = std::fs::read_dir(d)
                .expect("read_dir")
                .filter_map(|e| e.ok())
                .filter(|e| e.path().is_file())
                .map(|e| e.file_name())
                .collect();
            assert!(files.is_empty(), "{}: {files:?}", d.display());
        }
        remove(&cg.created);
        assert!(cg.created.iter().all(|d| !d.exists()));
        assert!(host.path("kubepods.slice").is_dir());
    }

    #[test]
    fn on_v2_a_cgroup_with_controllers_for_children_is_refused() {
        let host = FakeHost::v2();
        let pod = host.path("kubepods/pod1");
        std::fs::create_dir_all(&pod).expect("kubelet's");
        std::fs::write(pod.join("cgroup.subtree_control"), "cpu memory\n").expect("w");
        let e = host
            .hierarchies()
            .create("/kubepods/pod1")
            .expect_err("not a leaf")
            .to_string();
        assert!(
            e.contains("kubepods/pod1") && e.contains("(cpu memory)"),
            "{e}"
        );
        assert!(pod.is_dir(), "kubelet's stays");
    }

    #[test]
    fn a_cgroup_another_sandbox_still_uses_stays() {
        let host = FakeHost::v2();
        let cg = host.hierarchies().create("/kubepods/pod1/a").expect("a");
        let other = host.hierarchies().create("/kubepods/pod1/b").expect("b");
        assert_eq!(other.created, vec![host.path("kubepods/pod1/b")]);
        remove(&cg.created);
        assert!(!host.path("kubepods/pod1/a").exists());
        assert!(host.path("kubepods/pod1/b").is_dir());
        remove(&other.created);
        assert!(!host.path("kubepods/pod1/b").exists());
    }

    #[test]
    fn a_failed_create_leaves_nothing_behind() {
        let host = FakeHost::v1();
        // The pids hierarchy cannot take the cgroup: its root is a file.
        std::fs::remove_dir_all(host.path("pids")).expect("rm");
        std::fs::write(host.path("pids"), "").expect("file");
        let e = host
            .hierarchies()
            .create("/kubepods/pod1/sb")
            .expect_err("pids is a file");
        assert!(e.to_string().contains("pids/kubepods"), "{e}");
        for h in ["cpu,cpuacct", "memory", "systemd"] {
            assert!(!host.path(&format!("{h}/kubepods")).exists(), "{h}");
        }
    }

    #[test]
    fn v2_controllers_pass_down_to_the_cgroups_made_and_v1_cpusets_are_filled() {
        let tree = tempfile::tempdir().expect("tempdir");
        let (parent, child) = (
            tree.path().join("kubepods"),
            tree.path().join("kubepods/pod1"),
        );
        std::fs::create_dir_all(&child).expect("mkdir");
        std::fs::write(parent.join("cgroup.subtree_control"), "cpu memory pids\n").expect("w");
        std::fs::write(child.join("cgroup.subtree_control"), "").expect("w");
        enable_controllers(&parent, &child);
        assert_eq!(
            std::fs::read_to_string(child.join("cgroup.subtree_control")).expect("read"),
            "+cpu +memory +pids"
        );
        // Nothing given, nothing written; no file is ever created.
        let lone = tree.path().join("lone");
        std::fs::create_dir(&lone).expect("mkdir");
        enable_controllers(&child, &lone);
        assert!(!lone.join("cgroup.subtree_control").exists());

        std::fs::write(parent.join("cpuset.cpus"), "0-1\n").expect("w");
        std::fs::write(parent.join("cpuset.mems"), "0\n").expect("w");
        std::fs::write(child.join("cpuset.cpus"), "\n").expect("w");
        std::fs::write(child.join("cpuset.mems"), "\n").expect("w");
        inherit_cpuset(&parent, &child);
        let read = |f: &str| std::fs::read_to_string(child.join(f)).expect("read");
        assert_eq!(
            (read("cpuset.cpus"), read("cpuset.mems")),
            ("0-1".into(), "0".into())
        );
    }

    /// The test's own cgroup2 mount (this host binds every controller to v1, so it has
    /// none), with what the test started in it: on drop, even after a failed assertion,
    /// the processes are killed by pid, the cgroups removed and the mount undone.
    struct Cgroup2Mount {
        dir: tempfile::TempDir,
        pids: Vec<i32>,
        made: Vec<PathBuf>,
    }

    impl Cgroup2Mount {
        fn new() -> Option<Cgroup2Mount> {
            let dir = tempfile::tempdir().ok()?;
            nix::mount::mount(
                Some("none"),
                dir.path(),
                Some("cgroup2"),
                nix::mount::MsFlags::empty(),
                None::<&str>,
            )
            .ok()?;
            Some(Cgroup2Mount {
                dir,
                pids: Vec::new(),
                made: Vec::new(),
            })
        }

        /// The host as the shim sees it, reduced to this mount.
        fn hierarchies(&self) -> Hierarchies {
            let all = std::fs::read_to_string(MOUNTINFO).expect("mountinfo");
            let mine = format!(" {} ", self.dir.path().display());
            let line: String = all
                .lines()
                .filter(|l| l.contains(&mine) && l.contains(" - cgroup2 "))
                .map(|l| format!("{l}\n"))
                .collect();
            Hierarchies::from_mountinfo(&line)
        }
    }

    impl Drop for Cgroup2Mount {
        fn drop(&mut self) {
            hypervisor::kill_and_reap(&self.pids, Duration::from_secs(2));
            remove(&self.made);
            let _ = nix::mount::umount(self.dir.path());
        }
    }

    #[test]
    fn on_a_real_cgroup2_hierarchy_the_vmm_runs_in_the_pod_cgroup_and_is_accounted() {
        let Some(mut mnt) = Cgroup2Mount::new() else {
            hypervisor::test_skip::skipped("needs root to mount cgroup2");
            return;
        };
        let hierarchies = mnt.hierarchies();
        assert_eq!(
            hierarchies,
            Hierarchies(vec![Hierarchy {
                root: mnt.dir.path().to_path_buf(),
                kind: Kind::Unified,
            }])
        );
        let me = std::process::id();
        for (path, rel) in [
            (
                format!("/katatest{me}/burstable/pod1/sb"),
                format!("katatest{me}/burstable/pod1/sb"),
            ),
            (
                format!("katatest{me}-pod2.slice:cri-containerd:sb"),
                format!("katatest{me}.slice/katatest{me}-pod2.slice/cri-containerd-sb.scope"),
            ),
        ] {
            let cg = hierarchies.create(&path).expect("create");
            mnt.made.extend(cg.created.iter().cloned());
            let leaf = mnt.dir.path().join(&rel);
            assert!(cg.unified);
            assert_eq!(cg.dirs, vec![leaf.clone()]);
            assert_eq!(cg.created.last(), Some(&leaf));
            assert_eq!(cg.created.len(), rel.split('/').count(), "{:?}", cg.created);
            // v2 has no `tasks`: helpers join through cgroup.procs.
            assert_eq!(
                hypervisor::process::join_file(&leaf),
                leaf.join("cgroup.procs")
            );

            // A VMM stand-in, started as the shim starts QEMU and its helpers.
            let run = tempfile::tempdir().expect("tempdir");
            let cfg = hypervisor::VmConfig {
                cgroup: cg.dirs.clone(),
                ..Default::default()
            };
            let daemon = hypervisor::process::Daemon {
                step: "vmm",
                program: Path::new("sh"),
                args: vec![
                    "-c".into(),
                    "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; exec sleep 1000".into(),
                ],
                env: Vec::new(),
                log: run.path().join("vmm.log"),
                place: hypervisor::process::Place::new(&cfg, false).expect("place"),
            };
            let pid = daemon.spawn(&hypervisor::discard_logger()).expect("spawn");
            mnt.pids.push(pid);

            let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup");
            assert!(
                own.lines().any(|l| l == format!("0::/{rel}")),
                "/proc/{pid}/cgroup:\n{own}"
            );
            let procs = std::fs::read_to_string(leaf.join("cgroup.procs")).expect("procs");
            assert_eq!(procs.trim(), pid.to_string());

            // What the shim reports for the sandbox, and what containerd reads from the
            // pod's cgroup (the leaf's parent): CPU from cpu.stat, once the loop ran.
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            let figures = loop {
                let f = crate::stats::host_figures(&cg).expect("figures");
                if f.cpu_usage_usec > 1000 || std::time::Instant::now() > deadline {
                    break f;
                }
                std::thread::sleep(Duration::from_millis(50));
            };
            assert!(figures.cpu_usage_usec > 1000, "{figures:?}");
            assert!(
                figures.cpu_user_usec + figures.cpu_system_usec > 0,
                "{figures:?}"
            );
            let pod = std::fs::read_to_string(leaf.parent().expect("pod").join("cpu.stat"))
                .expect("pod cpu.stat");
            let pod_usage: u64 = pod
                .lines()
                .find_map(|l| l.strip_prefix("usage_usec "))
                .and_then(|v| v.trim().parse().ok())
                .expect("usage_usec");
            assert!(pod_usage >= figures.cpu_usage_usec, "{pod}");

            // Teardown as the shim does it: kill by pid, then the cgroups it made.
            assert!(hypervisor::kill_and_reap(&[pid], Duration::from_secs(2)).is_empty());
            mnt.pids.retain(|p| *p != pid);
            remove(&cg.created);
            assert!(cg.created.iter().all(|d| !d.exists()), "{:?}", cg.created);
            mnt.made.clear();
        }
        let mount_point = mnt.dir.path().to_path_buf();
        drop(mnt);
        let after = std::fs::read_to_string(MOUNTINFO).expect("mountinfo");
        assert!(
            !after.contains(&format!(" {} ", mount_point.display())),
            "still mounted: {after}"
        );
    }
}
