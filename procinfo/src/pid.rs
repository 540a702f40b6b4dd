//! Processes by pid: whether one still runs (reaping it when it is our child), how it
//! ended, its process group, and which processes name a path in their arguments.
//!
//! The shim has a global SIGCHLD reaper (`waitpid(-1)`), so a child may be reaped by
//! someone else at any time. Everything here works from the pid alone: `waitpid(pid,
//! WNOHANG)` when the process is still our child, `kill(pid, 0)` and `/proc/<pid>/stat`
//! when it is not (already reaped, or left behind by a crashed shim and re-parented).
//! Shared by the hypervisor crate, the shim and its VM factory.

use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// Whether a process is gone and, when we reaped it ourselves, how it ended.
pub fn exit_description(pid: i32) -> Option<String> {
    if pid <= 0 {
        return Some("has no valid pid".into());
    }
    loop {
        match waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => return None,
            Ok(WaitStatus::Exited(_, code)) => return Some(format!("exited with status {code}")),
            Ok(WaitStatus::Signaled(_, sig, _)) => return Some(format!("was killed by {sig}")),
            // Stopped/continued are only reported with WUNTRACED/WCONTINUED; treat as alive.
            Ok(_) => return None,
            Err(Errno::EINTR) => continue,
            Err(_) => {
                return if is_gone(pid) {
                    Some("exited".into())
                } else {
                    None
                };
            }
        }
    }
}

/// Whether the process still runs (reaps it if it is our exited child).
pub fn is_running(pid: i32) -> bool {
    exit_description(pid).is_none()
}

/// For a process that is not (or no longer) our child: gone, or a zombie whose parent
/// has not reaped it yet (it runs nothing any more).
pub fn is_gone(pid: i32) -> bool {
    match kill(Pid::from_raw(pid), None) {
        Err(Errno::ESRCH) => true,
        _ => is_zombie(pid),
    }
}

fn is_zombie(pid: i32) -> bool {
    let Some(stat) = stat(pid) else {
        return true;
    };
    stat_fields(&stat).is_some_and(|f| matches!(f.first(), Some(&("Z" | "X"))))
}
/// Whether process group `pid` still has members (the leader itself may be gone).
pub fn group_alive(pid: i32) -> bool {
    !matches!(kill(Pid::from_raw(-pid), None), Err(Errno::ESRCH))
}

/// Whether process group `pid` has a member that has not exited. Zombies do not count:
/// after a crashed shim its helpers are orphans whose reaper (init, or whoever adopted
/// them) may take its time, and waiting for that held up clean-up by seconds.
pub fn group_runs(pid: i32) -> bool {
    if !group_alive(pid) {
        return false;
    }
    let Some(pids) = all() else {
        return true;
    };
    pids.into_iter()
        .any(|p| stat(p).and_then(|stat| live_group_of(&stat)) == Some(pid))
}
/// The state letter and the process group of a `/proc/<pid>/stat` line.
pub fn state_and_group(stat: &str) -> Option<(&str, i32)> {
    let fields = stat_fields(stat)?;
    // state, ppid, pgrp, ...
    Some((fields.first()?, fields.get(2)?.parse().ok()?))
}

/// The process group of a `/proc/<pid>/stat` line, if the process has not exited.
pub fn live_group_of(stat: &str) -> Option<i32> {
    match state_and_group(stat)? {
        ("Z" | "X", _) => None,
        (_, group) => Some(group),
    }
}
/// Processes, other than this one, whose command line mentions `needle`. A sandbox's
/// VMM and helpers all name its run directory in their arguments: this finds them after
/// a shim that died before it could record their pids.
pub fn pids_mentioning(needle: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    all()
        .unwrap_or_default()
        .into_iter()
        .filter(|&pid| pid != me && mentions(pid, needle))
        .collect()
}

/// Whether `pid` runs now and an argument of its command line holds `needle`. A pid
/// written down earlier (in a state file, a pool's ready file) is checked with it before
/// it is signalled: once its process has ended, the kernel may have given the number to
/// a stranger (every 32,768 processes with the default `pid_max`). (A process in the
/// instant after its execve shows no arguments yet: it passes only once it has them.)
pub fn mentions(pid: i32, needle: &str) -> bool {
    pid > 0 && cmdline(pid).is_some_and(|args| args.iter().any(|a| a.contains(needle)))
}

