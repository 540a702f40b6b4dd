//! Kubernetes pods through containerd's CRI, as kubelet drives them: a private containerd
//! with the CRI plugin, a CNI bridge network of its own, our pause and busybox images, and
//! a CRI client of our own (tests/src/cri). Every case is written once and runs for both
//! RuntimeClass handlers: `runc::<case>` (the reference: it proves the harness and the
//! expectations) and `kata::<case>` (every pod in a VM through our shim). Every case ends
//! by removing its pods and checking that nothing of them is left on the host.
//!
//!     cargo test -p e2e-tests --test cri -- --test-threads=2 runc::
//!     cargo test -p e2e-tests --test cri -- --test-threads=2 kata::port_forward

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::{Duration, Instant};

use e2e_tests::cri_api::{ContainerState, NamespaceMode};
use e2e_tests::*;

/// Runs each case as `runc::<case>` and `kata::<case>`.
macro_rules! for_each_handler {
    ($($case:ident),* $(,)?) => {
        mod runc {
            $( #[test] fn $case() { super::$case(super::Handler::Runc) } )*
        }
        mod kata {
            $( #[test] fn $case() { super::$case(super::Handler::Kata) } )*
        }
    };
}

for_each_handler!(
    containers_of_a_pod_share_localhost_and_an_empty_dir,
    pod_ip_and_host_port_reach_the_pod_from_the_host,
    pods_reach_each_other,
    hostname_is_the_pods,
    pod_sysctls_apply_and_node_wide_ones_are_refused,
    exec_sync_returns_output_and_exit_code,
    exec_stream_carries_stdin_stdout_stderr_and_the_exit_code,
    attach_reaches_the_main_process,
    logs_are_written_while_the_container_runs,
    port_forward_reaches_a_port_served_in_the_pod,
    container_and_pod_stats_answer,
    stop_with_timeout_kills_a_process_that_ignores_sigterm,
    pod_pid_namespace_shows_the_pause_process,
    stopping_and_removing_a_running_pod_leaves_nothing,
    a_privileged_pod_has_bridges_veths_tun_and_netfilter,
    a_raw_block_volume_is_a_block_device_in_the_container,
    a_read_only_raw_block_volume_is_read_but_not_written,
    kubelet_volumes_share_sockets_hold_memory_and_raise_inotify_events,
);

const HTTP_PORT: u16 = 8080;

/// A private containerd with the CRI for this case and handler.
fn cri(case: &str, h: Handler) -> CriContainerd {
    CriContainerd::start(&format!("cri-{case}-{}", h.name()), h)
}

/// A container of `pod` serving `body` as /index.html with busybox httpd on `port`.
fn serve_http(c: &CriContainerd, pod: &Pod, name: &str, port: u16, body: &str) -> String {
    let script = format!(
        "mkdir -p /www && echo {body} > /www/index.html && exec httpd -f -p {port} -h /www"
    );
    let config = c.container_config(pod, name, &["sh", "-c", &script]);
    c.start_container(pod, config)
}

/// A container of `pod` that only sleeps.
fn sleeper(c: &CriContainerd, pod: &Pod, name: &str) -> String {
    let config = c.container_config(pod, name, &["sleep", "100000"]);
    c.start_container(pod, config)
}

/// `wget` of `url` from inside container `id`, retried for up to 30 s (the server may not
/// listen yet); the page, or the last error. (Debian's static busybox 1.35 `wget -T`
/// segfaults, so `timeout` bounds each try.)
fn wget_from(c: &CriContainerd, id: &str, url: &str) -> Result<String, String> {
    let script = format!(
        "for i in $(seq 1 30); do timeout 5 wget -q -O - {url} && exit 0; sleep 1; done; exit 1"
    );
    let out = c.exec(id, &["sh", "-c", &script]);
    if out.exit_code == 0 {
        Ok(out.stdout)
    } else {
        Err(format!(
            "wget {url} failed for 30 s (exit {}): {}",
            out.exit_code, out.stderr
        ))
    }
}

fn containers_of_a_pod_share_localhost_and_an_empty_dir(h: Handler) {
    let c = &cri("shared", h);
    let pod = c.run_pod(c.pod_config("shared"));
    let volume = c.volume_dir(&pod, "scratch");

    let mut server = c.container_config(
        &pod,
        "server",
        &[
            "sh",
            "-c",
            "echo from-server > /scratch/server.txt; mkdir -p /www; \
             echo hello-localhost > /www/index.html; exec httpd -f -p 8080 -h /www",
        ],
    );
    server.mounts.push(bind_mount(&volume, "/scratch"));
    let server = c.start_container(&pod, server);
    let mut client = c.container_config(&pod, "client", &["sleep", "100000"]);
    client.mounts.push(bind_mount(&volume, "/scratch"));
    let client = c.start_container(&pod, client);

    // localhost is the pod's: the client reaches the server's port on 127.0.0.1.
    let page = wget_from(c, &client, "http://127.0.0.1:8080/index.html")
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log_tail()));
    assert_eq!(page.trim(), "hello-localhost");

    // The emptyDir: what one container writes, the other and the host see.
    let out = c.exec(&client, &["cat", "/scratch/server.txt"]);
    assert_eq!(out.stdout.trim(), "from-server", "stderr: {}", out.stderr);
    let out = c.exec(
        &client,
        &["sh", "-c", "echo from-client > /scratch/client.txt"],
    );
    assert_eq!(out.exit_code, 0, "stderr: {}", out.stderr);
    let out = c.exec(&server, &["cat", "/scratch/client.txt"]);
    assert_eq!(out.stdout.trim(), "from-client", "stderr: {}", out.stderr);
    let on_host = std::fs::read_to_string(volume.join("client.txt")).unwrap_or_default();
    assert_eq!(
        on_host.trim(),
        "from-client",
        "the host dir does not hold the file"
    );

    c.remove_pod_checked(pod);
}

