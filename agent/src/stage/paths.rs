//! Resolving container paths inside a rootfs that the container's image controls.
//!
//! Mount targets and device paths are container paths ("/dev/shm"), but before
//! pivot_root they must be reached through the guest's view of the rootfs. Joining the
//! two lexically would let a hostile image put a symlink such as `/dev/shm -> /` into
//! its rootfs and have a mount land on the guest's root. So, like securejoin, each
//! component is looked up inside the rootfs and symlinks are followed as if the rootfs
//! were `/` (absolute targets restart at the rootfs, `..` stops at it). Components that
//! do not exist yet are appended as they are; they are created after resolution and
//! cannot be symlinks then. [`checked`] re-verifies the result right before it is used.

use std::ffi::OsString;
use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use super::StageError;

/// How many symlinks one resolution may follow (the kernel's limit is 40; securejoin's 255).
const MAX_SYMLINKS: u32 = 255;

/// `path` (a container path) resolved inside `root`; the result is `root` + a path that
/// contains no symlink among its existing components.
pub fn resolve_in_root(root: &Path, path: &str) -> Result<PathBuf, StageError> {
    walk(root, Path::new(path)).map(|w| w.path)
}

/// What [`walk`] found besides the resolved path. Every lookup here may be a request to
/// the host when the rootfs is a virtio-fs share, and virtiofsd's misses are not cached:
/// the walk stops looking once a component is missing, and tells its callers what
/// exists so they do not look again.
pub struct Walk {
    /// `root` + the resolved path.
    pub path: PathBuf,
    /// How many trailing components of `path` do not exist (nothing below a missing
    /// directory can).
    pub missing: usize,
    /// The target's metadata when it exists (`missing` 0) and was looked up; `None` also
    /// when the walk cannot tell (the path ends at the root or after a `..`).
    pub meta: Option<fs::Metadata>,
}

impl Walk {
    /// Whether something (of any kind) is at the resolved path; asks again only when the
    /// walk could not tell.
    pub fn exists(&self) -> bool {
        match (self.missing, &self.meta) {
            (0, Some(_)) => true,
            (0, None) => self.path.symlink_metadata().is_ok(),
            _ => false,
        }
    }

    /// Whether the resolved path's parent directory may be missing (then it is made).
    pub fn parent_missing(&self) -> bool {
        self.missing != 1 && !self.exists()
    }
}

/// `path` resolved inside `root` as [`resolve_in_root`] does, with what exists.
pub fn walk(root: &Path, path: &Path) -> Result<Walk, StageError> {
    let mut resolved = PathBuf::new();
    // Components still to visit, last one first.
    let mut pending: Vec<OsString> = Vec::new();
    push_components(&mut pending, path, &mut resolved);
    let mut links = 0;
    let mut missing = 0usize;
    let mut meta = None;
    while let Some(part) = pending.pop() {
        if part == ".." {
            resolved.pop();
            missing = missing.saturating_sub(1);
            meta = None;
            continue;
        }
        if missing > 0 {
            resolved.push(&part);
            missing += 1;
            continue;
        }
        let candidate = root.join(&resolved).join(&part);
        let found = match fs::symlink_metadata(&candidate) {
            Ok(found) => found,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                resolved.push(&part);
                missing = 1;
                meta = None;
                continue;
            }
            Err(e) => return Err(StageError::io("look up", candidate, e)),
        };
        if !found.file_type().is_symlink() {
            resolved.push(&part);
            meta = Some(found);
            continue;
        }
        links += 1;
        if links > MAX_SYMLINKS {
            return Err(StageError::SymlinkLoop {
                path: path.display().to_string(),
                root: root.to_path_buf(),
            });
        }
        let target =
            fs::read_link(&candidate).map_err(|e| StageError::io("read symlink", &candidate, e))?;
        meta = None;
        push_components(&mut pending, &target, &mut resolved);
    }
    Ok(Walk {
        path: root.join(resolved),
        missing,
        meta,
    })
}

