//! Reliability under faults, through containerd and ctr as users drive them: kill -9 of each
//! part of a sandbox (the shim, the VMM, either virtiofsd, the vsock backend) at each step of a
//! container's life (boot, created, running, exec, delete), containerd restarted under a
//! running sandbox, and the shim killed while containerd is down.
//!
//! After every fault: the task is reported exited or gone within [`LIMIT`] (the time from
//! the kill is printed, not asserted), `ctr task rm` and `ctr container rm` succeed, and
//! nothing of the sandbox is left on the host. When the VMM or a helper dies, the running
//! processes exit with 137 or 255 and the shim logs the cause.
//!
//! To hit a step deterministically, a test freezes the VMM with SIGSTOP while it injects
//! the fault (the guest cannot finish booting or answer a delete while frozen) and lets it
//! go on with SIGCONT right after.

use std::time::{Duration, Instant};

use e2e_tests::*;
use nix::sys::signal::Signal;

/// Hang guard for every wait after a fault: far above what a healthy shim needs (about a
/// second), below the 30 s a shim without a watchdog spends on a dead VM.
const LIMIT: Duration = Duration::from_secs(20);

/// How long a sandbox may take to boot here (QEMU/TCG, two tests in parallel).
const BOOT: Duration = Duration::from_secs(90);

/// Exit statuses a process may report when its VM died under it: 128 + SIGKILL, or 255.
const VM_DEATH_STATUSES: [u32; 2] = [137, 255];

/// A kill -9 the test made.
struct Fault {
    part: Part,
    pid: i32,
    at: Instant,
    /// Length of the containerd log (where the shim logs) at the kill.
    log_offset: usize,
}

impl Fault {
    fn describe(&self) -> String {
        format!("{:?} (pid {})", self.part, self.pid)
    }
}

fn find(id: &str, part: Part) -> i32 {
    pid_of(id, part).unwrap_or_else(|| {
        panic!(
            "no {part:?} process of sandbox {id}: {:?}",
            sandbox_processes(id)
        )
    })
}

/// kill -9 of `part` of sandbox `id`, waiting until it is gone.
fn kill9(c: &Containerd, id: &str, part: Part) -> Fault {
    let pid = find(id, part);
    let log_offset = c.log_len();
    assert!(signal(pid, Signal::SIGKILL), "kill -9 {pid} ({part:?})");
    let at = Instant::now();
    assert!(
        wait_gone(pid, Duration::from_secs(5)),
        "{part:?} {pid} survived SIGKILL"
    );
    eprintln!("{id}: killed {part:?} pid {pid}");
    Fault {
        part,
        pid,
        at,
        log_offset,
    }
}

/// The ctr arguments of a detached `sleep` in container `id`, with `extra` flags.
fn detached_sleep(c: &Containerd, id: &str, extra: &[&str]) -> Vec<String> {
    let mut flags = vec!["-d"];
    flags.extend_from_slice(extra);
    c.run_args(id, &flags, &["sleep", "1000"])
}

fn refs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// What must hold after any fault: the task is STOPPED or gone within [`LIMIT`], then
/// `ctr task rm` (when containerd still lists it) and `ctr container rm` succeed, and
/// nothing of the sandbox is left.
fn settles(c: &Containerd, id: &str, fault: &Fault) {
    let mut last = String::new();
    let status = poll(LIMIT, Duration::from_millis(100), || {
        match c.task_status(id) {
            None => Some("gone".to_string()),
            Some(s) if s == "STOPPED" => Some(s),
            Some(s) => {
                last = s;
                None
            }
        }
    })
    .unwrap_or_else(|| {
        panic!(
            "task {id} was still {last} {}s after kill -9 of {}\nshim log since the kill:\n{}",
            LIMIT.as_secs(),
            fault.describe(),
            c.log_since(fault.log_offset)
        )
    });
    eprintln!(
        "{id}: {status} {:.2}s after kill -9 of {}",
        fault.at.elapsed().as_secs_f64(),
        fault.describe()
    );
    if status == "STOPPED" {
        let t = Instant::now();
        let out = c
            .ctr_within(&["task", "rm", id], LIMIT)
            .unwrap_or_else(|e| panic!("{e}\n{}", c.log_since(fault.log_offset)));
        eprintln!(
            "{id}: ctr task rm answered in {:.2}s",
            t.elapsed().as_secs_f64()
        );
        assert!(
            out.status.success(),
            "ctr task rm {id} after the fault: {}\n{}",
            stderr(&out),
            c.log_since(fault.log_offset)
        );
    }
    let out = c
        .ctr_within(&["container", "rm", id], LIMIT)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        out.status.success(),
        "ctr container rm {id} after the fault: {}",
        stderr(&out)
    );
    assert_no_leftovers(id);
}

