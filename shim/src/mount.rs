//! Host mounts of a sandbox: the virtio-fs share and what is bound into it.
//!
//! Layout (Kata's): `<root>/<sandbox>/mounts` is a private bind of itself made `shared`,
//! and `<root>/<sandbox>/shared` a read-only bind of it that virtiofsd exports. Binds made
//! later under `mounts` (container rootfs, volumes) propagate into `shared`, and into
//! virtiofsd's own mount namespace, as separate read-write mounts; the guest cannot write
//! the top of the share itself.

use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

/// Root of the per-sandbox shares on the host.
pub const SHARE_ROOT: &str = "/run/kata-containers/shared/sandboxes";

#[derive(Debug, thiserror::Error)]
#[error("{op} {path}: {source}")]
pub struct MountError {
    op: &'static str,
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

pub type Result<T> = std::result::Result<T, MountError>;

fn err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(nix::Error) -> MountError + 'a {
    move |e| MountError {
        op,
        path: path.to_path_buf(),
        source: std::io::Error::from(e),
    }
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> MountError + 'a {
    move |source| MountError {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// The share of one sandbox.
#[derive(Debug, Clone)]
pub struct SharedDirs {
    /// Where the shim binds things (`.../mounts`).
    pub mounts: PathBuf,
    /// What virtiofsd exports (`.../shared`).
    pub shared: PathBuf,
    /// The sandbox's directory holding both.
    pub base: PathBuf,
}

impl SharedDirs {
    pub fn for_sandbox(sandbox_id: &str) -> Self {
        let base = Path::new(SHARE_ROOT).join(sandbox_id);
        SharedDirs {
            mounts: base.join("mounts"),
            shared: base.join("shared"),
            base,
        }
    }

    /// Creates the two binds; returns the mount points made, in order.
    pub fn setup(&self) -> Result<Vec<PathBuf>> {
        std::fs::create_dir_all(&self.mounts).map_err(io_err("create", &self.mounts))?;
        std::fs::create_dir_all(&self.shared).map_err(io_err("create", &self.shared))?;
        let mut made = Vec::new();
        let none: Option<&str> = None;
        mount(
            Some(&self.mounts),
            &self.mounts,
            none,
            MsFlags::MS_BIND,
            none,
        )
        .map_err(err("bind", &self.mounts))?;
        made.push(self.mounts.clone());
        let result = (|| {
            mount(none, &self.mounts, none, MsFlags::MS_PRIVATE, none)
                .map_err(err("make private", &self.mounts))?;
            mount(none, &self.mounts, none, MsFlags::MS_SHARED, none)
                .map_err(err("make shared", &self.mounts))?;
            mount(
                Some(&self.mounts),
                &self.shared,
                none,
                MsFlags::MS_BIND | MsFlags::MS_REC,
                none,
            )
            .map_err(err("bind", &self.shared))?;
            made.push(self.shared.clone());
            mount(
                none,
                &self.shared,
                none,
                MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
                none,
            )
            .map_err(err("remount read-only", &self.shared))?;
            Ok(())
        })();
        if let Err(e) = result {
            unmount_all(&made);
            return Err(e);
        }
        Ok(made)
    }
}

/// Bind-mounts `src` (a directory or a file) at `dst`, creating `dst` to match.
pub fn bind(src: &Path, dst: &Path, readonly: bool) -> Result<()> {
    let meta = std::fs::metadata(src).map_err(io_err("stat bind source", src))?;
    if meta.is_dir() {
        std::fs::create_dir_all(dst).map_err(io_err("create", dst))?;
    } else {
        if let Some(parent) = dst.parent() {
            std::fs::create_dir_all(parent).map_err(io_err("create", parent))?;
        }
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dst)
            .map_err(io_err("create", dst))?;
    }
    let none: Option<&str> = None;
    mount(
        Some(src),
        dst,
        none,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        none,
    )
    .map_err(err("bind", dst))?;
    if readonly {
        let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
        if let Err(e) = mount(none, dst, none, flags, none) {
            let _ = umount2(dst, MntFlags::MNT_DETACH);
            return Err(err("remount read-only", dst)(e));
        }
    }
    Ok(())
}

/// Unmounts each path, last first; missing mounts are fine. Lazy detach as a fallback so
/// a busy mount never blocks cleanup.
pub fn unmount_all(paths: &[PathBuf]) {
    for p in paths.iter().rev() {
        unmount(p);
    }
}

pub fn unmount(path: &Path) {
    // A path may carry several stacked mounts (rootfs overlay + bind): peel them all.
    for _ in 0..8 {
        match umount2(path, MntFlags::empty()) {
            Ok(()) => continue,
            Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => return,
            Err(_) => {
                if umount2(path, MntFlags::MNT_DETACH).is_err() {
                    return;
                }
            }
        }
    }
}

/// Every mount point at or below `root`, deepest first (from /proc/self/mountinfo).
pub fn mounts_under(root: &Path) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mountinfo)
        .map(PathBuf::from)
        .filter(|p| p.starts_with(root))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape_mountinfo(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Removes `dir` recursively, but only when nothing is mounted at or below it: removing
/// through a still-mounted bind would delete the user's files on the host.
pub fn remove_dir_if_unmounted(dir: &Path) -> std::io::Result<()> {
    let left = mounts_under(dir);
    if !left.is_empty() {
        return Err(std::io::Error::other(format!(
            "{} still has mounts ({}); not removing it",
            dir.display(),
            left.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_octal_escapes_are_decoded() {
        assert_eq!(unescape_mountinfo(r"/a\040b"), "/a b");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
        assert_eq!(unescape_mountinfo(r"/tail\"), r"/tail\");
    }

    #[test]
    fn share_layout_is_per_sandbox() {
        let d = SharedDirs::for_sandbox("sb1");
        assert_eq!(d.mounts, Path::new(SHARE_ROOT).join("sb1/mounts"));
        assert_eq!(d.shared, Path::new(SHARE_ROOT).join("sb1/shared"));
    }
}
