//! The OCI spec honoured inside the VM, as ctr's flags set it: user, capabilities,
//! no_new_privileges, seccomp, read-only rootfs, host bind mounts, the default mounts,
//! masked paths and devices, resource limits; and bad input failing clearly.

use e2e_tests::*;

/// Runs `script` in a fresh container with `extra` ctr flags; returns stdout.
fn sh(c: &Containerd, id: &str, extra: &[&str], script: &str) -> String {
    let mut flags = vec!["--rm"];
    flags.extend_from_slice(extra);
    let out = c.run(id, &flags, &["sh", "-c", script]);
    assert!(
        out.status.success(),
        "{id}: {}\n{}",
        stderr(&out),
        c.log_tail()
    );
    assert_no_leftovers(id);
    stdout(&out)
}

fn status_field(text: &str, field: &str) -> String {
    text.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("")
        .to_string()
}

#[test]
fn security_settings_of_the_process() {
    let c = Containerd::start("security");
    // ctr's defaults: no new privileges, the default capability set, no seccomp.
    let status = sh(&c, "s1", &[], "cat /proc/self/status");
    assert_eq!(status_field(&status, "NoNewPrivs:"), "1", "{status}");
    assert_eq!(
        status_field(&status, "CapBnd:"),
        "00000000a80425fb",
        "{status}"
    );
    assert_eq!(
        status_field(&status, "CapEff:"),
        "00000000a80425fb",
        "{status}"
    );

    let out = sh(&c, "s2", &["--cap-drop", "CAP_CHOWN", "--allow-new-privs"], "grep -E 'CapEff|NoNewPrivs' /proc/self/status; chown 65534 /tmp && echo chown-ok || echo chown-denied");
    assert_eq!(status_field(&out, "CapEff:"), "00000000a80425fa", "{out}");
    assert_eq!(status_field(&out, "NoNewPrivs:"), "0", "{out}");
    assert!(out.contains("chown-denied"), "{out}");

    let out = sh(
        &c,
        "s3",
        &["--seccomp"],
        "grep Seccomp: /proc/self/status; echo alive",
    );
    assert_eq!(status_field(&out, "Seccomp:"), "2", "{out}");
    assert!(out.contains("alive"));
}

fn assert_default_signals(status: &str) {
    for field in ["SigIgn:", "SigBlk:"] {
        assert_eq!(status_field(status, field), "0000000000000000", "{status}");
    }
}

#[test]
fn processes_start_with_default_signal_dispositions() {
    // As under runc: nothing ignored, nothing blocked. Ignored signals survive execve, so
    // a runtime written in a language whose runtime ignores SIGPIPE (Rust's does) hands
    // that on unless it resets it; a pipeline's writer then gets EPIPE instead of dying.
    // cat itself, not through sh: busybox sh ignores SIGQUIT for its commands (under
    // runc too).
    let c = Containerd::start("signals");
    let out = c.run("g1", &["--rm"], &["cat", "/proc/self/status"]);
    assert!(out.status.success(), "{}\n{}", stderr(&out), c.log_tail());
    assert_no_leftovers("g1");
    assert_default_signals(&stdout(&out));

    start_detached(&c, "g2", &[], &["sleep", "1000"]);
    let out = exec(&c, "g2", "e1", &[], &["cat", "/proc/self/status"]);
    let status = stdout(&out);
    remove_detached(&c, "g2");
    assert_no_leftovers("g2");
    assert!(out.status.success(), "{}", stderr(&out));
    assert_default_signals(&status);
}

