//! The Task API beyond run-and-exit, through ctr (and the shim's own ttrpc API for what
//! ctr 1.6 lacks): pause/resume, metrics, update, OOM, TTY, CloseIO, several
//! containers in one sandbox, concurrent execs.

use std::io::Write;
use std::process::{Command, Stdio};

use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::MessageField;
use containerd_shim_protos::shim::shim::{CloseIORequest, UpdateTaskRequest};
use e2e_tests::*;

#[test]
fn pause_resume_publish_events_and_refuse_exec_while_paused() {
    let c = Containerd::start("pause");
    let events = EventWatch::start(&c);
    start_detached(&c, "p1", &[], &["sleep", "1000"]);

    let out = c.ctr(&["task", "pause", "p1"]);
    assert!(
        out.status.success(),
        "pause: {}\n{}",
        stderr(&out),
        c.log_tail()
    );
    wait_status(&c, "p1", "PAUSED");
    let out = exec(&c, "p1", "e1", &[], &["true"]);
    assert!(
        !out.status.success(),
        "exec into a paused container succeeded"
    );
    assert!(
        stderr(&out).contains("paused"),
        "unclear refusal: {}",
        stderr(&out)
    );

    let out = c.ctr(&["task", "resume", "p1"]);
    assert!(out.status.success(), "resume: {}", stderr(&out));
    wait_status(&c, "p1", "RUNNING");
    let out = exec(&c, "p1", "e2", &[], &["echo", "awake"]);
    assert_eq!(stdout(&out), "awake\n", "{}", stderr(&out));

    assert!(
        events.wait_for("/tasks/paused", "p1"),
        "no paused event: {}",
        events.text()
    );
    assert!(
        events.wait_for("/tasks/resumed", "p1"),
        "no resumed event: {}",
        events.text()
    );
    remove_detached(&c, "p1");
    assert_no_leftovers("p1");
}

#[test]
fn metrics_and_update_reach_the_guest_cgroup() {
    let c = Containerd::start("metrics");
    start_detached(
        &c,
        "m1",
        &["--memory-limit", "67108864"],
        &["sleep", "1000"],
    );

    let out = c.ctr(&["task", "metrics", "--format", "json", "m1"]);
    assert!(
        out.status.success(),
        "metrics: {}\n{}",
        stderr(&out),
        c.log_tail()
    );
    let m: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metrics JSON");
    assert_eq!(m["memory"]["usage_limit"], 67108864u64, "{m}");
    assert!(m["memory"]["usage"].as_u64().unwrap_or(0) > 0, "{m}");
    assert!(m["pids"]["current"].as_u64().unwrap_or(0) >= 1, "{m}");

    // ctr 1.6 has no `task update`; containerd's CRI sends this same request.
    let resources = serde_json::json!({"memory": {"limit": 100663296u64}, "pids": {"limit": 42}});
    let req = UpdateTaskRequest {
        id: "m1".into(),
        resources: MessageField::some(Any {
            type_url: "types.containerd.io/opencontainers/runtime-spec/1/LinuxResources".into(),
            value: serde_json::to_vec(&resources).expect("json"),
            ..Default::default()
        }),
        ..Default::default()
    };
    task_client(&c, "m1")
        .update(ttrpc_ctx(), &req)
        .expect("update");
    let out = c.ctr(&["task", "metrics", "--format", "json", "m1"]);
    let m: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metrics JSON");
    assert_eq!(m["memory"]["usage_limit"], 100663296u64, "{m}");
    assert_eq!(m["pids"]["limit"], 42, "{m}");

    remove_detached(&c, "m1");
    assert_no_leftovers("m1");
}

