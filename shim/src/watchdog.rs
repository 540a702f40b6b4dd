//! Watches the processes a sandbox depends on (the VMM and its helpers) and says which
//! ended first and how.
//!
//! Event-driven, no polling: the shim's SIGCHLD reaper (containerd-shim's) reaps every
//! child and announces each exit on its monitor; the watchdog subscribes to those
//! announcements, then checks once that every watched process is still alive, so an exit
//! between the start of the VM and the subscription is not missed.

use containerd_shim::asynchronous::monitor::{monitor_subscribe, monitor_unsubscribe};
use containerd_shim::monitor::{Subject, Topic};

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
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim().to_string())
        .unwrap_or_else(|_| "process".into())
}

/// The first of `watched` that has exited, said as a sentence; None while all run.
pub fn exited(watched: &[Watched]) -> Option<String> {
    watched.iter().find_map(|w| {
        hypervisor::process::exit_description(w.pid)
            .map(|how| format!("{} (pid {}) {how}", w.what, w.pid))
    })
}

/// Waits until one of `watched` exits; returns a sentence saying which and how, e.g.
/// `the VMM qemu-system-x86 (pid 812) was killed by signal 9`.
pub async fn first_exit(watched: Vec<Watched>) -> String {
    let mut sub = match monitor_subscribe(Topic::Pid).await {
        Ok(s) => s,
        Err(e) => return format!("the sandbox's processes cannot be watched: {e}"),
    };
    let ended = async {
        if let Some(why) = exited(&watched) {
            return why;
        }
        while let Some(ev) = sub.rx.recv().await {
            let Subject::Pid(pid) = ev.subject else {
                continue;
            };
            if let Some(w) = watched.iter().find(|w| w.pid == pid) {
                return format!("{} (pid {pid}) {}", w.what, describe(ev.exit_code));
            }
        }
        "the shim's exit monitor stopped; the sandbox's processes are no longer watched".into()
    }
    .await;
    let _ = monitor_unsubscribe(sub.id).await;
    ended
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
        containerd_shim::asynchronous::monitor::monitor_notify_by_pid(helper_pid, 137)
            .await
            .unwrap();
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
}
