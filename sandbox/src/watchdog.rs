//! Watches the processes a sandbox depends on (the VMM and its helpers) and says which
//! ended first and how.
//!
//! Event-driven, no polling. The host process's own children (a cold start's VMM and
//! helpers): its reaper reaps every child and announces each exit ([`crate::exits`]);
//! the watchdog subscribes to those announcements, then checks once
//! that every watched process is still alive, so an exit between the start of the VM
//! and the subscription is not missed. Processes of another parent (a pooled VM's, the
//! VM factory's children): a pidfd each ([`first_exit_of_others`]).

use std::time::Duration;

use procinfo::pid::zombie_status;

use crate::exits;

/// A process the sandbox cannot live without.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watched {
    pub pid: i32,
    /// What it is, for the log: `the VMM qemu-system-x86_64`, `helper virtiofsd`.
    pub what: String,
}

impl Watched {
    /// A helper, named by its command (`/proc/<pid>/comm`): name it while it runs.
    pub fn helper(pid: i32) -> Self {
        Watched {
            pid,
            what: format!("helper {}", comm(pid)),
        }
    }

    pub fn vmm(pid: i32) -> Self {
        Watched {
            pid,
            what: format!("the VMM {}", comm(pid)),
        }
    }

    fn is_vmm(&self) -> bool {
        self.what.starts_with("the VMM")
    }
}

fn comm(pid: i32) -> String {
    procinfo::pid::comm(pid).unwrap_or_else(|| "process".into())
}

/// The first of `watched` that has exited, said as a sentence; None while all run.
pub fn exited(watched: &[Watched]) -> Option<String> {
    watched.iter().find_map(|w| {
        procinfo::pid::exit_description(w.pid)
            .map(|how| format!("{} (pid {}) {how}", w.what, w.pid))
    })
}

/// Waits until one of `watched` exits; returns a sentence saying which and how, e.g.
/// `the VMM qemu-system-x86 (pid 812) was killed by signal 9`.
pub async fn first_exit(watched: Vec<Watched>) -> String {
    let mut sub = exits::subscribe();
    let ended = async {
        if let Some(why) = exited(&watched) {
            return why;
        }
        while let Some(ev) = sub.rx.recv().await {
            let pid = ev.pid;
            if let Some(w) = watched.iter().find(|w| w.pid == pid) {
                let first = format!("{} (pid {pid}) {}", w.what, describe(ev.code));
                return match watched.iter().find(|v| v.is_vmm() && v.pid != pid) {
                    Some(vmm) => vmm_exit_within_grace(&mut sub.rx, vmm)
                        .await
                        .unwrap_or(first),
                    None => first,
                };
            }
        }
        "the exit announcements stopped; the sandbox's processes are no longer watched".into()
    }
    .await;
    drop(sub);
    ended
}

/// The VMM's exit, if the reaper announces it within [`VMM_EXIT_GRACE`]: a killed VMM
/// closes its sockets before it has finished exiting, so a helper, seeing them close,
/// may end first; the VMM is the cause then.
async fn vmm_exit_within_grace(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<exits::Exit>,
    vmm: &Watched,
) -> Option<String> {
    let deadline = tokio::time::Instant::now() + VMM_EXIT_GRACE;
    loop {
        let ev = tokio::time::timeout_at(deadline, rx.recv()).await.ok()??;
        if ev.pid == vmm.pid {
            return Some(format!(
                "{} (pid {}) {}",
                vmm.what,
                vmm.pid,
                describe(ev.code)
            ));
        }
    }
}

/// [`first_exit`] for processes that are not the shim's children (a pooled VM's, whose
/// parent is the VM factory): the reaper never hears of them, so each is watched through
/// a pidfd, which becomes readable when the process exits. How it ended is read from
/// `/proc/<pid>/stat` while it is a zombie; once its parent has reaped it, only that it
/// exited is known.
pub async fn first_exit_of_others(watched: Vec<Watched>) -> String {
    let mut waits = Vec::new();
    for w in &watched {
        match pidfd(w.pid) {
            Ok(fd) => waits.push(Box::pin(async move {
                // Readable once the process has exited; an error means the same for us.
                let _ = fd.readable().await;
            })),
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                return format!("{} (pid {}) {}", w.what, w.pid, describe_other(w.pid));
            }
            Err(e) => {
                return format!(
                    "the sandbox's processes cannot be watched: pidfd_open({}): {e}",
                    w.pid
                )
            }
        }
    }
    if waits.is_empty() {
        return "the sandbox has no process to watch".into();
    }
    let (_, i, _) = futures::future::select_all(waits).await;
    let w = the_cause(&watched, i).await;
    format!("{} (pid {}) {}", w.what, w.pid, describe_other(w.pid))
}

