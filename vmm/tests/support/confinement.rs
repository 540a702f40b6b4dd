//! What a process's threads say about their confinement in /proc/PID/task/*/status.

/// One thread's `Name`, `Seccomp` and `NoNewPrivs` lines.
#[derive(Debug)]
pub struct ThreadStatus {
    pub tid: String,
    pub name: String,
    pub seccomp: String,
    pub no_new_privs: String,
}

/// The status of every thread of `pid`.
pub fn thread_statuses(pid: u32) -> Vec<ThreadStatus> {
    let mut out = Vec::new();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("read the task list");
    for task in tasks {
        let task = task.expect("task entry");
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue; // the thread ended meanwhile
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        out.push(ThreadStatus {
            tid: task.file_name().to_string_lossy().into_owned(),
            name: field("Name"),
            seccomp: field("Seccomp"),
            no_new_privs: field("NoNewPrivs"),
        });
    }
    out
}

/// Asserts that `pid` has at least `min_threads` threads and every one runs under a seccomp
/// filter (`Seccomp: 2`) with `NoNewPrivs: 1`.
pub fn assert_every_thread_filtered(pid: u32, min_threads: usize) {
    let threads = thread_statuses(pid);
    assert!(
        threads.len() >= min_threads,
        "expected at least {min_threads} threads in {pid}: {threads:?}"
    );
    for t in &threads {
        assert_eq!(
            t.seccomp, "2",
            "thread {} ({}) of {pid} runs without a seccomp filter: {threads:?}",
            t.tid, t.name
        );
        assert_eq!(
            t.no_new_privs, "1",
            "thread {} ({}) of {pid} runs without NoNewPrivs: {threads:?}",
            t.tid, t.name
        );
    }
}