/// The shim logged why the sandbox ended: a line naming the dead process (its pid and what
/// it was) and the guest console's last lines.
fn cause_is_logged(c: &Containerd, fault: &Fault) {
    if fault.part == Part::Shim {
        return;
    }
    let pid = fault.pid.to_string();
    let names_pid = |line: &str| {
        line.match_indices(&pid).any(|(i, _)| {
            let before = line[..i].chars().next_back();
            let after = line[i + pid.len()..].chars().next();
            !before.is_some_and(|ch| ch.is_ascii_digit())
                && !after.is_some_and(|ch| ch.is_ascii_digit())
        })
    };
    let found = poll(Duration::from_secs(5), Duration::from_millis(100), || {
        let log = c.log_since(fault.log_offset);
        let cause = log
            .lines()
            .any(|l| names_pid(l) && fault.part.names().iter().any(|n| l.contains(n)));
        (cause && log.contains("console")).then_some(())
    });
    assert!(
        found.is_some(),
        "the shim did not log the cause (a line with pid {} and one of {:?}) with the guest \
         console's last lines; log since the kill:\n{}",
        fault.pid,
        fault.part.names(),
        c.log_since(fault.log_offset)
    );
}

// --- during boot -------------------------------------------------------------------------

/// `ctr run -d` while `part` is killed as the guest boots: after the VMM's pid is in
/// persist.json and the guest kernel has written to its console, before the agent
/// answers. The create fails, saying why, and nothing is left.
fn killed_during_boot(name: &str, part: Part) {
    let id = &format!("flt-{name}");
    let _cleanup = SandboxCleanup::new(id);
    // A boot is what is faulted: never from the VM pool (KATA_TEST_POOL_DIR).
    let c = Containerd::start_configured(
        name,
        &RuntimeConfig::qemu().set("factory", "vm_cache_number", "0"),
    );
    let mut run = c.ctr_background(&refs(&detached_sleep(&c, id, &[])));
    let console = format!("/run/vc/vm/{id}/console.log");
    let vmm = poll(BOOT, Duration::from_millis(5), || {
        let booting = std::fs::metadata(&console).is_ok_and(|m| m.len() > 0);
        persisted_pids(id)
            .filter(|p| p.vmm_pid > 0 && booting)
            .map(|p| p.vmm_pid)
    });
    let Some(vmm) = vmm else {
        let out = run.wait_within(Duration::ZERO);
        panic!(
            "the guest of {id} never booted (VMM pid in persist.json, output on {console}); \
             ctr run: {:?}\n{}",
            out.map(|o| stderr(&o)),
            c.log_tail()
        );
    };
    // Frozen, the guest cannot finish booting while the fault is injected.
    signal(vmm, Signal::SIGSTOP);
    let printed = std::fs::read_to_string(&console).unwrap_or_default();
    eprintln!(
        "{id}: VMM {vmm} frozen after {} bytes of console output, last: {:?}",
        printed.len(),
        printed.lines().last().unwrap_or("")
    );
    assert!(
        run.running(),
        "ctr run -d {id} ended before the fault:\n{}",
        c.log_tail()
    );
    let fault = kill9(&c, id, part);
    signal(vmm, Signal::SIGCONT);

    let out = run.wait_within(LIMIT).unwrap_or_else(|| {
        panic!(
            "ctr run -d {id} still creating {}s after kill -9 of {}\n{}",
            LIMIT.as_secs(),
            fault.describe(),
            c.log_since(fault.log_offset)
        )
    });
    eprintln!(
        "{id}: ctr run -d ended {:.2}s after the kill: {}",
        fault.at.elapsed().as_secs_f64(),
        stderr(&out).trim()
    );
    assert!(
        !out.status.success(),
        "ctr run -d {id} succeeded although {} was killed during boot",
        fault.describe()
    );
    if part != Part::Shim {
        let err = stderr(&out);
        assert!(
            part.names().iter().any(|n| err.contains(n)) || err.contains(&fault.pid.to_string()),
            "the create error does not say that {} died: {err}",
            fault.describe()
        );
        cause_is_logged(&c, &fault);
    }
    settles(&c, id, &fault);
}