/// How long a helper's exit waits to see whether the VMM's came with it.
const VMM_EXIT_GRACE: Duration = Duration::from_millis(200);

/// Which of `watched` to name when `first` exited first: the VMM if it is gone too
/// within [`VMM_EXIT_GRACE`]. A killed VMM closes its sockets before it has finished
/// exiting, so virtiofsd, seeing them close, may end first; the VMM is the cause then.
async fn the_cause(watched: &[Watched], first: usize) -> &Watched {
    let Some(vmm) = watched.iter().find(|w| w.is_vmm()) else {
        return &watched[first];
    };
    if vmm.pid == watched[first].pid {
        return vmm;
    }
    let deadline = tokio::time::Instant::now() + VMM_EXIT_GRACE;
    while tokio::time::Instant::now() < deadline {
        if !procinfo::pid::is_running(vmm.pid) {
            return vmm;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    &watched[first]
}

/// A pidfd of `pid`, registered with the runtime for readiness.
fn pidfd(pid: i32) -> std::io::Result<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes a pid and flags by value and returns a new descriptor.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a descriptor pidfd_open just returned, owned by nobody else.
    let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as std::os::fd::RawFd) };
    // SAFETY: the AsyncFd owns the descriptor, which stays open until it is dropped.
    unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(owned, tokio::io::Interest::READABLE)
    }
    .map_err(|e| e.into_parts().1)
}

/// How a process that is not our child ended, as far as `/proc` still says.
fn describe_other(pid: i32) -> String {
    procinfo::pid::stat(pid)
        .and_then(|stat| zombie_status(&stat))
        .map(describe_wait_status)
        .unwrap_or_else(|| "exited".into())
}

/// A `waitpid` status as a sentence.
fn describe_wait_status(status: i32) -> String {
    if libc::WIFSIGNALED(status) {
        format!("was killed by signal {}", libc::WTERMSIG(status))
    } else {
        format!("exited with status {}", libc::WEXITSTATUS(status))
    }
}

