//! `ctr` driving a private containerd that runs each container in its own VM through
//! containerd-shim-kata-v2, as a user would. Every case ends by checking that nothing of
//! its sandbox is left on the host.

use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

use e2e_tests::*;

fn host_kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .expect("host kernel release")
        .trim()
        .to_string()
}

#[test]
fn runs_in_the_guest_kernel_and_exit_codes_propagate() {
    let c = Containerd::start("kernel");
    let out = c.run("k1", &["--rm"], &["sh", "-c", "uname -r; date +%s"]);
    assert!(
        out.status.success(),
        "ctr run failed: {}\n{}",
        stderr(&out),
        c.log_tail()
    );
    let text = stdout(&out);
    let mut lines = text.lines();
    let guest = lines.next().unwrap_or("").trim().to_string();
    assert!(!guest.is_empty(), "no output; stderr: {}", stderr(&out));
    assert_ne!(guest, host_kernel(), "the container saw the host kernel");
    // The guest has the host's date (not 1970): TLS, logs and make depend on it.
    let guest_now: u64 = lines.next().unwrap_or("").trim().parse().unwrap_or(0);
    let host_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        guest_now.abs_diff(host_now) < 300,
        "guest clock {guest_now} vs host {host_now}"
    );
    assert_no_leftovers("k1");

    let out = c.run("k2", &["--rm"], &["sh", "-c", "exit 3"]);
    assert_eq!(out.status.code(), Some(3), "stderr: {}", stderr(&out));
    assert_no_leftovers("k2");
}

#[test]
fn large_stdout_arrives_intact_and_stderr_is_kept_apart() {
    let c = Containerd::start("stdout");
    // 2 MiB of random bytes; the guest reports their checksum on stderr.
    let script = "head -c 2097152 /dev/urandom > /tmp/data; md5sum /tmp/data >&2; cat /tmp/data";
    let out = c.run("big", &["--rm"], &["sh", "-c", script]);
    assert!(
        out.status.success(),
        "ctr run failed: {}\n{}",
        stderr(&out),
        c.log_tail()
    );
    assert_eq!(out.stdout.len(), 2097152, "stdout length");
    assert_eq!(
        md5_hex(&out.stdout),
        first_word(&stderr(&out)),
        "stdout differs from what the guest wrote"
    );
    assert_no_leftovers("big");

    let out = c.run(
        "split",
        &["--rm"],
        &["sh", "-c", "echo to-out; echo to-err >&2"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "to-out\n");
    assert_eq!(stderr(&out), "to-err\n");
    assert_no_leftovers("split");
}

#[test]
fn stdin_env_and_cwd_reach_the_container() {
    let c = Containerd::start("stdin");
    // ctr 1.6 never closes the container's stdin, so read one line rather than to EOF.
    let mut child = c.spawn_run("in1", &["--rm"], &["head", "-n", "1"]);
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"line from the host\nsecond\n")
        .expect("writing stdin");
    let out = child.wait_with_output().expect("ctr output");
    assert!(out.status.success(), "{}\n{}", stderr(&out), c.log_tail());
    assert_eq!(stdout(&out), "line from the host\n");
    assert_no_leftovers("in1");

    let out = c.run(
        "env1",
        &["--rm", "--env", "GREETING=hello vm", "--cwd", "/tmp"],
        &["sh", "-c", "echo \"$GREETING\"; pwd"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "hello vm\n/tmp\n");
    assert_no_leftovers("env1");
}

/// 16 MiB piped into a container's stdin: thousands of the guest's 4 KiB vsock receive
/// buffers used and posted again, which the guest kernel keeps to 128 at a time
/// (guest/patches/0003).
#[test]
fn large_stdin_arrives_intact() {
    const BLOCKS: usize = 4096;
    let c = Containerd::start("bigin");
    let mut data = vec![0u8; BLOCKS * 4096];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for b in data.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = (x >> 24) as u8;
    }
    // ctr sends CloseIO as soon as its own stdin ends, after writing the last bytes into
    // the fifo but often before the shim has read them: those must still arrive. dd takes
    // exactly BLOCKS blocks, so a short stdin shows in the checksum.
    let script = format!("dd bs=4096 count={BLOCKS} iflag=fullblock 2>/dev/null | md5sum");
    let mut child = c.spawn_run("bigin", &["--rm"], &["sh", "-c", &script]);
    let mut stdin = child.stdin.take().expect("stdin");
    let payload = data.clone();
    let writer = std::thread::spawn(move || stdin.write_all(&payload));
    let out = Background::new(child)
        .wait_within(Duration::from_secs(120))
        .unwrap_or_else(|| panic!("16 MiB of stdin not consumed in 120 s\n{}", c.log_tail()));
    let _ = writer.join();
    assert!(out.status.success(), "{}\n{}", stderr(&out), c.log_tail());
    assert_eq!(
        first_word(&stdout(&out)),
        md5_hex(&data),
        "the guest read other bytes"
    );
    assert_no_leftovers("bigin");
}

