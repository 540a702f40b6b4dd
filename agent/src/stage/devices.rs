//! Device nodes in the container's /dev: the defaults every container gets (runc's
//! list), the nodes of `linux.devices`, the /dev symlinks, and /dev/console for a
//! terminal. Nodes are made with mknod; where that is not permitted (e.g. the rootfs's
//! file system refuses device nodes) the guest's node of the same path is bind-mounted.
//!
//! Runs before pivot_root, so every path is resolved inside the rootfs (see `paths`).

use std::fs;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

use nix::errno::Errno;
use nix::mount::MsFlags;
use nix::sys::stat::{makedev, mknod, Mode, SFlag};
use nix::unistd::{chown, Gid, Uid};

use super::sys::do_mount;
use super::{log, paths, StageError};
use crate::spec::{Device, Spec};

/// (name, major, minor): character devices every container gets, mode 0666, root-owned.
const DEFAULT_DEVICES: [(&str, i64, i64); 6] = [
    ("null", 1, 3),
    ("zero", 1, 5),
    ("full", 1, 7),
    ("random", 1, 8),
    ("urandom", 1, 9),
    ("tty", 5, 0),
];

const DEFAULT_SYMLINKS: [(&str, &str); 5] = [
    ("/proc/self/fd", "/dev/fd"),
    ("/proc/self/fd/0", "/dev/stdin"),
    ("/proc/self/fd/1", "/dev/stdout"),
    ("/proc/self/fd/2", "/dev/stderr"),
    ("pts/ptmx", "/dev/ptmx"),
];

/// Creates every node and link in `rootfs` (the guest path of the container's root).
pub fn create_all(sync: BorrowedFd<'_>, rootfs: &Path, spec: &Spec) -> Result<(), StageError> {
    let spec_devices: &[Device] = spec.linux.as_ref().map_or(&[], |l| &l.devices);
    paths::dir_in_root(rootfs, "/dev")?;
    for (name, major, minor) in DEFAULT_DEVICES {
        let path = format!("/dev/{name}");
        if spec_devices.iter().any(|d| d.path == path) {
            continue;
        }
        let dev = Device {
            typ: "c".into(),
            path,
            major,
            minor,
            file_mode: Some(0o666),
            uid: Some(0),
            gid: Some(0),
        };
        create(sync, rootfs, &dev)?;
    }
    for dev in spec_devices {
        create(sync, rootfs, dev)?;
    }
    for (src, link) in DEFAULT_SYMLINKS {
        let target = paths::resolve_in_root(rootfs, link)?;
        if target.symlink_metadata().is_err() {
            symlink(src, &target).map_err(|e| StageError::io("create symlink", &target, e))?;
        }
    }
    if spec.process.as_ref().is_some_and(|p| p.terminal) {
        // The pty slave is the process's stdin; runc bind-mounts it on /dev/console.
        // Its path, not the fd: the fd's mount belongs to the agent's mount namespace,
        // which a bind into this one refuses (EINVAL).
        let pty = fs::read_link("/proc/self/fd/0").map_err(|source| StageError::Os {
            action: "find the terminal for /dev/console".into(),
            source,
        })?;
        if !pty.is_absolute() {
            return Err(StageError::NoPty { stdin: pty });
        }
        let console = paths::touch_in_root(rootfs, "/dev/console")?;
        do_mount(Some(&pty), &console, None, MsFlags::MS_BIND, None)?;
    }
    Ok(())
}

fn node_kind(dev: &Device) -> Result<SFlag, StageError> {
    Ok(match dev.typ.as_str() {
        "c" | "u" => SFlag::S_IFCHR,
        "b" => SFlag::S_IFBLK,
        "p" => SFlag::S_IFIFO,
        other => {
            return Err(StageError::bad_field(
                format!("linux.devices {}", dev.path),
                format!("unknown type {other:?}: use c, u, b or p"),
            ))
        }
    })
}

fn create(sync: BorrowedFd<'_>, rootfs: &Path, dev: &Device) -> Result<(), StageError> {
    if !dev.path.starts_with("/dev/") {
        return Err(StageError::bad_field(
            "linux.devices[].path",
            format!("{:?} must be under /dev/", dev.path),
        ));
    }
    let kind = node_kind(dev)?;
    let mode = dev.file_mode.unwrap_or(0o666) & 0o7777;
    let walk = paths::walk(rootfs, Path::new(&dev.path))?;
    if walk.exists() {
        // Something is there already (from the image or a mount); keep it, like runc.
        return Ok(());
    }
    let target = walk.path.clone();
    if let Some(parent) = target.parent() {
        // mkdir on the existing /dev would ask the host each time (see paths).
        if walk.parent_missing() {
            fs::create_dir_all(parent)
                .map_err(|e| StageError::io("create directory", parent, e))?;
        }
        paths::checked(rootfs, parent)?;
    }
    let major = u64::try_from(dev.major).map_err(|_| bad_number(dev))?;
    let minor = u64::try_from(dev.minor).map_err(|_| bad_number(dev))?;
    match mknod(
        &target,
        kind,
        Mode::from_bits_truncate(mode),
        makedev(major, minor),
    ) {
        Ok(()) => {}
        Err(Errno::EPERM | Errno::EACCES | Errno::EOPNOTSUPP) => {
            log(
                sync,
                format!(
                    "mknod {} not permitted; bind-mounting the guest's node",
                    dev.path
                ),
            );
            return bind_guest_node(&target, dev);
        }
        Err(e) => {
            return Err(StageError::sys(
                format!("mknod {} for device {}", target.display(), dev.path),
                e,
            ))
        }
    }
    // mknod applied the umask; the spec's mode is exact.
    fs::set_permissions(&target, fs::Permissions::from_mode(mode))
        .map_err(|e| StageError::io("chmod device", &target, e))?;
    chown(
        &target,
        Some(Uid::from_raw(dev.uid.unwrap_or(0))),
        Some(Gid::from_raw(dev.gid.unwrap_or(0))),
    )
    .map_err(|e| StageError::sys(format!("chown device {}", dev.path), e))
}

fn bind_guest_node(target: &Path, dev: &Device) -> Result<(), StageError> {
    let source = Path::new(&dev.path);
    if source.symlink_metadata().is_err() {
        return Err(StageError::bad_field(
            format!("linux.devices {}", dev.path),
            "cannot create the node and the guest has none to bind-mount: \
             remove the device from the spec",
        ));
    }
    fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(target)
        .map_err(|e| StageError::io("create mount target", target, e))?;
    do_mount(Some(source), target, None, MsFlags::MS_BIND, None)
}

fn bad_number(dev: &Device) -> StageError {
    StageError::bad_field(
        format!("linux.devices {}", dev.path),
        format!("invalid major/minor {}:{}", dev.major, dev.minor),
    )
}
