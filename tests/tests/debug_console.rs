//! `kata-runtime exec SANDBOX-ID`: a root shell in the guest through the agent's debug
//! console, only where the configuration turns it on (`[agent.kata]
//! debug_console_enabled = true`), and never reachable from a container.
//!
//! `kata-runtime` comes from `KATA_TEST_SHIM_DIR` (`make build` puts it next to the shim).
//! The shell is the debug initrd's busybox (`make initrd` builds it beside the plain one).

use std::time::Duration;

use e2e_tests::*;

/// What the user types (the stdin of `kata-runtime exec`, a pipe).
const SCRIPT: &str = "echo hello-from-guest; cat /proc/1/cmdline; echo; echo uid=$(id -u); \
                      ls /run/kata-containers/shared/containers; exit\n";
/// The debug console's port (protocols::DEBUG_CONSOLE_VSOCK_PORT).
const CONSOLE_PORT: u32 = 1026;
/// How long one `kata-runtime exec` may take, shell included.
const EXEC_LIMIT: Duration = Duration::from_secs(60);

/// The terminal's lines, without carriage returns.
fn lines(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| {
            l.trim_matches(|c: char| c == '\r' || c.is_whitespace())
                .to_string()
        })
        .collect()
}

#[test]
fn exec_opens_a_root_shell_in_the_guest() {
    let id = "dbgcon-on";
    let _cleanup = SandboxCleanup::new(id);
    let config = debug_config();
    let c = Containerd::start_configured("dbgcon-on", &config);
    start_detached(&c, id, &[], &["sleep", "600"]);

    let out = finish_shell(debug_shell(id, SCRIPT), EXEC_LIMIT);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("kata-runtime exec printed:\n{text}");
    assert!(
        out.status.success(),
        "kata-runtime exec failed: {}\n{}",
        stderr(&out),
        c.log_tail()
    );
    let got = lines(&text);
    // The terminal echoes what was typed: the shell's own output is a line of its own.
    assert!(
        got.iter().any(|l| l == "hello-from-guest"),
        "no output of echo: {text:?}"
    );
    // PID 1 of the guest, the agent, is the initrd's /init: the shell is in the guest
    // root, not in the container (whose PID 1 would be sleep).
    assert!(
        got.iter().any(|l| l.starts_with("/init")),
        "/proc/1/cmdline is not the agent's: {text:?}"
    );
    assert!(got.iter().any(|l| l == "uid=0"), "not root: {text:?}");
    // The guest's view of the shared directory holds this sandbox's container.
    assert!(
        got.iter().any(|l| l.split_whitespace().any(|w| w == id)),
        "the shared directory does not show {id}: {text:?}"
    );

    // The session ended cleanly and the sandbox still serves the host.
    let after = exec(&c, id, "after", &[], &["echo", "still-served"]);
    assert_eq!(stdout(&after), "still-served\n", "{}", stderr(&after));
    remove_detached(&c, id);
    assert_no_leftovers(id);
}

#[test]
fn exec_without_the_console_says_how_to_turn_it_on() {
    let id = "dbgcon-off";
    let _cleanup = SandboxCleanup::new(id);
    let c = Containerd::start("dbgcon-off");
    start_detached(&c, id, &[], &["sleep", "600"]);

    let out = finish_shell(debug_shell(id, SCRIPT), EXEC_LIMIT);
    let err = stderr(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "stdout {:?}, stderr {err}",
        stdout(&out)
    );
    assert!(
        err.contains(
            "the debug console is not enabled: set debug_console_enabled = true under \
             [agent.kata] and restart the sandbox"
        ),
        "{err}"
    );
    assert!(stdout(&out).is_empty(), "{:?}", stdout(&out));

    // A sandbox that does not exist is told apart.
    let out = finish_shell(debug_shell("dbgcon-nosuch", "exit\n"), EXEC_LIMIT);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("no sandbox \"dbgcon-nosuch\""),
        "{}",
        stderr(&out)
    );

    remove_detached(&c, id);
    assert_no_leftovers(id);
}