#[test]
fn filesystem_view_of_the_container() {
    let c = Containerd::start("fs");
    let host = c.dir.join("hostdata");
    std::fs::create_dir_all(&host).expect("host dir");
    std::fs::write(host.join("from-host"), "hello from the host\n").expect("host file");
    let rw = format!(
        "type=bind,src={},dst=/data,options=rbind:rw",
        host.display()
    );
    let out = sh(
        &c,
        "f1",
        &["--mount", &rw],
        "cat /data/from-host; echo written > /data/from-guest; \
         cat /sys/class/bdi/*/read_ahead_kb",
    );
    // The rootfs and the volume come through the sandbox's two virtio-fs shares, the
    // guest's only backing devices (a container's rootfs, a submount, reads through its
    // share's), which read ahead 1 MiB (agent init.rs, SHARE_READ_AHEAD_KB), not the
    // kernel's 128 KiB.
    assert_eq!(out, "hello from the host\n1024\n1024\n");
    assert_eq!(
        std::fs::read_to_string(host.join("from-guest")).expect("guest's file"),
        "written\n"
    );

    let ro = format!(
        "type=bind,src={},dst=/data,options=rbind:ro",
        host.display()
    );
    let out = sh(
        &c,
        "f2",
        &["--mount", &ro],
        "cat /data/from-host; touch /data/x 2>/dev/null && echo wrote || echo read-only",
    );
    assert_eq!(out, "hello from the host\nread-only\n");
    assert!(!host.join("x").exists());

    let out = sh(
        &c,
        "f3",
        &["--read-only"],
        "touch /newfile 2>/dev/null && echo wrote || echo read-only",
    );
    assert_eq!(out, "read-only\n");

    // The default mounts, devices and masked paths of ctr's spec.
    let out = sh(
        &c,
        "f4",
        &[],
        "for t in proc sysfs tmpfs devpts mqueue; do grep -q \" $t \" /proc/mounts && echo mount-$t; done; \
         for d in null zero full random urandom tty ptmx; do [ -e /dev/$d ] && echo dev-$d; done; \
         echo x > /dev/null && echo null-ok; head -c 4 /dev/zero | wc -c; \
         grep -c ' /sys/firmware tmpfs ro' /proc/mounts; wc -c < /proc/timer_list",
    );
    for want in [
        "mount-proc",
        "mount-sysfs",
        "mount-tmpfs",
        "mount-devpts",
        "mount-mqueue",
    ] {
        assert!(out.contains(want), "{want} missing: {out}");
    }
    for d in ["null", "zero", "full", "random", "urandom", "tty", "ptmx"] {
        assert!(out.contains(&format!("dev-{d}")), "/dev/{d} missing: {out}");
    }
    assert!(out.contains("null-ok"), "{out}");
    assert!(out.lines().any(|l| l.trim() == "4"), "{out}");
    // ctr masks /proc/timer_list (a file: /dev/null over it) and /sys/firmware (a
    // directory: an empty read-only tmpfs); both exist in our guest.
    let tail: Vec<&str> = out.lines().rev().take(2).map(str::trim).collect();
    assert_eq!(tail, ["0", "1"], "masked paths: {out}");
}

#[test]
fn resource_limits_apply_to_the_container_cgroup() {
    let c = Containerd::start("limits");
    let own = "/sys/fs/cgroup/$(cut -d: -f3 /proc/self/cgroup)";
    let out = sh(
        &c,
        "r1",
        &[
            "--memory-limit",
            "50331648",
            "--cpu-quota",
            "50000",
            "--cpu-period",
            "100000",
            // ctr's default spec mounts no cgroup file system; ask for one.
            "--mount",
            "type=cgroup2,src=cgroup,dst=/sys/fs/cgroup,options=ro",
        ],
        &format!("cat {own}/memory.max {own}/cpu.max"),
    );
    assert_eq!(out, "50331648\n50000 100000\n", "{out}");
}

#[test]
fn bad_input_fails_clearly_and_the_sandbox_stays_usable() {
    let c = Containerd::start("badinput");
    start_detached(&c, "b1", &[], &["sleep", "1000"]);

    let out = exec(&c, "b1", "e1", &["--cwd", "/no/such/dir"], &["true"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("/no/such/dir"),
        "bad cwd: {}",
        stderr(&out)
    );

    let out = exec(&c, "b1", "e2", &[], &["/no/such/binary"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("/no/such/binary"),
        "missing binary: {}",
        stderr(&out)
    );

    let out = exec(&c, "b1", "e3", &["--user", "no-such-user"], &["true"]);
    assert!(!out.status.success());
    // containerd resolves names from the image's /etc/passwd before the shim is asked.
    assert!(
        stderr(&out).contains("no users found"),
        "unknown user: {}",
        stderr(&out)
    );

    let out = exec(&c, "b1", "e4", &["--user", "65534"], &["id", "-u"]);
    assert_eq!(stdout(&out), "65534\n", "{}", stderr(&out));
    remove_detached(&c, "b1");
    assert_no_leftovers("b1");

    let out = c.run(
        "b2",
        &[
            "--rm",
            "--mount",
            "type=bind,src=/no/such/source,dst=/data,options=rbind:rw",
        ],
        &["true"],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("/no/such/source"),
        "bad mount source: {}",
        stderr(&out)
    );
    assert_no_leftovers("b2");
}
