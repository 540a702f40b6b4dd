//! The process module's tests: spawning in place, stopping by pid and group, readiness.

use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::kill;
use nix::unistd::Pid;
use procinfo::pid::{exit_description, group_alive, group_runs, pids_mentioning};

use super::lifecycle::TAIL_LINES;
use super::ready::{listens_in, wait_for_sockets};
use super::*;

fn spawn(cmd: &str) -> i32 {
    Command::new("sh")
        .args(["-c", cmd])
        .spawn()
        .map(|c| c.id() as i32)
        .unwrap()
}

#[test]
fn a_socket_listens_by_its_flags_in_the_table() {
    let table = "Num       RefCount Protocol Flags    Type St Inode Path\n\
        0000000000000000: 00000002 00000000 00010000 0001 01  1234 /run/vc/vm/a/fs.sock\n\
        0000000000000000: 00000002 00000000 00000000 0001 01 56789 /run/vc/vm/b/fs.sock\n\
        0000000000000000: 00000003 00000000 00000000 0001 03 99999 \n\
        0000000000000000: 00000002 00000000 00010000 0001 01 77777 /run/a dir/x.sock\n\
        0000000000000000: 00000002 00000000 00010000 0001 01 88888 @abstract\n";
    assert!(listens_in(table, "/run/vc/vm/a/fs.sock"));
    // Bound, not yet listening: connect(2) would be refused.
    assert!(!listens_in(table, "/run/vc/vm/b/fs.sock"));
    assert!(listens_in(table, "/run/a dir/x.sock"));
    assert!(!listens_in(table, "/run/a"));
    assert!(!listens_in(table, "/run/vc/vm/a/fs.sock.pid"));
    assert!(!listens_in("", "/run/vc/vm/a/fs.sock"));
}

/// A daemon that has bound its socket but not yet listened on it is not ready: the
/// wait returns only once a connection would succeed.
#[tokio::test]
async fn the_wait_for_a_socket_ends_when_it_listens_not_when_it_exists() {
    use nix::sys::socket::{
        bind, connect, listen, socket, AddressFamily, Backlog, SockFlag, SockType, UnixAddr,
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("daemon.sock");
    let sock = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    bind(sock.as_raw_fd(), &UnixAddr::new(&path).unwrap()).unwrap();
    assert!(path.exists());
    let stand_in = spawn("exec sleep 30");
    let daemon = Daemon {
        step: "a daemon",
        program: Path::new("sleep"),
        args: Vec::new(),
        env: Vec::new(),
        log: dir.path().join("daemon.log"),
        place: Place::default(),
    };
    let listens_at = Instant::now() + Duration::from_millis(300);
    let listener = std::thread::spawn(move || {
        std::thread::sleep(listens_at.saturating_duration_since(Instant::now()));
        listen(&sock, Backlog::new(8).unwrap()).unwrap();
        sock
    });
    let waited = wait_for_sockets(&daemon, stand_in, &[&path]).await;
    assert!(waited.is_ok(), "the wait failed");
    assert!(Instant::now() >= listens_at, "ready before it listened");
    let client = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    connect(client.as_raw_fd(), &UnixAddr::new(&path).unwrap()).unwrap();
    drop(listener.join().unwrap());
    assert!(kill_and_reap(&[stand_in], Duration::from_secs(2)).is_empty());
}

#[test]
fn a_group_leaders_children_do_not_outlive_it() {
    // Like virtiofsd: the parent forks a worker that ignores SIGTERM, and waits.
    let pid = Command::new("sh")
        .args([
            "-c",
            "sh -c 'trap \"\" TERM; while :; do sleep 0.05; done' & wait",
        ])
        .process_group(0)
        .spawn()
        .map(|c| c.id() as i32)
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(group_alive(pid));
    assert!(kill_and_reap(&[pid], Duration::from_millis(300)).is_empty());
    assert!(!group_runs(pid), "the worker was stopped with its parent");
}

#[test]
fn a_group_of_zombies_no_longer_runs() {
    // Exited but not reaped (as a crashed shim's orphaned helpers wait for init).
    let pid = Command::new("true")
        .process_group(0)
        .spawn()
        .map(|c| c.id() as i32)
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(group_alive(pid), "the unreaped group is still there");
    assert!(!group_runs(pid));
    assert!(kill_and_reap(&[pid], Duration::from_secs(5)).is_empty());
}

#[test]
fn processes_are_found_by_what_their_arguments_name() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("sandbox-run-dir/");
    let arg = format!("{}sock", marker.display());
    // The marker as argv[0], which sleep ignores.
    let pid = Command::new("sleep")
        .arg0(&arg)
        .arg("100")
        .spawn()
        .map(|c| c.id() as i32)
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let found = pids_mentioning(&marker.display().to_string());
    assert_eq!(found, vec![pid]);
    assert!(kill_and_reap(&found, Duration::from_secs(2)).is_empty());
    assert!(pids_mentioning(&marker.display().to_string()).is_empty());
}

#[test]
fn sigterm_stops_a_cooperative_process() {
    let pid = spawn("exec sleep 100");
    assert_eq!(exit_description(pid), None);
    assert!(kill_and_reap(&[pid], Duration::from_secs(5)).is_empty());
    assert!(kill(Pid::from_raw(pid), None).is_err());
}

