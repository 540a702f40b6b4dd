//! Terminals of containers. Each container gets its own devpts instance, mounted by the
//! agent under `/run/kata-containers/pts/<id>` and bound at the container's `/dev/pts`;
//! terminals are opened from that instance, so a process's terminal is `/dev/pts/N`
//! inside its container, as with runc (a pty from the agent's own instance would not
//! be found there: `tty` says "not a tty").

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

/// Where the per-container instances are mounted.
pub const DEVPTS_ROOT: &str = "/run/kata-containers/pts";

/// Mounts a new devpts instance for container `id`; returns its directory.
pub fn mount_instance(id: &str) -> io::Result<PathBuf> {
    let dir = Path::new(DEVPTS_ROOT).join(id);
    std::fs::create_dir_all(&dir)?;
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC;
    let data = "newinstance,ptmxmode=0666,mode=0620,gid=5";
    if let Err(e) = mount(Some("devpts"), &dir, Some("devpts"), flags, Some(data)) {
        let _ = std::fs::remove_dir(&dir);
        return Err(io::Error::other(format!(
            "mount devpts on {}: {e}",
            dir.display()
        )));
    }
    Ok(dir)
}

/// Undoes [`mount_instance`].
pub fn unmount_instance(dir: &Path) {
    let _ = umount2(dir, MntFlags::MNT_DETACH);
    let _ = std::fs::remove_dir(dir);
}

/// Opens a new terminal in the devpts instance at `dir`: (master, slave).
pub fn open_pty(dir: &Path) -> io::Result<(OwnedFd, OwnedFd)> {
    let master: OwnedFd = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(dir.join("ptmx"))?
        .into();
    let unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads one int from the pointer, which outlives the call.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // TIOCGPTPEER opens the slave through the master, with no path lookup that could
    // land in another devpts instance.
    // SAFETY: TIOCGPTPEER takes open flags by value and returns a new descriptor.
    let slave = unsafe {
        libc::ioctl(
            master.as_raw_fd(),
            libc::TIOCGPTPEER,
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    };
    if slave < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the ioctl returned a new descriptor that nothing else owns.
    let slave = unsafe { OwnedFd::from_raw_fd(slave) };
    Ok((master, slave))
}
