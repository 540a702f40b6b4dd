//! kubelet's volumes as containerd's CRI hands them to us: bind mounts whose source is
//! `<kubelet root>/pods/<pod uid>/volumes/kubernetes.io~<plugin>/<volume name>` (the
//! kubelet root is wherever kubelet's `--root-dir` says, so only the tail is matched).
//!
//! Two kinds are kept in the guest instead of being served over virtio-fs as they are:
//! - emptyDir: a guest directory per (pod, volume), or a guest tmpfs when kubelet made it
//!   `medium: Memory` (a tmpfs mounted at the host path, whose `size=` is the sizeLimit);
//! - ConfigMap, Secret, projected and downward API volumes: still bound into the share,
//!   and mirrored by the agent into the guest, where kubelet's updates raise inotify
//!   events.
//!
//! subPath binds (kubelet's `volume-subpaths/<volume>/<container>/<n>`, a bind of a
//! directory of the volume) of an emptyDir bind that directory of the guest's volume
//! ([`empty_dir_sub_path`]); of other volumes they stay host binds (kubelet never updates
//! them).
//!
//! Reads the host dir's metadata and `/proc/self/mountinfo`; changes nothing.

use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// What a bind source of kubelet's is to the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeletVolume {
    EmptyDir {
        pod_uid: String,
        name: String,
    },
    /// ConfigMap, Secret, projected or downward API: written by kubelet's atomic writer.
    Watched,
}

/// The plugin directories of volumes kubelet writes with its atomic writer.
const WATCHED_PLUGINS: &[&str] = &[
    "kubernetes.io~configmap",
    "kubernetes.io~secret",
    "kubernetes.io~projected",
    "kubernetes.io~downward-api",
];

const EMPTY_DIR_PLUGIN: &str = "kubernetes.io~empty-dir";

/// Recognises `.../pods/<uid>/volumes/<plugin>/<name>` at the end of `path` (a
/// canonical path).
pub fn classify(path: &Path) -> Option<KubeletVolume> {
    let parts: Vec<&str> = path
        .components()
        .filter(|c| !matches!(c, Component::RootDir))
        .map(|c| match c {
            Component::Normal(s) => s.to_str(),
            _ => None,
        })
        .collect::<Option<_>>()?;
    if parts.len() < 5 {
        return None;
    }
    let [.., pods, uid, volumes, plugin, name] = parts.as_slice() else {
        return None;
    };
    if *pods != "pods" || *volumes != "volumes" || uid.is_empty() || name.is_empty() {
        return None;
    }
    if *plugin == EMPTY_DIR_PLUGIN {
        return Some(KubeletVolume::EmptyDir {
            pod_uid: uid.to_string(),
            name: name.to_string(),
        });
    }
    WATCHED_PLUGINS
        .contains(plugin)
        .then_some(KubeletVolume::Watched)
}

/// A subPath bind of an emptyDir: `source` (canonical) is kubelet's
/// `<root>/pods/<uid>/volume-subpaths/<volume>/<container>/<n>`, a bind of a directory
/// `sub_path` below `<root>/pods/<uid>/volumes/kubernetes.io~empty-dir/<volume>` (found by
/// its inode: on the host, the guest's emptyDir holds only what kubelet made there).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmptyDirSubPath {
    pub pod_uid: String,
    pub name: String,
    pub volume_dir: PathBuf,
    pub sub_path: PathBuf,
}

/// How deep and how wide the host's emptyDir is searched for a subPath's directory.
const SUB_PATH_DEPTH: usize = 8;
const SUB_PATH_ENTRIES: usize = 4096;

pub fn empty_dir_sub_path(source: &Path) -> Option<EmptyDirSubPath> {
    let parts: Vec<&str> = source.iter().filter_map(|c| c.to_str()).collect();
    let n = parts.len();
    if n < 6 || parts[n - 6] != "pods" || parts[n - 4] != "volume-subpaths" {
        return None;
    }
    let (uid, name) = (parts[n - 5], parts[n - 3]);
    let pod_dir = source.ancestors().nth(4)?;
    let volume_dir = pod_dir.join("volumes").join(EMPTY_DIR_PLUGIN).join(name);
    let target = std::fs::metadata(source).ok()?;
    let mut budget = SUB_PATH_ENTRIES;
    let sub_path = find_inode(&volume_dir, (target.dev(), target.ino()), 0, &mut budget)?;
    Some(EmptyDirSubPath {
        pod_uid: uid.to_string(),
        name: name.to_string(),
        volume_dir,
        sub_path,
    })
}

