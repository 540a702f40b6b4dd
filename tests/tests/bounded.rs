//! Whatever a guest does, the host keeps a bounded amount of it (issue 29: containment).
//!
//! For about a minute a container connects over vsock again and again where nothing
//! listens or where it is refused: the host (CID 2) on unserved ports, through which the
//! vsock backend refuses it, and the agent's API port through the guest's loopback
//! transport (CID 1), which the agent closes and logs. Meanwhile root in the guest (the
//! debug console, standing for a guest that broke out of its container) writes 3 MiB to
//! the serial console. Afterwards the sandbox's host files stay within their caps:
//! - `console.log` within 1 MiB ([`CONSOLE_LOG_CAP`]: the shim keeps the newest output),
//! - the whole run directory `/run/vc/vm/<id>` within [`RUN_DIR_CAP`],
//! - `/run/vc/sbs/<id>` (files on its own file system) within [`SBS_DIR_CAP`],
//! - what the shim logged into containerd's log during the flood within [`SHIM_LOG_CAP`],
//!
//! and the sandbox still runs: an exec in the container answers. The agent's console log
//! is rate-limited: after a further AFTER_SECONDS of refused connects, once the console
//! is quiet, the console says how many of its lines were dropped.
//!
//! The runtime runs without debug (`enable_debug = false`): debug mode logs everything
//! on purpose. The debug console needs the debug initrd (`KATA_TEST_DEBUG_INITRD`) and
//! `kata-runtime` next to the shim (`KATA_TEST_SHIM_DIR`).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use e2e_tests::*;

/// How long the flood lasts, in seconds.
const FLOOD_SECONDS: u32 = 60;
/// How long the connect flood runs again once the console flood is over, in seconds.
const AFTER_SECONDS: u32 = 15;
/// The most `console.log` holds (hypervisor::console::CONSOLE_LOG_CAP).
const CONSOLE_LOG_CAP: u64 = 1 << 20;
/// The most the run directory holds: the console log and the daemons' own logs.
const RUN_DIR_CAP: u64 = 2 << 20;
/// The most the sandbox's state directory holds.
const SBS_DIR_CAP: u64 = 256 << 10;
/// The most the shim may log (into containerd's log) during the flood.
const SHIM_LOG_CAP: usize = 64 << 10;
/// The first line of a console log the shim has cut (hypervisor::bounded_log's note).
const CUT_NOTE: &str = "[kata: older output of the guest console was dropped";

/// `flood SECONDS`: for SECONDS, vsock connects where they fail, as fast as they go;
/// prints `ATTEMPTS host=N loopback=N` at the end.
const FLOOD_C: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <linux/vm_sockets.h>

static void attempt(unsigned cid, unsigned port) {
    int fd = socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) { perror("socket(AF_VSOCK)"); exit(1); }
    struct sockaddr_vm addr;
    memset(&addr, 0, sizeof addr);
    addr.svm_family = AF_VSOCK;
    addr.svm_cid = cid;
    addr.svm_port = port;
    (void)connect(fd, (struct sockaddr *)&addr, sizeof addr);
    close(fd);
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: flood SECONDS\n"); return 2; }
    time_t end = time(0) + atoi(argv[1]);
    long host = 0, loopback = 0;
    while (time(0) < end) {
        /* The host: ports nobody serves (the vsock backend refuses them). */
        attempt(2, 4000 + (unsigned)(host % 64));
        host++;
        /* The agent's API through the loopback transport: closed and logged. */
        attempt(1, 1024);
        loopback++;
    }
    printf("ATTEMPTS host=%ld loopback=%ld\n", host, loopback);
    return 0;
}
"#;

/// What root in the guest writes to its console: three times the log's cap.
const CONSOLE_FLOOD_BYTES: u64 = 3 * CONSOLE_LOG_CAP;

/// What root in the guest types into the debug console: the console flood, for at least
/// FLOOD_SECONDS, then a word saying it ran to its end.
fn console_flood_script() -> String {
    format!(
        "(yes 'console flood from root in the guest: 0123456789abcdefghijklmnopqrstuvwxyz' \
         | head -c {CONSOLE_FLOOD_BYTES} > /dev/console; echo console-written) & \
         sleep {FLOOD_SECONDS}; wait; \
         echo flood-done; exit\n"
    )
}

