//! The container's root file system, built inside its new mount namespace, in runc's
//! order: spec mounts (targets resolved securely inside the rootfs, see `paths`), device
//! nodes (`devices`), pivot_root, read-only root, sysctls (`sysctl`, needs /proc), then
//! read-only and masked paths.
//!
//! Runs in the container's init process before it waits for start; touches nothing
//! outside that mount namespace (the root is made a slave first).

use std::fs::File;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};

use nix::mount::{umount2, MntFlags, MsFlags};
use nix::unistd::{chdir, pivot_root};

use super::sys::do_mount;
use super::userns::{self, IdMaps};
use super::{devices, log, paths, sysctl, StageError};
use crate::spec::{Mount, Spec};

/// The container's user namespace: its mappings and the namespace, which ID-mapped
/// mounts map through.
pub type IdMap<'a> = Option<(&'a IdMaps, &'a File)>;

/// Sets up the rootfs and pivots into it.
pub fn prepare_rootfs(
    sync: BorrowedFd<'_>,
    spec: &Spec,
    idmap: IdMap<'_>,
) -> Result<(), StageError> {
    let root = spec.root.as_ref().ok_or(StageError::MissingField("root"))?;
    let rootfs = PathBuf::from(&root.path);
    do_mount(
        None,
        Path::new("/"),
        None,
        MsFlags::MS_SLAVE | MsFlags::MS_REC,
        None,
    )?;
    match idmap {
        Some((_, ns)) if userns::rootfs_idmapped(spec) => {
            userns::idmapped_bind(&rootfs, &rootfs, true, ns)?
        }
        _ => do_mount(
            Some(&rootfs),
            &rootfs,
            None,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None,
        )?,
    }

    for m in &spec.mounts {
        mount_one(sync, &rootfs, m, idmap)?;
    }
    devices::create_all(sync, &rootfs, spec)?;
    enter_rootfs(&rootfs)?;

    if root.readonly {
        let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
        do_mount(None, Path::new("/"), None, flags, None)?;
    }
    if let Some(linux) = &spec.linux {
        sysctl::apply(&linux.sysctl)?;
        for path in &linux.readonly_paths {
            readonly_path(path)?;
        }
        for path in &linux.masked_paths {
            mask_path(path)?;
        }
    }
    Ok(())
}

fn mount_one(
    sync: BorrowedFd<'_>,
    rootfs: &Path,
    m: &Mount,
    idmap: IdMap<'_>,
) -> Result<(), StageError> {
    if !m.destination.starts_with('/') {
        return Err(StageError::bad_field(
            "mounts[].destination",
            format!("{:?} must be an absolute path", m.destination),
        ));
    }
    let typ = m.typ.as_deref().unwrap_or("none");
    let (mut flags, data) = parse_options(&m.options);
    let is_bind = typ == "bind" || flags.contains(MsFlags::MS_BIND);
    let source = m.source.clone().unwrap_or_else(|| typ.to_string());

    let file = is_bind
        && !Path::new(&source)
            .metadata()
            .map_err(|e| StageError::BindSource {
                src: source.clone(),
                destination: m.destination.clone(),
                source: e,
            })?
            .is_dir();
    let make = || {
        if file {
            paths::touch_in_root(rootfs, &m.destination)
        } else {
            paths::mkdir_in_root(rootfs, &m.destination)
        }
    };
    // On an ID-mapped rootfs the mount point is made as the container's root.
    let target = match (make(), idmap) {
        (Err(e), Some((maps, _))) if userns::unmapped_caller(&e) => maps.as_container_root(make)?,
        (made, _) => made?,
    };

    let data = (!data.is_empty()).then_some(data.as_str());
    if is_bind {
        let bind = flags & (MsFlags::MS_BIND | MsFlags::MS_REC);
        match idmap {
            Some((maps, ns)) if maps.of_mount(m)? => userns::idmapped_bind(
                Path::new(&source),
                &target,
                bind.contains(MsFlags::MS_REC),
                ns,
            )?,
            _ => do_mount(Some(Path::new(&source)), &target, None, bind, None)?,
        }
        flags.remove(MsFlags::MS_BIND | MsFlags::MS_REC);
        if !flags.is_empty() {
            let remount = flags | MsFlags::MS_BIND | MsFlags::MS_REMOUNT;
            do_mount(None, &target, None, remount, None)?;
        }
        return Ok(());
    }
    if typ == "cgroup" || typ == "cgroup2" {
        // Only cgroup v2 exists in the guest; a container without it still runs.
        let r = do_mount(
            Some(Path::new("cgroup2")),
            &target,
            Some("cgroup2"),
            flags,
            None,
        );
        if let Err(e) = r {
            log(sync, format!("skipping cgroup mount: {e}"));
        }
        return Ok(());
    }
    do_mount(Some(Path::new(&source)), &target, Some(typ), flags, data)
}