/// Splits recorded `pids` by [`mentions`]: those whose process still names `needle`, and
/// those that run another program now (strangers, for the caller to log); pids whose
/// process is gone are in neither.
pub fn ours_and_strangers(pids: &[i32], needle: &str) -> (Vec<i32>, Vec<i32>) {
    let (ours, others): (Vec<i32>, Vec<i32>) = pids.iter().partition(|&&pid| mentions(pid, needle));
    let strangers = others.into_iter().filter(|&pid| is_running(pid)).collect();
    (ours, strangers)
}

/// Every process, by the numbered entries of `/proc`; None when `/proc` cannot be read.
pub fn all() -> Option<Vec<i32>> {
    let entries = std::fs::read_dir("/proc").ok()?;
    Some(
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .collect(),
    )
}

/// `pids` and every other process of the groups they lead, sorted.
pub fn with_groups(pids: &[i32]) -> Vec<i32> {
    let mut found: Vec<i32> = pids.iter().copied().filter(|&p| p > 0).collect();
    for pid in all().unwrap_or_default() {
        let group = stat(pid).and_then(|stat| state_and_group(&stat).map(|(_, g)| g));
        if group.is_some_and(|g| pids.contains(&g)) {
            found.push(pid);
        }
    }
    found.sort_unstable();
    found.dedup();
    found
}

/// The `/proc/<pid>/stat` line of `pid`, if it (still) has one.
pub fn stat(pid: i32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()
}

/// The fields of a `/proc/<pid>/stat` line after the parenthesised command name, which
/// may itself hold spaces and ')': the first is field 3 (the state), field n is at
/// n - 3.
pub fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    Some(
        stat.get(stat.rfind(')')? + 1..)?
            .split_ascii_whitespace()
            .collect(),
    )
}

/// The wait status of a zombie's `/proc/<pid>/stat` line (field 52, `exit_code`); None
/// for a process that is not a zombie.
pub fn zombie_status(stat: &str) -> Option<i32> {
    let fields = stat_fields(stat)?;
    if fields.first() != Some(&"Z") {
        return None;
    }
    fields.get(52 - 3)?.parse().ok()
}

/// The command name of `pid` (`/proc/<pid>/comm`, trimmed).
pub fn comm(pid: i32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|c| c.trim().to_string())
}

/// The arguments of `pid` (`/proc/<pid>/cmdline`, each read as UTF-8 lossily).
pub fn cmdline(pid: i32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|&b| b == 0)
            .map(|arg| String::from_utf8_lossy(arg).into_owned())
            .collect(),
    )
}

/// The children of `pid`'s main thread (`/proc/<pid>/task/<pid>/children`).
pub fn children(pid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_ascii_whitespace()
        .filter_map(|c| c.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pid_mentions_what_its_command_line_holds() {
        let mut child = std::process::Command::new("sleep")
            .arg("1000")
            .spawn()
            .expect("start sleep");
        let pid = child.id() as i32;
        // A process that has just called execve shows an empty command line until the
        // kernel has set up its new stack.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !mentions(pid, "100") && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(mentions(pid, "100"));
        assert!(!mentions(pid, "/run/vc/vm/"));
        assert!(pids_mentioning("1000").contains(&pid));
        let me = std::process::id() as i32;
        assert_eq!(
            ours_and_strangers(&[pid, me, 0], "sleep"),
            (vec![pid], vec![me])
        );
        child.kill().expect("kill sleep");
        child.wait().expect("reap sleep");
        // Gone: it mentions nothing any more.
        assert!(!mentions(pid, "100"));
        assert!(!mentions(0, ""));
        assert!(!mentions(-1, ""));
    }

    #[test]
    fn the_group_of_a_stat_line() {
        let stat = "42 (a) b) c) S 1 977 977 0 -1 4194560 100";
        assert_eq!(live_group_of(stat), Some(977));
        assert_eq!(live_group_of("42 (x) Z 1 977 977 0"), None);
        assert_eq!(live_group_of("garbage"), None);
        assert_eq!(state_and_group("42 (a) b) S 1 977 977 0"), Some(("S", 977)));
    }
}
