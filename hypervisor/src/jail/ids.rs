//! The uid and gid of each sandbox's host processes: [`SandboxIds::claim`] takes a free id
//! from the configured range: an `O_EXCL` claim file `<dir>/<uid>` naming the sandbox,
//! `flock`ed for as long as the claiming shim lives, taken under a lock of the whole
//! directory. A claim whose holder died and whose uid no process runs as any more is stale
//! and taken over. [`SandboxIds::release`] (the VM's stop) and [`release_claims_of`] (a
//! crashed shim's `delete`) remove it. [`own_run_dir`] and [`hand_over`] give the sandbox's
//! files to its ids.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::Error;

/// Where sandboxes claim their ids, one file per uid in use.
pub use layout::ID_CLAIMS_DIR;

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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A claim range for tests (also the probe's).
    pub(crate) fn range(start: u32, count: u32) -> kata_config::HostProcesses {
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
