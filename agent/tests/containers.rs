//! kata-agent end to end on the host: containers from a busybox rootfs, driven through
//! the ttrpc API on a unix socket. Needs root, runc (for `runc spec`) and busybox-static.

mod common;

use common::{code, md5, message, TestAgent};
use kata_agent::stage::spawner::ZYGOTE_NAME;
use protocols::agent::*;
use protocols::stdio::StdioStream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_output_and_exit_code() {
    let agent = TestAgent::start("echo").await;
    let (status, out, err) = agent.run("c1", &["echo", "hello"], &[], "/").await;
    assert_eq!(status, 0);
    assert_eq!(out, b"hello\n");
    assert!(err.is_empty());
    let (status, _, _) = agent.run("c2", &["sh", "-c", "exit 3"], &[], "/").await;
    assert_eq!(status, 3);
    agent.remove("c1").await.expect("remove c1");
    agent.remove("c2").await.expect("remove c2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stages_come_from_the_zygote_which_ends_with_the_agent() {
    let agent = TestAgent::start("zygote").await;
    let zygote = agent
        .zygote_pid()
        .expect("the agent forked no stage zygote");

    // A container and an exec, each through a stage.
    let (status, out, _) = agent.run("z", &["echo", "from-init"], &[], "/").await;
    assert_eq!((status, out.as_slice()), (0, &b"from-init\n"[..]));
    let rootfs = agent.rootfs("y");
    let spec = agent.spec(&rootfs, &["sleep", "1000"], &[], "/");
    agent.create("y", spec, false).await.expect("create");
    agent.start_container("y").await.expect("start");
    let mut req = ExecProcessRequest::new();
    req.container_id = "y".into();
    req.exec_id = "e1".into();
    req.process =
        br#"{"args":["echo","from-exec"],"env":["PATH=/bin"],"cwd":"/","user":{"uid":0,"gid":0}}"#
            .to_vec();
    let out = agent.read_all_after_exec(&req).await;
    assert_eq!(agent.wait("y", "e1").await, 0);
    assert_eq!(out.await.expect("exec stdout"), b"from-exec\n");

    // The same zygote served both: the agent never fell back to re-executing itself
    // (it would have logged why).
    assert_eq!(agent.zygote_pid(), Some(zygote));
    let log = std::fs::read_to_string(agent.dir.join("agent.log")).expect("agent log");
    assert!(!log.contains("stage zygote"), "{log}");
    agent.remove("z").await.expect("remove z");
    agent.remove("y").await.expect("remove y");

    // The zygote reads end-of-file when the agent is gone, and exits.
    drop(agent);
    let gone = (0..100).any(|_| {
        let state = std::fs::read_to_string(format!("/proc/{zygote}/stat"));
        let alive = state.is_ok_and(|s| {
            s.contains(&format!("({})", ZYGOTE_NAME.to_string_lossy()))
                && s.rsplit_once(')')
                    .and_then(|(_, r)| r.split_whitespace().next())
                    != Some("Z")
        });
        if alive {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        !alive
    });
    assert!(gone, "the zygote {zygote} outlived its agent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_stdout_arrives_intact() {
    let agent = TestAgent::start("large").await;
    let script =
        "head -c 8388608 /dev/urandom >/tmp/data && md5sum </tmp/data >&2 && cat /tmp/data";
    let (status, out, err) = agent.run("big", &["sh", "-c", script], &[], "/").await;
    assert_eq!(status, 0);
    assert_eq!(
        out.len(),
        8 * 1024 * 1024,
        "stderr: {}",
        String::from_utf8_lossy(&err)
    );
    let expected = String::from_utf8_lossy(&err)
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_string();
    assert_eq!(md5(&out), expected);
    agent.remove("big").await.expect("remove");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stderr_env_cwd_and_hostname() {
    let agent = TestAgent::start("env").await;
    let script = "echo out; echo err >&2; echo $FOO; pwd; hostname";
    let (status, out, err) = agent
        .run("e", &["sh", "-c", script], &["FOO=bar"], "/work")
        .await;
    assert_eq!(status, 0);
    assert_eq!(String::from_utf8_lossy(&out), "out\nbar\n/work\ntestbox\n");
    assert_eq!(err, b"err\n");
    agent.remove("e").await.expect("remove");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_reaches_the_process() {
    let agent = TestAgent::start("stdin").await;
    let rootfs = agent.rootfs("s");
    agent
        .create("s", agent.spec(&rootfs, &["wc", "-c"], &[], "/"), true)
        .await
        .expect("create");
    let out = agent.read_all("s", "", false);
    let mut stdin = agent.open_stream("s", "", StdioStream::Stdin).await;
    agent.start_container("s").await.expect("start");
    stdin
        .write_all(&[b'x'; 100_000])
        .await
        .expect("write stdin");
    // The half-close is the end of the process's stdin.
    stdin.shutdown().await.expect("close stdin");
    assert_eq!(agent.wait("s", "").await, 0);
    assert_eq!(
        String::from_utf8_lossy(&out.await.expect("stdout")).trim(),
        "100000"
    );
    agent.remove("s").await.expect("remove");
}

/// Output written before anyone attaches waits in the pipe, also after the process
/// exited; each stream is attached once; refusals say why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_streams_keep_early_output_and_refuse_with_reasons() {
    let agent = TestAgent::start("stdio").await;
    let rootfs = agent.rootfs("o");
    let script = "echo early; echo late >&2";
    agent
        .create(
            "o",
            agent.spec(&rootfs, &["sh", "-c", script], &[], "/"),
            false,
        )
        .await
        .expect("create");
    agent.start_container("o").await.expect("start");
    assert_eq!(agent.wait("o", "").await, 0);
    assert_eq!(
        agent.read_all("o", "", false).await.expect("stdout"),
        b"early\n"
    );
    assert_eq!(
        agent.read_all("o", "", true).await.expect("stderr"),
        b"late\n"
    );

    for (id, exec_id, stream, reason) in [
        (
            "o",
            "",
            StdioStream::Stdout,
            "its stdout is already attached",
        ),
        ("o", "", StdioStream::Stdin, "started without stdin"),
        (
            "o",
            "e9",
            StdioStream::Stdout,
            "container o has no process e9",
        ),
        (
            "nope",
            "",
            StdioStream::Stderr,
            "container nope does not exist",
        ),
    ] {
        let (answer, mut conn) = agent.request_stream(id, exec_id, stream).await;
        let why = answer.expect_err("a refusal");
        assert!(why.contains(reason), "{stream} of {id}/{exec_id}: {why}");
        let mut rest = Vec::new();
        conn.read_to_end(&mut rest).await.expect("read after ERR");
        assert!(rest.is_empty(), "a refused connection is closed");
    }

    let mut conn = UnixStream::connect(agent.stdio_socket())
        .await
        .expect("connect");
    conn.write_all(b"stdio o\n").await.expect("send");
    let mut answer = String::new();
    conn.read_to_string(&mut answer).await.expect("read");
    assert!(
        answer.starts_with("ERR ") && answer.contains("unknown stream"),
        "{answer:?}"
    );
    agent.remove("o").await.expect("remove");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_signal_and_remove() {
    let agent = TestAgent::start("exec").await;
    let rootfs = agent.rootfs("x");
    agent
        .create(
            "x",
            agent.spec(&rootfs, &["sleep", "1000"], &[], "/"),
            false,
        )
        .await
        .expect("create");
    agent.start_container("x").await.expect("start");

    let process = br#"{"args":["sh","-c","echo in-exec; exit 5"],"env":["PATH=/bin"],"cwd":"/","user":{"uid":0,"gid":0}}"#;
    let mut req = ExecProcessRequest::new();
    req.container_id = "x".into();
    req.exec_id = "e1".into();
    req.process = process.to_vec();
    let out = agent.read_all_after_exec(&req).await;
    assert_eq!(agent.wait("x", "e1").await, 5);
    assert_eq!(out.await.expect("exec stdout"), b"in-exec\n");

    let err = agent
        .client
        .exec_process(common::ctx(), &req)
        .await
        .expect_err("reused exec id");
    assert_eq!(
        code(&err),
        Some(ttrpc::Code::ALREADY_EXISTS),
        "{}",
        message(&err)
    );

    let mut list = ContainerRequest::new();
    list.container_id = "x".into();
    let pids = agent
        .client
        .list_processes(common::ctx(), &list)
        .await
        .expect("list")
        .pids;
    assert!(!pids.is_empty());

    agent.signal("x", 9).await.expect("signal");
    assert_eq!(agent.wait("x", "").await, 137);
    // Signalling an exited process is not an error.
    agent.signal("x", 9).await.expect("signal exited");

    agent.remove("x").await.expect("remove");
    for pid in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "pid {pid} survived"
        );
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mountinfo.contains(&rootfs.display().to_string()),
        "mounts left under {}",
        rootfs.display()
    );
    let err = agent.wait_err("x").await;
    assert_eq!(
        code(&err),
        Some(ttrpc::Code::NOT_FOUND),
        "{}",
        message(&err)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clear_errors() {
    let agent = TestAgent::start("errors").await;
    // What the rootfs lacks fails CreateContainer, before anything starts.
    let rootfs = agent.rootfs("n");
    let err = agent
        .create("n", agent.spec(&rootfs, &["nosuchbin"], &[], "/"), false)
        .await
        .expect_err("create must fail");
    assert_eq!(code(&err), Some(ttrpc::Code::INVALID_ARGUMENT), "{err:?}");
    assert!(
        message(&err).contains(r#"process.args[0] "nosuchbin": no such executable file"#),
        "{}",
        message(&err)
    );

    // A failed create takes back all it made: nothing of it runs, and its id is free.
    assert!(agent.children().is_empty(), "{:?}", agent.children());
    agent
        .create("n", agent.spec(&rootfs, &["true"], &[], "/"), false)
        .await
        .expect("the id of a failed create can be used again");
    agent.remove("n").await.expect("remove");

    let rootfs = agent.rootfs("d");
    let err = agent
        .create("d", agent.spec(&rootfs, &["true"], &[], "/nope"), false)
        .await
        .expect_err("create must fail");
    assert_eq!(code(&err), Some(ttrpc::Code::INVALID_ARGUMENT), "{err:?}");
    assert!(
        message(&err).contains(r#"process.cwd "/nope": no such file or directory"#),
        "{}",
        message(&err)
    );

    let err = agent
        .create("bad", b"{not json".to_vec(), false)
        .await
        .expect_err("bad spec");
    assert_eq!(
        code(&err),
        Some(ttrpc::Code::INVALID_ARGUMENT),
        "{}",
        message(&err)
    );
    let err = agent
        .start_container("ghost")
        .await
        .expect_err("no such container");
    assert_eq!(
        code(&err),
        Some(ttrpc::Code::NOT_FOUND),
        "{}",
        message(&err)
    );

    // An init process killed while it waits for StartContainer: the start says so.
    let rootfs = agent.rootfs("k");
    agent
        .create("k", agent.spec(&rootfs, &["true"], &[], "/"), false)
        .await
        .expect("create k");
    agent.signal("k", 9).await.expect("kill k's init");
    assert_eq!(agent.wait("k", "").await, 137);
    let err = agent
        .start_container("k")
        .await
        .expect_err("k's init is gone");
    assert_eq!(
        code(&err),
        Some(ttrpc::Code::FAILED_PRECONDITION),
        "{}",
        message(&err)
    );
    assert!(
        message(&err).contains(
            "container k: its init process ended before it was started (killed by signal 9)"
        ),
        "{}",
        message(&err)
    );
    agent.remove("k").await.expect("remove k");

    let check = agent
        .client
        .check(common::ctx(), &Empty::new())
        .await
        .expect("check");
    assert!(!check.kernel_release.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quarter_gigabyte_of_stdout() {
    let agent = TestAgent::start("huge").await;
    let script = "head -c 268435456 /dev/zero";
    let (status, out, _) = agent.run("h", &["sh", "-c", script], &[], "/").await;
    assert_eq!(status, 0);
    assert_eq!(out.len(), 256 * 1024 * 1024);
    assert!(out.iter().all(|b| *b == 0));
    agent.remove("h").await.expect("remove");
}

/// A container that shares another's PID namespace (a pod container without one of its
/// own) ends with its init process, as under runc's shim: what the init process left
/// running is killed before WaitProcess answers, so the container's output closes. (With
/// a PID namespace of its own, the kernel does that.) critest's web server specs stopped
/// hanging on this: their nginx's worker kept the container's output open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_exit_ends_a_container_that_shares_a_pid_namespace() {
    let agent = TestAgent::start("sharedpid").await;
    let holder_root = agent.rootfs("holder");
    agent
        .create(
            "holder",
            agent.spec(&holder_root, &["sleep", "1000"], &[], "/"),
            false,
        )
        .await
        .expect("create holder");
    agent.start_container("holder").await.expect("start holder");
    let mut list = ContainerRequest::new();
    list.container_id = "holder".into();
    let holder_pid = agent
        .client
        .list_processes(common::ctx(), &list)
        .await
        .expect("list holder")
        .pids[0];

    // The member joins the holder's PID namespace; its init leaves a sleep behind.
    let rootfs = agent.rootfs("member");
    let spec = agent.spec(
        &rootfs,
        &[
            "sh",
            "-c",
            "sleep 1000 & echo $! >/tmp/orphan; echo started",
        ],
        &[],
        "/",
    );
    let mut spec: serde_json::Value = serde_json::from_slice(&spec).expect("spec json");
    for ns in spec["linux"]["namespaces"]
        .as_array_mut()
        .expect("namespaces")
    {
        if ns["type"] == "pid" {
            ns["path"] = format!("/proc/{holder_pid}/ns/pid").into();
        }
    }
    agent
        .create("member", serde_json::to_vec(&spec).expect("encode"), false)
        .await
        .expect("create member");
    let out = agent.read_all("member", "", false);
    agent.start_container("member").await.expect("start member");
    assert_eq!(agent.wait("member", "").await, 0);
    // The orphan held the output open; it is gone, so the stream ends.
    let out = tokio::time::timeout(std::time::Duration::from_secs(10), out)
        .await
        .expect("the member's output stayed open after its init exited")
        .expect("stdout task");
    assert_eq!(out, b"started\n");

    // The holder, whose PID namespace it was, runs on.
    let pids = agent
        .client
        .list_processes(common::ctx(), &list)
        .await
        .expect("list holder")
        .pids;
    assert!(pids.contains(&holder_pid), "{pids:?}");

    // The member's mount namespace is gone, and the kernel hands its inode number to the
    // next namespace made. A container created now must not be taken for the member's
    // leftovers when its init is waited for again (containerd does wait again).
    let next_root = agent.rootfs("next");
    agent
        .create(
            "next",
            agent.spec(&next_root, &["echo", "next"], &[], "/"),
            false,
        )
        .await
        .expect("create next");
    assert_eq!(agent.wait("member", "").await, 0);
    let out = agent.read_all("next", "", false);
    agent
        .start_container("next")
        .await
        .expect("the container created after the member's exit still starts");
    assert_eq!(agent.wait("next", "").await, 0);
    assert_eq!(out.await.expect("stdout task"), b"next\n");
    agent.remove("next").await.expect("remove next");
    agent.remove("member").await.expect("remove member");
    agent.remove("holder").await.expect("remove holder");
}