fn pod_ip_and_host_port_reach_the_pod_from_the_host(h: Handler) {
    let c = cri("hostport", h);
    let host_port = free_tcp_port();
    let mut config = c.pod_config("web");
    config
        .port_mappings
        .push(tcp_port_mapping(HTTP_PORT, host_port));
    let pod = c.run_pod(config);
    assert!(
        !pod.ip.is_empty(),
        "PodSandboxStatus reports no IP\n{}",
        c.log_tail()
    );
    serve_http(&c, &pod, "web", HTTP_PORT, "hello-from-the-pod");

    let page = wait_http(
        &pod.ip,
        HTTP_PORT,
        "/index.html",
        "hello-from-the-pod",
        Duration::from_secs(30),
    )
    .unwrap_or_else(|e| panic!("pod IP {}:{HTTP_PORT} from the host: {e}", pod.ip));
    assert!(
        page.starts_with("HTTP/1.0 200") || page.starts_with("HTTP/1.1 200"),
        "{page}"
    );

    let host = host_ip();
    wait_http(
        &host,
        host_port,
        "/index.html",
        "hello-from-the-pod",
        Duration::from_secs(30),
    )
    .unwrap_or_else(|e| panic!("host port {host}:{host_port} (portmap to {HTTP_PORT}): {e}"));

    c.remove_pod_checked(pod);
}

fn pods_reach_each_other(h: Handler) {
    let c = cri("p2p", h);
    let a = c.run_pod(c.pod_config("pod-a"));
    let b = c.run_pod(c.pod_config("pod-b"));
    assert!(
        !a.ip.is_empty() && !b.ip.is_empty(),
        "pods without IP: {:?} {:?}",
        a.ip,
        b.ip
    );
    assert_ne!(a.ip, b.ip, "two pods got the same IP");
    let server = serve_http(&c, &a, "server", HTTP_PORT, "hello-pod-b");
    let client = sleeper(&c, &b, "client");

    let page = wget_from(
        &c,
        &client,
        &format!("http://{}:{HTTP_PORT}/index.html", a.ip),
    )
    .unwrap_or_else(|e| panic!("pod b -> pod a ({}): {e}\n{}", a.ip, c.log_tail()));
    assert_eq!(page.trim(), "hello-pod-b");

    // 16 MiB across: over ten thousand frames through pod b's receive ring, which the
    // guest kernel keeps to 256 posted buffers (guest/patches/0005).
    let made = c.exec(
        &server,
        &[
            "sh",
            "-c",
            "dd if=/dev/urandom of=/www/big bs=65536 count=256 2>/dev/null && md5sum /www/big",
        ],
    );
    assert_eq!(made.exit_code, 0, "making /www/big: {}", made.stderr);
    let fetch = format!(
        "timeout 50 wget -q -O - http://{}:{HTTP_PORT}/big | md5sum",
        a.ip
    );
    let got = c.exec(&client, &["sh", "-c", &fetch]);
    assert_eq!(
        first_word(&got.stdout),
        first_word(&made.stdout),
        "16 MiB from pod a arrived changed or cut short in pod b: {}",
        got.stderr
    );
    // And the other way: pod a reaches pod b's address (ping needs no server).
    let server_side = sleeper(&c, &a, "pinger");
    let out = c.exec(&server_side, &["ping", "-c", "1", "-W", "5", &b.ip]);
    assert_eq!(
        out.exit_code, 0,
        "pod a cannot ping pod b ({}): {}{}",
        b.ip, out.stdout, out.stderr
    );

    c.remove_pod_checked(a);
    c.remove_pod_checked(b);
}

fn hostname_is_the_pods(h: Handler) {
    let c = cri("hostname", h);
    let pod = c.run_pod(c.pod_config("named-pod"));
    let id = sleeper(&c, &pod, "app");

    let out = c.exec(&id, &["hostname"]);
    assert_eq!(
        out.stdout.trim(),
        pod.hostname(),
        "`hostname` in the container"
    );
    let out = c.exec(&id, &["cat", "/etc/hostname"]);
    assert_eq!(out.stdout.trim(), pod.hostname(), "/etc/hostname");
    let out = c.exec(&id, &["cat", "/etc/hosts"]);
    assert!(
        out.stdout.contains("localhost"),
        "/etc/hosts: {:?}",
        out.stdout
    );
    let out = c.exec(&id, &["test", "-f", "/etc/resolv.conf"]);
    assert_eq!(out.exit_code, 0, "no /etc/resolv.conf in the container");

    c.remove_pod_checked(pod);
}

