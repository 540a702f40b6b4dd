//! The agent serves the host only. Vsock is not namespaced, so a process in a container
//! can connect to a guest port through the loopback transport (CID 1, or the guest's own
//! CID); the agent must close such a connection unanswered, on its API port (1024), on its
//! port forwarder (1027), on its stdio streams (1028: another container's output and
//! stdin) and on the bench sink (1025) when that runs at all.
//!
//! The busybox image has no vsock client, so each test compiles a small static probe
//! (`gcc -static`) and bind-mounts it into the container. The probe sends a real ttrpc
//! `Check` request and prints, per target, which step ended the attempt. Positive
//! controls: the host asks the same ports through the sandbox's hybrid vsock socket and
//! gets answers, so a refusal is the agent's doing, not a dead port.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use e2e_tests::*;

const AGENT_PORT: u32 = 1024;
const BENCH_SINK_PORT: u32 = 1025;
const PORT_FORWARD_PORT: u32 = 1027;
const STDIO_PORT: u32 = 1028;
/// The kernel command line word that turns the agent's bench sink on.
const BENCH_SINK_PARAM: &str = "agent.bench_sink=1";

/// The probe: `vsock-probe CID:PORT...` (CID `local` = the guest's own CID, from
/// IOCTL_VM_SOCKETS_GET_LOCAL_CID on /dev/vsock if the container has it, else 3, the
/// CID our hypervisors give the guest). One `RESULT label cid=N port=N outcome detail`
/// line per target; outcomes: socket-failed, connect-failed, closed-no-reply,
/// reset-no-reply, recv-failed, timeout-no-reply, reply.
const PROBE_C: &str = r#"
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>
#include <linux/vm_sockets.h>

static unsigned local_cid(const char **from) {
    int fd = open("/dev/vsock", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        unsigned cid = 0;
        int r = ioctl(fd, IOCTL_VM_SOCKETS_GET_LOCAL_CID, &cid);
        close(fd);
        if (r == 0) { *from = "ioctl"; return cid; }
    }
    *from = "default";
    return 3;
}

/* A ttrpc frame: length, stream id 1, type 1 (request), flags 0, then the Request
   message {service, method, payload = empty Empty}. */
static size_t check_request(unsigned char *buf) {
    const char *service = "kata.agent.v1.AgentService", *method = "Check";
    size_t n = 10, sl = strlen(service), ml = strlen(method);
    buf[n++] = 0x0a; buf[n++] = (unsigned char)sl; memcpy(buf + n, service, sl); n += sl;
    buf[n++] = 0x12; buf[n++] = (unsigned char)ml; memcpy(buf + n, method, ml); n += ml;
    buf[n++] = 0x1a; buf[n++] = 0;
    size_t body = n - 10;
    buf[0] = 0; buf[1] = 0; buf[2] = 0; buf[3] = (unsigned char)body;
    buf[4] = 0; buf[5] = 0; buf[6] = 0; buf[7] = 1;
    buf[8] = 1; buf[9] = 0;
    return n;
}

static void probe(const char *label, unsigned cid, unsigned port) {
    printf("RESULT %s cid=%u port=%u ", label, cid, port);
    int fd = socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) { printf("socket-failed %s\n", strerror(errno)); return; }
    struct sockaddr_vm addr;
    memset(&addr, 0, sizeof addr);
    addr.svm_family = AF_VSOCK;
    addr.svm_cid = cid;
    addr.svm_port = port;
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
        printf("connect-failed %s\n", strerror(errno));
        close(fd);
        return;
    }
    unsigned char req[128];
    size_t len = check_request(req);
    ssize_t sent = send(fd, req, len, MSG_NOSIGNAL);
    const char *sent_text = sent == (ssize_t)len ? "request-sent" : strerror(errno);
    struct pollfd p = { .fd = fd, .events = POLLIN };
    if (poll(&p, 1, 5000) == 0) {
        printf("timeout-no-reply %s\n", sent_text);
        close(fd);
        return;
    }
    unsigned char buf[4096];
    ssize_t got = recv(fd, buf, sizeof buf, 0);
    if (got > 0) printf("reply %zd-bytes %s\n", got, sent_text);
    else if (got == 0) printf("closed-no-reply %s\n", sent_text);
    else if (errno == ECONNRESET) printf("reset-no-reply %s\n", sent_text);
    else printf("recv-failed %s\n", strerror(errno));
    close(fd);
}

int main(int argc, char **argv) {
    const char *from;
    unsigned own = local_cid(&from);
    printf("LOCAL_CID %u from=%s\n", own, from);
    for (int i = 1; i < argc; i++) {
        char *colon = strchr(argv[i], ':');
        if (!colon) { printf("RESULT %s bad-argument\n", argv[i]); continue; }
        *colon = 0;
        unsigned cid = strcmp(argv[i], "local") == 0 ? own : (unsigned)strtoul(argv[i], 0, 10);
        *colon = ':';
        probe(argv[i], cid, (unsigned)strtoul(colon + 1, 0, 10));
    }
    fflush(stdout);
    return 0;
}
"#;

