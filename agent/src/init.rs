//! PID 1 duties in the guest: the base file systems, cgroup v2, the shared virtio-fs
//! directory, and ending the VM (sync + reset) on destroy or on a fatal error.

use std::fs;
use std::path::Path;

use nix::mount::{mount, MsFlags};
use nix::sys::reboot::{reboot, RebootMode};
use slog::{crit, Logger};

use crate::cgroup::CgroupRoot;

/// A boot step that failed; the VM cannot serve without it.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("failed to {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to {action}: {}: check the guest kernel's config", source.desc())]
    Sys {
        action: String,
        #[source]
        source: nix::errno::Errno,
    },
    #[error("failed to enable the cgroup controllers: {0}")]
    Cgroup(#[source] std::io::Error),
}

fn create_dir(path: impl AsRef<Path>) -> Result<(), InitError> {
    let path = path.as_ref();
    fs::create_dir_all(path).map_err(|source| InitError::Io {
        action: "create directory",
        path: path.display().to_string(),
        source,
    })
}

fn sys(action: impl Into<String>) -> impl FnOnce(nix::errno::Errno) -> InitError {
    let action = action.into();
    move |source| InitError::Sys { action, source }
}

struct BaseMount {
    source: &'static str,
    target: &'static str,
    fstype: &'static str,
    flags: MsFlags,
    data: Option<&'static str>,
}

fn base_mounts() -> [BaseMount; 8] {
    let nse = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    [
        BaseMount {
            source: "proc",
            target: "/proc",
            fstype: "proc",
            flags: nse,
            data: None,
        },
        BaseMount {
            source: "sysfs",
            target: "/sys",
            fstype: "sysfs",
            flags: nse,
            data: None,
        },
        BaseMount {
            source: "devtmpfs",
            target: "/dev",
            fstype: "devtmpfs",
            flags: MsFlags::MS_NOSUID,
            data: Some("mode=0755"),
        },
        BaseMount {
            source: "devpts",
            target: "/dev/pts",
            fstype: "devpts",
            flags: MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            data: Some("newinstance,ptmxmode=0666,mode=0620,gid=5"),
        },
        BaseMount {
            source: "shm",
            target: "/dev/shm",
            fstype: "tmpfs",
            flags: nse,
            data: Some("mode=1777"),
        },
        BaseMount {
            source: "tmpfs",
            target: "/run",
            fstype: "tmpfs",
            flags: MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            data: Some("mode=0755"),
        },
        BaseMount {
            source: "tmpfs",
            target: "/tmp",
            fstype: "tmpfs",
            flags: MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            data: Some("mode=1777"),
        },
        BaseMount {
            source: "cgroup2",
            target: "/sys/fs/cgroup",
            fstype: "cgroup2",
            flags: nse,
            data: Some(CGROUP2_OPTIONS),
        },
    ]
}

/// cgroup v2's `favordynmods` (Linux 6.0 and later): moving a process into a cgroup no
/// longer waits for an RCU grace period. Without it, the first write to `cgroup.procs`
/// switches the hierarchy's lock into its writer mode and waits for a grace period,
/// which on the guest's one idle vCPU costs several timer ticks; each container stage
/// joins its container's cgroup that way, on the path of every create and every exec.
/// Measured in the guest: joining 15-20 ms, with the option 4-7 ms. Forks and exits pay
/// a little more for it, which no one can see. A kernel that does not know the option
/// mounts cgroup v2 without it.
const CGROUP2_OPTIONS: &str = "favordynmods";

/// Mounts the guest's base file systems. Runs before logging exists (the console is on
/// devtmpfs), so it returns the first error for the caller to log.
pub fn mount_base() -> Result<(), InitError> {
    for m in base_mounts() {
        create_dir(m.target)?;
        let with =
            |data: Option<&str>| mount(Some(m.source), m.target, Some(m.fstype), m.flags, data);
        let mut mounted = with(m.data);
        if mounted == Err(nix::Error::EINVAL) && m.data == Some(CGROUP2_OPTIONS) {
            mounted = with(None);
        }
        mounted.map_err(sys(format!("mount {} on {}", m.fstype, m.target)))?;
    }
    if let Some(root) = CgroupRoot::detect(Path::new("/sys/fs/cgroup")) {
        root.enable_controllers().map_err(InitError::Cgroup)?;
    }
    Ok(())
}

/// Whether the kernel command line `cmdline` says the VM has the rootfs share.
pub fn has_rootfs_share(cmdline: &str) -> bool {
    cmdline
        .split_whitespace()
        .any(|w| w == protocols::ROOTFS_SHARE_PARAM)
}

/// Mounts the sandbox's virtio-fs share, where the shim puts volumes, and, when the VM
/// has it, the rootfs share, which the shim names containers' root filesystems on
/// (without it they are on the first).
pub fn mount_shares(rootfs_share: bool) -> Result<(), InitError> {
    mount_virtiofs(protocols::SHARED_FS_TAG, protocols::GUEST_SHARED_DIR)?;
    if rootfs_share {
        mount_virtiofs(protocols::ROOTFS_FS_TAG, protocols::GUEST_ROOTFS_DIR)?;
    }
    Ok(())
}