fn pod_sysctls_apply_and_node_wide_ones_are_refused(h: Handler) {
    let c = cri("sysctl", h);
    let mut config = c.pod_config("sysctls");
    add_sysctl(&mut config, "kernel.shm_rmid_forced", "1");
    add_sysctl(&mut config, "fs.mqueue.msg_max", "64");
    let pod = c.run_pod(config);
    let id = sleeper(&c, &pod, "app");
    let out = c.exec(&id, &["cat", "/proc/sys/kernel/shm_rmid_forced"]);
    assert_eq!(
        out.stdout.trim(),
        "1",
        "kernel.shm_rmid_forced: {}",
        out.stderr
    );
    let out = c.exec(&id, &["cat", "/proc/sys/fs/mqueue/msg_max"]);
    assert_eq!(out.stdout.trim(), "64", "fs.mqueue.msg_max: {}", out.stderr);
    c.remove_pod_checked(pod);

    // kernel.panic is node-wide (no namespace holds it): the pod must be refused, saying
    // which sysctl, and leave nothing behind.
    let mut config = c.pod_config("node-sysctl");
    add_sysctl(&mut config, "kernel.panic", "10");
    match c.try_run_pod(config) {
        Ok(pod) => {
            let id = pod.id.clone();
            c.remove_pod_checked(pod);
            panic!("a pod with sysctl kernel.panic started ({id}); it must be refused");
        }
        Err(e) => assert!(
            e.message().contains("kernel.panic"),
            "the error does not name the sysctl: {e}"
        ),
    }
    let pods = c.cri().list_pod_sandbox().expect("ListPodSandbox");
    assert!(
        pods.iter()
            .all(|p| p.metadata.as_ref().map(|m| m.name.as_str()) != Some("node-sysctl")),
        "the refused pod is still listed: {pods:?}"
    );
    let shims = poll(Duration::from_secs(15), Duration::from_millis(200), || {
        let left = c.shims_left();
        left.is_empty().then_some(())
    });
    assert!(
        shims.is_some(),
        "shims left after the refusal: {:?}",
        c.shims_left()
    );
}

fn exec_sync_returns_output_and_exit_code(h: Handler) {
    let c = cri("execsync", h);
    let pod = c.run_pod(c.pod_config("exec-sync"));
    let id = sleeper(&c, &pod, "app");

    let out = c.exec(&id, &["sh", "-c", "echo to-out; echo to-err >&2; exit 3"]);
    assert_eq!(out.stdout, "to-out\n");
    assert_eq!(out.stderr, "to-err\n");
    assert_eq!(out.exit_code, 3);
    let out = c.exec(&id, &["uname", "-r"]);
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    let host_kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    if h.is_vm() {
        assert_ne!(
            out.stdout.trim(),
            host_kernel.trim(),
            "the pod runs on the host kernel"
        );
    } else {
        assert_eq!(out.stdout.trim(), host_kernel.trim());
    }
    // A timeout that expires: the CRI answers (an error or a non-zero exit), it does not hang.
    let started = Instant::now();
    let r = c.cri().exec_sync(&id, &["sleep", "30"], 2);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "ExecSync with a 2 s timeout took {:?}: {r:?}",
        started.elapsed()
    );
    assert!(
        r.as_ref().map(|o| o.exit_code != 0).unwrap_or(true),
        "sleep 30 with a 2 s timeout succeeded: {r:?}"
    );

    c.remove_pod_checked(pod);
}

fn exec_stream_carries_stdin_stdout_stderr_and_the_exit_code(h: Handler) {
    let c = cri("exec", h);
    let pod = c.run_pod(c.pod_config("exec-stream"));
    let id = sleeper(&c, &pod, "app");

    let session = c
        .cri()
        .exec_stream(
            &id,
            &[
                "sh",
                "-c",
                "read line; echo \"got:$line\"; echo to-err >&2; exit 7",
            ],
            true,
            false,
        )
        .unwrap_or_else(|e| panic!("Exec: {e}\n{}", c.log_tail()));
    session.write_stdin(b"hello\n").expect("writing stdin");
    let status = session
        .finish(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log_tail()));
    assert_eq!(session.stdout_text(), "got:hello\n");
    assert_eq!(session.stderr_text(), "to-err\n");
    assert_eq!(status.exit_code, 7, "status: {}", status.raw);

    // A TTY session (`kubectl exec -it`): one output stream, a terminal on the process's
    // side, sized through the resize channel. (With a TTY but no stdin, containerd 1.6
    // loses the output of runc execs now and then, so this asks for stdin as kubectl does.)
    let session = c
        .cri()
        .exec_stream(&id, &["sh", "-c", "read go; stty size; tty"], true, true)
        .unwrap_or_else(|e| panic!("Exec (tty): {e}\n{}", c.log_tail()));
    session.resize(100, 40).expect("resizing");
    std::thread::sleep(Duration::from_millis(500));
    session.write_stdin(b"go\n").expect("writing stdin");
    let status = session
        .finish(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log_tail()));
    let out = session.stdout_text();
    assert!(
        out.contains("40 100") && out.contains("/dev/pts/"),
        "tty output (stty size; tty): {out:?}"
    );
    assert_eq!(status.exit_code, 0, "status: {}", status.raw);

    c.remove_pod_checked(pod);
}