/// Queues `path`'s components in front of `pending`; an absolute path restarts at the root.
fn push_components(pending: &mut Vec<OsString>, path: &Path, resolved: &mut PathBuf) {
    let mut parts = Vec::new();
    for c in path.components() {
        match c {
            Component::RootDir | Component::Prefix(_) => {
                resolved.clear();
                parts.clear();
            }
            Component::CurDir => {}
            Component::ParentDir => parts.push(OsString::from("..")),
            Component::Normal(name) => parts.push(name.to_os_string()),
        }
    }
    pending.extend(parts.into_iter().rev());
}

/// Checks, right before use, that `resolved` (from [`resolve_in_root`]) still lies inside
/// `root` once the kernel resolves it; guards against the rootfs changing in between.
pub fn checked(root: &Path, resolved: &Path) -> Result<(), StageError> {
    let real_root =
        fs::canonicalize(root).map_err(|e| StageError::io("resolve rootfs", root, e))?;
    let real = fs::canonicalize(resolved)
        .map_err(|e| StageError::io("resolve mount target", resolved, e))?;
    if real.starts_with(&real_root) {
        Ok(())
    } else {
        Err(StageError::OutsideRootfs {
            resolved: resolved.to_path_buf(),
            real,
            root: root.to_path_buf(),
        })
    }
}

/// Creates the directory `path` (container path) and its parents inside `root`; returns
/// the resolved path. For a mount target, which an image often lacks: see [`mkdir_last`].
pub fn mkdir_in_root(root: &Path, path: &str) -> Result<PathBuf, StageError> {
    match mkdir_last(root, Path::new(path))? {
        Some(made) => Ok(made),
        None => dir_in_root(root, path),
    }
}

/// Like [`mkdir_in_root`] for a directory that usually exists (`/dev` once mounted):
/// looked up first, and made only when missing. (`mkdir` on a name that exists still
/// asks the host: an exclusive create revalidates the name.)
pub fn dir_in_root(root: &Path, path: &str) -> Result<PathBuf, StageError> {
    let walk = walk(root, Path::new(path))?;
    let target = walk.path;
    if !walk.meta.is_some_and(|m| m.is_dir()) {
        fs::create_dir_all(&target).map_err(|e| StageError::io("create directory", &target, e))?;
    }
    checked(root, &target)?;
    Ok(target)
}

/// Makes the last component of `path` in its parent when the parent exists, which is
/// the common case of a mount target an image lacks (`/proc` in a minimal image): found
/// missing by the kernel's own lookup in `mkdir`, not first by ours as well. `None` when
/// the parent does not exist or the name is taken (a directory, or a symlink that
/// [`walk`] must follow): the caller then walks the whole path.
fn mkdir_last(root: &Path, path: &Path) -> Result<Option<PathBuf>, StageError> {
    let (Some(parent), Some(Component::Normal(name))) =
        (path.parent(), path.components().next_back())
    else {
        return Ok(None);
    };
    let parent = walk(root, parent)?;
    let parent_is_dir =
        parent.missing == 0 && (parent.path == root || parent.meta.is_some_and(|m| m.is_dir()));
    if !parent_is_dir {
        return Ok(None);
    }
    let target = parent.path.join(name);
    match fs::create_dir(&target) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => return Ok(None),
        Err(e) => return Err(StageError::io("create directory", &target, e)),
    }
    checked(root, &target)?;
    Ok(Some(target))
}