/// The probe: `console-probe CID:PORT...` (CID `local` = the guest's CID, 3). For each, one
/// `RESULT label outcome` line: connect-failed, closed-no-reply, reset-no-reply,
/// timeout-no-reply, reply (the console writes a prompt to whoever it serves).
const PROBE_C: &str = r#"
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <linux/vm_sockets.h>

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        char *colon = strchr(argv[i], ':');
        if (!colon) { printf("RESULT %s bad-argument\n", argv[i]); continue; }
        *colon = 0;
        unsigned cid = strcmp(argv[i], "local") == 0 ? 3 : (unsigned)strtoul(argv[i], 0, 10);
        *colon = ':';
        printf("RESULT %s ", argv[i]);
        int fd = socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_vm addr;
        memset(&addr, 0, sizeof addr);
        addr.svm_family = AF_VSOCK;
        addr.svm_cid = cid;
        addr.svm_port = (unsigned)strtoul(colon + 1, 0, 10);
        if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
            printf("connect-failed %s\n", strerror(errno));
            if (fd >= 0) close(fd);
            continue;
        }
        /* A shell would read this and answer even if it printed no prompt. */
        send(fd, "echo console-reached\n", 21, MSG_NOSIGNAL);
        struct pollfd p = { .fd = fd, .events = POLLIN };
        char buf[256];
        ssize_t got;
        if (poll(&p, 1, 5000) == 0) printf("timeout-no-reply\n");
        else if ((got = recv(fd, buf, sizeof buf, 0)) > 0) printf("reply %zd-bytes\n", got);
        else if (got == 0) printf("closed-no-reply\n");
        else if (errno == ECONNRESET) printf("reset-no-reply\n");
        else printf("recv-failed %s\n", strerror(errno));
        close(fd);
    }
    fflush(stdout);
    return 0;
}
"#;

/// The compiled probe in a temp directory, removed on drop (also when the test fails).

#[test]
fn a_container_cannot_reach_the_console() {
    let id = "dbgcon-iso";
    let _cleanup = SandboxCleanup::new(id);
    let probe = StaticProbe::build("console-probe", PROBE_C);
    let config = debug_config();
    let c = Containerd::start_configured("dbgcon-iso", &config);
    start_detached(&c, id, &["--mount", &probe.mount()], &["sleep", "600"]);

    let targets = [format!("1:{CONSOLE_PORT}"), format!("local:{CONSOLE_PORT}")];
    let exe = probe.path_in_container();
    let mut cmd = vec![exe.as_str()];
    cmd.extend(targets.iter().map(String::as_str));
    let out = exec(&c, id, "probe", &[], &cmd);
    let text = stdout(&out);
    eprintln!("probe:\n{text}");
    assert!(
        out.status.success(),
        "the probe did not run: {}",
        stderr(&out)
    );
    for label in &targets {
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("RESULT {label} ")))
            .unwrap_or_else(|| panic!("no result for {label}: {text}"));
        assert!(
            !line.starts_with("reply"),
            "a container reached the debug console at {label}: {text}"
        );
    }

    // Positive control: the host does get the shell.
    let out = finish_shell(debug_shell(id, "echo host-$((40+2)); exit\n"), EXEC_LIMIT);
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        lines(&printed).iter().any(|l| l == "host-42"),
        "{printed:?}"
    );

    remove_detached(&c, id);
    assert_no_leftovers(id);
}

/// A runtime configuration with the console on and the debug initrd, which has the shell.
fn debug_config() -> RuntimeConfig {
    let initrd = std::env::var("KATA_TEST_DEBUG_INITRD")
        .expect("KATA_TEST_DEBUG_INITRD is not set: run the end-to-end tests with `make test`");
    RuntimeConfig::qemu()
        .set("agent.kata", "debug_console_enabled", "true")
        .set("hypervisor.qemu", "initrd", &toml_str(&initrd))
}