fn attach_reaches_the_main_process(h: Handler) {
    let c = cri("attach", h);
    let pod = c.run_pod(c.pod_config("attach"));
    let mut config = c.container_config(
        &pod,
        "echo",
        &["sh", "-c", "while read l; do echo \"echo:$l\"; done"],
    );
    config.stdin = true;
    let id = c.start_container(&pod, config);

    let mut session = c
        .cri()
        .attach_stream(&id, true, false)
        .unwrap_or_else(|e| panic!("Attach: {e}\n{}", c.log_tail()));
    session.write_stdin(b"ping\n").expect("writing stdin");
    assert!(
        session.wait_stdout("echo:ping", Duration::from_secs(30)),
        "no echo through attach; stdout {:?}\n{}",
        session.stdout_text(),
        c.log_tail()
    );
    session.close();
    drop(session);
    // The output went to the log as well, and detaching left the process running.
    let logged = poll(Duration::from_secs(10), Duration::from_millis(100), || {
        c.container_log(&id)
            .iter()
            .any(|l| l.content == "echo:ping")
            .then_some(())
    });
    assert!(logged.is_some(), "log: {:?}", c.container_log(&id));
    assert_eq!(
        c.cri().container_state(&id).ok(),
        Some(ContainerState::ContainerRunning),
        "the container ended when the attach session closed"
    );

    c.remove_pod_checked(pod);
}

fn logs_are_written_while_the_container_runs(h: Handler) {
    let c = cri("logs", h);
    let pod = c.run_pod(c.pod_config("logs"));
    let config = c.container_config(
        &pod,
        "ticker",
        &[
            "sh",
            "-c",
            "echo first; echo on-stderr >&2; i=0; \
             while true; do echo \"tick $i\"; i=$((i+1)); sleep 0.2; done",
        ],
    );
    let id = c.start_container(&pod, config);

    let ticks = |lines: &[LogLine]| -> Vec<String> {
        lines
            .iter()
            .filter(|l| l.content.starts_with("tick "))
            .map(|l| l.content.clone())
            .collect()
    };
    let lines = poll(Duration::from_secs(30), Duration::from_millis(200), || {
        let lines = c.container_log(&id);
        (ticks(&lines).len() >= 5).then_some(lines)
    })
    .unwrap_or_else(|| panic!("fewer than 5 ticks logged: {:?}", c.container_log(&id)));
    assert_eq!(
        c.cri().container_state(&id).ok(),
        Some(ContainerState::ContainerRunning),
        "the log was read while the container runs"
    );
    let first = lines
        .iter()
        .find(|l| l.content == "first")
        .expect("line `first`");
    assert_eq!(first.stream, "stdout");
    assert!(first.time.starts_with("20"), "timestamp {:?}", first.time);
    let err = lines
        .iter()
        .find(|l| l.content == "on-stderr")
        .expect("line `on-stderr`");
    assert_eq!(err.stream, "stderr");
    assert!(
        lines.iter().all(|l| l.stream != "?"),
        "malformed records: {lines:?}"
    );
    let seen = ticks(&lines);
    for (i, t) in seen.iter().enumerate() {
        assert_eq!(
            t,
            &format!("tick {i}"),
            "ticks out of order or missing: {seen:?}"
        );
    }
    // Still being written.
    let more = poll(Duration::from_secs(20), Duration::from_millis(200), || {
        (ticks(&c.container_log(&id)).len() > seen.len() + 3).then_some(())
    });
    assert!(
        more.is_some(),
        "the log stopped growing at {} ticks",
        seen.len()
    );

    c.remove_pod_checked(pod);
}

fn port_forward_reaches_a_port_served_in_the_pod(h: Handler) {
    let c = cri("portfwd", h);
    let pod = c.run_pod(c.pod_config("port-forward"));
    let id = serve_http(&c, &pod, "web", HTTP_PORT, "hello-port-forward");
    // The server listens before we forward to it (seen in the container's socket table,
    // which needs no working network in the pod).
    let listening = c.exec(
        &id,
        &[
            "sh",
            "-c",
            "for i in $(seq 1 30); do netstat -ltn | grep -q ':8080 ' && exit 0; sleep 1; done; \
             netstat -ltn; exit 1",
        ],
    );
    assert_eq!(
        listening.exit_code, 0,
        "httpd never listened on 8080: {}{}",
        listening.stdout, listening.stderr
    );

    let session = c
        .cri()
        .port_forward_stream(&pod.id, HTTP_PORT)
        .unwrap_or_else(|e| panic!("PortForward: {e}\n{}", c.log_tail()));
    session
        .send(b"GET /index.html HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .expect("sending the request");
    let (data, error) = session
        .finish(Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log_tail()));
    let text = String::from_utf8_lossy(&data);
    assert!(
        text.contains("hello-port-forward"),
        "port-forward answer {text:?}, error channel {error:?}\n{}",
        c.log_tail()
    );
    assert!(error.is_empty(), "error channel: {error}");

    c.remove_pod_checked(pod);
}

