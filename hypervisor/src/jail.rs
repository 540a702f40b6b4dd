//! Containment of a sandbox's host processes: the VMM (QEMU or kata-vmm) and kata-vsock
//! run as a uid and gid of the sandbox's own, with no capabilities and no new privileges,
//! in a minimal root of their own (see [`Jail::with_root`]) with a private `/dev` holding
//! only the nodes they use, and (kata-vsock) an empty network namespace; as
//! Firecracker's jailer does. A guest that escapes into one of them then
//! holds an unprivileged user that owns nothing on the host but its run directory.
//!
//! - [`SandboxIds::claim`] takes a free id from the configured range: an `O_EXCL` claim
//!   file `<dir>/<uid>` naming the sandbox, `flock`ed for as long as the claiming shim
//!   lives, taken under a lock of the whole directory. A claim whose holder died and whose
//!   uid no process runs as any more is stale and taken over. [`SandboxIds::release`]
//!   (the VM's stop) and [`release_claims_of`] (a crashed shim's `delete`) remove it.
//! - [`Jail`] is what the child does between fork and exec ([`Jail::enter`]), prepared
//!   in the parent: it may only make async-signal-safe system calls there.
//! - [`open_tap`] and [`own_tap`]: the VMM gets its taps as descriptors the shim opened
//!   (QEMU's `-netdev tap,fd=N`) or owned by its uid (kata-vmm attaches by name).
//! - [`ReadOnlyFile`]: the kernel and initrd reach the VMM as descriptors opened
//!   read-only by the shim, named `/proc/self/fd/N`, so it needs no path to them.

use std::collections::HashSet;
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::Error;

/// Where sandboxes claim their ids, one file per uid in use.
pub const ID_CLAIMS_DIR: &str = "/run/vc/ids";
/// The descriptors a confined VMM gets its kernel, initrd and first tap on.
pub const KERNEL_FD: RawFd = 4;
pub const INITRD_FD: RawFd = 5;
pub const FIRST_TAP_FD: RawFd = 10;

/// The path a child opens passed descriptor `fd` by.
pub fn fd_path(fd: RawFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{fd}"))
}

/// The lock of the whole claims directory (allocation, reclaim and release).
const LOCK_FILE: &str = ".lock";

/// The uid and gid (the same number) of one sandbox's host processes, claimed until
/// [`SandboxIds::release`] (or the claiming process's death, after which the claim is
/// stale once no process runs as the uid).
#[derive(Debug)]
pub struct SandboxIds {
    pub uid: u32,
    pub gid: u32,
    claim: PathBuf,
    /// Open and `flock`ed while the claim is held.
    _held: File,
}

/// The claims directory, locked while the guard lives.
struct DirLock(File);

impl DirLock {
    fn take(dir: &Path) -> Result<DirLock, Error> {
        let fail = |e: io::Error| {
            Error::Containment(format!(
                "cannot lock the sandbox id claims in {}: {e}",
                dir.display()
            ))
        };
        std::fs::create_dir_all(dir).map_err(fail)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(fail)?;
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .mode(0o600)
            .open(dir.join(LOCK_FILE))
            .map_err(fail)?;
        flock(&file, libc::LOCK_EX).map_err(fail)?;
        Ok(DirLock(file))
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        let _ = flock(&self.0, libc::LOCK_UN);
    }
}