/// The reaper reports `128 + signal` for a process killed by a signal.
fn describe(code: i32) -> String {
    if code > 128 && code < 128 + 65 {
        format!("was killed by signal {}", code - 128)
    } else {
        format!("exited with status {code}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_read_as_sentences() {
        assert_eq!(describe(137), "was killed by signal 9");
        assert_eq!(describe(0), "exited with status 0");
        assert_eq!(describe(1), "exited with status 1");
    }

    #[test]
    fn a_zombies_status_reads_as_a_sentence() {
        let fields: Vec<String> = (4..=52).map(|i| i.to_string()).collect();
        let mut stat = format!("77 (qemu) x) Z {}", fields.join(" "));
        // Field 52 (exit_code): killed by SIGKILL.
        stat = stat.replace(" 52", " 9");
        assert_eq!(zombie_status(&stat), Some(9));
        assert_eq!(describe_wait_status(9), "was killed by signal 9");
        assert_eq!(describe_wait_status(3 << 8), "exited with status 3");
        assert_eq!(zombie_status(&stat.replace(" Z ", " S ")), None);
    }

    #[tokio::test]
    async fn the_exit_of_a_process_that_is_not_ours_ends_the_watch() {
        // A grandchild: `sh` is its parent and reaps it, never us.
        let (mut sh, pid) = hypervisor::process::spawn_grandchild("sleep 100");
        let watch = tokio::spawn(first_exit_of_others(vec![Watched {
            pid,
            what: "the VMM sleep".into(),
        }]));
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(!watch.is_finished(), "the process still runs");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        let why = tokio::time::timeout(std::time::Duration::from_secs(5), watch)
            .await
            .expect("the exit ends the watch")
            .unwrap();
        assert!(
            why.starts_with(&format!("the VMM sleep (pid {pid}) ")),
            "{why}"
        );
        assert!(
            why.ends_with("was killed by signal 9") || why.ends_with("exited"),
            "{why}"
        );
        sh.wait().unwrap();
        // Gone before the watch starts: said at once.
        let why = first_exit_of_others(vec![Watched {
            pid,
            what: "helper sleep".into(),
        }])
        .await;
        assert_eq!(why, format!("helper sleep (pid {pid}) exited"));
    }

    #[tokio::test]
    async fn an_already_dead_process_is_reported_at_once() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        let why = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            first_exit(vec![Watched {
                pid,
                what: "helper true".into(),
            }]),
        )
        .await
        .expect("a dead process is reported without waiting");
        assert!(
            why.starts_with(&format!("helper true (pid {pid})")),
            "{why}"
        );
    }

    #[tokio::test]
    async fn an_exit_announced_by_the_reaper_ends_the_watch() {
        let mut vmm = std::process::Command::new("sleep")
            .arg("100")
            .spawn()
            .unwrap();
        let mut helper = std::process::Command::new("sleep")
            .arg("100")
            .spawn()
            .unwrap();
        let (vmm_pid, helper_pid) = (vmm.id() as i32, helper.id() as i32);
        // Let both exec, so /proc/<pid>/comm names the program.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let watch = tokio::spawn(first_exit(vec![
            Watched::vmm(vmm_pid),
            Watched::helper(helper_pid),
        ]));
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(!watch.is_finished(), "both processes still run");
        // What the shim's SIGCHLD reaper does when the helper is killed.
        helper.kill().unwrap();
        helper.wait().unwrap();
        exits::announce(helper_pid, 137);
        let why = tokio::time::timeout(std::time::Duration::from_secs(5), watch)
            .await
            .expect("the exit ends the watch")
            .unwrap();
        assert_eq!(
            why,
            format!("helper sleep (pid {helper_pid}) was killed by signal 9")
        );
        vmm.kill().unwrap();
        vmm.wait().unwrap();
    }

    #[tokio::test]
    async fn a_helper_whose_exit_the_reaper_announces_just_before_the_vmms_does_not_take_the_blame()
    {
        let sleep = || {
            std::process::Command::new("sleep")
                .arg("100")
                .spawn()
                .unwrap()
        };
        let (mut vmm, mut helper) = (sleep(), sleep());
        let (vmm_pid, helper_pid) = (vmm.id() as i32, helper.id() as i32);
        let watch = tokio::spawn(first_exit(vec![
            Watched {
                pid: vmm_pid,
                what: "the VMM qemu".into(),
            },
            Watched {
                pid: helper_pid,
                what: "helper virtiofsd".into(),
            },
        ]));
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        // The reaper announces the helper (status 0) 50 ms before the killed VMM.
        helper.kill().unwrap();
        helper.wait().unwrap();
        exits::announce(helper_pid, 0);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        vmm.kill().unwrap();
        vmm.wait().unwrap();
        exits::announce(vmm_pid, 137);
        let why = tokio::time::timeout(std::time::Duration::from_secs(5), watch)
            .await
            .expect("the exits end the watch")
            .unwrap();
        assert_eq!(
            why,
            format!("the VMM qemu (pid {vmm_pid}) was killed by signal 9")
        );
    }

    #[tokio::test]
    async fn a_helper_ending_as_the_vmm_dies_does_not_take_the_blame() {
        let spawn = |cmd: &str| {
            std::process::Command::new("sh")
                .args(["-c", cmd])
                .spawn()
                .unwrap()
        };
        let watched = |vmm: u32, helper: u32| {
            vec![
                Watched {
                    pid: vmm as i32,
                    what: "the VMM qemu".into(),
                },
                Watched {
                    pid: helper as i32,
                    what: "helper virtiofsd".into(),
                },
            ]
        };
        // The helper first, the VMM 50 ms later: the VMM is the cause.
        let mut vmm = spawn("sleep 0.05");
        let mut helper = spawn("exit 0");
        let _ = helper.wait();
        let w = watched(vmm.id(), helper.id());
        assert_eq!(the_cause(&w, 1).await.pid, vmm.id() as i32);
        let _ = vmm.wait();
        // A VMM that runs on: the helper is.
        let mut vmm = spawn("sleep 30");
        let w = watched(vmm.id(), helper.id());
        assert_eq!(the_cause(&w, 1).await.pid, helper.id() as i32);
        let _ = vmm.kill();
        let _ = vmm.wait();
    }
}