fn container_and_pod_stats_answer(h: Handler) {
    let c = cri("stats", h);
    let pod = c.run_pod(c.pod_config("stats"));
    let config = c.container_config(
        &pod,
        "busy",
        &[
            "sh",
            "-c",
            "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; exec sleep 100000",
        ],
    );
    let id = c.start_container(&pod, config);

    let container = poll(Duration::from_secs(30), Duration::from_millis(500), || {
        let s = c.cri().container_stats(&id).ok()?;
        let (cpu, mem) = cpu_and_memory(s.cpu.as_ref(), s.memory.as_ref());
        (cpu > 0 && mem > 0).then_some((cpu, mem))
    });
    assert!(
        container.is_some(),
        "ContainerStats without CPU or memory: {:?}",
        c.cri().container_stats(&id)
    );
    let listed = c
        .cri()
        .list_container_stats(Some(&pod.id))
        .unwrap_or_else(|e| panic!("ListContainerStats: {e}"));
    let mine = listed
        .iter()
        .find(|s| s.attributes.as_ref().map(|a| a.id.as_str()) == Some(id.as_str()));
    let (cpu, mem) = mine
        .map(|s| cpu_and_memory(s.cpu.as_ref(), s.memory.as_ref()))
        .unwrap_or((0, 0));
    assert!(cpu > 0 && mem > 0, "ListContainerStats: {listed:?}");

    let pod_stats = poll(Duration::from_secs(30), Duration::from_millis(500), || {
        let s = c.cri().pod_sandbox_stats(&pod.id).ok()?;
        let linux = s.linux.as_ref()?;
        let (cpu, mem) = cpu_and_memory(linux.cpu.as_ref(), linux.memory.as_ref());
        (cpu > 0 && mem > 0).then_some(())
    });
    assert!(
        pod_stats.is_some(),
        "PodSandboxStats without CPU or memory: {:?}\n{}",
        c.cri().pod_sandbox_stats(&pod.id),
        c.log_tail()
    );
    let all = c
        .cri()
        .list_pod_sandbox_stats(None)
        .unwrap_or_else(|e| panic!("ListPodSandboxStats: {e}"));
    let listed = all
        .iter()
        .find(|s| s.attributes.as_ref().map(|a| a.id.as_str()) == Some(pod.id.as_str()));
    let (cpu, mem) = listed
        .and_then(|s| s.linux.as_ref())
        .map(|l| cpu_and_memory(l.cpu.as_ref(), l.memory.as_ref()))
        .unwrap_or((0, 0));
    assert!(cpu > 0 && mem > 0, "ListPodSandboxStats: {all:?}");

    c.remove_pod_checked(pod);
}

fn stop_with_timeout_kills_a_process_that_ignores_sigterm(h: Handler) {
    let c = cri("stop", h);
    let pod = c.run_pod(c.pod_config("stop"));
    let config = c.container_config(
        &pod,
        "stubborn",
        &[
            "sh",
            "-c",
            "trap '' TERM; echo trapped; while true; do sleep 1; done",
        ],
    );
    let id = c.start_container(&pod, config);
    let trapped = poll(Duration::from_secs(20), Duration::from_millis(100), || {
        c.container_log(&id)
            .iter()
            .any(|l| l.content == "trapped")
            .then_some(())
    });
    assert!(trapped.is_some(), "the container never set its trap");

    let timeout = 2;
    let started = Instant::now();
    c.cri()
        .stop_container(&id, timeout)
        .unwrap_or_else(|e| panic!("StopContainer: {e}\n{}", c.log_tail()));
    let took = started.elapsed();
    let status = c.cri().container_status(&id).expect("ContainerStatus");
    assert_eq!(
        ContainerState::try_from(status.state).ok(),
        Some(ContainerState::ContainerExited),
        "after StopContainer: {status:?}"
    );
    // SIGTERM was ignored, so only SIGKILL at the deadline ended it.
    assert_eq!(status.exit_code, 137, "exit code (SIGKILL): {status:?}");
    assert!(
        took >= Duration::from_millis(1500),
        "StopContainer returned after {took:?}, before the 2 s timeout: was SIGTERM ignored?"
    );
    assert!(
        took <= Duration::from_secs(timeout as u64 + 10),
        "StopContainer with a {timeout} s timeout took {took:?}"
    );
    c.cri()
        .remove_container(&id)
        .unwrap_or_else(|e| panic!("RemoveContainer: {e}"));

    c.remove_pod_checked(pod);
}