/// The outcome word of the probe's line for `label` (e.g. "1:1024").
fn outcome<'a>(output: &'a str, label: &str) -> &'a str {
    let prefix = format!("RESULT {label} ");
    output
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split_whitespace().nth(2))
        .unwrap_or_else(|| panic!("the probe printed nothing for {label}:\n{output}"))
}

/// Asserts that the container connected to `label` (so the guest routed it to the
/// listener) and was closed with no answer to its Check request.
fn assert_refused_by_listener(output: &str, label: &str) {
    let got = outcome(output, label);
    assert!(
        got == "closed-no-reply" || got == "reset-no-reply",
        "{label}: a container process must be connected and then closed unanswered, got \
         {got:?} (connect-failed: the guest kernel did not route it to the listener, so \
         the check was not exercised; reply: the container talked to the service):\n{output}"
    );
}

/// Runs the probe in the running container `id`, against `targets`.
fn run_probe(c: &Containerd, id: &str, exec_id: &str, targets: &[&str]) -> String {
    let mut cmd = vec!["/probe/vsock-probe"];
    cmd.extend_from_slice(targets);
    let out = exec(c, id, exec_id, &[], &cmd);
    assert!(
        out.status.success(),
        "the probe did not run in the container: {}\n{}",
        stderr(&out),
        c.log_tail()
    );
    let text = stdout(&out);
    eprintln!("{id} probe:\n{text}");
    text
}

/// Connects to guest `port` through the sandbox's hybrid vsock socket, as the shim does.
fn host_connect(sandbox: &str, port: u32) -> UnixStream {
    let path = vm_run_dir(sandbox).join("kata.hvsock");
    let mut s =
        UnixStream::connect(&path).unwrap_or_else(|e| panic!("connect to {}: {e}", path.display()));
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("set a read timeout");
    s.write_all(format!("CONNECT {port}\n").as_bytes())
        .expect("send CONNECT");
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while byte[0] != b'\n' {
        s.read_exact(&mut byte)
            .unwrap_or_else(|e| panic!("no answer to CONNECT {port}: {e}"));
        line.push(byte[0]);
    }
    assert!(
        line.to_ascii_uppercase().starts_with(b"OK"),
        "CONNECT {port} answered {:?}",
        String::from_utf8_lossy(&line)
    );
    s
}

/// Sends `request` to guest `port` from the host and reads the answer to its end.
fn host_request(sandbox: &str, port: u32, request: &str) -> String {
    let mut s = host_connect(sandbox, port);
    s.write_all(request.as_bytes())
        .unwrap_or_else(|e| panic!("send {request:?} to port {port}: {e}"));
    let mut answer = String::new();
    s.read_to_string(&mut answer)
        .unwrap_or_else(|e| panic!("read port {port}'s answer: {e}"));
    answer
}

/// The probe's ttrpc Check request, built the same way in Rust.
fn check_request() -> Vec<u8> {
    let (service, method) = (b"kata.agent.v1.AgentService", b"Check");
    let mut body = vec![0x0a, service.len() as u8];
    body.extend_from_slice(service);
    body.extend_from_slice(&[0x12, method.len() as u8]);
    body.extend_from_slice(method);
    body.extend_from_slice(&[0x1a, 0]);
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&1u32.to_be_bytes());
    frame.extend_from_slice(&[1, 0]);
    frame.extend_from_slice(&body);
    frame
}