fn flock(file: &File, how: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: flock on a descriptor we own; no memory is passed.
        if unsafe { libc::flock(file.as_raw_fd(), how) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Whether another process holds the claim's lock (its claimer is alive).
fn held_elsewhere(file: &File) -> io::Result<bool> {
    match flock(file, libc::LOCK_EX | libc::LOCK_NB) {
        Ok(()) => Ok(false),
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => Ok(true),
        Err(e) => Err(e),
    }
}

/// Every uid (real, effective, saved, file system) some process on the host runs as.
fn uids_in_use() -> HashSet<u32> {
    let mut uids = HashSet::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return uids;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        if !name.as_bytes().iter().all(u8::is_ascii_digit) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        if let Some(line) = status.lines().find(|l| l.starts_with("Uid:")) {
            uids.extend(
                line[4..]
                    .split_whitespace()
                    .filter_map(|u| u.parse::<u32>().ok()),
            );
        }
    }
    uids
}

impl SandboxIds {
    /// Claims a free uid of `range` for `sandbox_id` in `dir` (see the module's notes).
    pub fn claim(
        dir: &Path,
        range: &kata_config::HostProcesses,
        sandbox_id: &str,
    ) -> Result<SandboxIds, Error> {
        let _lock = DirLock::take(dir)?;
        let fail = |path: &Path, e: io::Error| {
            Error::Containment(format!("cannot claim {}: {e}", path.display()))
        };
        let mut in_use: Option<HashSet<u32>> = None;
        let end = u64::from(range.uid_start) + u64::from(range.uid_count);
        for uid in u64::from(range.uid_start)..end {
            let Ok(uid) = u32::try_from(uid) else { break };
            let path = dir.join(uid.to_string());
            let fresh = OpenOptions::new()
                .create_new(true)
                .read(true)
                .write(true)
                .mode(0o600)
                .open(&path);
            let mut file = match fresh {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    let Ok(f) = OpenOptions::new().read(true).write(true).open(&path) else {
                        continue;
                    };
                    if held_elsewhere(&f).map_err(|e| fail(&path, e))? {
                        continue;
                    }
                    // Its claimer is gone; the id is free once nothing runs as it (a
                    // crashed shim's VMM may, until `delete` stops it).
                    if in_use.get_or_insert_with(uids_in_use).contains(&uid) {
                        continue;
                    }
                    f
                }
                Err(e) => return Err(fail(&path, e)),
            };
            flock(&file, libc::LOCK_EX | libc::LOCK_NB).map_err(|e| fail(&path, e))?;
            file.set_len(0).map_err(|e| fail(&path, e))?;
            file.rewind().map_err(|e| fail(&path, e))?;
            file.write_all(sandbox_id.as_bytes())
                .map_err(|e| fail(&path, e))?;
            return Ok(SandboxIds {
                uid,
                gid: uid,
                claim: path,
                _held: file,
            });
        }
        Err(Error::Containment(format!(
            "every id of host_uid_start {} .. + host_uid_count {} is taken by a running \
             sandbox (claims in {}); raise host_uid_count",
            range.uid_start,
            range.uid_count,
            dir.display()
        )))
    }

    /// Takes over the claim of `uid` in `dir` that `from_owner` made (a pooled VM's,
    /// named by its pool id) for `to_owner` (the sandbox that adopts the VM): the claim
    /// file then names `to_owner` (so [`release_claims_of`] finds it after a crashed
    /// shim) and is `flock`ed by the caller until [`SandboxIds::release`] or its death.
    ///
    /// The previous holder must have let go of its lock first ([`SandboxIds::let_go`]);
    /// a claim still locked, missing, or naming someone else is refused.
    pub fn take_over(
        dir: &Path,
        uid: u32,
        from_owner: &str,
        to_owner: &str,
    ) -> Result<SandboxIds, Error> {
        let _lock = DirLock::take(dir)?;
        let path = dir.join(uid.to_string());
        let fail = |what: String| {
            Error::Containment(format!(
                "cannot take over the id claim {} of {from_owner} for {to_owner}: {what}",
                path.display()
            ))
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| fail(e.to_string()))?;
        let mut owner = String::new();
        file.read_to_string(&mut owner)
            .map_err(|e| fail(e.to_string()))?;
        if owner != from_owner && owner != to_owner {
            return Err(fail(format!("it is held for {owner:?}")));
        }
        match flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {
                return Err(fail(
                    "a live process still holds it (the VM factory must let go of a VM's \
                     claim before it offers the VM)"
                        .into(),
                ))
            }
            Err(e) => return Err(fail(e.to_string())),
        }
        file.set_len(0).map_err(|e| fail(e.to_string()))?;
        file.rewind().map_err(|e| fail(e.to_string()))?;
        file.write_all(to_owner.as_bytes())
            .map_err(|e| fail(e.to_string()))?;
        Ok(SandboxIds {
            uid,
            gid: uid,
            claim: path,
            _held: file,
        })
    }

    /// Lets go of the claim's lock but keeps the claim: the id stays taken while a
    /// process runs as it (a claim nobody holds is reclaimed only once no process runs
    /// as its uid), and another process may [`SandboxIds::take_over`] it. The VM
    /// factory does this for a VM it offers; [`release_claims_of`] with the claim's
    /// owner removes it once the VM is stopped.
    pub fn let_go(self) {
        drop(self);
    }

    /// The uid `owner` holds a claim of in `dir`, if any.
    pub fn claimed_by(dir: &Path, owner: &str) -> Option<u32> {
        let entries = std::fs::read_dir(dir).ok()?;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(uid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(text) = std::fs::read_to_string(entry.path()) else {
                continue;
            };
            if text == owner {
                return Some(uid);
            }
        }
        None
    }

    /// Gives the id back, once nothing runs as it any more.
    pub fn release(self) {
        let Some(dir) = self.claim.parent() else {
            return;
        };
        if let Ok(_lock) = DirLock::take(dir) {
            let _ = std::fs::remove_file(&self.claim);
        }
    }
}

/// [`SandboxIds::claim`] in [`ID_CLAIMS_DIR`], on a blocking thread.
pub async fn claim_async(
    range: kata_config::HostProcesses,
    sandbox_id: &str,
) -> Result<SandboxIds, Error> {
    let id = sandbox_id.to_string();
    tokio::task::spawn_blocking(move || SandboxIds::claim(Path::new(ID_CLAIMS_DIR), &range, &id))
        .await
        .map_err(|e| Error::Containment(format!("claiming an id panicked: {e}")))?
}