fn mount_virtiofs(tag: &str, dir: &str) -> Result<(), InitError> {
    create_dir(dir)?;
    mount(
        Some(tag),
        dir,
        Some("virtiofs"),
        MsFlags::empty(),
        None::<&str>,
    )
    .map_err(sys(format!("mount virtiofs {tag} on {dir}")))?;
    set_read_ahead(dir);
    Ok(())
}

/// How far the guest reads ahead on a virtio-fs share, in KiB. The kernel's default,
/// 128, cut a container's first exec of busybox into 17 requests through virtiofsd; at
/// 1 MiB it takes 4 (virtiofsd accepts requests that large), and `ctr run ... echo hi`
/// spends ~10 ms less from start to exit under TCG, for ~0.3 MiB more read.
const SHARE_READ_AHEAD_KB: &str = "1024";

/// Sets the read-ahead of the file system mounted on `dir` (its backing device's, in
/// sysfs). Best effort: without it reads are only smaller.
fn set_read_ahead(dir: &str) {
    use std::os::unix::fs::MetadataExt;
    if let Ok(meta) = std::fs::metadata(dir) {
        let dev = meta.dev();
        let (major, minor) = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
        let path = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
        let _ = std::fs::write(path, SHARE_READ_AHEAD_KB);
    }
}

/// Ends the VM: with `reboot=t -no-reboot` a reset makes QEMU exit.
pub fn reset_vm() -> ! {
    nix::unistd::sync();
    let _ = reboot(RebootMode::RB_AUTOBOOT);
    // reboot only returns on failure; PID 1 must not exit (that panics the kernel).
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

/// Logs a fatal error and ends the VM instead of leaving it hanging.
pub fn fatal(log: &Logger, msg: &str) -> ! {
    crit!(log, "fatal error, resetting the VM"; "error" => msg);
    reset_vm()
}

/// As PID 1, a panic must end the VM too.
pub fn install_panic_hook(log: Logger) {
    std::panic::set_hook(Box::new(move |info| fatal(&log, &info.to_string())));
}

/// Milliseconds since the guest booted (CLOCK_BOOTTIME: needs no /proc, and no wall
/// clock, which has only the RTC's second resolution at boot).
pub fn boot_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// Binds the initrd's `/bin` (the debug console's shell) at `new_root`/bin, to stay
/// reachable from the new root; `debug_console` removes it at boot when the console is
/// off. Best effort: without it the console says it has no shell, and nothing else needs
/// it (runs before logging exists, so it cannot say why).
fn bind_shell_dir(new_root: &Path) {
    let shell_dir = Path::new(crate::debug_console::SHELL_DIR);
    if !shell_dir.is_dir() {
        return;
    }
    let target = new_root.join("bin");
    if fs::create_dir_all(&target).is_ok() {
        let none: Option<&str> = None;
        let _ = mount(Some(shell_dir), &target, none, MsFlags::MS_BIND, none);
    }
}

/// Moves PID 1 off the initramfs onto a tmpfs root.
///
/// The kernel's initial rootfs can never be unmounted or pivoted away from, so
/// `pivot_root` into a container rootfs fails with EINVAL while the agent's own root is
/// that rootfs. A tmpfs moved over `/` is an ordinary mount, and containers can pivot.
/// The agent's binary stays where it is, in the initramfs: nothing re-executes it by path
/// (container stages are forked from the agent's zygote, or start from
/// `/proc/self/exe`), so neither a copy nor a re-exec is needed, which under TCG saved
/// ~60 ms of every boot.
pub fn leave_initramfs() -> Result<(), InitError> {
    let new_root = Path::new("/newroot");
    let none: Option<&str> = None;
    create_dir(new_root)?;
    mount(
        Some("tmpfs"),
        new_root,
        Some("tmpfs"),
        MsFlags::MS_NOSUID,
        Some("mode=0755"),
    )
    .map_err(sys(format!("mount tmpfs on {}", new_root.display())))?;
    for dir in ["proc", "sys", "dev", "run", "tmp", "etc"] {
        create_dir(new_root.join(dir))?;
    }
    bind_shell_dir(new_root);
    nix::unistd::chdir(new_root).map_err(sys("chdir to /newroot"))?;
    mount(Some("."), "/", none, MsFlags::MS_MOVE, none).map_err(sys("move /newroot to /"))?;
    nix::unistd::chroot(".").map_err(sys("chroot into the new root"))?;
    nix::unistd::chdir("/").map_err(sys("chdir to /"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rootfs_share_is_announced_by_a_whole_word() {
        assert!(has_rootfs_share(
            "console=ttyS0 quiet agent.rootfs_share agent.log=debug\n"
        ));
        assert!(!has_rootfs_share("console=ttyS0 quiet\n"));
        assert!(!has_rootfs_share(
            "agent.rootfs_shared agent.rootfs_share=0"
        ));
    }
}
