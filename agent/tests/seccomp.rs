//! Seccomp in kata-agent, end to end on the host: a profile that denies mkdir with
//! EPERM, for the init process (with and without no_new_privs) and exec'd processes, and
//! a profile shaped like containerd's default under which busybox runs.
//! Needs root, runc (for `runc spec`) and busybox-static.

mod common;
mod hardening;

use common::TestAgent;
use hardening::{rootfs, run_ok, spec};
use serde_json::{json, Value};

/// A profile shaped like containerd's default: deny by default with an errno, an allow
/// list, argument conditions (AND on distinct arguments, masked compares, several
/// conditions on one argument) and names libseccomp does not know.
fn default_like_profile() -> Value {
    let allowed = [
        "access",
        "arch_prctl",
        "brk",
        "chdir",
        "close",
        "dup",
        "dup2",
        "dup3",
        "execve",
        "exit",
        "exit_group",
        "fcntl",
        "fstat",
        "newfstatat",
        "statx",
        "getcwd",
        "getdents64",
        "getegid",
        "geteuid",
        "getgid",
        "getpid",
        "getppid",
        "getuid",
        "getgroups",
        "ioctl",
        "lseek",
        "mmap",
        "mprotect",
        "munmap",
        "open",
        "openat",
        "pipe",
        "pipe2",
        "poll",
        "prlimit64",
        "read",
        "readlink",
        "readv",
        "rt_sigaction",
        "rt_sigprocmask",
        "rt_sigreturn",
        "set_tid_address",
        "stat",
        "lstat",
        "uname",
        "wait4",
        "write",
        "writev",
        "fork",
        "vfork",
        "getrlimit",
        "setrlimit",
        "umask",
        "sendto",
        "sendmsg",
        "recvfrom",
        "capget",
        "capset",
        "prctl",
        "setgroups",
        "setgid",
        "setuid",
        "setresuid",
        "setresgid",
        "getrandom",
        "rseq",
        "set_robust_list",
        "futex",
        "getpgrp",
        "setpgid",
        "getpgid",
        "getsid",
        "setsid",
        "gettid",
        "kill",
        "tgkill",
        "sysinfo",
        "nanosleep",
        "clock_nanosleep",
        "clock_gettime",
        "gettimeofday",
        "sched_getaffinity",
        "sched_yield",
        "madvise",
        "mremap",
        "pread64",
        "pwrite64",
        "faccessat",
        "faccessat2",
        "fchdir",
        "getresuid",
        "getresgid",
        "sigaltstack",
        "select",
        "pselect6",
        "ppoll",
        "exit",
        "some_future_syscall_xyz",
    ];
    json!({
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": 1,
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "syscalls": [
            {"names": allowed.as_slice(), "action": "SCMP_ACT_ALLOW"},
            {"names": ["personality"], "action": "SCMP_ACT_ALLOW",
                "args": [{"index": 0, "value": 0, "op": "SCMP_CMP_EQ"}]},
            {"names": ["personality"], "action": "SCMP_ACT_ALLOW",
                "args": [{"index": 0, "value": 8, "op": "SCMP_CMP_EQ"},
                         {"index": 0, "value": 4294967295u32, "op": "SCMP_CMP_EQ"}]},
            {"names": ["clone"], "action": "SCMP_ACT_ALLOW",
                "args": [{"index": 0, "value": 2114060288, "valueTwo": 0,
                          "op": "SCMP_CMP_MASKED_EQ"}]},
            {"names": ["socket"], "action": "SCMP_ACT_ALLOW",
                "args": [{"index": 0, "value": 40, "op": "SCMP_CMP_NE"},
                         {"index": 1, "value": 0, "op": "SCMP_CMP_GE"}]},
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38},
            {"names": ["reboot"], "action": "SCMP_ACT_ERRNO"}
        ]
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seccomp_profiles_are_enforced() {
    let agent = TestAgent::start("seccomp").await;
    let deny_mkdir = json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1}]
    });
    let script = "mkdir /tmp/d 2>&1; echo mkdir=$?; touch /tmp/f && echo touch-ok";
    for (id, nnp) in [("nnp", true), ("privs", false)] {
        let profile = deny_mkdir.clone();
        let out = run_ok(&agent, id, script, move |s| {
            s["process"]["noNewPrivileges"] = nnp.into();
            s["linux"]["seccomp"] = profile;
        })
        .await;
        assert!(out.contains("Operation not permitted"), "{id}: {out}");
        assert!(out.contains("mkdir=1\ntouch-ok\n"), "{id}: {out}");
    }

    // Exec'd processes get the container's profile too.
    let root = rootfs(&agent, "x");
    let profile = deny_mkdir.clone();
    let spec = spec(&agent, &root, "sleep 1000", move |s| {
        s["linux"]["seccomp"] = profile
    });
    agent.create("x", spec, false).await.expect("create");
    agent.start_container("x").await.expect("start");
    let mut req = protocols::agent::ExecProcessRequest::new();
    req.container_id = "x".into();
    req.exec_id = "e".into();
    req.process = serde_json::to_vec(&json!({"args": ["sh", "-c", "mkdir /tmp/e; echo $?"],
        "env": ["PATH=/bin"], "cwd": "/", "user": {"uid": 0, "gid": 0}}))
    .expect("process JSON");
    let out = agent.read_all_after_exec(&req).await;
    assert_eq!(agent.wait("x", "e").await, 0);
    assert!(String::from_utf8_lossy(&out.await.expect("out")).ends_with("1\n"));
    agent.remove("x").await.expect("remove");

    let out = run_ok(&agent, "default", "echo hello from sh; uname -s", |s| {
        s["linux"]["seccomp"] = default_like_profile();
    })
    .await;
    assert_eq!(out, "hello from sh\nLinux\n");
    let out = run_ok(&agent, "denied", "mkdir /tmp/nope 2>&1; echo $?", |s| {
        s["linux"]["seccomp"] = default_like_profile();
    })
    .await;
    assert!(out.ends_with("1\n"), "{out}");
}
