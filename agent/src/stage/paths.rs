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
    let mut resolved = PathBuf::new();
    // Components still to visit, last one first.
    let mut pending: Vec<OsString> = Vec::new();
    push_components(&mut pending, Path::new(path), &mut resolved);
    let mut links = 0;
    while let Some(part) = pending.pop() {
        if part == ".." {
            resolved.pop();
            continue;
        }
        let candidate = root.join(&resolved).join(&part);
        let meta = match fs::symlink_metadata(&candidate) {
            Ok(meta) => meta,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                resolved.push(&part);
                continue;
            }
            Err(e) => return Err(StageError::io("look up", candidate, e)),
        };
        if !meta.file_type().is_symlink() {
            resolved.push(&part);
            continue;
        }
        links += 1;
        if links > MAX_SYMLINKS {
            return Err(StageError::SymlinkLoop {
                path: path.to_string(),
                root: root.to_path_buf(),
            });
        }
        let target =
            fs::read_link(&candidate).map_err(|e| StageError::io("read symlink", &candidate, e))?;
        push_components(&mut pending, &target, &mut resolved);
    }
    Ok(root.join(resolved))
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
/// the resolved path.
pub fn mkdir_in_root(root: &Path, path: &str) -> Result<PathBuf, StageError> {
    let target = resolve_in_root(root, path)?;
    fs::create_dir_all(&target).map_err(|e| StageError::io("create directory", &target, e))?;
    checked(root, &target)?;
    Ok(target)
}

/// Creates an empty file at `path` (container path) inside `root` unless something is
/// there already (e.g. the target of a file bind mount); returns the resolved path.
pub fn touch_in_root(root: &Path, path: &str) -> Result<PathBuf, StageError> {
    let target = resolve_in_root(root, path)?;
    if let Some(parent) = target.parent() {
        fs::create_dir_all(parent).map_err(|e| StageError::io("create directory", parent, e))?;
    }
    if target.symlink_metadata().is_err() {
        fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&target)
            .map_err(|e| StageError::io("create mount target", &target, e))?;
    }
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
