//! kata-agent's process and rootfs hardening, end to end on the host: capabilities,
//! no_new_privs, rlimits, user and groups, umask, masked and read-only paths, sysctls,
//! read-only rootfs and binds, devices and /dev/console, secure mount targets, and clear
//! errors for bad input. Needs root, runc (for `runc spec`) and busybox-static.

mod common;
mod hardening;

use std::path::Path;

use common::{message, TestAgent};
use hardening::{
    expect_create_error, expect_create_invalid, rootfs, run, run_ok, spec, status_field,
};
use protocols::agent::ExecProcessRequest;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capability_sets_are_applied() {
    let agent = TestAgent::start("caps").await;
    // Root gets its bounding set on execve, as with runc.
    let out = run_ok(&agent, "root", "grep Cap /proc/self/status", |s| {
        s["process"]["capabilities"] = json!({
            "bounding": ["CAP_CHOWN", "CAP_KILL", "CAP_NET_BIND_SERVICE"],
            "effective": ["CAP_CHOWN", "CAP_KILL", "CAP_NET_BIND_SERVICE"],
            "permitted": ["CAP_CHOWN", "CAP_KILL", "CAP_NET_BIND_SERVICE"],
        });
    })
    .await;
    assert_eq!(status_field(&out, "CapBnd"), "0000000000000421");
    assert_eq!(status_field(&out, "CapEff"), "0000000000000421");
    assert_eq!(status_field(&out, "CapAmb"), "0000000000000000");

    // A non-root user keeps exactly its inheritable and ambient sets across execve;
    // the ambient capability could only be raised if permitted and inheritable were
    // set after the switch of user.
    let out = run_ok(&agent, "user", "grep Cap /proc/self/status", |s| {
        s["process"]["user"] = json!({"uid": 1000, "gid": 1000});
        s["process"]["capabilities"] = json!({
            "bounding": ["CAP_CHOWN", "CAP_KILL", "CAP_NET_BIND_SERVICE"],
            "effective": ["CAP_KILL"],
            "permitted": ["CAP_KILL", "CAP_NET_BIND_SERVICE"],
            "inheritable": ["CAP_KILL", "CAP_NET_BIND_SERVICE"],
            "ambient": ["CAP_NET_BIND_SERVICE"],
        });
    })
    .await;
    assert_eq!(status_field(&out, "CapBnd"), "0000000000000421");
    assert_eq!(status_field(&out, "CapInh"), "0000000000000420");
    assert_eq!(status_field(&out, "CapPrm"), "0000000000000400");
    assert_eq!(status_field(&out, "CapEff"), "0000000000000400");
    assert_eq!(status_field(&out, "CapAmb"), "0000000000000400");

    // Without CAP_CHOWN even root cannot chown.
    let script = "touch /tmp/f && chown 1:1 /tmp/f; echo status=$?";
    let out = run_ok(&agent, "nochown", script, |s| {
        let caps = json!(["CAP_KILL"]);
        s["process"]["capabilities"] =
            json!({"bounding": caps, "effective": caps, "permitted": caps});
    })
    .await;
    assert_eq!(out.trim(), "status=1");
    let out = run_ok(&agent, "chown", script, |s| {
        let caps = json!(["CAP_CHOWN"]);
        s["process"]["capabilities"] =
            json!({"bounding": caps, "effective": caps, "permitted": caps});
    })
    .await;
    assert_eq!(out.trim(), "status=0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_new_privileges_rlimits_user_and_umask() {
    let agent = TestAgent::start("process").await;
    let out = run_ok(&agent, "nnp", "grep NoNewPrivs /proc/self/status", |s| {
        s["process"]["noNewPrivileges"] = true.into();
    })
    .await;
    assert_eq!(status_field(&out, "NoNewPrivs"), "1");
    let out = run_ok(&agent, "nonnp", "grep NoNewPrivs /proc/self/status", |s| {
        s["process"]["noNewPrivileges"] = false.into();
    })
    .await;
    assert_eq!(status_field(&out, "NoNewPrivs"), "0");

    let out = run_ok(&agent, "rlimit", "ulimit -n; ulimit -Hn; ulimit -c", |s| {
        s["process"]["rlimits"] = json!([
            {"type": "RLIMIT_NOFILE", "soft": 321, "hard": 654},
            {"type": "RLIMIT_CORE", "soft": 0, "hard": 0},
        ]);
    })
    .await;
    assert_eq!(out, "321\n654\n0\n");

    let out = run_ok(&agent, "user", "id; umask", |s| {
        s["process"]["user"] =
            json!({"uid": 1000, "gid": 1001, "additionalGids": [1002, 1003], "umask": 0o027});
    })
    .await;
    let mut lines = out.lines();
    assert_eq!(
        lines.next(),
        Some("uid=1000 gid=1001 groups=1002,1003"),
        "{out}"
    );
    assert_eq!(lines.next(), Some("0027"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masked_and_readonly_paths_sysctls_and_readonly_mounts() {
    let agent = TestAgent::start("paths").await;
    let root = rootfs(&agent, "p");
    std::fs::write(root.join("secret.txt"), "top secret").expect("write secret");
    std::fs::create_dir_all(root.join("secretdir")).expect("mkdir");
    std::fs::write(root.join("secretdir/key"), "key").expect("write key");
    std::fs::create_dir_all(root.join("rodir")).expect("mkdir");
    let shared = agent.dir.join("shared");
    std::fs::create_dir_all(&shared).expect("mkdir shared");
    std::fs::write(shared.join("f"), "from the guest").expect("write shared");
    let host_msgmax = std::fs::read_to_string("/proc/sys/kernel/msgmax").expect("msgmax");

    let script = "cat /secret.txt; ls /secretdir; echo masked-end; \
        touch /secretdir/x 2>/dev/null && echo BAD-masked-writable; \
        touch /rodir/x 2>/dev/null && echo BAD-rodir-writable; \
        touch /tmp/ok && echo tmp-writable; \
        cat /proc/sys/kernel/msgmax; \
        cat /ro/f; echo; touch /ro/new 2>/dev/null && echo BAD-ro-bind-writable; \
        touch /rw/new && echo rw-bind-writable";
    let shared_src = shared.display().to_string();
    let spec = spec(&agent, &root, script, |s| {
        s["linux"]["maskedPaths"] = json!(["/secret.txt", "/secretdir", "/does/not/exist"]);
        s["linux"]["readonlyPaths"] = json!(["/rodir", "/missing"]);
        s["linux"]["sysctl"] = json!({"kernel.msgmax": "12345"});
        let mounts = s["mounts"].as_array_mut().expect("mounts");
        mounts.push(
            json!({"destination": "/ro", "type": "bind", "source": shared_src,
            "options": ["rbind", "ro"]}),
        );
        mounts.push(
            json!({"destination": "/rw", "type": "bind", "source": shared_src,
            "options": ["rbind", "rw"]}),
        );
    });
    let (status, out, err) = run(&agent, "p", spec).await;
    assert_eq!(status, 0, "stderr: {err}");
    assert_eq!(
        out, "masked-end\ntmp-writable\n12345\nfrom the guest\nrw-bind-writable\n",
        "stderr: {err}"
    );
    assert_eq!(
        std::fs::read_to_string("/proc/sys/kernel/msgmax").expect("msgmax"),
        host_msgmax,
        "the sysctl leaked out of the container"
    );
    assert!(
        shared.join("new").is_file(),
        "the rw bind did not write through"
    );

    // A read-only rootfs refuses writes; mounts on it still work.
    let out = run_ok(
        &agent,
        "rofs",
        "touch /x 2>/dev/null && echo BAD; grep -c . /proc/self/status >/dev/null && echo ok",
        |s| s["root"]["readonly"] = true.into(),
    )
    .await;
    assert_eq!(out, "ok\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_and_secure_mount_targets() {
    let agent = TestAgent::start("devices").await;
    let root = rootfs(&agent, "d");
    // A hostile image: /escape points at a guest directory outside the rootfs.
    let outside = agent.dir.join("outside");
    std::fs::create_dir_all(&outside).expect("mkdir outside");
    std::os::unix::fs::symlink(&outside, root.join("escape")).expect("symlink");
    // /up climbs out of the rootfs (to the test's own directory, should it escape).
    std::os::unix::fs::symlink("../..", root.join("up")).expect("symlink");

    let script = "stat -c '%F %t:%T %a %u:%g' /dev/null /dev/mynull; \
        echo hi > /dev/mynull && echo wrote-mynull; readlink /dev/ptmx; \
        ls -d /up/etc-target >/dev/null && echo up-inside";
    let spec = spec(&agent, &root, script, |s| {
        s["linux"]["devices"] = json!([{"type": "c", "path": "/dev/mynull", "major": 1,
            "minor": 3, "fileMode": 0o620, "uid": 0, "gid": 5}]);
        let mounts = s["mounts"].as_array_mut().expect("mounts");
        mounts.push(json!({"destination": "/escape/sub", "type": "tmpfs", "source": "tmpfs"}));
        mounts.push(json!({"destination": "/up/etc-target", "type": "tmpfs", "source": "tmpfs"}));
    });
    let (status, out, err) = run(&agent, "d", spec).await;
    assert_eq!(status, 0, "stdout {out:?} stderr {err:?}");
    let mut lines = out.lines();
    assert_eq!(
        lines.next(),
        Some("character special file 1:3 666 0:0"),
        "{out}"
    );
    assert_eq!(
        lines.next(),
        Some("character special file 1:3 620 0:5"),
        "{out}"
    );
    assert_eq!(lines.next(), Some("wrote-mynull"), "{out}");
    assert_eq!(lines.next(), Some("pts/ptmx"), "{out}");
    assert!(out.contains("up-inside"), "{out}");
    // The mount targets were created inside the rootfs, never through the symlinks.
    assert!(
        !outside.join("sub").exists(),
        "a mount target escaped the rootfs"
    );
    let inside = root
        .join(outside.strip_prefix("/").expect("absolute"))
        .join("sub");
    assert!(inside.is_dir(), "{} missing", inside.display());
    assert!(root.join("etc-target").is_dir());
    assert!(
        !agent.dir.join("etc-target").exists(),
        "/up escaped the rootfs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_fails_clearly_and_the_agent_goes_on() {
    let agent = TestAgent::start("badinput").await;
    let root = rootfs(&agent, "b");
    let bad_cap = spec(&agent, &root, "true", |s| {
        s["process"]["capabilities"]["bounding"] = json!(["CAP_CHOWN", "CAP_TELEPORT"]);
    });
    expect_create_error(&agent, "cap", bad_cap, "CAP_TELEPORT").await;
    let bad_rlimit = spec(&agent, &root, "true", |s| {
        s["process"]["rlimits"] = json!([{"type": "RLIMIT_WISHES", "soft": 1, "hard": 1}]);
    });
    expect_create_error(&agent, "rlimit", bad_rlimit, "RLIMIT_WISHES").await;
    let bad_sysctl = spec(&agent, &root, "true", |s| {
        s["linux"]["sysctl"] = json!({"vm.swappiness": "10"});
    });
    expect_create_error(&agent, "sysctl", bad_sysctl, "vm.swappiness").await;
    let bad_seccomp = spec(&agent, &root, "true", |s| {
        s["linux"]["seccomp"] = json!({"defaultAction": "SCMP_ACT_DANCE"});
    });
    expect_create_error(&agent, "seccomp", bad_seccomp, "SCMP_ACT_DANCE").await;
    let bad_op = spec(&agent, &root, "true", |s| {
        s["linux"]["seccomp"] = json!({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
            {"names": ["mkdir"], "action": "SCMP_ACT_ERRNO",
             "args": [{"index": 9, "value": 1, "op": "SCMP_CMP_EQ"}]}]});
    });
    expect_create_error(&agent, "seccomp-arg", bad_op, "argument index 9").await;
    let bad_source = spec(&agent, &root, "true", |s| {
        s["mounts"]
            .as_array_mut()
            .expect("mounts")
            .push(json!({"destination": "/data",
            "type": "bind", "source": "/no/such/guest/dir", "options": ["rbind"]}));
    });
    expect_create_error(&agent, "source", bad_source, "/no/such/guest/dir").await;

    // A uid the guest cannot set fails at start, naming it.
    let bad_uid = spec(&agent, &root, "true", |s| {
        s["process"]["user"] = json!({"uid": 4294967295u32, "gid": 0});
    });
    agent.create("uid", bad_uid, false).await.expect("create");
    let err = agent
        .start_container("uid")
        .await
        .expect_err("start must fail");
    assert!(
        message(&err).contains("set uid 4294967295"),
        "{}",
        message(&err)
    );
    agent.remove("uid").await.expect("remove");

    // The agent still runs containers.
    let out = run_ok(&agent, "after", "echo still-alive", |_| {}).await;
    assert_eq!(out, "still-alive\n");
}

/// A spec that the container's rootfs cannot satisfy fails CreateContainer (or
/// ExecProcess) with INVALID_ARGUMENT and a message that names the field, the value and
/// what to do; nothing of the attempt stays behind, and the agent goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spec_the_rootfs_cannot_satisfy_is_refused_and_leaves_nothing() {
    let agent = TestAgent::start("rootfsinput").await;
    let root = rootfs(&agent, "r");
    std::fs::create_dir_all(root.join("etc")).expect("mkdir etc");
    std::fs::write(
        root.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nworker:x:1234:1235::/:/bin/sh\n",
    )
    .expect("write passwd");

    let no_cmd = spec(&agent, &root, "true", |s| {
        s["process"]["args"] = json!(["no-such-command", "arg"]);
    });
    let needles = [
        r#"process.args[0] "no-such-command": no such executable file"#,
        "PATH=/bin",
        "add it to the image",
    ];
    expect_create_invalid(&agent, "cmd", no_cmd, &needles).await;
    let no_abs_cmd = spec(&agent, &root, "true", |s| {
        s["process"]["args"] = json!(["/bin/nope"]);
    });
    let needles = [r#""/bin/nope": no such file or directory"#];
    expect_create_invalid(&agent, "abscmd", no_abs_cmd, &needles).await;
    let not_exec = spec(&agent, &root, "true", |s| {
        s["process"]["args"] = json!(["/etc/passwd"]);
    });
    let needles = [r#""/etc/passwd": not an executable file"#];
    expect_create_invalid(&agent, "notexec", not_exec, &needles).await;

    let no_cwd = spec(&agent, &root, "true", |s| {
        s["process"]["cwd"] = "/no/such/dir".into();
    });
    let needles = [
        r#"process.cwd "/no/such/dir": no such file or directory"#,
        "create it in the image",
    ];
    expect_create_invalid(&agent, "cwd", no_cwd, &needles).await;

    let no_user = spec(&agent, &root, "true", |s| {
        s["process"]["user"] = json!({"uid": 0, "gid": 0, "username": "nosuchuser"});
    });
    let needles = [
        r#"process.user.username "nosuchuser" is not in the container's /etc/passwd"#,
        "numeric process.user.uid",
    ];
    expect_create_invalid(&agent, "user", no_user, &needles).await;

    let bad_ns = spec(&agent, &root, "true", |s| {
        s["linux"]["namespaces"]
            .as_array_mut()
            .expect("namespaces")
            .push(json!({"type": "wormhole"}));
    });
    let needles = [
        r#"type "wormhole" is not a namespace type"#,
        "use one of pid",
    ];
    expect_create_invalid(&agent, "ns", bad_ns, &needles).await;

    // Nothing is left: no process, no devpts instance, and the ids are free again.
    assert_nothing_left(&agent, &["cmd", "abscmd", "notexec", "cwd", "user", "ns"]).await;
    let named = spec(&agent, &root, "id -u; id -g", |s| {
        s["process"]["user"] = json!({"username": "worker"});
    });
    let (status, out, err) = run(&agent, "user", named).await;
    assert_eq!((status, out.as_str()), (0, "1234\n1235\n"), "stderr: {err}");

    // A mount destination through symlinks that point out of the rootfs lands inside it.
    let outside = agent.dir.join("outside");
    std::fs::create_dir_all(&outside).expect("mkdir outside");
    std::os::unix::fs::symlink(&outside, root.join("escape")).expect("symlink");
    std::os::unix::fs::symlink("../../../../../..", root.join("up")).expect("symlink");
    let shared = agent.dir.join("shared");
    std::fs::create_dir_all(&shared).expect("mkdir shared");
    std::fs::write(shared.join("f"), "bound").expect("write shared");
    let shared_src = shared.display().to_string();
    let through_links = spec(&agent, &root, "cat /escape/data/f /up/data2/f", |s| {
        let mounts = s["mounts"].as_array_mut().expect("mounts");
        for dest in ["/escape/data", "/up/data2"] {
            mounts.push(
                json!({"destination": dest, "type": "bind", "source": shared_src,
                "options": ["rbind", "ro"]}),
            );
        }
    });
    let (status, out, err) = run(&agent, "links", through_links).await;
    assert_eq!((status, out.as_str()), (0, "boundbound"), "stderr: {err}");
    assert!(
        !outside.join("data").exists(),
        "a mount target escaped the rootfs"
    );
    assert!(!Path::new("/data2").exists(), "/up escaped the rootfs");
    let inside = root.join(outside.strip_prefix("/").expect("absolute"));
    assert!(inside.join("data").is_dir(), "{}", inside.display());
    assert!(root.join("data2").is_dir());

    // ExecProcess: the same checks, and a failed exec_id can be used again.
    let sleeper = spec(&agent, &root, "sleep 1000", |_| {});
    agent.create("svc", sleeper, false).await.expect("create");
    agent.start_container("svc").await.expect("start");
    let mut req = ExecProcessRequest::new();
    req.container_id = "svc".into();
    req.exec_id = "e".into();
    req.process = br#"{"args":["no-such-command"],"env":["PATH=/bin"],"cwd":"/"}"#.to_vec();
    let err = agent
        .client
        .exec_process(common::ctx(), &req)
        .await
        .expect_err("exec of a missing command");
    assert_eq!(
        common::code(&err),
        Some(ttrpc::Code::INVALID_ARGUMENT),
        "{err:?}"
    );
    assert!(
        message(&err).contains(r#"exec in container svc: process.args[0] "no-such-command""#),
        "{}",
        message(&err)
    );
    req.process = br#"{"args":["echo","exec-ok"],"env":["PATH=/bin"],"cwd":"/"}"#.to_vec();
    let out = agent.read_all_after_exec(&req).await;
    assert_eq!(agent.wait("svc", "e").await, 0);
    assert_eq!(out.await.expect("exec stdout"), b"exec-ok\n");
    agent.remove("svc").await.expect("remove");
    assert_nothing_left(&agent, &["svc", "links", "user"]).await;
}

/// Waits (up to 5 s, for the reaper) until the agent has no child process and no devpts
/// instance of any of `ids` is mounted.
async fn assert_nothing_left(agent: &TestAgent, ids: &[&str]) {
    let mut left = Vec::new();
    for _ in 0..100 {
        left = agent.children();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        for id in ids {
            let pts = format!("{}/{id} ", kata_agent::devpts::DEVPTS_ROOT);
            left.extend(
                mounts
                    .lines()
                    .filter(|l| l.contains(&pts))
                    .map(String::from),
            );
        }
        if left.is_empty() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("left behind:\n{}", left.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_gets_dev_console() {
    let agent = TestAgent::start("console").await;
    let root = rootfs(&agent, "t");
    let spec = spec(
        &agent,
        &root,
        "stat -c '%F' /dev/console; [ -t 0 ] && echo is-a-tty",
        |s| s["process"]["terminal"] = true.into(),
    );
    let (status, out, err) = run(&agent, "t", spec).await;
    assert_eq!(status, 0, "stdout {out:?} stderr {err:?}");
    assert!(out.contains("character special file"), "{out:?}");
    assert!(out.contains("is-a-tty"), "{out:?}");
}