/// Removes the claims `sandbox_id` left behind (a crashed shim's `delete`, after its
/// processes are stopped); claims held by a live process are left alone.
pub fn release_claims_of(dir: &Path, sandbox_id: &str) {
    if !dir.is_dir() {
        return;
    }
    let Ok(_lock) = DirLock::take(dir) else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_name() == LOCK_FILE {
            continue;
        }
        let Ok(mut f) = OpenOptions::new().read(true).write(true).open(&path) else {
            continue;
        };
        let mut owner = String::new();
        if f.read_to_string(&mut owner).is_err() || owner != sandbox_id {
            continue;
        }
        if let Ok(false) = held_elsewhere(&f) {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// Makes `run_dir` the sandbox's: owned by its uid and gid, mode 0700.
/// Every directory above it must let others through (as /run/vc/vm does).
pub fn own_run_dir(run_dir: &Path, ids: &SandboxIds) -> Result<(), Error> {
    for dir in run_dir.ancestors().skip(1) {
        let Ok(meta) = std::fs::metadata(dir) else {
            continue;
        };
        if meta.mode() & 0o001 == 0 {
            return Err(Error::Containment(format!(
                "the sandbox's uid cannot reach its run directory {}: {} has mode {:o}, \
                 without search permission for others",
                run_dir.display(),
                dir.display(),
                meta.mode() & 0o7777
            )));
        }
    }
    chown_mode(run_dir, ids, 0o700)
}

/// Hands sockets that root-run helpers (virtiofsd) made over to the sandbox's uid alone.
pub fn hand_over(paths: &[&Path], ids: &SandboxIds) -> Result<(), Error> {
    for path in paths {
        chown_mode(path, ids, 0o600)?;
    }
    Ok(())
}

fn chown_mode(path: &Path, ids: &SandboxIds, mode: u32) -> Result<(), Error> {
    let fail = |source| Error::RunDir {
        path: path.to_path_buf(),
        source,
    };
    std::os::unix::fs::chown(path, Some(ids.uid), Some(ids.gid)).map_err(fail)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(fail)
}

/// A file the VMM reads through a descriptor the shim opened read-only
/// (`/proc/self/fd/N` in its arguments, see [`fd_path`]): it needs no path to them.
#[derive(Debug)]
pub struct ReadOnlyFile(std::sync::Arc<OwnedFd>);

impl ReadOnlyFile {
    pub fn open(what: &str, path: &Path) -> Result<ReadOnlyFile, Error> {
        File::open(path)
            .map(|f| ReadOnlyFile(std::sync::Arc::new(f.into())))
            .map_err(|e| {
                Error::Unsupported(format!(
                    "cannot open the guest {what} {}: {e}",
                    path.display()
                ))
            })
    }

    /// Passes it to the child as descriptor `target`.
    pub fn pass_to(&self, place: &mut crate::process::Place, target: RawFd) {
        place.pass_fd(self.0.clone(), target);
    }
}

/// `struct ifreq` with the flags member of its union (40 bytes on Linux).
#[repr(C)]
struct IfReqFlags {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _rest: [u8; 22],
}

const TUNSETIFF: libc::c_ulong =
    nix::request_code_write!(b'T', 202, std::mem::size_of::<libc::c_int>()) as libc::c_ulong;
const TUNSETOWNER: libc::c_ulong =
    nix::request_code_write!(b'T', 204, std::mem::size_of::<libc::c_int>()) as libc::c_ulong;
const TUNSETGROUP: libc::c_ulong =
    nix::request_code_write!(b'T', 206, std::mem::size_of::<libc::c_int>()) as libc::c_ulong;

/// Attaches to the existing tap `name` in the network namespace `netns` and returns the
/// queue's descriptor (what QEMU's `-netdev tap,fd=N` takes), with the flags the shim made
/// the tap with. When `owner` is given, the tap is also given to that uid and gid, so
/// that an unprivileged VMM may attach to it by name.
pub fn open_tap(netns: &Path, name: &str, owner: Option<&SandboxIds>) -> Result<OwnedFd, Error> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(Error::Unsupported(format!(
            "tap name {name:?} must be 1 to 15 bytes"
        )));
    }
    let ns = File::open(netns).map_err(|source| Error::Place {
        what: "the pod's network namespace",
        path: netns.to_path_buf(),
        source,
    })?;
    let mut req = IfReqFlags {
        name: [0; libc::IFNAMSIZ],
        flags: (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short,
        _rest: [0; 22],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    let ids = owner.map(|o| (o.uid, o.gid));
    let name = name.to_string();
    // A thread of its own enters the namespace (setns affects the calling thread only),
    // and ends there.
    std::thread::spawn(move || -> io::Result<OwnedFd> {
        // SAFETY: setns on a namespace descriptor we own, for this thread alone.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let tun = OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/net/tun")?;
        // SAFETY: TUNSETIFF reads and writes one `struct ifreq`, which `req` lays out and
        // which lives across the call.
        if unsafe { libc::ioctl(tun.as_raw_fd(), TUNSETIFF, &mut req) } < 0 {
            return Err(io::Error::last_os_error());
        }
        if let Some((uid, gid)) = ids {
            for (request, id) in [(TUNSETOWNER, uid), (TUNSETGROUP, gid)] {
                // SAFETY: TUNSETOWNER and TUNSETGROUP take the id by value.
                if unsafe { libc::ioctl(tun.as_raw_fd(), request, id as libc::c_ulong) } < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
        }
        Ok(tun.into())
    })
    .join()
    .map_err(|_| Error::Unsupported(format!("opening tap {name} panicked")))?
    .map_err(|e| Error::Unsupported(format!("cannot open tap {name} for the VMM: {e}")))
}

/// Gives the tap `name` in `netns` to the sandbox's uid and gid (kata-vmm attaches to it
/// by name, without CAP_NET_ADMIN).
pub fn own_tap(netns: &Path, name: &str, ids: &SandboxIds) -> Result<(), Error> {
    open_tap(netns, name, Some(ids)).map(drop)
}

/// A device node of the private `/dev`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DevNode {
    Null,
    Zero,
    Full,
    Random,
    Urandom,
    /// `/dev/kvm`, the sandbox's uid's alone.
    Kvm,
    /// `/dev/net/tun`, the sandbox's uid's alone (it attaches only to taps it owns).
    Tun,
}

impl DevNode {
    /// The nodes every confined process gets.
    pub const BASIC: [DevNode; 5] = [
        DevNode::Null,
        DevNode::Zero,
        DevNode::Full,
        DevNode::Random,
        DevNode::Urandom,
    ];

    fn host_path(self) -> &'static str {
        match self {
            DevNode::Null => "/dev/null",
            DevNode::Zero => "/dev/zero",
            DevNode::Full => "/dev/full",
            DevNode::Random => "/dev/random",
            DevNode::Urandom => "/dev/urandom",
            DevNode::Kvm => "/dev/kvm",
            DevNode::Tun => "/dev/net/tun",
        }
    }

    /// The sandbox's own, 0600; else everyone's, 0666 (as on the host).
    fn private(self) -> bool {
        matches!(self, DevNode::Kvm | DevNode::Tun)
    }
}

/// One node to make: path, mode, device number, whether the sandbox's uid owns it.
#[derive(Debug)]
struct Node {
    path: CString,
    mode: libc::mode_t,
    rdev: libc::dev_t,
    owned: bool,
}

/// A bind mount of the minimal root.
#[derive(Debug)]
struct Bind {
    source: CString,
    /// Under the staging directory.
    target: CString,
    writable: bool,
}

/// The minimal root a confined child pivots into (as Firecracker's jailer's chroot): a
/// read-only tmpfs holding `/usr` (and the top-level links or directories of the system's
/// programs and libraries) read-only, the program itself, `/etc/ld.so.cache`, its
/// writable directories (the run directory), a `/proc` that shows only its own uid's
/// processes, and the private `/dev`. Built on [`ROOT_STAGE`] in the child's own mount
/// namespace (every child mounts its own tmpfs there).
#[derive(Debug)]
struct Root {
    stage: CString,
    /// Directories to make under the stage, parents first.
    dirs: Vec<CString>,
    /// Empty files to make under the stage (mount points of file binds).
    files: Vec<CString>,
    /// (target, link path under the stage).
    links: Vec<(CString, CString)>,
    binds: Vec<Bind>,
    proc_dir: CString,
}

/// The path a confined program is run by: its real path, without links or `..`, which
/// the minimal root holds (see [`Jail::with_root`]).
pub fn real_path(program: &Path) -> Result<PathBuf, Error> {
    std::fs::canonicalize(program)
        .map_err(|e| Error::Containment(format!("cannot resolve {}: {e}", program.display())))
}

/// Where confined children build their minimal root (see [`Root`]).
pub const ROOT_STAGE: &str = "/run/vc/jail-root";

/// What a confined child does between fork and exec, prepared in the parent.
#[derive(Debug)]
pub struct Jail {
    uid: libc::uid_t,
    gid: libc::gid_t,
    new_netns: bool,
    /// The private `/dev`'s nodes (and `/dev/net` when one is under it).
    nodes: Vec<Node>,
    dev_dir: CString,
    /// `/dev/net`, when `/dev/net/tun` is one of the nodes.
    dev_net: Option<CString>,
    root: Option<Root>,
    /// The devices it gets besides [`DevNode::BASIC`].
    extra: Vec<DevNode>,
    /// The highest capability number of this kernel.
    last_cap: libc::c_ulong,
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

impl Jail {
    /// A child of `ids`, with a private `/dev` of [`DevNode::BASIC`] and `extra`, in an
    /// empty network namespace of its own when `new_netns`.
    pub fn new(ids: &SandboxIds, extra: &[DevNode], new_netns: bool) -> Result<Jail, Error> {
        let mut jail = Jail {
            uid: ids.uid,
            gid: ids.gid,
            new_netns,
            nodes: Vec::new(),
            dev_dir: cstring("/dev")?,
            dev_net: None,
            root: None,
            extra: extra.to_vec(),
            last_cap: last_cap(),
        };
        jail.make_dev("")?;
        Ok(jail)
    }

    /// The private `/dev` under `prefix` (empty: at `/dev` itself).
    fn make_dev(&mut self, prefix: &str) -> Result<(), Error> {
        self.nodes.clear();
        for node in DevNode::BASIC.iter().chain(&self.extra) {
            let host = node.host_path();
            let meta = std::fs::metadata(host).map_err(|e| {
                Error::Containment(format!("cannot stat {host} for the private /dev: {e}"))
            })?;
            self.nodes.push(Node {
                path: cstring(&format!("{prefix}{host}"))?,
                mode: libc::S_IFCHR | if node.private() { 0o600 } else { 0o666 },
                rdev: meta.rdev(),
                owned: node.private(),
            });
        }
        self.dev_dir = cstring(&format!("{prefix}/dev"))?;
        self.dev_net = if self.extra.contains(&DevNode::Tun) {
            Some(cstring(&format!("{prefix}/dev/net"))?)
        } else {
            None
        };
        Ok(())
    }

    /// The same in a minimal root of its own (see [`Root`]) that holds `program` and
    /// the directories `writable`, at their paths.
    pub fn with_root(mut self, program: &Path, writable: &[&Path]) -> Result<Jail, Error> {
        let stage = Path::new(ROOT_STAGE);
        std::fs::create_dir_all(stage)
            .map_err(|e| Error::Containment(format!("cannot make {}: {e}", stage.display())))?;
        let under = |p: &Path| -> Result<CString, Error> {
            cstring(&format!("{ROOT_STAGE}{}", p.display()))
        };
        let mut dirs: Vec<PathBuf> = Vec::new();
        let add_dir = |p: &Path, dirs: &mut Vec<PathBuf>| {
            for a in p.ancestors().collect::<Vec<_>>().into_iter().rev() {
                if a != Path::new("/") && !dirs.iter().any(|d| d == a) {
                    dirs.push(a.to_path_buf());
                }
            }
        };
        let mut root = Root {
            stage: cstring(ROOT_STAGE)?,
            dirs: Vec::new(),
            files: Vec::new(),
            links: Vec::new(),
            binds: Vec::new(),
            proc_dir: under(Path::new("/proc"))?,
        };
        add_dir(Path::new("/usr"), &mut dirs);
        root.binds.push(Bind {
            source: cstring("/usr")?,
            target: under(Path::new("/usr"))?,
            writable: false,
        });
        for top in ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"] {
            let top = Path::new(top);
            let Ok(meta) = std::fs::symlink_metadata(top) else {
                continue;
            };
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(top).map_err(|e| {
                    Error::Containment(format!("cannot read {}: {e}", top.display()))
                })?;
                root.links
                    .push((cstring(&target.display().to_string())?, under(top)?));
            } else if meta.is_dir() {
                add_dir(top, &mut dirs);
                root.binds.push(Bind {
                    source: cstring(&top.display().to_string())?,
                    target: under(top)?,
                    writable: false,
                });
            }
        }
        let mut files = Vec::new();
        let ld_cache = Path::new("/etc/ld.so.cache");
        if ld_cache.is_file() {
            add_dir(Path::new("/etc"), &mut dirs);
            files.push(ld_cache.to_path_buf());
        }
        // The program at its real path (see [`real_path`]), unless /usr brings it.
        let real = real_path(program)?;
        if !real.starts_with("/usr/") {
            if let Some(parent) = real.parent() {
                add_dir(parent, &mut dirs);
            }
            files.push(real);
        }
        for f in &files {
            root.files.push(under(f)?);
            root.binds.push(Bind {
                source: cstring(&f.display().to_string())?,
                target: under(f)?,
                writable: false,
            });
        }
        for w in writable {
            add_dir(w, &mut dirs);
            root.binds.push(Bind {
                source: cstring(&w.display().to_string())?,
                target: under(w)?,
                writable: true,
            });
        }
        add_dir(Path::new("/proc"), &mut dirs);
        add_dir(Path::new("/dev"), &mut dirs);
        // Directories that are bind targets themselves are made as well (the mount point).
        root.dirs = dirs.iter().map(|d| under(d)).collect::<Result<_, _>>()?;
        self.make_dev(ROOT_STAGE)?;
        self.root = Some(root);
        Ok(self)
    }

    /// Builds the minimal root on the stage and pivots into it (in the child).
    fn enter_root(root: &Root, dev: impl Fn() -> io::Result<()>) -> io::Result<()> {
        fn check(ret: libc::c_int) -> io::Result<()> {
            if ret < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        }
        // SAFETY: a raw system call on strings made before the fork that outlive it.
        check(unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                root.stage.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                c"mode=0755,size=64k,nr_inodes=256".as_ptr().cast(),
            )
        })?;
        for dir in &root.dirs {
            // SAFETY: as above.
            check(unsafe { libc::mkdir(dir.as_ptr(), 0o755) })?;
        }
        for file in &root.files {
            // SAFETY: as above; the descriptor is closed at once.
            let fd = unsafe {
                libc::open(
                    file.as_ptr(),
                    libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                    0o644,
                )
            };
            check(fd)?;
            // SAFETY: `fd` was just opened here.
            unsafe { libc::close(fd) };
        }
        for (target, link) in &root.links {
            // SAFETY: as above.
            check(unsafe { libc::symlink(target.as_ptr(), link.as_ptr()) })?;
        }
        for bind in &root.binds {
            // SAFETY: as above.
            check(unsafe {
                libc::mount(
                    bind.source.as_ptr(),
                    bind.target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                )
            })?;
            let mut flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_NOSUID | libc::MS_NODEV;
            if bind.writable {
                flags |= libc::MS_NOEXEC;
            } else {
                flags |= libc::MS_RDONLY;
            }
            // SAFETY: as above.
            check(unsafe {
                libc::mount(
                    std::ptr::null(),
                    bind.target.as_ptr(),
                    std::ptr::null(),
                    flags,
                    std::ptr::null(),
                )
            })?;
        }
        // SAFETY: as above.
        check(unsafe {
            libc::mount(
                c"proc".as_ptr(),
                root.proc_dir.as_ptr(),
                c"proc".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                c"hidepid=2".as_ptr().cast(),
            )
        })?;
        dev()?;
        // SAFETY: as above.
        check(unsafe {
            libc::mount(
                std::ptr::null(),
                root.stage.as_ptr(),
                std::ptr::null(),
                libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
                std::ptr::null(),
            )
        })?;
        // SAFETY: as above.
        check(unsafe { libc::chdir(root.stage.as_ptr()) })?;
        // pivot_root(".", ".") stacks the old root under the new one; detaching it
        // leaves the new root alone.
        // SAFETY: as above.
        check(unsafe {
            libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) as libc::c_int
        })?;
        // SAFETY: as above.
        check(unsafe { libc::umount2(c".".as_ptr(), libc::MNT_DETACH) })?;
        // SAFETY: as above.
        check(unsafe { libc::chdir(c"/".as_ptr()) })
    }

    /// Applies the jail in the child, after it joined its cgroups and network namespace.
    /// Only async-signal-safe system calls; nothing allocates. The order matters: the
    /// namespaces and mounts while the child is still root, the bounding set while it
    /// has CAP_SETPCAP, the ids last but no new privileges.
    pub(crate) fn enter(&self) -> io::Result<()> {
        fn check(ret: libc::c_int) -> io::Result<()> {
            if ret < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        }
        if self.new_netns {
            // SAFETY: a raw system call on integers, or on strings and arrays made before
            // the fork that outlive it; it allocates nothing.
            check(unsafe { libc::unshare(libc::CLONE_NEWNET) })?;
        }
        // SAFETY: a raw system call on integers, or on strings and arrays made before
        // the fork that outlive it; it allocates nothing.
        check(unsafe { libc::unshare(libc::CLONE_NEWNS) })?;
        // SAFETY: a raw system call on integers, or on strings and arrays made before
        // the fork that outlive it; it allocates nothing.
        check(unsafe {
            libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            )
        })?;
        let dev = || -> io::Result<()> {
            // SAFETY: a raw system call on integers, or on strings and arrays made before
            // the fork that outlive it; it allocates nothing.
            check(unsafe {
                libc::mount(
                    c"tmpfs".as_ptr(),
                    self.dev_dir.as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NOEXEC,
                    c"mode=0755,size=16k,nr_inodes=32".as_ptr().cast(),
                )
            })?;
            if let Some(dev_net) = &self.dev_net {
                // SAFETY: a raw system call on integers, or on strings and arrays made before
                // the fork that outlive it; it allocates nothing.
                check(unsafe { libc::mkdir(dev_net.as_ptr(), 0o755) })?;
            }
            for node in &self.nodes {
                // SAFETY: a raw system call on integers, or on strings and arrays made before
                // the fork that outlive it; it allocates nothing.
                check(unsafe { libc::mknod(node.path.as_ptr(), node.mode, node.rdev) })?;
                // mknod applies the umask; the mode is what it must be.
                // SAFETY: a raw system call on integers, or on strings and arrays made before
                // the fork that outlive it; it allocates nothing.
                check(unsafe { libc::chmod(node.path.as_ptr(), node.mode & 0o7777) })?;
                if node.owned {
                    // SAFETY: a raw system call on integers, or on strings and arrays made before
                    // the fork that outlive it; it allocates nothing.
                    check(unsafe { libc::chown(node.path.as_ptr(), self.uid, self.gid) })?;
                }
            }
            // SAFETY: a raw system call on integers, or on strings and arrays made before
            // the fork that outlive it; it allocates nothing.
            check(unsafe {
                libc::mount(
                    std::ptr::null(),
                    self.dev_dir.as_ptr(),
                    std::ptr::null(),
                    libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NOEXEC,
                    std::ptr::null(),
                )
            })?;
            Ok(())
        };
        match &self.root {
            Some(root) => Self::enter_root(root, dev)?,
            None => dev()?,
        }
        // SAFETY: a raw system call on integers, or on strings and arrays made before
        // the fork that outlive it; it allocates nothing.
        unsafe { libc::umask(0o077) };
        for cap in 0..=self.last_cap {
            // SAFETY: a raw system call on integers, or on strings and arrays made before
            // the fork that outlive it; it allocates nothing.
            check(unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) })?;
        }
        // SAFETY: a raw system call on integers, or on strings and arrays made before
        // the fork that outlive it; it allocates nothing.
        check(unsafe {
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0,
            )
        })?;
        // SAFETY: a raw system call on integers, or on strings and arrays made before
        // the fork that outlive it; it allocates nothing.
        check(unsafe { libc::setgroups(0, std::ptr::null()) })?;
        // SAFETY: a raw system call on integers, or on strings and arrays made before
        // the fork that outlive it; it allocates nothing.
        check(unsafe { libc::setresgid(self.gid, self.gid, self.gid) })?;
        // SAFETY: a raw system call on integers, or on strings and arrays made before
        // the fork that outlive it; it allocates nothing.
        check(unsafe { libc::setresuid(self.uid, self.uid, self.uid) })?;
        // setresuid cleared the permitted and effective sets; the inheritable set
        // survives it, so it is cleared too.
        let header = CapHeader {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        let data = [CapData::default(); 2];
        // SAFETY: a raw system call on integers, or on strings and arrays made before
        // the fork that outlive it; it allocates nothing.
        check(unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) as libc::c_int })?;
        // SAFETY: a raw system call on integers, or on strings and arrays made before
        // the fork that outlive it; it allocates nothing.
        check(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) })?;
        Ok(())
    }
}