/// The path below `dir` of the directory with `(dev, ino)`, not following symlinks.
fn find_inode(dir: &Path, id: (u64, u64), depth: usize, budget: &mut usize) -> Option<PathBuf> {
    if depth >= SUB_PATH_DEPTH {
        return None;
    }
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        *budget = budget.checked_sub(1)?;
        let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
            continue;
        };
        if !meta.is_dir() {
            continue;
        }
        if (meta.dev(), meta.ino()) == id {
            return Some(PathBuf::from(entry.file_name()));
        }
        if let Some(below) = find_inode(&entry.path(), id, depth + 1, budget) {
            return Some(Path::new(&entry.file_name()).join(below));
        }
    }
    None
}

/// What a bind source (canonical) is among kubelet's volumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeletBind {
    /// The emptyDir at `volume_dir`, or its `sub_path` (empty: all of it).
    EmptyDir {
        pod_uid: String,
        name: String,
        volume_dir: PathBuf,
        sub_path: PathBuf,
    },
    Watched,
}

pub fn of_bind(source: &Path) -> Option<KubeletBind> {
    match classify(source) {
        Some(KubeletVolume::EmptyDir { pod_uid, name }) => Some(KubeletBind::EmptyDir {
            pod_uid,
            name,
            volume_dir: source.to_path_buf(),
            sub_path: PathBuf::new(),
        }),
        Some(KubeletVolume::Watched) => Some(KubeletBind::Watched),
        None => empty_dir_sub_path(source).map(|s| KubeletBind::EmptyDir {
            pod_uid: s.pod_uid,
            name: s.name,
            volume_dir: s.volume_dir,
            sub_path: s.sub_path,
        }),
    }
}

/// How kubelet set up an emptyDir on the host: what the guest's copy gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmptyDirSetup {
    /// `Some(size)` for `medium: Memory` (a tmpfs at the path): its `size=` in bytes, 0
    /// when the mount has none.
    pub tmpfs_size: Option<u64>,
    pub uid: u32,
    pub gid: u32,
    /// Permission bits with setgid and sticky (fsGroup makes the dir setgid).
    pub mode: u32,
}

/// Reads the emptyDir at `path` (canonical) and the host's mount table.
pub fn empty_dir_setup(path: &Path) -> std::io::Result<EmptyDirSetup> {
    let meta = std::fs::metadata(path)?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(EmptyDirSetup {
        tmpfs_size: tmpfs_size_at(&mountinfo, path),
        uid: meta.uid(),
        gid: meta.gid(),
        mode: meta.mode() & 0o7777,
    })
}

/// When the mount visible at `path` (the last one mounted there) is a tmpfs: its
/// `size=` in bytes (0 without one).
pub fn tmpfs_size_at(mountinfo: &str, path: &Path) -> Option<u64> {
    let top = mountinfo.lines().rev().find(|l| {
        l.split(' ')
            .nth(4)
            .is_some_and(|p| Path::new(&procinfo::mounts::unescape(p)) == path)
    })?;
    // Optional fields end at " - ", then the fs type, the source and the super options.
    let (_, after) = top.split_once(" - ")?;
    let mut fields = after.split(' ');
    if fields.next()? != "tmpfs" {
        return None;
    }
    let options = fields.nth(1).unwrap_or("");
    Some(
        options
            .split(',')
            .find_map(|o| o.strip_prefix("size="))
            .and_then(parse_size)
            .unwrap_or(0),
    )
}

