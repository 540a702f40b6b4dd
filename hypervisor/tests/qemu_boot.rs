//! Boots the real guest kernel under QEMU with trivial initrds (a static C `/init`).
//!
//! Needs root, qemu-system-x86_64, virtiofsd, kata-vsock, gcc with a static libc,
//! and a guest kernel: `$KATA_TEST_KERNEL`, else the newest
//! `/var/cache/kata-guest/kernel-*/vmlinux` (built by `guest/build-kernel.sh`). Skips with
//! a message when QEMU or the kernel is missing. Every test kills whatever mentions its
//! run directory when it ends, pass or fail.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use hypervisor::new_hypervisor;
use procinfo::pid::is_running;

mod common;
use common::{skipped, wait_for, Sandbox, QEMU, SERIAL};

const MARKER: &str = "HELLO-FROM-GUEST";

fn guest_kernel() -> Option<PathBuf> {
    if let Some(k) = std::env::var_os("KATA_TEST_KERNEL") {
        return Some(PathBuf::from(k));
    }
    let mut kernels: Vec<(std::time::SystemTime, PathBuf)> =
        std::fs::read_dir("/var/cache/kata-guest")
            .ok()?
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("kernel-"))
            .map(|e| e.path().join("vmlinux"))
            .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
            .collect();
    kernels.sort();
    kernels.pop().map(|(_, p)| p)
}

/// The kernel, or None (with a message) when this host cannot run the test.
fn prerequisites() -> Option<PathBuf> {
    if !Path::new(QEMU).exists() {
        skipped(&format!("needs {QEMU}"));
        return None;
    }
    if !common::helpers_installed() {
        return None;
    }
    match guest_kernel() {
        Some(k) if k.exists() => Some(k),
        _ => {
            skipped("needs a guest kernel (set KATA_TEST_KERNEL or run guest/build-kernel.sh)");
            None
        }
    }
}

/// A static `/init` that prints the marker to the console, then reboots (ending QEMU)
/// or, with `stay`, sleeps forever.
fn build_initrd(dir: &Path, stay: bool) -> PathBuf {
    let src = dir.join("init.c");
    std::fs::write(
        &src,
        r#"
#include <fcntl.h>
#include <unistd.h>
#include <sys/reboot.h>
int main(void) {
    static const char msg[] = "HELLO-FROM-GUEST\n";
    int fd = open("/dev/console", O_WRONLY);
    if (fd < 0) fd = 1;
    write(fd, msg, sizeof msg - 1);
#ifdef STAY
    for (;;) pause();
#else
    reboot(RB_AUTOBOOT);
#endif
    return 0;
}
"#,
    )
    .unwrap();
    let bin = dir.join("init");
    let mut gcc = Command::new("gcc");
    gcc.args(["-static", "-Os", "-o"]).arg(&bin).arg(&src);
    if stay {
        gcc.arg("-DSTAY");
    }
    let status = gcc.status().expect("gcc must be installed");
    assert!(status.success(), "gcc failed: {status}");

    let mut cpio = Vec::new();
    cpio_entry(&mut cpio, "dev", 0o040755, (0, 0), &[]);
    cpio_entry(&mut cpio, "dev/console", 0o020600, (5, 1), &[]);
    cpio_entry(
        &mut cpio,
        "init",
        0o100755,
        (0, 0),
        &std::fs::read(&bin).unwrap(),
    );
    cpio_entry(&mut cpio, "TRAILER!!!", 0, (0, 0), &[]);
    let initrd = dir.join("initrd.cpio");
    std::fs::write(&initrd, cpio).unwrap();
    initrd
}