#[test]
fn shim_killed_during_boot() {
    killed_during_boot("shim-boot", Part::Shim);
}

#[test]
fn vmm_killed_during_boot() {
    killed_during_boot("vmm-boot", Part::Vmm);
}

#[test]
fn virtiofsd_killed_during_boot() {
    killed_during_boot("fsd-boot", Part::Virtiofsd);
}

#[test]
fn rootfs_virtiofsd_killed_during_boot() {
    killed_during_boot("rfsd-boot", Part::RootfsVirtiofsd);
}

#[test]
fn vsock_backend_killed_during_boot() {
    killed_during_boot("vsock-boot", Part::VsockBackend);
}

/// The shim killed at the first moment its VMM process exists, before the shim can have
/// recorded the VMM's pid: containerd's clean-up (`shim delete`) must still find and stop
/// the VMM and the helpers.
#[test]
fn shim_killed_as_the_vmm_starts() {
    let id = "flt-shim-early";
    let _cleanup = SandboxCleanup::new(id);
    let c = Containerd::start("shim-early");
    let mut run = c.ctr_background(&refs(&detached_sleep(&c, id, &[])));
    let vmm = poll(BOOT, Duration::from_millis(2), || {
        sandbox_processes(id)
            .into_iter()
            .find(|p| p.part == Part::Vmm)
            .map(|p| p.pid)
    })
    .unwrap_or_else(|| panic!("no VMM of {id} appeared\n{}", c.log_tail()));
    signal(vmm, Signal::SIGSTOP);
    let recorded = persisted_pids(id).unwrap_or_default();
    eprintln!(
        "{id}: VMM {vmm} frozen at start; persist.json records vmm_pid {} helpers {:?}",
        recorded.vmm_pid, recorded.helper_pids
    );
    let fault = kill9(&c, id, Part::Shim);
    signal(vmm, Signal::SIGCONT);
    let out = run
        .wait_within(LIMIT)
        .unwrap_or_else(|| panic!("ctr run -d {id} hung after the shim died"));
    assert!(
        !out.status.success(),
        "ctr run -d {id} succeeded although its shim was killed"
    );
    settles(&c, id, &fault);
}

// --- created, not started ----------------------------------------------------------------

/// `ctr run -d` whose pid file cannot be written: ctr 1.6 writes it between the task's
/// create and start, and stops there (without deleting the task when detached), which
/// leaves the task CREATED: the one way through ctr to stop between the two.
fn create_without_start(c: &Containerd, id: &str) {
    let pid_file = c.dir.join("no-such-dir/pid").display().to_string();
    let args = detached_sleep(c, id, &["--pid-file", &pid_file]);
    let out = c
        .ctr_within(&refs(&args), BOOT)
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log_tail()));
    assert!(
        !out.status.success() && stderr(&out).contains("no-such-dir"),
        "ctr run -d --pid-file {pid_file}: {}\n{}",
        stderr(&out),
        c.log_tail()
    );
    assert_eq!(
        c.task_status(id).as_deref(),
        Some("CREATED"),
        "{}",
        c.log_tail()
    );
}

/// The reference for the faults below: a created task that is never started is removed
/// by `ctr task rm -f` (containerd refuses a plain rm of a CREATED task, with runc too)
/// and leaves nothing.
#[test]
fn a_created_task_is_removed_without_starting() {
    let id = "flt-created";
    let _cleanup = SandboxCleanup::new(id);
    let c = Containerd::start("created");
    create_without_start(&c, id);
    let out = c
        .ctr_within(&["task", "rm", "-f", id], LIMIT)
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log_tail()));
    assert!(
        out.status.success(),
        "ctr task rm -f {id}: {}",
        stderr(&out)
    );
    let out = c.ctr(&["container", "rm", id]);
    assert!(
        out.status.success(),
        "ctr container rm {id}: {}",
        stderr(&out)
    );
    assert_no_leftovers(id);
}

fn killed_after_create(name: &str, part: Part) {
    let id = &format!("flt-{name}");
    let _cleanup = SandboxCleanup::new(id);
    let c = Containerd::start(name);
    create_without_start(&c, id);
    let fault = kill9(&c, id, part);
    settles(&c, id, &fault);
}

#[test]
fn shim_killed_after_create() {
    killed_after_create("shim-created", Part::Shim);
}

#[test]
fn vmm_killed_after_create() {
    killed_after_create("vmm-created", Part::Vmm);
}