fn pod_pid_namespace_shows_the_pause_process(h: Handler) {
    let c = cri("podpid", h);
    let mut config = c.pod_config("pod-pid");
    set_pod_pid_mode(&mut config, NamespaceMode::Pod);
    let pod = c.run_pod(config);
    let id = sleeper(&c, &pod, "app");

    let out = c.exec(&id, &["ps", "-o", "pid,args"]);
    let pause = out
        .stdout
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("/pause"));
    assert!(
        pause.is_some(),
        "the app container does not see the pause process: {}",
        out.stdout
    );
    assert!(
        out.stdout.lines().any(|l| l.contains("sleep 100000")),
        "ps lacks the container's own process: {}",
        out.stdout
    );
    let out = c.exec(&id, &["cat", "/proc/1/cmdline"]);
    assert_eq!(
        out.stdout.trim_end_matches('\0'),
        "/pause",
        "PID 1 of the pod"
    );

    c.remove_pod_checked(pod);
}

fn stopping_and_removing_a_running_pod_leaves_nothing(h: Handler) {
    let c = cri("teardown", h);
    let pod = c.run_pod(c.pod_config("teardown"));
    let volume = c.volume_dir(&pod, "data");
    let mut web = c.container_config(
        &pod,
        "web",
        &[
            "sh",
            "-c",
            "mkdir -p /www && echo up > /www/index.html && exec httpd -f -p 8080 -h /www",
        ],
    );
    web.mounts.push(bind_mount(&volume, "/data"));
    let web = c.start_container(&pod, web);
    let other = sleeper(&c, &pod, "other");
    // A streaming exec still open when the pod goes.
    let session = c
        .cri()
        .exec_stream(&other, &["sleep", "100000"], false, false)
        .unwrap_or_else(|e| panic!("Exec: {e}"));

    // No StopContainer first: StopPodSandbox must take the running containers down.
    c.stop_and_remove_pod(&pod);
    let ended = poll(Duration::from_secs(20), Duration::from_millis(100), || {
        session.is_closed().then_some(())
    });
    assert!(ended.is_some(), "the exec session outlived its pod");
    let containers = c.cri().list_containers().expect("ListContainers");
    assert!(
        containers.iter().all(|x| x.id != web && x.id != other),
        "containers of the removed pod are still listed: {containers:?}"
    );
    c.assert_pod_removed_cleanly(&pod);
    let shims = poll(Duration::from_secs(15), Duration::from_millis(200), || {
        c.shims_left().is_empty().then_some(())
    });
    assert!(shims.is_some(), "shims left: {:?}", c.shims_left());
    assert!(
        volume.exists(),
        "the pod's removal took the host's volume dir with it"
    );
}

/// Asks the kernel for its nf_tables tables over netlink (busybox has no `nft`): prints
/// `nftables ok` when the nf_tables subsystem answers, else why not.
const NFT_PROBE_C: &str = r#"
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <linux/netlink.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nf_tables.h>

int main(void) {
    int fd = socket(AF_NETLINK, SOCK_RAW, NETLINK_NETFILTER);
    if (fd < 0) { printf("nftables: no netfilter netlink: %s\n", strerror(errno)); return 1; }
    struct { struct nlmsghdr nh; struct nfgenmsg nf; } req;
    memset(&req, 0, sizeof req);
    req.nh.nlmsg_len = sizeof req;
    req.nh.nlmsg_type = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETTABLE;
    req.nh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
    req.nh.nlmsg_seq = 1;
    req.nf.nfgen_family = AF_UNSPEC;
    req.nf.version = NFNETLINK_V0;
    if (send(fd, &req, sizeof req, 0) < 0) { printf("nftables: send: %s\n", strerror(errno)); return 1; }
    char buf[8192];
    int n = recv(fd, buf, sizeof buf, 0);
    if (n < (int)sizeof(struct nlmsghdr)) { printf("nftables: recv: %s\n", strerror(errno)); return 1; }
    struct nlmsghdr *nh = (struct nlmsghdr *)buf;
    if (nh->nlmsg_type == NLMSG_ERROR) {
        struct nlmsgerr *err = NLMSG_DATA(nh);
        if (err->error != 0) { printf("nftables: %s\n", strerror(-err->error)); return 1; }
    }
    printf("nftables ok\n");
    return 0;
}
"#;