/// One entry of a "newc" cpio archive (what the kernel unpacks as an initramfs).
fn cpio_entry(out: &mut Vec<u8>, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
    let ino = out.len() as u32 + 1;
    let nlink = if mode & 0o040000 != 0 { 2 } else { 1 };
    let fields = [
        ino,
        mode,
        0,
        0,
        nlink,
        0,
        data.len() as u32,
        0,
        0,
        rdev.0,
        rdev.1,
        name.len() as u32 + 1,
        0,
    ];
    out.extend_from_slice(b"070701");
    for f in fields {
        out.extend_from_slice(format!("{f:08x}").as_bytes());
    }
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
    out.extend_from_slice(data);
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

#[tokio::test]
async fn guest_prints_marker_and_reboot_ends_qemu() {
    let _serial = SERIAL.lock().await;
    let Some(kernel) = prerequisites() else {
        return;
    };
    let mut sb = Sandbox::new();
    let initrd = build_initrd(sb.dir.path(), false);
    let mut hv = new_hypervisor(&sb.config(&kernel, &initrd), hypervisor::discard_logger());

    let started = Instant::now();
    let info = hv.start_vm(&sb.vm_config()).await.unwrap();
    let ready = started.elapsed();
    sb.pids = hv.pids();
    assert_eq!(sb.pids[0], info.vmm_pid);
    // virtiofsd of the share, virtiofsd of the rootfs share, the vsock backend.
    assert_eq!(info.helper_pids.len(), 3, "{info:?}");
    assert_eq!(info.accelerator, "tcg", "this host's KVM cannot boot Linux");

    wait_for("the guest marker", Duration::from_secs(120), || {
        std::fs::read_to_string(&info.console_log).is_ok_and(|s| s.contains(MARKER))
    });
    eprintln!(
        "start_vm returned after {:?}; marker on the console after {:?}",
        ready,
        started.elapsed()
    );
    wait_for(
        "QEMU to exit after the guest reboot",
        Duration::from_secs(60),
        || !is_running(info.vmm_pid),
    );

    hv.stop_vm().await.unwrap();
    assert!(hv.pids().is_empty());
    for pid in std::iter::once(info.vmm_pid).chain(info.helper_pids.iter().copied()) {
        assert!(!is_running(pid), "pid {pid} still runs");
    }
    assert_eq!(sb.leftovers(), Vec::<i32>::new());
}

#[tokio::test]
async fn agent_socket_accepts_connections() {
    let _serial = SERIAL.lock().await;
    let Some(kernel) = prerequisites() else {
        return;
    };
    let mut sb = Sandbox::new();
    let initrd = build_initrd(sb.dir.path(), true);
    let mut hv = new_hypervisor(&sb.config(&kernel, &initrd), hypervisor::discard_logger());
    let info = hv.start_vm(&sb.vm_config()).await.unwrap();
    sb.pids = hv.pids();

    assert!(info.agent_socket.exists());
    let mut stream = UnixStream::connect(&info.agent_socket).unwrap();
    // The backend may already have closed it (no listener in the guest): that is fine.
    if let Err(e) = stream.write_all(b"CONNECT 1024\n") {
        assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            ),
            "{e}"
        );
    }
    // No agent listens in this guest: the backend closes or stays silent; both are fine.
    stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut buf = [0u8; 64];
    let answer = stream.read(&mut buf);
    eprintln!("CONNECT 1024 without an agent: {answer:?}");
    drop(stream);

    // A second start on the same backend is refused.
    let again = hv.start_vm(&sb.vm_config()).await.unwrap_err();
    assert!(again.to_string().contains("already running"), "{again}");

    hv.stop_vm().await.unwrap();
    hv.stop_vm().await.unwrap();
    for pid in std::iter::once(info.vmm_pid).chain(info.helper_pids.iter().copied()) {
        assert!(!is_running(pid), "pid {pid} still runs");
    }
    assert!(!info.agent_socket.exists(), "stop_vm removes the sockets");
    assert_eq!(sb.leftovers(), Vec::<i32>::new());
}

#[tokio::test]
async fn bad_kernel_path_fails_and_leaves_nothing_running() {
    let _serial = SERIAL.lock().await;
    let Some(_) = prerequisites() else { return };
    let sb = Sandbox::new();
    let missing = sb.dir.path().join("no-such-vmlinux");
    let initrd = sb.dir.path().join("initrd");
    std::fs::write(&initrd, b"").unwrap();
    let mut hv = new_hypervisor(&sb.config(&missing, &initrd), hypervisor::discard_logger());

    let err = hv.start_vm(&sb.vm_config()).await.unwrap_err().to_string();
    eprintln!("start_vm error: {err}");
    assert!(err.starts_with("starting qemu failed"), "{err}");
    assert!(err.contains(&missing.display().to_string()), "{err}");
    assert!(hv.pids().is_empty());
    assert_eq!(sb.leftovers(), Vec::<i32>::new());
}