#[test]
fn exec_into_a_running_container_and_kill_it() {
    let c = Containerd::start("exec");
    start_detached(&c, "ex1", &[], &["sleep", "1000"]);

    let out = exec(
        &c,
        "ex1",
        "e1",
        &[],
        &["sh", "-c", "echo from-exec; exit 5"],
    );
    assert_eq!(
        out.status.code(),
        Some(5),
        "exec: {}\n{}",
        stderr(&out),
        c.log_tail()
    );
    assert_eq!(stdout(&out), "from-exec\n");

    let out = c.ctr(&["task", "ps", "ex1"]);
    assert!(out.status.success(), "task ps: {}", stderr(&out));

    let out = c.ctr(&["task", "kill", "-s", "SIGKILL", "ex1"]);
    assert!(out.status.success(), "kill: {}", stderr(&out));
    wait_status(&c, "ex1", "STOPPED");
    remove_detached(&c, "ex1");
    assert_no_leftovers("ex1");
}

/// An exec whose background child inherits its stdout still ends: the exit is reported
/// once the process's own output is through (a short grace), not when the child lets go.
#[test]
fn an_exec_whose_background_child_keeps_stdout_open_still_returns() {
    let c = Containerd::start("exec-bg");
    start_detached(&c, "bg1", &[], &["sleep", "1000"]);
    let fifo = c.dir.join("fifo").display().to_string();
    let script = "echo before; sleep 1000 & exit 3";
    let mut ctr = c
        .ctr_cmd(&[
            "task",
            "exec",
            "--fifo-dir",
            &fifo,
            "--exec-id",
            "e1",
            "bg1",
            "sh",
            "-c",
            script,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ctr task exec");
    // Far beyond the grace: a ctr still waiting then waits for the child, for good.
    let deadline = Instant::now() + Duration::from_secs(120);
    while ctr.try_wait().expect("wait for ctr").is_none() {
        if Instant::now() > deadline {
            let _ = ctr.kill();
            let _ = ctr.wait();
            remove_detached(&c, "bg1");
            panic!(
                "ctr task exec never returned: the exit waited for the background child's \
                 stdout\n{}",
                c.log_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = ctr.wait_with_output().expect("ctr's output");
    assert_eq!(out.status.code(), Some(3), "exec: {}", stderr(&out));
    assert_eq!(stdout(&out), "before\n");
    remove_detached(&c, "bg1");
    assert_no_leftovers("bg1");
}

#[test]
fn a_signal_ends_the_container_with_its_status() {
    let c = Containerd::start("signal");
    let child = c.spawn_run("sig1", &["--rm"], &["sleep", "1000"]);
    wait_status(&c, "sig1", "RUNNING");
    let out = c.ctr(&["task", "kill", "-s", "SIGKILL", "sig1"]);
    assert!(out.status.success(), "kill: {}", stderr(&out));
    let out = child.wait_with_output().expect("ctr output");
    assert_eq!(out.status.code(), Some(137), "{}", stderr(&out));
    assert_no_leftovers("sig1");
}

#[test]
fn a_failed_create_says_why_and_leaves_nothing() {
    let c = Containerd::start("badcreate");
    let out = c.run("bad1", &["--rm"], &["/no/such/binary"]);
    assert!(!out.status.success(), "running a missing binary succeeded");
    let err = stderr(&out);
    assert!(
        err.contains("/no/such/binary"),
        "the error does not name the binary: {err}"
    );
    assert_no_leftovers("bad1");
    // containerd cleans up the failed task; the name is free again.
    let _ = c.ctr(&["container", "rm", "bad1"]);
    let out = c.run("bad1", &["--rm"], &["true"]);
    assert!(
        out.status.success(),
        "the sandbox after a failure: {}",
        stderr(&out)
    );
    assert_no_leftovers("bad1");
}

/// A static x86-64 program of `PAGE_WALK_PAGES` pages whose code runs through every page,
/// adding `v` in each, and exits with the sum (mod 256). Each version has new code at the
/// same addresses.
const PAGE_WALK_PAGES: usize = 201;

fn page_walker(v: u32) -> Vec<u8> {
    const BASE: u64 = 0x40_0000;
    const PAGE: usize = 4096;
    const ENTRY: usize = 0x100;
    let mut img = vec![0u8; PAGE * PAGE_WALK_PAGES];
    let put = |img: &mut Vec<u8>, at: usize, bytes: &[u8]| {
        img[at..at + bytes.len()].copy_from_slice(bytes);
    };
    put(&mut img, ENTRY, &[0x31, 0xff]); // xor edi, edi
    let mut at = ENTRY + 2;
    for page in 0..PAGE_WALK_PAGES {
        let mut add = vec![0x81, 0xc7]; // add edi, imm32
        add.extend_from_slice(&v.to_le_bytes());
        put(&mut img, at, &add);
        at += add.len();
        if page + 1 < PAGE_WALK_PAGES {
            let next = (page + 1) * PAGE;
            let rel = (next as i64 - (at as i64 + 5)) as i32;
            let mut jmp = vec![0xe9]; // jmp rel32, to the next page's start
            jmp.extend_from_slice(&rel.to_le_bytes());
            put(&mut img, at, &jmp);
            at = next;
        }
    }
    put(&mut img, at, &[0xb8, 0x3c, 0, 0, 0, 0x0f, 0x05]); // exit(edi)

    let size = img.len() as u64;
    let mut hdr = Vec::with_capacity(120);
    // ELF header: 64-bit, little-endian, executable, x86-64, one program header.
    hdr.extend_from_slice(b"\x7fELF\x02\x01\x01\x00");
    hdr.extend_from_slice(&[0; 8]);
    hdr.extend_from_slice(&2u16.to_le_bytes());
    hdr.extend_from_slice(&62u16.to_le_bytes());
    hdr.extend_from_slice(&1u32.to_le_bytes());
    hdr.extend_from_slice(&(BASE + ENTRY as u64).to_le_bytes());
    hdr.extend_from_slice(&64u64.to_le_bytes()); // program headers at 64
    hdr.extend_from_slice(&0u64.to_le_bytes()); // no section headers
    hdr.extend_from_slice(&0u32.to_le_bytes());
    for half in [64u16, 56, 1, 0, 0, 0] {
        hdr.extend_from_slice(&half.to_le_bytes());
    }
    // One PT_LOAD, read + execute, the whole file at BASE.
    hdr.extend_from_slice(&1u32.to_le_bytes());
    hdr.extend_from_slice(&5u32.to_le_bytes());
    for word in [0, BASE, BASE, size, size, PAGE as u64] {
        hdr.extend_from_slice(&word.to_le_bytes());
    }
    put(&mut img, 0, &hdr);
    img
}

/// A program replaced on a volume while the sandbox runs must run its new code. Under
/// TCG this catches translations of a page's old code surviving a device's write of new
/// contents (virtiofsd fills guest page-cache pages behind the emulator's back): without
/// a cure nearly every run here ran older code or crashed.
#[test]
fn a_program_replaced_on_a_volume_runs_its_new_code() {
    let id = "replaced";
    let _cleanup = SandboxCleanup::new(id);
    let prog = StaticProbe::from_bytes("walker", &page_walker(0));
    let c = Containerd::start("replaced");
    start_detached(&c, id, &["--mount", &prog.mount()], &["sleep", "600"]);
    let mut wrong = Vec::new();
    for v in 1..=30u32 {
        prog.replace(&page_walker(v));
        let out = exec(&c, id, &format!("e{v}"), &[], &[&prog.path_in_container()]);
        let want = (v as usize * PAGE_WALK_PAGES % 256) as i32;
        if out.status.code() != Some(want) {
            wrong.push(format!(
                "version {v}: exit {:?}, want {want} {}",
                out.status.code(),
                stderr(&out).trim()
            ));
        }
    }
    remove_detached(&c, id);
    assert!(
        wrong.is_empty(),
        "{} of 30 runs did not run the program's new code:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    assert_no_leftovers(id);
}