/// Every regular file under `dir` on `dir`'s own file system (bind mounts of container
/// root filesystems and volumes are not the sandbox's), with its size.
fn files_under(dir: &Path) -> Vec<(PathBuf, u64)> {
    let Ok(top) = std::fs::symlink_metadata(dir) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(m) = std::fs::symlink_metadata(e.path()) else {
                continue;
            };
            if m.dev() != top.dev() {
                continue;
            }
            if m.is_dir() {
                todo.push(e.path());
            } else if m.is_file() {
                found.push((e.path(), m.len()));
            }
        }
    }
    found.sort();
    found
}

fn total(files: &[(PathBuf, u64)]) -> u64 {
    files.iter().map(|(_, n)| n).sum()
}

fn listing(files: &[(PathBuf, u64)]) -> String {
    files
        .iter()
        .map(|(p, n)| format!("  {n:>9} {}", p.display()))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_minute_of_refused_connects_and_console_flood_leaves_bounded_host_files() {
    // Unique per run: another run of this test at the same time has a sandbox of its own.
    let id = &format!("bounded-{}", std::process::id());
    let _cleanup = SandboxCleanup::new(id);
    let initrd = std::env::var("KATA_TEST_DEBUG_INITRD")
        .expect("KATA_TEST_DEBUG_INITRD is not set: run the end-to-end tests with `make test`");
    let config = RuntimeConfig::qemu()
        .set("runtime", "enable_debug", "false")
        .set("agent.kata", "debug_console_enabled", "true")
        .set("hypervisor.qemu", "initrd", &toml_str(&initrd));
    let probe = StaticProbe::build("flood", FLOOD_C);
    let c = Containerd::start_configured("bounded", &config);
    start_detached(&c, id, &["--mount", &probe.mount()], &["sleep", "600"]);
    let run_dir = Path::new("/run/vc/vm").join(id);
    let sbs_dir = Path::new("/run/vc/sbs").join(id);
    assert!(run_dir.is_dir(), "no run directory {}", run_dir.display());
    let log_before = c.log_len();

    // Both floods at once, for FLOOD_SECONDS.
    let flood_started = Instant::now();
    let shell = debug_shell(id, &console_flood_script());
    let seconds = FLOOD_SECONDS.to_string();
    let flood = exec(&c, id, "flood", &[], &["/probe/flood", &seconds]);
    let shell = finish_shell(shell, Duration::from_secs(u64::from(FLOOD_SECONDS) + 120));
    eprintln!(
        "debug console after {:?}: {}",
        flood_started.elapsed(),
        String::from_utf8_lossy(&shell.stdout)
    );

    // The floods ran.
    let flood_out = stdout(&flood);
    assert!(
        flood.status.success(),
        "the connect flood did not run: {}{}\n{}",
        flood_out,
        stderr(&flood),
        c.log_tail()
    );
    eprintln!("connect flood: {flood_out}");
    let attempts: u64 = flood_out
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("host="))
        .find_map(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        attempts >= 100,
        "too few connects to test anything: {flood_out}"
    );
    assert!(
        String::from_utf8_lossy(&shell.stdout).contains("flood-done"),
        "the console flood did not run to its end: {}{}",
        String::from_utf8_lossy(&shell.stdout),
        String::from_utf8_lossy(&shell.stderr)
    );

    // Refused connects once the console is quiet again: while `yes` fills the console the
    // agent's log lines wait their turn (its refusals with them), so whether the agent
    // dropped any during the flood depends on the host's speed. Over AFTER_SECONDS at
    // tens of refusals a second it must drop some, and say so.
    let after = AFTER_SECONDS.to_string();
    let flood2 = exec(&c, id, "flood2", &[], &["/probe/flood", &after]);
    assert!(
        flood2.status.success(),
        "the second connect flood did not run: {}{}",
        stdout(&flood2),
        stderr(&flood2)
    );
    eprintln!("connect flood after the console flood: {}", stdout(&flood2));

    let shim_log = c.log_since(log_before);
    // The host kept a bounded amount of it.
    let console = std::fs::read(run_dir.join("console.log")).expect("read console.log");
    let run_files = files_under(&run_dir);
    let sbs_files = files_under(&sbs_dir);
    eprintln!(
        "after the flood: run dir {} bytes:\n{}\nstate dir {} bytes:\n{}\nshim log {} bytes",
        total(&run_files),
        listing(&run_files),
        total(&sbs_files),
        listing(&sbs_files),
        shim_log.len()
    );
    assert!(
        console.len() as u64 <= CONSOLE_LOG_CAP,
        "console.log has {} bytes, over its cap of {CONSOLE_LOG_CAP}",
        console.len()
    );
    assert!(
        console.starts_with(CUT_NOTE.as_bytes()),
        "the guest wrote {CONSOLE_FLOOD_BYTES} bytes to its console, yet the log was not \
         cut: it starts with {:?}",
        String::from_utf8_lossy(&console[..console.len().min(200)])
    );
    // The agent's console log is rate-limited: its refusals are counted, not all logged.
    let text = String::from_utf8_lossy(&console);
    let others: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with("console flood from root"))
        .collect();
    assert!(
        text.contains("log lines dropped"),
        "the agent logged every refused connect (no rate limit note in the console); \
         {} lines besides the flood, the last:\n{}",
        others.len(),
        others[others.len().saturating_sub(20)..].join("\n")
    );
    assert!(
        total(&run_files) <= RUN_DIR_CAP,
        "{} holds {} bytes, over the cap of {RUN_DIR_CAP}:\n{}",
        run_dir.display(),
        total(&run_files),
        listing(&run_files)
    );
    assert!(
        total(&sbs_files) <= SBS_DIR_CAP,
        "{} holds {} bytes, over the cap of {SBS_DIR_CAP}:\n{}",
        sbs_dir.display(),
        total(&sbs_files),
        listing(&sbs_files)
    );
    assert!(
        shim_log.len() <= SHIM_LOG_CAP,
        "the shim logged {} bytes during the flood, over the cap of {SHIM_LOG_CAP}; the \
         last lines:\n{}",
        shim_log.len(),
        shim_log
            .lines()
            .rev()
            .take(30)
            .collect::<Vec<_>>()
            .join("\n")
    );

    // And the sandbox still runs.
    let out = exec(&c, id, "after", &[], &["echo", "still-here"]);
    assert!(
        out.status.success() && stdout(&out).contains("still-here"),
        "an exec after the flood failed: {}{}\n{}",
        stdout(&out),
        stderr(&out),
        c.log_tail()
    );
    remove_detached(&c, id);
}