/// What privileged and networking pods commonly use inside their sandbox: bridges,
/// veths, taps, iptables and nftables with conntrack. (With
/// `privileged_without_host_devices`, as the runtime entries set it, a privileged kata
/// container gets the VM's kernel but not the node's device nodes: it makes /dev/net/tun
/// itself, as Docker-in-Docker images do.)
fn a_privileged_pod_has_bridges_veths_tun_and_netfilter(h: Handler) {
    let c = cri("privileged", h);
    let mut config = c.pod_config("privileged");
    if let Some(sc) = config
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
    {
        sc.privileged = true;
    }
    let pod = c.run_pod(config);
    let probe = StaticProbe::build("nft-probe", NFT_PROBE_C);
    let mut app = c.container_config(&pod, "netadmin", &["sleep", "100000"]);
    if let Some(sc) = app.linux.as_mut().and_then(|l| l.security_context.as_mut()) {
        sc.privileged = true;
    }
    app.mounts.push(bind_mount(probe.dir(), "/probe"));
    let id = c.start_container(&pod, app);

    let script = "brctl addbr kbr0 && ip link set kbr0 up \
        && ip link add kv0 type veth peer name kv1 && ip link set kv0 master kbr0 \
        && { [ -e /dev/net/tun ] || { mkdir -p /dev/net && mknod /dev/net/tun c 10 200; }; } \
        && tunctl -t ktap0 >/dev/null && ip link show ktap0 >/dev/null \
        && test -e /proc/net/ip_tables_names && echo iptables ok \
        && test -e /proc/sys/net/netfilter/nf_conntrack_max && echo conntrack ok \
        && /probe/nft-probe && ls /sys/class/net/kbr0/brif";
    let out = c.exec(&id, &["sh", "-c", script]);
    assert_eq!(out.exit_code, 0, "{}\n{}", out.stdout, out.stderr);
    for expect in ["iptables ok", "conntrack ok", "nftables ok", "kv0"] {
        assert!(
            out.stdout.contains(expect),
            "no {expect:?} in:\n{}",
            out.stdout
        );
    }
    // Under runc these live in the pod's namespace on the host, which the leak check
    // reads: take them down again.
    let out = c.exec(
        &id,
        &[
            "sh",
            "-c",
            "ip link del kv0 && ip link del kbr0 && tunctl -d ktap0 >/dev/null",
        ],
    );
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    c.remove_pod_checked(pod);
}

/// Where kubelet puts a raw block volume (`volumeDevices`), and the bytes written there.
const BLOCK_PATH: &str = "/dev/xvda";
const BLOCK_BYTES: &str = "kata-raw-block-volume";

/// A container of `pod` running `sleep`, with host block device `disk` as [`BLOCK_PATH`],
/// as kubelet asks for a raw block volume.
fn with_block_device(c: &CriContainerd, pod: &Pod, disk: &LoopDevice) -> cri_api::ContainerConfig {
    let mut config = c.container_config(pod, "disk", &["sleep", "100000"]);
    config.devices.push(cri_api::Device {
        container_path: BLOCK_PATH.into(),
        host_path: disk.path().display().to_string(),
        permissions: "rwm".into(),
    });
    config
}

/// A raw block volume (kubelet's `volumeDevices`: a CRI Device) on a host loop device:
/// in the container it is a block device at the path asked for (under kata the guest's
/// SCSI disk, with the guest's numbers), what is written there is read back and lands in
/// the host's file, and once the container is removed nothing of the disk is left in the
/// VM, QEMU or the shim.
fn a_raw_block_volume_is_a_block_device_in_the_container(h: Handler) {
    let disk = LoopDevice::new(8 << 20);
    let c = cri("block", h);
    let pod = c.run_pod(c.pod_config("block"));
    let keeper = sleeper(&c, &pod, "keeper");
    let id = c.start_container(&pod, with_block_device(&c, &pod, &disk));
    let script = format!(
        "test -b {BLOCK_PATH} || {{ echo not a block device; exit 1; }}; \
         stat -c '%t %a %u %g' {BLOCK_PATH}; \
         printf {BLOCK_BYTES} > /tmp/bytes && \
         dd if=/tmp/bytes of={BLOCK_PATH} bs=512 seek=1 conv=fsync 2>/dev/null && \
         dd if={BLOCK_PATH} bs=512 skip=1 count=1 2>/dev/null | head -c {}",
        BLOCK_BYTES.len()
    );
    let out = c.exec(&id, &["sh", "-c", &script]);
    assert_eq!(out.exit_code, 0, "{}\n{}", out.stdout, out.stderr);
    let mut lines = out.stdout.lines();
    // `stat %t`: the major number in hex. The host's loop device is 7; in the VM the
    // disk is a SCSI disk (sd, 8). Mode and owner are the host node's, as the CRI asks.
    let host = std::fs::metadata(disk.path()).expect("the loop device's node");
    let major = if h.is_vm() { "8" } else { "7" };
    let want = format!(
        "{major} {:o} {} {}",
        host.permissions().mode() & 0o7777,
        host.uid(),
        host.gid()
    );
    assert_eq!(
        lines.next().unwrap_or_default(),
        want,
        "major, mode, uid and gid of {BLOCK_PATH}: {}",
        out.stdout
    );
    assert_eq!(lines.next(), Some(BLOCK_BYTES), "read back: {}", out.stdout);

    if let Err(e) = c.cri().stop_container(&id, 0) {
        panic!("StopContainer: {e}\n{}", c.log_tail());
    }
    if let Err(e) = c.cri().remove_container(&id) {
        panic!("RemoveContainer: {e}\n{}", c.log_tail());
    }
    if h.is_vm() {
        let holders = || {
            [Part::Vmm, Part::Shim]
                .into_iter()
                .filter_map(|p| pid_of(&pod.id, p))
                .flat_map(|pid| {
                    fds_open_on(pid, disk.path())
                        .into_iter()
                        .map(move |fd| format!("{pid}/fd/{fd}"))
                })
                .collect::<Vec<_>>()
        };
        let released = poll(Duration::from_secs(10), Duration::from_millis(100), || {
            holders().is_empty().then_some(())
        });
        assert!(
            released.is_some(),
            "the removed container's disk is still open on the host: {:?}",
            holders()
        );
        let out = c.exec(&keeper, &["ls", "/sys/block"]);
        assert!(
            !out.stdout.split_whitespace().any(|d| d.starts_with("sd")),
            "the removed container's disk is still in the VM: {}",
            out.stdout
        );
    }
    c.remove_pod_checked(pod);
    let bytes = disk.detach_and_read();
    assert_eq!(
        &bytes[512..512 + BLOCK_BYTES.len()],
        BLOCK_BYTES.as_bytes(),
        "the bytes written in the container are not in the host's file"
    );
}

