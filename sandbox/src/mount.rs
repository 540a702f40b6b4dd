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
pub use layout::SHARE_ROOT;

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

/// How much of a bind the container may write, in the CRI's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Access {
    /// As the source is.
    #[default]
    ReadWrite,
    /// The bind's top is read-only; mounts below it stay as they are on the host (OCI
    /// `ro`, runc's meaning).
    ReadOnly,
    /// The bind and every mount below it are read-only (OCI `rro`).
    RecursiveReadOnly,
}

/// What the bind receives from its source's mounts later on (OCI `rprivate`, `rslave`,
/// `rshared`). It always shares its own mounts and unmounts with its copies in the
/// share, which is how virtiofsd sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Propagation {
    /// Nothing mounted at the source later reaches the bind.
    #[default]
    Private,
    /// Mounts made at the source later reach the bind (host to container).
    Slave,
    /// The bind stays in its source's peer group, as a plain bind would.
    Shared,
}

/// Bind-mounts `src` (a directory or a file) and the mounts below it at `dst`, creating
/// `dst` to match.
///
/// The tree is cloned detached (`open_tree`), given its propagation and read-only flags
/// (`mount_setattr`), and only then attached (`move_mount`): the copies that propagate
/// from `dst` into the share and virtiofsd's mount namespace are cloned from a tree that
/// is already read-only. (A remount after the bind would change `dst` alone and leave
/// every copy writable: the guest writes through virtiofsd's copy.)
pub fn bind(src: &Path, dst: &Path, access: Access, propagation: Propagation) -> Result<()> {
    make_mount_point(src, dst)?;
    let tree = prepared_tree(src, access, propagation)?;
    newmount::attach(&tree, dst).map_err(io_err("bind", dst))
}

/// Creates `dst` as a directory or an empty file, to match `src`.
fn make_mount_point(src: &Path, dst: &Path) -> Result<()> {
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
    Ok(())
}

/// A detached clone of the mount tree at `src` with `propagation` on all of it and
/// `access` on its top or all of it.
fn prepared_tree(
    src: &Path,
    access: Access,
    propagation: Propagation,
) -> Result<std::os::fd::OwnedFd> {
    let tree = newmount::clone_tree(src).map_err(io_err("clone the mount tree of", src))?;
    let prop = match propagation {
        Propagation::Private => Some(libc::MS_PRIVATE),
        Propagation::Slave => Some(libc::MS_SLAVE),
        Propagation::Shared => None,
    };
    if let Some(prop) = prop {
        newmount::set_attr(&tree, 0, prop, true)
            .map_err(io_err("set the propagation of the bind of", src))?;
    }
    match access {
        Access::ReadWrite => {}
        Access::ReadOnly => newmount::set_attr(&tree, libc::MOUNT_ATTR_RDONLY, 0, false)
            .map_err(io_err("make read-only the bind of", src))?,
        Access::RecursiveReadOnly => newmount::set_attr(&tree, libc::MOUNT_ATTR_RDONLY, 0, true)
            .map_err(io_err("make recursively read-only the bind of", src))?,
    }
    Ok(tree)
}

/// The mount namespaces that serve the share to the guest: virtiofsd's own (its
/// `--sandbox namespace`, whose root is the share), found among the sandbox's helper
/// processes and their children; one open `/proc/PID/ns/mnt` each.
pub fn serving_namespaces(helper_pids: &[i32]) -> Vec<std::fs::File> {
    let own = std::fs::read_link("/proc/self/ns/mnt").ok();
    let mut seen = Vec::new();
    let mut found = Vec::new();
    for &pid in helper_pids {
        let candidates = std::iter::once(pid).chain(procinfo::pid::children(pid));
        for p in candidates {
            if procinfo::pid::comm(p).as_deref() != Some("virtiofsd") {
                continue;
            }
            let ns = format!("/proc/{p}/ns/mnt");
            let Ok(link) = std::fs::read_link(&ns) else {
                continue;
            };
            if Some(&link) == own.as_ref() || seen.contains(&link) {
                continue;
            }
            if let Ok(f) = std::fs::File::open(&ns) {
                seen.push(link);
                found.push(f);
            }
        }
    }
    found
}