/// The most each host process's log holds (hypervisor::bounded_log::LOG_CAP).
const HOST_LOG_CAP: u64 = 1 << 20;
/// How long the container may take to make a helper's log reach its cap.
const NOISY_LIMIT: Duration = Duration::from_secs(180);

/// A container that walks its root file system without end: with debug on (the tests'
/// default), virtiofsd logs every request the guest sends it, about a megabyte in
/// seconds. Its log, and every other log of the run directory, stays within
/// [`HOST_LOG_CAP`], keeping its newest lines behind the cut's note.
#[test]
fn a_noisy_helper_s_log_stays_within_its_cap() {
    let id = &format!("noisy-{}", std::process::id());
    let _cleanup = SandboxCleanup::new(id);
    let c = Containerd::start_configured("noisy", &RuntimeConfig::qemu());
    start_detached(
        &c,
        id,
        &[],
        &[
            "sh",
            "-c",
            "while :; do ls -laR /bin /etc /usr >/dev/null 2>&1; cat /bin/busybox >/dev/null; done",
        ],
    );
    let run_dir = Path::new("/run/vc/vm").join(id);
    let is_log = |p: &Path| p.extension().is_some_and(|e| e == "log");
    let cut = poll(NOISY_LIMIT, Duration::from_secs(1), || {
        let files = files_under(&run_dir);
        for (path, len) in &files {
            assert!(
                !is_log(path) || *len <= HOST_LOG_CAP,
                "{} has {len} bytes, above its cap:\n{}",
                path.display(),
                listing(&files)
            );
        }
        files.into_iter().find(|(p, _)| {
            is_log(p)
                && !p.ends_with("console.log")
                && std::fs::read(p).is_ok_and(|t| t.starts_with(b"[kata: older "))
        })
    });
    let (path, _) = cut.unwrap_or_else(|| {
        panic!(
            "no helper's log reached its cap in {}s:\n{}",
            NOISY_LIMIT.as_secs(),
            listing(&files_under(&run_dir))
        )
    });
    let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap_or_default()).to_string();
    let lines: Vec<&str> = text.lines().collect();
    eprintln!(
        "{} was cut: {} bytes, first line {:?}, last line {:?}",
        path.display(),
        text.len(),
        lines.first(),
        lines.last()
    );
    assert!(lines.len() > 100, "the cut kept too little: {text}");
    // The sandbox still answers.
    let out = exec(&c, id, "e1", &[], &["echo", "still here"]);
    assert_eq!(stdout(&out), "still here\n", "{}", stderr(&out));
    let files = files_under(&run_dir);
    assert!(
        files.iter().all(|(p, n)| !is_log(p) || *n <= HOST_LOG_CAP),
        "a log above its cap:\n{}",
        listing(&files)
    );
    remove_detached(&c, id);
    assert_no_leftovers(id);
}