/// Creates an empty file at `path` (container path) inside `root` unless something is
/// there already (e.g. the target of a file bind mount); returns the resolved path.
pub fn touch_in_root(root: &Path, path: &str) -> Result<PathBuf, StageError> {
    let walk = walk(root, Path::new(path))?;
    if !walk.exists() {
        if let Some(parent) = walk.path.parent().filter(|_| walk.parent_missing()) {
            fs::create_dir_all(parent)
                .map_err(|e| StageError::io("create directory", parent, e))?;
        }
        fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&walk.path)
            .map_err(|e| StageError::io("create mount target", &walk.path, e))?;
    }
    let target = walk.path;
    checked(root, &target)?;
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A scratch directory with `a/b` in it, removed on drop.
    struct TempRoot(PathBuf);

    impl Drop for TempRoot {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn tempdir(name: &str) -> TempRoot {
        let dir = std::env::temp_dir().join(format!("paths-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("a/b")).expect("mkdir");
        TempRoot(dir)
    }

    #[test]
    fn symlinks_stay_inside_the_root() {
        let tmp = tempdir("inside");
        let root = tmp.0.clone();
        symlink("/", root.join("abs")).expect("symlink");
        symlink("../../../../etc", root.join("a/up")).expect("symlink");
        symlink("b", root.join("a/rel")).expect("symlink");
        symlink("loop", root.join("loop")).expect("symlink");
        let r = |p: &str| resolve_in_root(&root, p).expect("resolve");
        assert_eq!(r("/abs/shm"), root.join("shm"));
        assert_eq!(r("/a/up/passwd"), root.join("etc/passwd"));
        assert_eq!(r("/a/rel/x"), root.join("a/b/x"));
        assert_eq!(r("/../../x/./y/.."), root.join("x"));
        assert_eq!(r("/new/dir"), root.join("new/dir"));
        let err = resolve_in_root(&root, "/loop/x")
            .expect_err("loop")
            .to_string();
        assert!(err.contains("too many levels"), "{err}");
    }

    #[test]
    fn walk_tells_what_exists() {
        let tmp = tempdir("walk");
        let root = tmp.0.clone();
        symlink("a", root.join("to-a")).expect("symlink");
        let w = |p: &str| walk(&root, Path::new(p)).expect("walk");
        let b = w("/to-a/b");
        assert_eq!((b.path, b.missing), (root.join("a/b"), 0));
        assert!(b.meta.is_some_and(|m| m.is_dir()));
        let deep = w("/a/new/x/y");
        assert_eq!((deep.path, deep.missing), (root.join("a/new/x/y"), 3));
        assert!(deep.meta.is_none());
        // Back out of a missing part: `..` undoes it, and the walk looks again after.
        let back = w("/a/new/../b");
        assert_eq!((back.path, back.missing), (root.join("a/b"), 0));
        assert!(back.meta.is_some());
        let up = w("/a/new/..");
        assert_eq!((up.path, up.missing), (root.join("a"), 0));
        assert!(up.meta.is_none(), "after `..` the walk cannot tell");
    }

    #[test]
    fn mount_targets_are_made_once_and_kept() {
        let tmp = tempdir("targets");
        let root = tmp.0.clone();
        assert_eq!(
            mkdir_in_root(&root, "/a/b").expect("existing"),
            root.join("a/b")
        );
        assert_eq!(mkdir_in_root(&root, "/p/q").expect("new"), root.join("p/q"));
        assert!(root.join("p/q").is_dir());
        assert_eq!(
            mkdir_in_root(&root, "/a/..").expect("unknown"),
            root.join("")
        );
        // A name that is a symlink is followed inside the root, not made or replaced.
        symlink("/a/b", root.join("link")).expect("symlink");
        assert_eq!(
            mkdir_in_root(&root, "/link").expect("link"),
            root.join("a/b")
        );
        assert!(root.join("link").is_symlink());
        fs::write(root.join("a/file"), b"kept").expect("write");
        let err = mkdir_in_root(&root, "/a/file").expect_err("a file is no directory");
        assert!(err.to_string().contains("create directory"), "{err}");
        // A file bind-mount target: kept when it exists, made (with its parents) when not.
        assert_eq!(
            touch_in_root(&root, "/a/file").expect("existing"),
            root.join("a/file")
        );
        assert_eq!(fs::read(root.join("a/file")).expect("read"), b"kept");
        touch_in_root(&root, "/a/b/new").expect("parent exists");
        touch_in_root(&root, "/etc/x/hosts").expect("parents missing");
        touch_in_root(&root, "/a/b/../other").expect("unknown");
        for made in ["a/b/new", "etc/x/hosts", "a/other"] {
            assert!(root.join(made).is_file(), "{made}");
        }
    }

    #[test]
    fn mkdir_follows_hostile_links_into_the_root() {
        let tmp = tempdir("mkdir");
        let root = tmp.0.clone();
        let outside = root.with_extension("outside");
        let _ = fs::remove_dir_all(&outside);
        symlink(&outside, root.join("evil")).expect("symlink");
        let made = mkdir_in_root(&root, "/evil/sub").expect("mkdir");
        assert!(made.starts_with(&root));
        assert!(!outside.exists(), "created outside the rootfs");
    }
}