#[test]
fn virtiofsd_killed_after_create() {
    killed_after_create("fsd-created", Part::Virtiofsd);
}

#[test]
fn vsock_backend_killed_after_create() {
    killed_after_create("vsock-created", Part::VsockBackend);
}

// --- running -----------------------------------------------------------------------------

fn killed_while_running(name: &str, part: Part) {
    let id = &format!("flt-{name}");
    let _cleanup = SandboxCleanup::new(id);
    let c = Containerd::start(name);
    let events = EventWatch::start(&c);
    start_detached(&c, id, &[], &["sleep", "1000"]);
    let fault = kill9(&c, id, part);
    let status = events.exit_status(id, id, LIMIT);
    eprintln!(
        "{id}: exit event {status:?} {:.2}s after the kill",
        fault.at.elapsed().as_secs_f64()
    );
    assert!(
        status.is_some_and(|s| VM_DEATH_STATUSES.contains(&s)),
        "exit of {id} after kill -9 of {}: {status:?}, expected one of {VM_DEATH_STATUSES:?}\n\
         events: {}\nshim log since the kill:\n{}",
        fault.describe(),
        events.text(),
        c.log_since(fault.log_offset)
    );
    cause_is_logged(&c, &fault);
    settles(&c, id, &fault);
}

#[test]
fn shim_killed_while_running() {
    killed_while_running("shim-running", Part::Shim);
}

#[test]
fn vmm_killed_while_running() {
    killed_while_running("vmm-running", Part::Vmm);
}

#[test]
fn virtiofsd_killed_while_running() {
    killed_while_running("fsd-running", Part::Virtiofsd);
}

#[test]
fn rootfs_virtiofsd_killed_while_running() {
    killed_while_running("rfsd-running", Part::RootfsVirtiofsd);
}

#[test]
fn vsock_backend_killed_while_running() {
    killed_while_running("vsock-running", Part::VsockBackend);
}

// --- during an exec ----------------------------------------------------------------------

fn killed_during_exec(name: &str, part: Part) {
    let id = &format!("flt-{name}");
    let _cleanup = SandboxCleanup::new(id);
    let c = Containerd::start(name);
    let events = EventWatch::start(&c);
    start_detached(&c, id, &[], &["sleep", "1000"]);
    let fifo = c.dir.join("fifo").display().to_string();
    // The exec says when it runs: `ctr task ps` lists an exec the shim has registered
    // before the guest has started it.
    let mut exec = c.ctr_background(&[
        "task",
        "exec",
        "--fifo-dir",
        &fifo,
        "--exec-id",
        "long",
        id,
        "sh",
        "-c",
        "echo started; exec sleep 1000",
    ]);
    let started = poll(LIMIT, Duration::from_millis(20), || {
        exec.stdout_so_far().contains("started").then_some(())
    });
    assert!(
        started.is_some() && exec.running(),
        "the exec in {id} never ran: {:?}\n{}",
        exec.wait_within(Duration::ZERO).map(|o| stderr(&o)),
        c.log_tail()
    );
    let fault = kill9(&c, id, part);
    let out = exec.wait_within(LIMIT).unwrap_or_else(|| {
        panic!(
            "ctr task exec in {id} still waiting {}s after kill -9 of {}\n{}",
            LIMIT.as_secs(),
            fault.describe(),
            c.log_since(fault.log_offset)
        )
    });
    eprintln!(
        "{id}: the exec's ctr ended with {:?} {:.2}s after the kill: {}",
        out.status.code(),
        fault.at.elapsed().as_secs_f64(),
        stderr(&out).trim()
    );
    if part == Part::Shim {
        // With the shim gone, no one is left to report the exec's status: ctr says so.
        assert!(!out.status.success(), "the exec reported success");
    } else {
        let code = out.status.code().map(|c| c as u32);
        assert!(
            code.is_some_and(|s| VM_DEATH_STATUSES.contains(&s)),
            "the exec's status after kill -9 of {}: {code:?}, expected one of \
             {VM_DEATH_STATUSES:?}: {}",
            fault.describe(),
            stderr(&out)
        );
        let status = events.exit_status(id, id, LIMIT);
        assert!(
            status.is_some_and(|s| VM_DEATH_STATUSES.contains(&s)),
            "exit of {id}'s init: {status:?}\nevents: {}",
            events.text()
        );
        cause_is_logged(&c, &fault);
    }
    settles(&c, id, &fault);
}