#[test]
fn sigkill_after_grace_for_a_process_ignoring_sigterm() {
    let pid = spawn("trap '' TERM; while :; do sleep 0.05; done");
    std::thread::sleep(Duration::from_millis(100));
    assert!(kill_and_reap(&[pid], Duration::from_millis(200)).is_empty());
    assert!(kill(Pid::from_raw(pid), None).is_err());
}

#[test]
fn already_reaped_and_invalid_pids_are_fine() {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id() as i32;
    child.wait().unwrap();
    assert!(kill_and_reap(&[pid, 0, -1], Duration::from_millis(100)).is_empty());
}

#[test]
fn exit_status_is_described() {
    let pid = spawn("exit 3");
    let deadline = Instant::now() + Duration::from_secs(10);
    let desc = loop {
        if let Some(d) = exit_description(pid) {
            break d;
        }
        assert!(Instant::now() < deadline);
        std::thread::sleep(POLL);
    };
    assert_eq!(desc, "exited with status 3");
}

/// The test's own cgroup in each hierarchy that can take a process without set-up
/// (cpuset's cpus and mems start empty in v1), removed again on drop.
struct TestCgroups(Vec<PathBuf>);

impl Drop for TestCgroups {
    fn drop(&mut self) {
        for dir in &self.0 {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

fn test_cgroups(name: &str) -> Option<TestCgroups> {
    let root = Path::new("/sys/fs/cgroup");
    let mut made = TestCgroups(Vec::new());
    let v2 = root.join("cgroup.controllers").exists();
    let parents: Vec<PathBuf> = if v2 {
        vec![root.to_path_buf()]
    } else {
        ["pids", "memory", "cpu", "systemd"]
            .iter()
            .map(|h| root.join(h))
            .filter(|p| p.join("tasks").exists())
            .collect()
    };
    for parent in parents {
        let dir = parent.join(name);
        std::fs::create_dir(&dir).ok()?;
        made.0.push(dir);
    }
    (!made.0.is_empty()).then_some(made)
}

#[test]
fn a_daemon_starts_in_the_sandbox_cgroup_of_every_hierarchy() {
    let name = format!("kata-hv-test-{}", std::process::id());
    let Some(cgroups) = test_cgroups(&name) else {
        crate::test_skip::skipped("needs root and a writable /sys/fs/cgroup");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cfg = crate::VmConfig {
        cgroup: cgroups.0.clone(),
        ..Default::default()
    };
    let daemon = Daemon {
        step: "sleep",
        program: Path::new("sleep"),
        args: vec!["30".into()],
        env: Vec::new(),
        log: dir.path().join("sleep.log"),
        place: Place::new(&cfg, false).unwrap(),
    };
    let pid = daemon.spawn(&crate::discard_logger()).unwrap();
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup"));
    assert!(kill_and_reap(&[pid], Duration::from_millis(300)).is_empty());
    let own = own.unwrap();
    for cg in &cgroups.0 {
        let procs = std::fs::read_to_string(cg.join("cgroup.procs")).unwrap();
        assert!(procs.trim().is_empty(), "{}: {procs}", cg.display());
    }
    let lines: Vec<&str> = own
        .lines()
        .filter(|l| l.ends_with(&format!(":/{name}")))
        .collect();
    assert_eq!(lines.len(), cgroups.0.len(), "/proc/{pid}/cgroup:\n{own}");
}

#[test]
fn children_join_through_tasks_on_v1_and_cgroup_procs_on_v2() {
    let tree = tempfile::tempdir().unwrap();
    let v1 = tree.path().join("v1/pod");
    let v2 = tree.path().join("v2/pod");
    for (dir, files) in [
        (&v1, &["tasks", "cgroup.procs", "notify_on_release"][..]),
        (
            &v2,
            &["cgroup.procs", "cgroup.controllers", "cgroup.threads"][..],
        ),
    ] {
        std::fs::create_dir_all(dir).unwrap();
        for f in files {
            std::fs::write(dir.join(f), "").unwrap();
        }
    }
    assert_eq!(join_file(&v1), v1.join("tasks"));
    assert_eq!(join_file(&v2), v2.join("cgroup.procs"));
}

#[test]
fn a_daemon_log_planted_as_a_link_is_never_followed() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "host file\n").unwrap();
    let log = dir.path().join("qemu.log");
    std::os::unix::fs::symlink(&secret, &log).unwrap();
    let d = Daemon {
        step: "qemu",
        program: Path::new("/bin/echo"),
        args: vec!["written through the link".into()],
        env: Vec::new(),
        log,
        place: Place::default(),
    };
    let pid = d.spawn(&crate::discard_logger()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while exit_description(pid).is_none() {
        assert!(Instant::now() < deadline, "echo hangs");
        std::thread::sleep(POLL);
    }
    assert_eq!(log_tail(&d.log), "written through the link");
    assert!(!std::fs::symlink_metadata(&d.log).unwrap().is_symlink());
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "host file\n");
}

#[test]
fn log_tail_does_not_follow_links() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "host secret\n").unwrap();
    let log = dir.path().join("qemu.log");
    std::os::unix::fs::symlink(&secret, &log).unwrap();
    assert_eq!(log_tail(&log), "");
}

#[test]
fn log_tail_keeps_the_last_lines() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("x.log");
    let text: String = (0..100).map(|i| format!("line {i}\n")).collect();
    std::fs::write(&log, text).unwrap();
    let tail = log_tail(&log);
    assert!(tail.ends_with("line 99"), "{tail}");
    assert_eq!(tail.lines().count(), TAIL_LINES);
    assert_eq!(log_tail(&dir.path().join("missing")), "");
}
