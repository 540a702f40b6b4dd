//! Containment of a sandbox's host processes: the VMM (QEMU or kata-vmm) and kata-vsock
//! run as a uid and gid of the sandbox's own, with no capabilities and no new privileges,
//! in a minimal root of their own (see [`Jail::with_root`]) with a private `/dev` holding
//! only the nodes they use, and (kata-vsock) an empty network namespace; as
//! Firecracker's jailer does. A guest that escapes into one of them then
//! holds an unprivileged user that owns nothing on the host but its run directory.
//!
//! By concern, as the jailer splits it:
//! - [`ids`]: the sandbox's uid and gid, claimed from the configured range, and the run
//!   directory and sockets given to them;
//! - [`tap`]: the VMM's taps, as descriptors or owned by its uid;
//! - `root` and `dev`: the minimal root and the private `/dev`;
//! - `sys`: the system calls the child makes, each wrapped once.
//!
//! [`Jail`] is what the child does between fork and exec ([`Jail::enter`], called by
//! `process`), prepared in the parent: it may only make async-signal-safe system calls
//! there. [`ReadOnlyFile`]: the kernel and initrd reach the VMM as descriptors opened
//! read-only by the shim, named `/proc/self/fd/N`, so it needs no path to them. Nothing
//! here starts a process: `process` spawns, `crate::probe` tries both together.

mod dev;
pub mod ids;
mod root;
mod sys;
pub mod tap;

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use dev::DevNode;
pub use ids::{claim_async, hand_over, own_run_dir, release_claims_of, SandboxIds, ID_CLAIMS_DIR};
pub use root::{real_path, ROOT_STAGE};
pub use tap::{open_tap, own_tap};

use crate::Error;

/// The descriptors a confined VMM gets its kernel, initrd and first tap on.
pub const KERNEL_FD: RawFd = 4;
pub const INITRD_FD: RawFd = 5;
pub const FIRST_TAP_FD: RawFd = 10;

/// The path a child opens passed descriptor `fd` by.
pub fn fd_path(fd: RawFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{fd}"))
}

/// A file the VMM reads through a descriptor the shim opened read-only
/// (`/proc/self/fd/N` in its arguments, see [`fd_path`]): it needs no path to them.
#[derive(Debug)]
pub struct ReadOnlyFile(Arc<OwnedFd>);

impl ReadOnlyFile {
    pub fn open(what: &str, path: &Path) -> Result<ReadOnlyFile, Error> {
        File::open(path)
            .map(|f| ReadOnlyFile(Arc::new(f.into())))
            .map_err(|e| {
                Error::Unsupported(format!(
                    "cannot open the guest {what} {}: {e}",
                    path.display()
                ))
            })
    }

    /// The descriptor, to pass to the child (`process::Place::pass_fd`).
    pub fn fd(&self) -> Arc<OwnedFd> {
        self.0.clone()
    }
}

fn cstring(s: &str) -> Result<CString, Error> {
    CString::new(s).map_err(|_| Error::Unsupported(format!("{s:?} holds a NUL byte")))
}

/// The highest capability this kernel knows (`/proc/sys/kernel/cap_last_cap`).
fn last_cap() -> libc::c_ulong {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63)
}

/// What a confined child does between fork and exec, prepared in the parent.
#[derive(Debug)]
pub struct Jail {
    uid: libc::uid_t,
    gid: libc::gid_t,
    new_netns: bool,
    dev: dev::PrivateDev,
    root: Option<root::Root>,
    /// The devices it gets besides [`DevNode::BASIC`].
    extra: Vec<DevNode>,
    /// The highest capability number of this kernel.
    last_cap: libc::c_ulong,
}

impl Jail {
    /// A child of `ids`, with a private `/dev` of [`DevNode::BASIC`] and `extra`, in an
    /// empty network namespace of its own when `new_netns`.
    pub fn new(ids: &SandboxIds, extra: &[DevNode], new_netns: bool) -> Result<Jail, Error> {
        Ok(Jail {
            uid: ids.uid,
            gid: ids.gid,
            new_netns,
            dev: dev::PrivateDev::new("", extra)?,
            root: None,
            extra: extra.to_vec(),
            last_cap: last_cap(),
        })
    }

    /// The same in a minimal root of its own (see `root::Root`) that holds `program` and
    /// the directories `writable`, at their paths.
    pub fn with_root(mut self, program: &Path, writable: &[&Path]) -> Result<Jail, Error> {
        self.root = Some(root::Root::build(program, writable)?);
        self.dev = dev::PrivateDev::new(ROOT_STAGE, &self.extra)?;
        Ok(self)
    }

    /// Applies the jail in the child, after it joined its cgroups and network namespace.
    /// Only async-signal-safe system calls; nothing allocates. The order matters: the
    /// namespaces and mounts while the child is still root, the bounding set while it
    /// has CAP_SETPCAP, the ids last but no new privileges.
    pub(crate) fn enter(&self) -> io::Result<()> {
        if self.new_netns {
            sys::unshare(libc::CLONE_NEWNET)?;
        }
        sys::unshare(libc::CLONE_NEWNS)?;
        sys::mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)?;
        match &self.root {
            Some(root) => root.enter(&self.dev, self.uid, self.gid)?,
            None => self.dev.make(self.uid, self.gid)?,
        }
        sys::umask(0o077);
        for cap in 0..=self.last_cap {
            sys::prctl(libc::PR_CAPBSET_DROP, cap, 0)?;
        }
        sys::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
        )?;
        sys::become_ids(self.uid, self.gid)?;
        // setresuid cleared the permitted and effective sets; the inheritable set
        // survives it, so it is cleared too.
        sys::clear_capabilities()?;
        sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0)
    }
}