#[test]
fn exceeding_the_memory_limit_is_an_oom_kill() {
    let c = Containerd::start("oom");
    let events = EventWatch::start(&c);
    let hog = "x=0123456789; while true; do x=$x$x; done";
    let out = c.run(
        "o1",
        &["--rm", "--memory-limit", "33554432"],
        &["sh", "-c", hog],
    );
    assert_eq!(
        out.status.code(),
        Some(137),
        "{}\n{}",
        stderr(&out),
        c.log_tail()
    );
    assert!(
        events.wait_for("/tasks/oom", "o1"),
        "no oom event: {}",
        events.text()
    );
    assert_no_leftovers("o1");
}

#[test]
fn tty_gives_a_terminal_whose_size_follows_the_host() {
    let c = Containerd::start("tty");
    let args = c.run_args("t1", &["--rm", "-t"], &["sh", "-c", "tty; stty size"]);
    let ctr = format!("ctr -a {} {}", c.socket.display(), args.join(" "));
    // `script` gives ctr a terminal of a known size; ctr passes it on with ResizePty.
    let out = Command::new("script")
        .args(["-qec", &format!("stty rows 31 cols 97; {ctr}"), "/dev/null"])
        .env(
            "PATH",
            std::env::var("KATA_TEST_SHIM_DIR").unwrap_or_default()
                + ":"
                + &std::env::var("PATH").unwrap_or_default(),
        )
        .stdin(Stdio::null())
        .output()
        .expect("script");
    let text = stdout(&out);
    assert!(
        text.contains("/dev/pts/"),
        "no terminal in the container: {text:?}\n{}",
        c.log_tail()
    );
    assert!(
        text.contains("31 97"),
        "terminal size did not follow: {text:?}"
    );
    assert_no_leftovers("t1");

    // `ctr task exec -t` into a running container.
    start_detached(&c, "t2", &[], &["sleep", "1000"]);
    let fifo = c.dir.join("fifo").display().to_string();
    let exec = format!(
        "ctr -a {} task exec -t --fifo-dir {fifo} --exec-id tty1 t2 sh -c 'tty; stty size'",
        c.socket.display()
    );
    let out = Command::new("script")
        .args([
            "-qec",
            &format!("stty rows 23 cols 55; {exec}"),
            "/dev/null",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("script");
    let text = stdout(&out);
    assert!(
        text.contains("/dev/pts/"),
        "no terminal in the exec: {text:?}"
    );
    assert!(
        text.contains("23 55"),
        "exec terminal size did not follow: {text:?}"
    );
    remove_detached(&c, "t2");
    assert_no_leftovers("t2");
}

#[test]
fn close_io_delivers_end_of_input() {
    let c = Containerd::start("closeio");
    let mut child = c.spawn_run("ci1", &["--rm"], &["wc", "-c"]);
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(&[b'z'; 12345]).expect("writing stdin");
    stdin.flush().expect("flush");
    wait_status(&c, "ci1", "RUNNING");
    // ctr keeps the fifo open, so only CloseIO can end the input.
    std::thread::sleep(std::time::Duration::from_secs(1));
    let req = CloseIORequest {
        id: "ci1".into(),
        stdin: true,
        ..Default::default()
    };
    task_client(&c, "ci1")
        .close_io(ttrpc_ctx(), &req)
        .expect("close_io");
    let out = child.wait_with_output().expect("ctr output");
    drop(stdin);
    assert!(out.status.success(), "{}\n{}", stderr(&out), c.log_tail());
    assert_eq!(stdout(&out).trim(), "12345");
    assert_no_leftovers("ci1");
}

#[test]
fn pod_containers_share_the_sandbox_vm() {
    let c = Containerd::start("pod");
    let sb = ["--annotation", "io.kubernetes.cri.container-type=sandbox"];
    start_detached(&c, "pod1", &sb, &["sleep", "1000"]);
    let member = [
        "--annotation",
        "io.kubernetes.cri.container-type=container",
        "--annotation",
        "io.kubernetes.cri.sandbox-id=pod1",
    ];
    start_detached(&c, "pod1-app", &member, &["sleep", "1000"]);

    // One VM, one shim. The sandbox container reports the VMM's pid, the member a pid of
    // its own (what `kubectl debug --target` names it by): a thread of that shim.
    let ls = stdout(&c.ctr(&["task", "ls"]));
    let pid_of = |id: &str| {
        ls.lines()
            .find(|l| l.starts_with(&format!("{id} ")))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok())
            .unwrap_or_else(|| panic!("no pid of {id} in: {ls}"))
    };
    let (sandbox, member) = (pid_of("pod1"), pid_of("pod1-app"));
    assert_ne!(sandbox, member, "{ls}");
    let comm = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    assert!(
        comm(sandbox).starts_with("qemu"),
        "{sandbox}: {}",
        comm(sandbox)
    );
    let status = std::fs::read_to_string(format!("/proc/{member}/status")).unwrap_or_default();
    let tgid: u32 = status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{member} is no process: {status}"));
    assert_eq!(comm(tgid), "containerd-shim", "{member} belongs to {tgid}");
    let shims = leftovers("pod1")
        .iter()
        .filter(|l| l.contains("containerd-shim-kata-v2"))
        .count();
    assert_eq!(shims, 1, "{:?}", leftovers("pod1"));
    let out = exec(&c, "pod1-app", "x1", &[], &["hostname"]);
    assert!(
        out.status.success(),
        "exec in the pod container: {}",
        stderr(&out)
    );

    // The member goes first; the VM stays for the sandbox container.
    remove_detached(&c, "pod1-app");
    let out = exec(&c, "pod1", "x2", &[], &["echo", "still-up"]);
    assert_eq!(stdout(&out), "still-up\n", "{}", stderr(&out));
    remove_detached(&c, "pod1");
    assert_no_leftovers("pod1");
}

#[test]
fn concurrent_execs_keep_their_own_output_and_status() {
    let c = Containerd::start("execs");
    start_detached(&c, "x1", &[], &["sleep", "1000"]);
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let args: Vec<String> = ["task", "exec", "--fifo-dir"]
                .iter()
                .map(|s| s.to_string())
                .chain([
                    c.dir.join("fifo").display().to_string(),
                    "--exec-id".into(),
                    format!("c{i}"),
                    "x1".into(),
                ])
                .chain([
                    "sh".into(),
                    "-c".into(),
                    format!("for j in 1 2 3; do echo exec{i}-$j; done; exit {}", 10 + i),
                ])
                .collect();
            let mut cmd = c.ctr_cmd(&args.iter().map(String::as_str).collect::<Vec<_>>());
            cmd.stdin(Stdio::null());
            std::thread::spawn(move || cmd.output().expect("ctr exec"))
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        let out = h.join().expect("exec thread");
        assert_eq!(out.status.code(), Some(10 + i as i32), "{}", stderr(&out));
        assert_eq!(stdout(&out), format!("exec{i}-1\nexec{i}-2\nexec{i}-3\n"));
    }

    // Kill of an exec, and a reused exec id refused while it is in use.
    let args = [
        "task",
        "exec",
        "--fifo-dir",
        &c.dir.join("fifo").display().to_string(),
        "--exec-id",
        "long",
        "x1",
        "sleep",
        "1000",
    ]
    .map(str::to_string);
    let mut long = c
        .ctr_cmd(&args.iter().map(String::as_str).collect::<Vec<_>>())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("ctr exec");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let ps = stdout(&c.ctr(&["task", "ps", "x1"]));
        if ps.lines().count() >= 3 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the long exec never started: {ps}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let out = exec(&c, "x1", "long", &[], &["true"]);
    assert!(
        !out.status.success() && stderr(&out).contains("already"),
        "exec id reuse: {}",
        stderr(&out)
    );
    let out = c.ctr(&["task", "kill", "--exec-id", "long", "-s", "SIGKILL", "x1"]);
    assert!(out.status.success(), "kill exec: {}", stderr(&out));
    let status = long.wait().expect("long exec");
    assert_eq!(status.code(), Some(137));
    remove_detached(&c, "x1");
    assert_no_leftovers("x1");
}