#[test]
fn shim_killed_during_exec() {
    killed_during_exec("shim-exec", Part::Shim);
}

#[test]
fn vmm_killed_during_exec() {
    killed_during_exec("vmm-exec", Part::Vmm);
}

#[test]
fn virtiofsd_killed_during_exec() {
    killed_during_exec("fsd-exec", Part::Virtiofsd);
}

#[test]
fn vsock_backend_killed_during_exec() {
    killed_during_exec("vsock-exec", Part::VsockBackend);
}

// --- during delete -----------------------------------------------------------------------

/// `ctr task rm` of a stopped task while the VMM is frozen, so that the delete is still
/// waiting on the guest when `part` is killed.
fn killed_during_delete(name: &str, part: Part) {
    let id = &format!("flt-{name}");
    let _cleanup = SandboxCleanup::new(id);
    let c = Containerd::start(name);
    start_detached(&c, id, &[], &["sleep", "1000"]);
    let out = c.ctr(&["task", "kill", "-s", "SIGKILL", id]);
    assert!(out.status.success(), "kill: {}", stderr(&out));
    wait_status(&c, id, "STOPPED");

    let vmm = find(id, Part::Vmm);
    signal(vmm, Signal::SIGSTOP);
    let mut rm = c.ctr_background(&["task", "rm", id]);
    std::thread::sleep(Duration::from_millis(500));
    let in_progress = rm.running();
    let fault = kill9(&c, id, part);
    signal(vmm, Signal::SIGCONT);
    assert!(
        in_progress,
        "ctr task rm {id} finished while the VM was frozen, before the fault: {:?}",
        rm.wait_within(Duration::ZERO).map(|o| stderr(&o))
    );
    let out = rm.wait_within(LIMIT).unwrap_or_else(|| {
        panic!(
            "ctr task rm {id} still deleting {}s after kill -9 of {}\n{}",
            LIMIT.as_secs(),
            fault.describe(),
            c.log_since(fault.log_offset)
        )
    });
    eprintln!(
        "{id}: the interrupted ctr task rm ended with {:?} {:.2}s after the kill: {}",
        out.status.code(),
        fault.at.elapsed().as_secs_f64(),
        stderr(&out).trim()
    );
    settles(&c, id, &fault);
}

#[test]
fn shim_killed_during_delete() {
    killed_during_delete("shim-delete", Part::Shim);
}

#[test]
fn vmm_killed_during_delete() {
    killed_during_delete("vmm-delete", Part::Vmm);
}

#[test]
fn virtiofsd_killed_during_delete() {
    killed_during_delete("fsd-delete", Part::Virtiofsd);
}

#[test]
fn vsock_backend_killed_during_delete() {
    killed_during_delete("vsock-delete", Part::VsockBackend);
}

// --- containerd restarts -----------------------------------------------------------------

/// containerd stopped and started again under a running sandbox: it finds the task
/// RUNNING through the shim, exec works, and the usual kill and rm end it cleanly.
#[test]
fn containerd_restarted_under_a_running_sandbox() {
    let id = "flt-restart";
    let _cleanup = SandboxCleanup::new(id);
    let c = Containerd::start("restart");
    start_detached(&c, id, &[], &["sleep", "1000"]);
    let vmm = find(id, Part::Vmm);
    c.stop_daemon();
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        alive(vmm) && pid_of(id, Part::Shim).is_some(),
        "the sandbox did not outlive containerd: {:?}",
        sandbox_processes(id)
    );
    c.start_daemon();
    wait_status(&c, id, "RUNNING");
    let out = exec(&c, id, "after-restart", &[], &["echo", "still-here"]);
    assert_eq!(
        stdout(&out),
        "still-here\n",
        "exec after the restart: {}\n{}",
        stderr(&out),
        c.log_tail()
    );
    remove_detached(&c, id);
    assert_no_leftovers(id);
}

/// The shim killed while containerd is down: on its restart containerd finds the shim
/// gone, runs `containerd-shim-kata-v2 delete`, which must stop the VMM and the helpers
/// from what persist.json records.
#[test]
fn shim_killed_while_containerd_is_down() {
    let id = "flt-shim-down";
    let _cleanup = SandboxCleanup::new(id);
    let c = Containerd::start("shim-down");
    start_detached(&c, id, &[], &["sleep", "1000"]);
    c.stop_daemon();
    let fault = kill9(&c, id, Part::Shim);
    c.start_daemon();
    settles(&c, id, &fault);
}