/// tmpfs's `size=`: bytes with an optional k, m or g (the kernel shows kibibytes).
fn parse_size(s: &str) -> Option<u64> {
    let (digits, shift) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 10),
        b'm' | b'M' => (&s[..s.len() - 1], 20),
        b'g' | b'G' => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    digits.parse::<u64>().ok()?.checked_mul(1u64 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_volume_paths_are_recognised_by_their_tail() {
        let empty = |uid: &str, name: &str| KubeletVolume::EmptyDir {
            pod_uid: uid.into(),
            name: name.into(),
        };
        assert_eq!(
            classify(Path::new(
                "/var/lib/kubelet/pods/0f3c-11/volumes/kubernetes.io~empty-dir/cache"
            )),
            Some(empty("0f3c-11", "cache"))
        );
        // Any kubelet root.
        assert_eq!(
            classify(Path::new(
                "/srv/k/root/pods/u1/volumes/kubernetes.io~empty-dir/shared"
            )),
            Some(empty("u1", "shared"))
        );
        for plugin in ["configmap", "secret", "projected", "downward-api"] {
            let p = format!("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~{plugin}/v");
            assert_eq!(classify(Path::new(&p)), Some(KubeletVolume::Watched), "{p}");
        }
        for other in [
            // subPath binds: never updated by kubelet, a host bind as for runc.
            "/var/lib/kubelet/pods/u1/volume-subpaths/cfg/c/0",
            "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/cache/sub",
            "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/pv/mount",
            "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~host-path/h",
            "/var/lib/kubelet/pods/u1/etc-hosts",
            "/pods/u1/vol/kubernetes.io~empty-dir/x",
            "/tmp",
            "/",
        ] {
            assert_eq!(classify(Path::new(other)), None, "{other}");
        }
    }

    #[test]
    fn a_sub_path_of_an_empty_dir_is_found_below_the_volume() {
        let tmp = tempfile::tempdir().unwrap();
        let pod = tmp.path().canonicalize().unwrap().join("pods/u1");
        let vol = pod.join("volumes/kubernetes.io~empty-dir/data");
        std::fs::create_dir_all(vol.join("a/b")).unwrap();
        std::fs::create_dir_all(vol.join("c")).unwrap();
        // kubelet's bind is the same directory; a symlink stands in for it here.
        let sub = pod.join("volume-subpaths/data/app/0");
        std::fs::create_dir_all(sub.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(vol.join("a/b"), &sub).unwrap();
        let found = empty_dir_sub_path(&sub).unwrap();
        assert_eq!(
            (found.pod_uid.as_str(), found.name.as_str()),
            ("u1", "data")
        );
        assert_eq!(found.volume_dir, vol);
        assert_eq!(found.sub_path, PathBuf::from("a/b"));
        // A subPath of a volume that is no emptyDir.
        let other = pod.join("volume-subpaths/cfg/app/0");
        std::fs::create_dir_all(&other).unwrap();
        assert_eq!(empty_dir_sub_path(&other), None);
        assert_eq!(empty_dir_sub_path(Path::new("/tmp")), None);
    }

    const MOUNTINFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
301 22 0:61 / /var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/mem rw,relatime shared:150 - tmpfs tmpfs rw,size=65536k,inode64
302 22 0:62 / /var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/nolimit rw,relatime - tmpfs tmpfs rw,inode64
303 22 0:63 / /k\\040root/pods/u1/volumes/kubernetes.io~empty-dir/m rw - tmpfs tmpfs rw,size=2g
304 22 0:64 / /var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/over rw - tmpfs tmpfs rw,size=1024k
305 304 8:1 /x /var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/over rw - ext4 /dev/sda1 rw
";

    #[test]
    fn a_memory_empty_dir_is_the_tmpfs_at_its_path_with_its_size() {
        let at = |p: &str| tmpfs_size_at(MOUNTINFO, Path::new(p));
        assert_eq!(
            at("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/mem"),
            Some(64 << 20)
        );
        assert_eq!(
            at("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/nolimit"),
            Some(0)
        );
        assert_eq!(
            at("/k root/pods/u1/volumes/kubernetes.io~empty-dir/m"),
            Some(2 << 30)
        );
        // A disk emptyDir: no mount of its own.
        assert_eq!(
            at("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/disk"),
            None
        );
        // What is visible is the last mount there.
        assert_eq!(
            at("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/over"),
            None
        );
        assert_eq!(at("/"), None);
    }

    #[test]
    fn tmpfs_sizes_parse_with_their_suffixes() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("64k"), Some(64 << 10));
        assert_eq!(parse_size("3M"), Some(3 << 20));
        assert_eq!(parse_size("1g"), Some(1 << 30));
        assert_eq!(parse_size("50%"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("99999999999999999999g"), None);
    }
}