/// Binds volume `src` at `rel` in the share (`<share.mounts>/<rel>`, which the guest
/// sees) with `access` and `propagation`. Where the share is served from mount
/// namespaces of its own (`namespaces`, see [`serving_namespaces`]), the bind is made in
/// each of them and not in the host's: nothing of the volume is then mounted in the
/// host's namespace, where it would keep the host's own submounts of the source busy
/// (an rmdir there gets EBUSY, as it never does under runc, whose copy is in the
/// container's namespace); removing the mount point on the host detaches them (see
/// [`remove_dir_if_unmounted`]). Returns the host mount point when the bind is in the
/// host's namespace (no serving namespace), to be unmounted at teardown.
pub fn bind_volume(
    src: &Path,
    share_mounts: &Path,
    rel: &Path,
    access: Access,
    propagation: Propagation,
    namespaces: &[std::fs::File],
) -> Result<Option<PathBuf>> {
    let dst = share_mounts.join(rel);
    if namespaces.is_empty() {
        bind(src, &dst, access, propagation)?;
        return Ok(Some(dst));
    }
    make_mount_point(src, &dst)?;
    let in_ns = Path::new("/").join(rel);
    for ns in namespaces {
        let tree = prepared_tree(src, access, propagation)?;
        newmount::attach_in_namespace(&tree, ns, &in_ns)
            .map_err(io_err("bind in virtiofsd's mount namespace", &in_ns))?;
    }
    Ok(None)
}