/// Runs `program args` confined as a sandbox's process would be (an id of `range`, no
/// capabilities, no new privileges, a private `/dev`, an empty network namespace when
/// `new_netns`) and waits for it to exit 0: whether this host, and the program's files,
/// allow the containment. The id is claimed in a directory of its own, not in
/// [`ID_CLAIMS_DIR`]. Err: what failed, with the program's output.
pub fn probe(
    range: &kata_config::HostProcesses,
    program: &Path,
    args: &[&str],
    new_netns: bool,
) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("kata-containment-probe-{}", std::process::id()));
    let result = probe_in(&dir, range, program, args, new_netns);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn probe_in(
    dir: &Path,
    range: &kata_config::HostProcesses,
    program: &Path,
    args: &[&str],
    new_netns: bool,
) -> Result<(), String> {
    let ids = SandboxIds::claim(&dir.join("ids"), range, "probe").map_err(|e| e.to_string())?;
    let log = dir.join("probe.log");
    let program = &real_path(program).map_err(|e| e.to_string())?;
    let daemon = crate::process::Daemon {
        step: "the containment probe",
        program,
        args: args.iter().map(|a| a.to_string()).collect(),
        env: Vec::new(),
        log: log.clone(),
        place: crate::process::Place::default().jailed(Some(
            Jail::new(&ids, &[], new_netns)
                .and_then(|j| j.with_root(program, &[]))
                .map_err(|e| e.to_string())?,
        )),
    };
    let pid = daemon
        .spawn(&crate::discard_logger())
        .map_err(|e| e.to_string())?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let how = loop {
        if let Some(how) = crate::process::exit_description(pid) {
            break how;
        }
        if std::time::Instant::now() >= deadline {
            crate::kill_and_reap(&[pid], std::time::Duration::ZERO);
            break "did not exit within 10 s".to_string();
        }
        std::thread::sleep(crate::process::POLL);
    };
    let result = if how == "exited with status 0" {
        Ok(())
    } else {
        Err(format!(
            "{} {args:?} as uid {} {how}: {}",
            program.display(),
            ids.uid,
            crate::process::log_tail(&log)
        ))
    };
    ids.release();
    result
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(start: u32, count: u32) -> kata_config::HostProcesses {
        kata_config::HostProcesses {
            sandboxed: true,
            uid_start: start,
            uid_count: count,
        }
    }

    #[test]
    fn two_sandboxes_never_share_an_id_and_a_released_one_is_reused() {
        let dir = tempfile::tempdir().unwrap();
        let r = range(0x7100_0000, 2);
        let a = SandboxIds::claim(dir.path(), &r, "a").unwrap();
        let b = SandboxIds::claim(dir.path(), &r, "b").unwrap();
        assert_ne!(a.uid, b.uid);
        assert_eq!((a.uid, a.gid), (0x7100_0000, 0x7100_0000));
        let e = SandboxIds::claim(dir.path(), &r, "c")
            .unwrap_err()
            .to_string();
        assert!(e.contains("raise host_uid_count"), "{e}");
        let a_uid = a.uid;
        a.release();
        assert!(!dir.path().join(a_uid.to_string()).exists());
        let c = SandboxIds::claim(dir.path(), &r, "c").unwrap();
        assert_eq!(c.uid, a_uid);
        assert_eq!(
            std::fs::read_to_string(dir.path().join(c.uid.to_string())).unwrap(),
            "c"
        );
        b.release();
        c.release();
    }

    #[test]
    fn a_dead_claimers_id_is_reclaimed_unless_a_process_still_runs_as_it() {
        let dir = tempfile::tempdir().unwrap();
        // A claim file nobody holds: its shim died. (An id outside the default range, which
        // sandboxes running on this host may use.)
        std::fs::write(dir.path().join("2113929216"), "crashed").unwrap();
        let r = range(0x7e00_0000, 1);
        let taken = SandboxIds::claim(dir.path(), &r, "new").unwrap();
        assert_eq!(taken.uid, 0x7e00_0000);
        taken.release();
        // Root (uid 0) runs this test: a stale claim of uid 0's stays taken.
        let root_range = kata_config::HostProcesses {
            uid_start: 0,
            ..range(0, 1)
        };
        std::fs::write(dir.path().join("0"), "crashed").unwrap();
        if uids_in_use().contains(&0) {
            assert!(SandboxIds::claim(dir.path(), &root_range, "new").is_err());
        }
    }

    /// The fields of `/proc/<pid>/status` a confined process must show.
    fn status_field<'a>(status: &'a str, name: &str) -> &'a str {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .unwrap_or_else(|| panic!("no {name} in {status}"))
            .trim()
    }

    #[test]
    fn a_jailed_daemon_runs_as_the_sandbox_without_privileges_devices_or_network() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            crate::test_skip::skipped("needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let claims = dir.path().join("ids");
        let ids = SandboxIds::claim(&claims, &range(0x7200_0000, 4), "jailed").unwrap();
        let run = dir.path().join("run");
        std::fs::create_dir(&run).unwrap();
        own_run_dir(&run, &ids).unwrap();
        let out = run.join("out");
        let script = format!(
            "cat /proc/self/status; echo devices: $(ls /dev); echo links: $(tail -n +3 /proc/self/net/dev | cut -d: -f1); \
             touch /etc/h2-jail-test 2>/dev/null && echo wrote-etc; \
             echo x > /dev/null && echo devnull-ok; touch {}/made && echo made; \
             echo root: $(ls /); echo etc: $(ls /etc); test -e /proc/1/status && echo sees-init",
            run.display()
        );
        let daemon = crate::process::Daemon {
            step: "sh",
            program: Path::new("/bin/sh"),
            args: vec!["-c".into(), script],
            env: Vec::new(),
            log: out.clone(),
            place: crate::process::Place::default().jailed(Some(
                Jail::new(&ids, &[], true)
                    .unwrap()
                    .with_root(Path::new("/bin/sh"), &[&run])
                    .unwrap(),
            )),
        };
        let pid = daemon.spawn(&crate::discard_logger()).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while crate::process::exit_description(pid).is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "the jailed shell hangs"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        crate::bounded_log::settle(&out);
        let text = std::fs::read_to_string(&out).unwrap();
        let uid = ids.uid.to_string();
        assert_eq!(
            status_field(&text, "Uid")
                .split_whitespace()
                .collect::<Vec<_>>(),
            [uid.as_str(); 4],
            "{text}"
        );
        assert_eq!(
            status_field(&text, "Gid")
                .split_whitespace()
                .collect::<Vec<_>>(),
            [uid.as_str(); 4],
            "{text}"
        );
        assert_eq!(status_field(&text, "Groups"), "", "{text}");
        for caps in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            assert_eq!(
                status_field(&text, caps),
                "0000000000000000",
                "{caps}: {text}"
            );
        }
        assert_eq!(status_field(&text, "NoNewPrivs"), "1", "{text}");
        let devices = text.lines().find(|l| l.starts_with("devices:")).unwrap();
        assert_eq!(devices, "devices: full null random urandom zero", "{text}");
        // An empty network namespace: its own loopback only.
        assert!(text.contains("links: lo\n"), "{text}");
        assert!(!text.contains("wrote-etc"), "{text}");
        assert!(
            text.contains("devnull-ok") && text.contains("made"),
            "{text}"
        );
        // The minimal root: /usr and the loader's links, the run directory, /proc, /dev;
        // of /etc only the loader's cache; of /proc only its own uid's processes.
        let root = text.lines().find(|l| l.starts_with("root:")).unwrap();
        for absent in ["home", "root", "var", "sys", "boot"] {
            assert!(!root.split_whitespace().any(|d| d == absent), "{root}");
        }
        let etc = text.lines().find(|l| l.starts_with("etc:")).unwrap();
        assert!(etc == "etc: ld.so.cache" || etc == "etc:", "{etc}");
        assert!(!text.contains("sees-init"), "{text}");
        let made = std::fs::metadata(run.join("made")).unwrap();
        assert_eq!((made.uid(), made.mode() & 0o777), (ids.uid, 0o600));
        let _ = std::fs::remove_file("/etc/h2-jail-test");
        ids.release();
    }

    #[test]
    fn a_crashed_shims_claims_are_released_by_sandbox_id() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("2097152000"), "gone").unwrap();
        std::fs::write(dir.path().join("2097152001"), "other").unwrap();
        // A live claim of the same sandbox (held by this process) stays.
        let held = SandboxIds::claim(dir.path(), &range(0x7d00_0002, 1), "gone").unwrap();
        release_claims_of(dir.path(), "gone");
        assert!(!dir.path().join("2097152000").exists());
        assert!(dir.path().join("2097152001").exists());
        assert!(held.claim.exists());
        held.release();
    }

    #[test]
    fn a_pooled_vms_claim_is_handed_over_to_the_sandbox_that_adopts_it() {
        let dir = tempfile::tempdir().unwrap();
        let r = range(0x7300_0000, 2);
        let factory = SandboxIds::claim(dir.path(), &r, "pool-1").unwrap();
        let uid = factory.uid;
        assert_eq!(SandboxIds::claimed_by(dir.path(), "pool-1"), Some(uid));
        // While the factory holds it, nobody takes it over.
        let e = SandboxIds::take_over(dir.path(), uid, "pool-1", "sb")
            .unwrap_err()
            .to_string();
        assert!(e.contains("still holds it"), "{e}");
        factory.let_go();
        // Let go of, the claim stays: the uid is still the VM's.
        let path = dir.path().join(uid.to_string());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "pool-1");
        // Only for the VM it names.
        let e = SandboxIds::take_over(dir.path(), uid, "pool-2", "sb")
            .unwrap_err()
            .to_string();
        assert!(e.contains("held for \"pool-1\""), "{e}");
        let adopted = SandboxIds::take_over(dir.path(), uid, "pool-1", "sb").unwrap();
        assert_eq!((adopted.uid, adopted.gid), (uid, uid));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "sb");
        assert_eq!(SandboxIds::claimed_by(dir.path(), "pool-1"), None);
        // Held by the sandbox now: the factory's clean-up by the VM's id leaves it, and
        // no other sandbox gets the uid.
        release_claims_of(dir.path(), "pool-1");
        release_claims_of(dir.path(), "sb");
        assert!(path.exists());
        let other = SandboxIds::claim(dir.path(), &r, "other").unwrap();
        assert_ne!(other.uid, uid);
        other.release();
        adopted.release();
        assert!(!path.exists());
    }
}
