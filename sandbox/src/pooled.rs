//! The host side of adopting a pooled VM (issue 30): its processes, which the VM factory
//! started (their parent), become the sandbox's.
//!
//! - [`processes`]: the VMM, the helpers and whatever each of them forked (virtiofsd's
//!   sandboxed worker), found by process group (every daemon leads its own).
//! - [`move_to_cgroup`]: each into the pod's host cgroup, through `cgroup.procs`, which
//!   moves every thread of a process at once.
//! - [`renice`]: every thread back to priority 0 (the factory boots its VMs at nice 19,
//!   so that refills never slow a real start much).
//! - [`entropy`]: the random bytes every sandbox's guest mixes into its pool.

use std::path::{Path, PathBuf};

/// How many random bytes the host sends every guest at CreateSandbox.
pub const ENTROPY_BYTES: usize = 64;

/// `pids` and every other process of the groups they lead, sorted.
pub fn processes(pids: &[i32]) -> Vec<i32> {
    procinfo::pid::with_groups(pids)
}

/// Why a process could not be moved into the pod's cgroup.
#[derive(Debug, thiserror::Error)]
#[error("cannot move process {pid} of the pooled VM into the pod's cgroup {}: {source}", file.display())]
pub struct MoveError {
    pid: i32,
    file: PathBuf,
    #[source]
    source: std::io::Error,
}

/// Moves every process of `pids` (all its threads) into each of `dirs` (the pod's
/// cgroup, one directory per hierarchy). A process gone meanwhile is skipped: the
/// watchdog reports its death.
pub fn move_to_cgroup(dirs: &[PathBuf], pids: &[i32]) -> Result<(), MoveError> {
    for dir in dirs {
        let file = dir.join("cgroup.procs");
        for &pid in pids {
            match write_pid(&file, pid) {
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(source) => {
                    return Err(MoveError {
                        pid,
                        file: file.clone(),
                        source,
                    })
                }
                Ok(()) => {}
            }
        }
    }
    Ok(())
}

fn write_pid(file: &Path, pid: i32) -> std::io::Result<()> {
    // One write per pid: the kernel takes one pid per write(2).
    use std::io::Write;
    std::fs::OpenOptions::new()
        .write(true)
        .open(file)?
        .write_all(pid.to_string().as_bytes())
}

/// Sets every thread of `pids` to `nice`; returns how many threads were changed. A
/// thread gone meanwhile is skipped.
pub fn renice(pids: &[i32], nice: i32) -> usize {
    let mut changed = 0;
    for &pid in pids {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for tid in tasks
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<libc::id_t>().ok())
        {
            // SAFETY: setpriority takes integers by value; on Linux, PRIO_PROCESS with a
            // thread id sets that thread's nice value.
            if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) } == 0 {
                changed += 1;
            }
        }
    }
    changed
}

/// [`ENTROPY_BYTES`] random bytes from the host kernel (getrandom, which blocks only
/// before the host's pool was ever initialised).
pub fn entropy() -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; ENTROPY_BYTES];
    let mut filled = 0;
    while filled < buf.len() {
        let rest = &mut buf[filled..];
        // SAFETY: getrandom writes at most `rest.len()` bytes into `rest`, which is
        // valid and writable for that long.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        filled += n as usize;
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    #[test]
    fn a_daemons_forked_workers_are_its_processes() {
        // Like virtiofsd: a group leader that forks a worker.
        let mut leader = Command::new("sh")
            .args(["-c", "sleep 100 & wait"])
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = leader.id() as i32;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let found = loop {
            let found = processes(&[pid]);
            if found.len() > 1 || std::time::Instant::now() > deadline {
                break found;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        leader.wait().unwrap();
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.contains(&pid));
    }

    #[test]
    fn every_thread_gets_the_new_priority() {
        let mut child = Command::new("sleep").arg("100").spawn().unwrap();
        let pid = child.id() as i32;
        // SAFETY: setpriority takes integers by value.
        assert_eq!(
            unsafe { libc::setpriority(libc::PRIO_PROCESS, pid as libc::id_t, 19) },
            0
        );
        let changed = renice(&[pid], 0);
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(changed, 1);
        // Field 19 (nice), the 17th after the command name.
        let after = &stat[stat.rfind(')').unwrap() + 1..];
        assert_eq!(after.split_whitespace().nth(16), Some("0"), "{stat}");
    }

    #[test]
    fn a_move_into_a_cgroup_that_is_not_one_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let e = move_to_cgroup(&[dir.path().to_path_buf()], &[std::process::id() as i32])
            .unwrap_err()
            .to_string();
        assert!(e.contains("cgroup.procs"), "{e}");
    }

    #[test]
    fn entropy_is_fresh_each_time() {
        let (a, b) = (entropy().unwrap(), entropy().unwrap());
        assert_eq!(a.len(), ENTROPY_BYTES);
        assert_ne!(a, b);
    }
}