/// A raw block volume the container may only read (CRI permissions `r`, as for a
/// read-only volume): reads work, writes fail (under kata the VM's disk itself is
/// read-only: the shim opened the host device read-only).
fn a_read_only_raw_block_volume_is_read_but_not_written(h: Handler) {
    let disk = LoopDevice::new(1 << 20);
    let c = cri("blockro", h);
    let pod = c.run_pod(c.pod_config("blockro"));
    let mut config = with_block_device(&c, &pod, &disk);
    config.devices[0].permissions = "r".into();
    let id = c.start_container(&pod, config);
    let script = format!(
        "dd if={BLOCK_PATH} of=/dev/null bs=512 count=1 2>/dev/null && echo read; \
         dd if=/dev/zero of={BLOCK_PATH} bs=512 count=1 2>/dev/null && echo written; true"
    );
    let out = c.exec(&id, &["sh", "-c", &script]);
    assert_eq!(out.stdout, "read\n", "{}\n{}", out.stdout, out.stderr);
    c.remove_pod_checked(pod);
}

/// With `block_device_hotplug = false` the VM has no SCSI controller: a container with a
/// raw block volume fails to start, and the error names the device and the key.
#[test]
fn kata_refuses_a_raw_block_volume_without_block_device_hotplug() {
    let disk = LoopDevice::new(1 << 20);
    let config = RuntimeConfig::qemu().set("hypervisor.qemu", "block_device_hotplug", "false");
    let c = CriContainerd::start_configured("cri-blockoff-kata", Handler::Kata, &config);
    let pod = c.run_pod(c.pod_config("blockoff"));
    let id = c
        .create_container(&pod, &with_block_device(&c, &pod, &disk))
        .unwrap_or_else(|e| panic!("CreateContainer: {e}\n{}", c.log_tail()));
    let e = match c.cri().start_container(&id) {
        Ok(()) => {
            panic!("a container with a raw block volume started without block_device_hotplug")
        }
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains(BLOCK_PATH) && e.contains("block_device_hotplug"),
        "{e}"
    );
    eprintln!("refused as expected: {e}");
    let _ = c.cri().remove_container(&id);
    c.remove_pod_checked(pod);
}

/// A VM cannot join the node's network: a hostNetwork pod is refused with a reason and a
/// way out, and leaves nothing.
#[test]
fn kata_refuses_a_host_network_pod_saying_why() {
    let c = cri("hostnet", Handler::Kata);
    let mut config = c.pod_config("hostnet");
    if let Some(ns) = config
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut())
    {
        ns.network = NamespaceMode::Node as i32;
    }
    let e = match c.try_run_pod(config) {
        Ok(pod) => panic!("a hostNetwork pod ran in a VM sandbox: {}", pod.id),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("hostNetwork"), "{e}");
    assert!(e.contains("runc") || e.contains("RuntimeClass"), "{e}");
    assert!(
        c.shims_left().is_empty(),
        "shims left: {:?}",
        c.shims_left()
    );
}

/// A shim killed under a running pod: containerd's `delete` of the dead shim must undo
/// the pod network wiring (the taps are persistent, so nothing else would) and the host
/// cgroup, and the pod is then stopped and removed as usual.
#[test]
fn kata_pod_whose_shim_was_killed_is_removed_cleanly() {
    let c = cri("shimkill", Handler::Kata);
    let pod = c.run_pod(c.pod_config("shimkill"));
    let _app = sleeper(&c, &pod, "app");
    let shim = pid_of(&pod.id, Part::Shim).expect("the pod's shim");
    assert!(
        signal(shim, nix::sys::signal::Signal::SIGKILL),
        "kill the shim"
    );
    assert!(
        wait_gone(shim, Duration::from_secs(10)),
        "the shim survived SIGKILL"
    );
    c.remove_pod_checked(pod);
}

/// kubelet's volumes as a pod uses them (see [`assert_kubelet_volumes_behave`]).
fn kubelet_volumes_share_sockets_hold_memory_and_raise_inotify_events(h: Handler) {
    let c = &cri("kubelet-volumes", h);
    assert_kubelet_volumes_behave(c, |_| {});
}