/// The new mount API (Linux 5.12 and later for `mount_setattr`), which nix does not
/// wrap.
mod newmount {
    use std::ffi::CString;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    fn cstring(path: &Path) -> std::io::Result<CString> {
        CString::new(path.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
    }

    /// Adds what to do to an error of a syscall this kernel may lack.
    fn explain(e: std::io::Error) -> std::io::Error {
        if e.raw_os_error() == Some(libc::ENOSYS) {
            std::io::Error::other(format!(
                "{e}: the host kernel lacks the new mount API (open_tree, mount_setattr); \
                 volumes need Linux 5.12 or later"
            ))
        } else {
            e
        }
    }

    /// A detached clone of the mount tree at `src` (`open_tree(OPEN_TREE_CLONE |
    /// AT_RECURSIVE)`).
    pub fn clone_tree(src: &Path) -> std::io::Result<OwnedFd> {
        let path = cstring(src)?;
        let flags: libc::c_uint =
            libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC | libc::AT_RECURSIVE as libc::c_uint;
        // SAFETY: `path` is a NUL-terminated string that outlives the call; open_tree
        // reads it and returns a new file descriptor or -1, touching no other memory.
        let fd =
            unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, path.as_ptr(), flags) };
        if fd < 0 {
            return Err(explain(std::io::Error::last_os_error()));
        }
        let fd = i32::try_from(fd).map_err(|_| std::io::Error::other("open_tree: bad fd"))?;
        // SAFETY: open_tree returned a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// `mount_setattr` on the detached tree `tree`: sets `attr_set`, and the propagation
    /// `propagation` (0: unchanged), on its top or, with `recursive`, on all of it.
    pub fn set_attr(
        tree: &OwnedFd,
        attr_set: u64,
        propagation: u64,
        recursive: bool,
    ) -> std::io::Result<()> {
        let attr = libc::mount_attr {
            attr_set,
            attr_clr: 0,
            propagation,
            userns_fd: 0,
        };
        let mut flags = libc::AT_EMPTY_PATH as libc::c_uint;
        if recursive {
            flags |= libc::AT_RECURSIVE as libc::c_uint;
        }
        // SAFETY: the path is a static empty C string, `attr` a live mount_attr whose
        // size is passed with it; mount_setattr only reads both.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                tree.as_raw_fd(),
                c"".as_ptr(),
                flags,
                &attr as *const libc::mount_attr,
                std::mem::size_of::<libc::mount_attr>(),
            )
        };
        if rc < 0 {
            return Err(explain(std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Attaches the detached tree `tree` at `path` in the mount namespace `ns` (an open
    /// `/proc/PID/ns/mnt`), from a thread of its own that leaves the process's file
    /// system context (`unshare(CLONE_FS)`) to enter it: a thread sharing it cannot. (Not
    /// a child process: containerd's shim crate reaps every child on SIGCHLD.) The thread
    /// ends with the move; a symlink at `path` is not followed.
    pub fn attach_in_namespace(
        tree: &OwnedFd,
        ns: &std::fs::File,
        path: &Path,
    ) -> std::io::Result<()> {
        let to = cstring(path)?;
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    nix::sched::unshare(nix::sched::CloneFlags::CLONE_FS)
                        .map_err(std::io::Error::from)?;
                    nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNS)
                        .map_err(std::io::Error::from)?;
                    move_mount(tree, &to)
                })
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("the mounting thread panicked")))
        })
    }

    /// Attaches the detached tree `tree` at `dst` (`move_mount`; a symlink at `dst` is
    /// not followed).
    pub fn attach(tree: &OwnedFd, dst: &Path) -> std::io::Result<()> {
        move_mount(tree, &cstring(dst)?).map_err(explain)
    }

    /// `move_mount(2)` of the detached tree `tree` onto `to`, not through a symlink.
    fn move_mount(tree: &OwnedFd, to: &CString) -> std::io::Result<()> {
        // SAFETY: both paths are NUL-terminated strings that outlive the call;
        // move_mount only reads them.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_move_mount,
                tree.as_raw_fd(),
                c"".as_ptr(),
                libc::AT_FDCWD,
                to.as_ptr(),
                libc::MOVE_MOUNT_F_EMPTY_PATH,
            )
        };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
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
    // Never through a symlink: a path in the share is reachable by the guest.
    for _ in 0..8 {
        match umount2(path, MntFlags::UMOUNT_NOFOLLOW) {
            Ok(()) => continue,
            Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => return,
            Err(_) => {
                if umount2(path, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW).is_err() {
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
        .map(procinfo::mounts::unescape)
        .map(PathBuf::from)
        .filter(|p| p.starts_with(root))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
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

    /// A scratch tree under /run (a tmpfs on the host) with its own mounts, all
    /// unmounted and removed on drop, even when the test fails.
    struct Scratch {
        dir: PathBuf,
    }

    impl Scratch {
        fn new(name: &str) -> Self {
            assert!(
                nix::unistd::geteuid().is_root(),
                "mount tests need root (as the shim does)"
            );
            let dir = std::env::temp_dir().join(format!("h3-mount-{name}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            Scratch { dir }
        }

        fn tmpfs(&self, at: &Path) {
            std::fs::create_dir_all(at).unwrap();
            mount(
                Some("tmpfs"),
                at,
                Some("tmpfs"),
                MsFlags::empty(),
                None::<&str>,
            )
            .unwrap();
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            for m in mounts_under(&self.dir) {
                let _ = umount2(&m, MntFlags::MNT_DETACH);
            }
            let _ = remove_dir_if_unmounted(&self.dir);
        }
    }

    fn write_errno(path: &Path) -> Option<i32> {
        std::fs::write(path, b"x")
            .err()
            .map(|e| e.raw_os_error().unwrap_or(-1))
    }

    /// A volume source: a file at its top and a tmpfs submount, as critest makes it.
    fn volume(s: &Scratch) -> PathBuf {
        let src = s.dir.join("src");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(src.join("top"), b"host").unwrap();
        s.tmpfs(&src.join("tmpfs"));
        src
    }

    /// The share's layout: `mounts` shared, `shared` its read-only recursive copy (what
    /// virtiofsd serves).
    fn share(s: &Scratch) -> SharedDirs {
        let base = s.dir.join("share");
        let d = SharedDirs {
            mounts: base.join("mounts"),
            shared: base.join("shared"),
            base,
        };
        d.setup().unwrap();
        d
    }

    #[test]
    fn a_read_only_volume_has_its_top_read_only_in_every_copy_and_its_submounts_as_they_are() {
        let s = Scratch::new("ro");
        let src = volume(&s);
        let d = share(&s);
        let dst = d.mounts.join("c1/mounts/0-data");
        bind(&src, &dst, Access::ReadOnly, Propagation::Private).unwrap();
        // The copy virtiofsd sees, propagated from the share's `mounts`.
        let served = d.shared.join("c1/mounts/0-data");
        for at in [&dst, &served] {
            assert_eq!(
                write_errno(&at.join("top")),
                Some(libc::EROFS),
                "{}",
                at.display()
            );
            assert_eq!(
                write_errno(&at.join("new")),
                Some(libc::EROFS),
                "{}",
                at.display()
            );
        }
        assert_eq!(
            write_errno(&dst.join("tmpfs/file")),
            None,
            "the tmpfs stays writable"
        );
        assert_eq!(std::fs::read(src.join("tmpfs/file")).unwrap(), b"x");
        assert_eq!(std::fs::read(src.join("top")).unwrap(), b"host");
        assert!(!src.join("new").exists());
    }

    #[test]
    fn a_recursively_read_only_volume_is_read_only_to_the_bottom_in_every_copy() {
        let s = Scratch::new("rro");
        let src = volume(&s);
        let d = share(&s);
        let dst = d.mounts.join("c1/mounts/0-data");
        bind(&src, &dst, Access::RecursiveReadOnly, Propagation::Private).unwrap();
        let served = d.shared.join("c1/mounts/0-data");
        for at in [&dst, &served] {
            assert_eq!(write_errno(&at.join("top")), Some(libc::EROFS));
            assert_eq!(write_errno(&at.join("tmpfs/file")), Some(libc::EROFS));
        }
        // The host's own mounts are untouched.
        assert_eq!(write_errno(&src.join("tmpfs/file")), None);
        assert_eq!(write_errno(&src.join("top")), None);
    }

    #[test]
    fn propagation_from_the_source_follows_the_option_and_unmounts_reach_every_copy() {
        let s = Scratch::new("prop");
        let src = s.dir.join("src");
        std::fs::create_dir_all(&src).unwrap();
        // A shared source, as / is on a systemd host.
        mount(
            Some(&src),
            &src,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .unwrap();
        mount(
            None::<&str>,
            &src,
            None::<&str>,
            MsFlags::MS_SHARED,
            None::<&str>,
        )
        .unwrap();
        std::fs::create_dir_all(src.join("later")).unwrap();
        let d = share(&s);
        let private = d.mounts.join("c1/mounts/0-private");
        let slave = d.mounts.join("c1/mounts/1-slave");
        bind(&src, &private, Access::ReadWrite, Propagation::Private).unwrap();
        bind(&src, &slave, Access::ReadOnly, Propagation::Slave).unwrap();
        s.tmpfs(&src.join("later"));
        let later = |p: &Path| mounts_under(&s.dir).contains(&p.join("later"));
        assert!(
            !later(&private),
            "a private bind got the host's later mount"
        );
        assert!(later(&slave), "a slave bind missed the host's later mount");
        assert!(later(&d.shared.join("c1/mounts/1-slave")));
        // The container's teardown: every copy in the share goes with it.
        unmount(&d.mounts.join("c1/mounts/1-slave/later"));
        for m in [&private, &slave] {
            unmount(m);
        }
        let left: Vec<_> = mounts_under(&d.shared.join("c1"));
        assert!(left.is_empty(), "copies left in the share: {left:?}");
    }

    /// A process in a mount namespace of its own (as virtiofsd's), killed by its pid on
    /// drop.
    struct NsHolder(std::process::Child);

    impl NsHolder {
        fn start() -> Self {
            let child = std::process::Command::new("unshare")
                .args(["--mount", "--propagation", "slave", "sleep", "600"])
                .spawn()
                .expect("unshare (util-linux)");
            let pid = child.id();
            let holder = NsHolder(child);
            // Until unshare has made the namespace and exec'd sleep.
            for _ in 0..500 {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                if comm.trim() == "sleep" {
                    return holder;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            panic!("unshare did not start sleep");
        }

        fn pid(&self) -> u32 {
            self.0.id()
        }

        fn ns(&self) -> std::fs::File {
            std::fs::File::open(format!("/proc/{}/ns/mnt", self.pid())).unwrap()
        }

        fn mounts(&self) -> String {
            std::fs::read_to_string(format!("/proc/{}/mountinfo", self.pid())).unwrap()
        }
    }

    impl Drop for NsHolder {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn a_volume_served_from_a_namespace_of_its_own_leaves_the_hosts_submounts_free() {
        let s = Scratch::new("ns");
        let src = volume(&s);
        let holder = NsHolder::start();
        // The holder's root is the host's: the share is `/` in both, so `rel` is the
        // same path in both namespaces.
        let rel = s.dir.join("share/c1/mounts/0-data");
        let rel = rel.strip_prefix("/").unwrap();
        let made = bind_volume(
            &src,
            Path::new("/"),
            rel,
            Access::ReadOnly,
            Propagation::Private,
            &[holder.ns()],
        )
        .unwrap();
        assert_eq!(made, None, "nothing is mounted in the host's namespace");
        let dst = Path::new("/").join(rel);
        assert!(!mounts_under(&s.dir).contains(&dst));
        assert!(holder.mounts().contains(&format!(" {} ", dst.display())));
        // Through the holder's namespace: the top is read-only, the tmpfs is not.
        let seen = PathBuf::from(format!("/proc/{}/root", holder.pid())).join(rel);
        assert_eq!(write_errno(&seen.join("top")), Some(libc::EROFS));
        assert_eq!(write_errno(&seen.join("tmpfs/file")), None);
        assert_eq!(std::fs::read(src.join("tmpfs/file")).unwrap(), b"x");

        // What critest's clean-up does while the container runs: unmount the source's
        // tmpfs on the host and remove the directory. In the host's namespace it is no
        // mount point of ours, so this works as under runc.
        umount2(&src.join("tmpfs"), MntFlags::MNT_DETACH).unwrap();
        std::fs::remove_dir(src.join("tmpfs")).unwrap();

        // Teardown: removing the mount point on the host detaches the namespace's bind.
        remove_dir_if_unmounted(&s.dir.join("share")).unwrap();
        assert!(
            !holder.mounts().contains(&format!(" {} ", dst.display())),
            "{}",
            holder.mounts()
        );
    }

    #[test]
    fn unmount_does_not_follow_a_symlink() {
        let s = Scratch::new("nofollow");
        let target = s.dir.join("target");
        s.tmpfs(&target);
        let link = s.dir.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        unmount(&link);
        assert!(
            mounts_under(&s.dir).contains(&target),
            "unmounted through a symlink"
        );
    }

    #[test]
    fn share_layout_is_per_sandbox() {
        let d = SharedDirs::for_sandbox("sb1");
        assert_eq!(d.mounts, Path::new(SHARE_ROOT).join("sb1/mounts"));
        assert_eq!(d.shared, Path::new(SHARE_ROOT).join("sb1/shared"));
    }
}