#[test]
fn a_container_cannot_reach_the_agent_over_vsock() {
    let id = "iso-agent";
    let _cleanup = SandboxCleanup::new(id);
    let probe = StaticProbe::build("vsock-probe", PROBE_C);
    let c = Containerd::start("iso-agent");
    // The normal path still works: the host drove the agent to start this container.
    start_detached(&c, id, &["--mount", &probe.mount()], &["sleep", "600"]);

    let targets = [
        "1:1024",
        "local:1024",
        "1:1027",
        "local:1027",
        "1:1028",
        "local:1028",
        // Without agent.bench_sink=1 nothing listens on 1025.
        "1:1025",
        "local:1025",
    ];
    let out = run_probe(&c, id, "probe", &targets);
    assert_refused_by_listener(&out, "1:1024");
    assert_refused_by_listener(&out, "local:1024");
    assert_refused_by_listener(&out, "1:1027");
    assert_refused_by_listener(&out, "local:1027");
    assert_refused_by_listener(&out, "1:1028");
    assert_refused_by_listener(&out, "local:1028");
    for label in ["1:1025", "local:1025"] {
        assert_eq!(
            outcome(&out, label),
            "connect-failed",
            "the bench sink must not listen in a production sandbox:\n{out}"
        );
    }

    // Positive control: the host gets an answer to the very same request on 1024.
    let mut s = host_connect(id, AGENT_PORT);
    s.write_all(&check_request()).expect("send Check");
    let mut header = [0u8; 10];
    s.read_exact(&mut header).expect("read the reply header");
    let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
    assert_eq!(
        (&header[4..8], header[8]),
        (&1u32.to_be_bytes()[..], 2),
        "not a response to stream 1: {header:?}"
    );
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).expect("read the reply");
    let version = env!("CARGO_PKG_VERSION").as_bytes();
    assert!(
        body.windows(version.len()).any(|w| w == version),
        "the Check reply carries no agent version: {body:?}"
    );
    drop(s);

    // Positive control for the port forwarder: the host is answered (nothing serves
    // port 1 in the guest, which the answer says).
    let answer = host_request(id, PORT_FORWARD_PORT, "1\n");
    assert!(
        answer.starts_with("ERR ") && answer.contains("port 1"),
        "the port forwarder answered {answer:?}"
    );

    // Positive control for the stdio streams: the host is answered, and told that the
    // container's stdout already has its connection (the shim's).
    let answer = host_request(id, STDIO_PORT, &format!("stdout {id}\n"));
    assert!(
        answer.starts_with("ERR ") && answer.contains("already attached"),
        "the stdio server answered {answer:?}"
    );

    // The refusals did not stop the server: the agent still runs processes.
    let out = exec(&c, id, "after", &[], &["echo", "still-served"]);
    assert_eq!(stdout(&out), "still-served\n", "{}", stderr(&out));
    remove_detached(&c, id);
    assert_no_leftovers(id);
}

#[test]
fn a_production_agent_has_no_bench_sink_even_when_asked() {
    let id = "iso-nosink";
    let _cleanup = SandboxCleanup::new(id);
    let probe = StaticProbe::build("vsock-probe", PROBE_C);
    // The production initrd, with the word that starts the sink in the bench's.
    let config = RuntimeConfig::qemu().set(
        "hypervisor.qemu",
        "kernel_params",
        &toml_str(BENCH_SINK_PARAM),
    );
    let c = Containerd::start_configured("iso-nosink", &config);
    start_detached(&c, id, &["--mount", &probe.mount()], &["sleep", "600"]);
    // Nothing listens: the guest kernel resets the connect.
    let out = run_probe(&c, id, "probe", &["local:1025"]);
    assert_eq!(outcome(&out, "local:1025"), "connect-failed", "{out}");
    // Nor does the host reach anything there: the VMM side refuses the port.
    let path = vm_run_dir(id).join("kata.hvsock");
    let mut s = UnixStream::connect(&path).expect("connect to the hybrid vsock socket");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("set a read timeout");
    s.write_all(format!("CONNECT {BENCH_SINK_PORT}\n").as_bytes())
        .expect("send CONNECT");
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(
        !answer.to_ascii_uppercase().starts_with("OK"),
        "a production guest accepted the bench sink's port: {answer:?}"
    );
    drop(s);
    remove_detached(&c, id);
    assert_no_leftovers(id);
}

#[test]
fn a_container_cannot_reach_the_bench_sink_when_it_runs() {
    let id = "iso-sink";
    let _cleanup = SandboxCleanup::new(id);
    let probe = StaticProbe::build("vsock-probe", PROBE_C);
    // The bench's initrd: its agent has the sink (`make initrd-bench`).
    let initrd = std::env::var("KATA_TEST_BENCH_INITRD")
        .expect("KATA_TEST_BENCH_INITRD is not set: run the end-to-end tests with `make test`");
    let config = RuntimeConfig::qemu()
        .set(
            "hypervisor.qemu",
            "kernel_params",
            &toml_str(BENCH_SINK_PARAM),
        )
        .set("hypervisor.qemu", "initrd", &toml_str(&initrd));
    let c = Containerd::start_configured("iso-sink", &config);
    start_detached(&c, id, &["--mount", &probe.mount()], &["sleep", "600"]);

    // The sink writes zeros to whoever it accepts: any byte here would be a reply.
    let out = run_probe(&c, id, "probe", &["1:1025", "local:1025", "1:1024"]);
    assert_refused_by_listener(&out, "1:1025");
    assert_refused_by_listener(&out, "local:1025");
    assert_refused_by_listener(&out, "1:1024");

    // Positive control: the parameter did start the sink, and the host reads from it.
    let mut s = host_connect(id, BENCH_SINK_PORT);
    let mut zeros = vec![0xffu8; 64 * 1024];
    s.read_exact(&mut zeros).expect("read from the bench sink");
    assert!(
        zeros.iter().all(|&b| b == 0),
        "the sink sent non-zero bytes"
    );
    drop(s);

    remove_detached(&c, id);
    assert_no_leftovers(id);
}