/// Splits mount options into flags and the data string the file system parses.
pub fn parse_options(options: &[String]) -> (MsFlags, String) {
    let mut flags = MsFlags::empty();
    let mut data = Vec::new();
    for opt in options {
        let (set, clear) = match opt.as_str() {
            "ro" => (MsFlags::MS_RDONLY, MsFlags::empty()),
            "rw" => (MsFlags::empty(), MsFlags::MS_RDONLY),
            "nosuid" => (MsFlags::MS_NOSUID, MsFlags::empty()),
            "suid" => (MsFlags::empty(), MsFlags::MS_NOSUID),
            "nodev" => (MsFlags::MS_NODEV, MsFlags::empty()),
            "dev" => (MsFlags::empty(), MsFlags::MS_NODEV),
            "noexec" => (MsFlags::MS_NOEXEC, MsFlags::empty()),
            "exec" => (MsFlags::empty(), MsFlags::MS_NOEXEC),
            "sync" => (MsFlags::MS_SYNCHRONOUS, MsFlags::empty()),
            "dirsync" => (MsFlags::MS_DIRSYNC, MsFlags::empty()),
            "noatime" => (MsFlags::MS_NOATIME, MsFlags::empty()),
            "nodiratime" => (MsFlags::MS_NODIRATIME, MsFlags::empty()),
            "relatime" => (MsFlags::MS_RELATIME, MsFlags::empty()),
            "strictatime" => (MsFlags::MS_STRICTATIME, MsFlags::empty()),
            "bind" => (MsFlags::MS_BIND, MsFlags::empty()),
            "rbind" => (MsFlags::MS_BIND | MsFlags::MS_REC, MsFlags::empty()),
            // Propagation is handled for the whole tree; these need no data.
            "private" | "rprivate" | "slave" | "rslave" | "shared" | "rshared" => continue,
            other => {
                data.push(other);
                continue;
            }
        };
        flags.insert(set);
        flags.remove(clear);
    }
    (flags, data.join(","))
}

/// pivot_root into `rootfs` and detach the old root (runc's "pivot_root(., .)" trick,
/// which needs no directory for the old root).
fn enter_rootfs(rootfs: &Path) -> Result<(), StageError> {
    chdir(rootfs)
        .map_err(|e| StageError::sys(format!("chdir to rootfs {}", rootfs.display()), e))?;
    pivot_root(".", ".")
        .map_err(|e| StageError::sys(format!("pivot_root to {}", rootfs.display()), e))?;
    do_mount(
        None,
        Path::new("."),
        None,
        MsFlags::MS_SLAVE | MsFlags::MS_REC,
        None,
    )?;
    umount2(".", MntFlags::MNT_DETACH).map_err(|e| StageError::sys("detach the old root", e))?;
    chdir("/").map_err(|e| StageError::sys("chdir to /", e))
}

/// Hides `path`: /dev/null over a file, an empty read-only tmpfs over a directory;
/// a path that does not exist needs no hiding.
fn mask_path(path: &str) -> Result<(), StageError> {
    let p = Path::new(path);
    match p.metadata() {
        Err(_) => Ok(()),
        Ok(meta) if meta.is_dir() => do_mount(
            Some(Path::new("tmpfs")),
            p,
            Some("tmpfs"),
            MsFlags::MS_RDONLY,
            None,
        ),
        Ok(_) => do_mount(
            Some(Path::new("/dev/null")),
            p,
            None,
            MsFlags::MS_BIND,
            None,
        ),
    }
}

/// Makes `path` (and the mounts below it) read-only; a missing path is skipped.
fn readonly_path(path: &str) -> Result<(), StageError> {
    let p = Path::new(path);
    if p.metadata().is_err() {
        return Ok(());
    }
    do_mount(Some(p), p, None, MsFlags::MS_BIND | MsFlags::MS_REC, None)?;
    let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
    do_mount(None, p, None, flags, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_split_into_flags_and_data() {
        let opts: Vec<String> = [
            "nosuid",
            "noexec",
            "newinstance",
            "ptmxmode=0666",
            "ro",
            "rbind",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let (flags, data) = parse_options(&opts);
        assert!(flags.contains(MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC | MsFlags::MS_RDONLY));
        assert!(flags.contains(MsFlags::MS_BIND | MsFlags::MS_REC));
        assert_eq!(data, "newinstance,ptmxmode=0666");
    }
}
