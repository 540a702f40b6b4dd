//! Boots test guests in the real kata-vmm binary on /dev/kvm.
//!
//! The guests are a few thousand instructions at most: an emulated KVM runs about a million
//! instructions per second. Deadlines are generous; timings are never asserted.

mod support;
use support::confinement;
mod guests;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use guests::*;
use vmm::devices::virtio::net::test_utils::{self as net, taps_available};
use vmm_contract::test_skip::skipped;

const DEADLINE: Duration = Duration::from_secs(30);

/// Kills the VMM by pid when the test ends, passing or failing.
struct VmmProcess {
    child: Child,
}

impl Drop for VmmProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: kill(2) on the pid of our own unreaped child.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
            let _ = self.child.wait();
        }
    }
}

impl VmmProcess {
    fn wait(&mut self, deadline: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    fn stderr(&mut self) -> String {
        use std::io::Read;
        let mut s = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut s);
        }
        s
    }
}

/// Whether /dev/kvm exists; if not, the test is reported as skipped.
fn kvm_available() -> bool {
    Path::new("/dev/kvm").exists() || skipped("needs /dev/kvm")
}

struct Run {
    status: ExitStatus,
    serial: String,
    stderr: String,
}

fn start_vmm(
    dir: &Path,
    kernel: &Path,
    cmdline: &str,
    extra: serde_json::Value,
) -> (VmmProcess, PathBuf) {
    let serial = dir.join("serial.log");
    let mut config = serde_json::json!({
        "kernel": kernel,
        "cmdline": cmdline,
        "vcpus": 1,
        "memory_mib": 128,
        "serial_log": serial,
    });
    if let (Some(c), Some(e)) = (config.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            c.insert(k.clone(), v.clone());
        }
    }
    let config_path = dir.join("vmm.json");
    std::fs::write(&config_path, config.to_string()).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_kata-vmm"))
        .arg("--config")
        .arg(&config_path)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    (VmmProcess { child }, serial)
}

impl VmmProcess {
    /// Waits for kata-vmm to exit; its status, serial output (from `serial`) and stderr.
    fn finish(self, serial: &Path) -> Run {
        self.finish_within(serial, DEADLINE)
    }

    fn finish_within(mut self, serial: &Path, deadline: Duration) -> Run {
        let status = self.wait(deadline);
        let stderr = self.stderr();
        let serial = std::fs::read_to_string(serial).unwrap_or_default();
        let status = status.unwrap_or_else(|| {
            panic!(
                "kata-vmm did not exit within {deadline:?}; serial: {serial:?}; stderr: {stderr}"
            )
        });
        Run {
            status,
            serial,
            stderr,
        }
    }

    /// Waits until the guest has printed `text` on the serial port.
    fn wait_for_serial(&mut self, serial: &Path, text: &str) {
        let start = Instant::now();
        while !std::fs::read_to_string(serial)
            .unwrap_or_default()
            .contains(text)
        {
            assert!(
                start.elapsed() < DEADLINE,
                "the guest never printed {text:?}: {}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Boots the guest `source` in `dir` with `extra` in its vmm.json, until kata-vmm exits.
fn boot_in(dir: &Path, source: &str, cmdline: &str, extra: serde_json::Value) -> Run {
    let kernel = build_guest(dir, "guest", source);
    let (vmm, serial) = start_vmm(dir, &kernel, cmdline, extra);
    vmm.finish(&serial)
}

fn boot(source: &str, cmdline: &str) -> Run {
    let dir = tempfile::tempdir().unwrap();
    boot_in(dir.path(), source, cmdline, serde_json::json!({}))
}

#[test]
fn linux64_guest_prints_cmdline_from_zero_page() {
    if !kvm_available() {
        return;
    }
    let cmdline = "console=ttyS0 kata.test=zero-page";
    let run = boot(&linux64_cmdline_guest(), cmdline);
    assert_eq!(run.status.code(), Some(0), "stderr: {}", run.stderr);
    assert!(
        run.serial.starts_with("LM e820=00000003 ["),
        "serial: {:?}",
        run.serial
    );
    assert!(run.serial.contains(cmdline), "serial: {:?}", run.serial);
    // The virtio-rng device is announced after the configured command line.
    assert!(
        run.serial.contains("virtio_mmio.device=4K@0xd0000000:5]"),
        "serial: {:?}",
        run.serial
    );
    assert!(run.stderr.contains("i8042"), "stderr: {}", run.stderr);
}

#[test]
fn i8042_reset_exits_zero() {
    if !kvm_available() {
        return;
    }
    let run = boot(&reset_guest(), "");
    assert_eq!(run.status.code(), Some(0), "stderr: {}", run.stderr);
    assert!(
        run.stderr.contains("reset the machine through the i8042"),
        "{}",
        run.stderr
    );
}

#[test]
fn triple_fault_exits_zero() {
    if !kvm_available() {
        return;
    }
    let run = boot(&triple_fault_guest(), "");
    assert_eq!(run.status.code(), Some(0), "stderr: {}", run.stderr);
    assert_eq!(run.serial, "T");
    assert!(run.stderr.contains("shut down"), "{}", run.stderr);
}

#[test]
fn halt_with_interrupts_off_exits_zero() {
    if !kvm_available() {
        return;
    }
    let run = boot(&cli_hlt_guest(), "");
    assert_eq!(run.status.code(), Some(0), "stderr: {}", run.stderr);
    assert_eq!(run.serial, "H");
    assert!(run.stderr.contains("interrupts disabled"), "{}", run.stderr);
}

#[test]
fn pvh_guest_sees_start_info_and_virtio_rng() {
    if !kvm_available() {
        return;
    }
    let run = boot(&pvh_virtio_guest(), "pvh=yes");
    assert_eq!(run.status.code(), Some(0), "stderr: {}", run.stderr);
    assert!(run.stderr.contains("Pvh entry"), "{}", run.stderr);
    assert!(
        run.serial
            .starts_with("PVH cmdline=pvh=yes virtio_mmio.device=4K@0xd0000000:5"),
        "serial: {:?}",
        run.serial
    );
    assert!(
        run.serial
            .contains(" magic=74726976 version=00000002 id=00000004"),
        "serial: {:?}",
        run.serial
    );
    assert!(
        run.serial.contains(" status=0000000f"),
        "serial: {:?}",
        run.serial
    );
    assert!(
        run.serial.contains(" rng-used-len=00000010"),
        "serial: {:?}",
        run.serial
    );
}

#[test]
fn smp_guest_finds_the_mp_table_and_starts_its_second_vcpu() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let kernel = build_guest(dir.path(), "smp", &smp_guest());
    let (vmm, serial) = start_vmm(
        dir.path(),
        &kernel,
        "",
        serde_json::json!({ "vcpus": 2, "rng": false }),
    );
    // The guest gives up waiting for the AP by itself; leave it time to say so.
    let Run {
        status,
        serial,
        stderr,
    } = vmm.finish_within(&serial, 2 * DEADLINE);
    assert_eq!(status.code(), Some(0), "stderr: {stderr}");
    assert!(stderr.contains("2 vCPU(s)"), "{stderr}");
    assert_eq!(
        serial, "MP cpus=00000002 ioapic=fec00000\nAP 1\nap up\n",
        "stderr: {stderr}"
    );
    assert!(
        stderr.contains("reset the machine through the i8042"),
        "{stderr}"
    );
}

#[test]
fn sigterm_stops_a_running_guest() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Spins forever with interrupts on.
    let kernel = build_guest(
        dir.path(),
        "spin",
        ".code64\n.globl _start\n_start: jmp _start\n",
    );
    let ready = dir.path().join("ready");
    let (mut vmm, _) = start_vmm(
        dir.path(),
        &kernel,
        "",
        serde_json::json!({ "ready_file": ready }),
    );
    let start = Instant::now();
    while !ready.exists() && start.elapsed() < DEADLINE {
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = std::fs::read_to_string(&ready).unwrap();
    assert_eq!(pid.trim(), vmm.child.id().to_string());
    // SAFETY: kill(2) on the pid of our own running child.
    unsafe { libc::kill(vmm.child.id() as i32, libc::SIGTERM) };
    let status = vmm
        .wait(DEADLINE)
        .expect("kata-vmm did not stop on SIGTERM");
    let stderr = vmm.stderr();
    assert_eq!(status.code(), Some(0), "stderr: {stderr}");
    assert!(stderr.contains("stopped by signal 15"), "{stderr}");
}

#[test]
fn vsock_device_is_announced_and_its_socket_listens() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("kata.hvsock");
    let Run {
        status,
        serial,
        stderr,
    } = boot_in(
        dir.path(),
        &vsock_probe_guest(),
        "",
        serde_json::json!({ "vsock": { "guest_cid": 42, "uds_path": uds } }),
    );
    assert_eq!(status.code(), Some(0), "stderr: {stderr}");
    assert!(
        stderr.contains("virtio_mmio.device=4K@0xd0001000:6"),
        "{stderr}"
    );
    assert_eq!(serial, "vsock id=00000013 cid=0000002a\n");
}

#[test]
fn vsock_socket_accepts_connections_while_the_guest_runs() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let kernel = build_guest(
        dir.path(),
        "spin",
        ".code64\n.globl _start\n_start: jmp _start\n",
    );
    let uds = dir.path().join("kata.hvsock");
    let ready = dir.path().join("ready");
    let (mut vmm, _) = start_vmm(
        dir.path(),
        &kernel,
        "",
        serde_json::json!({ "ready_file": ready, "vsock": { "guest_cid": 3, "uds_path": uds } }),
    );
    let start = Instant::now();
    while !ready.exists() && start.elapsed() < DEADLINE {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(ready.exists(), "stderr: {}", vmm.stderr());
    use std::io::Write;
    let mut stream = std::os::unix::net::UnixStream::connect(&uds).unwrap();
    stream.write_all(b"CONNECT 1024\n").unwrap();
    // No guest driver answers; the VMM must stay up (and not be killed by its seccomp
    // filter while the device thread handles the connection).
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        vmm.child.try_wait().unwrap().is_none(),
        "stderr: {}",
        vmm.stderr()
    );
    // Every thread runs filtered, the main thread too: main, device, vCPU.
    confinement::assert_every_thread_filtered(vmm.child.id(), 3);
}

#[test]
fn vsock_stream_between_host_socket_and_guest() {
    if !kvm_available() {
        return;
    }
    use std::io::{BufRead, BufReader, Write};
    let dir = tempfile::tempdir().unwrap();
    let kernel = build_guest(dir.path(), "echo", &vsock_echo_guest());
    let uds = dir.path().join("kata.hvsock");
    let (mut vmm, serial) = start_vmm(
        dir.path(),
        &kernel,
        "",
        serde_json::json!({ "vsock": { "guest_cid": 3, "uds_path": uds } }),
    );
    // The guest says when its queues are set up.
    vmm.wait_for_serial(&serial, "vsock ready");
    let mut stream = std::os::unix::net::UnixStream::connect(&uds).unwrap();
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    stream.write_all(b"CONNECT 1024\n").unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert!(line.starts_with("OK "), "{line:?}");
    line.clear();
    reader.read_line(&mut line).unwrap();
    assert_eq!(line, "hello from guest\n");
    stream.write_all(b"ping\n").unwrap();
    let run = vmm.finish(&serial);
    assert_eq!(run.status.code(), Some(0), "stderr: {}", run.stderr);
    assert_eq!(
        run.serial, "vsock ready\ngot: ping\n",
        "stderr: {}",
        run.stderr
    );
}

#[test]
fn net_frames_between_an_af_packet_socket_and_the_guest() {
    if !kvm_available() || !taps_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let kernel = build_guest(dir.path(), "net", &net_frame_guest());
    // kata-vmm creates the tap, and it goes away when kata-vmm exits (or is killed).
    let tap = format!("kvb{}", std::process::id());
    let guest_mac = [0x02, 0, 0, 0, 0, 0x0a];
    let (mut vmm, serial) = start_vmm(
        dir.path(),
        &kernel,
        "",
        serde_json::json!({ "net": [{ "tap": tap, "mac": "02:00:00:00:00:0a" }] }),
    );
    // The guest says when its queues are set up; the tap exists by then.
    vmm.wait_for_serial(&serial, "net ready");
    net::link_up(&tap);
    let sock = net::PacketSocket::bind(&tap, DEADLINE);
    sock.send(&net::frame(
        guest_mac,
        [0x02, 0, 0, 0, 0, 0x0b],
        b"ping from host",
    ));
    let reply = sock.recv();
    assert_eq!(
        reply,
        net::frame([0xff; 6], guest_mac, b"hello from guest"),
        "stderr: {}",
        vmm.stderr()
    );
    let Run {
        status,
        serial,
        stderr,
    } = vmm.finish(&serial);
    assert_eq!(status.code(), Some(0), "stderr: {stderr}");
    assert!(
        stderr.contains("virtio_mmio.device=4K@0xd0001000:6"),
        "{stderr}"
    );
    // 40 = the 12-byte header, 14 bytes of Ethernet header and the 14-byte payload.
    assert_eq!(
        serial, "net ready mac=02000000000a\ngot 00000028 ping from host\nsent\n",
        "stderr: {stderr}"
    );
    assert!(!net::interface_exists(&tap), "the tap outlived kata-vmm");
}

#[test]
fn a_bad_tap_name_fails_the_build_with_a_sentence() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Run { status, stderr, .. } = boot_in(
        dir.path(),
        &reset_guest(),
        "",
        serde_json::json!({ "net": [{ "tap": "a/b" }] }),
    );
    assert_eq!(status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("Cannot set up the virtio-net on tap a/b: The tap name"),
        "{stderr}"
    );
}

#[test]
fn pvh_guest_reads_writes_and_flushes_a_disk() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    // Sector 0 holds a string for the guest to print; sector 1 is not zero, so the test
    // sees the guest's whole sector land; a partial fifth sector is not addressable.
    let mut image = vec![0u8; 4 * 512 + 100];
    let text = b"hello from the host disk\n";
    image[..text.len()].copy_from_slice(text);
    image[512..].fill(0xee);
    std::fs::write(&disk, &image).unwrap();
    let Run {
        status,
        serial,
        stderr,
    } = boot_in(
        dir.path(),
        &block_guest(),
        "",
        serde_json::json!({ "rng": false, "block": [{ "path": disk, "serial": "disk0" }] }),
    );
    assert_eq!(status.code(), Some(0), "stderr: {stderr}");
    assert!(
        stderr.contains(r#"cmdline \"virtio_mmio.device=4K@0xd0000000:5\""#),
        "the disk is the only virtio device: {stderr}"
    );
    assert_eq!(
        serial,
        "blk id=00000002 status=0000000f capacity=00000004 blk_size=00000200\n\
         sector 0: hello from the host disk\n\
         in=00000000 len=00000201 out=00000000 len=00000001 flush=00000000 len=00000001\n",
        "stderr: {stderr}"
    );
    let after = std::fs::read(&disk).unwrap();
    assert_eq!(after.len(), image.len());
    let mut sector1 = BLOCK_GUEST_TEXT.as_bytes().to_vec();
    sector1.resize(512, 0);
    assert_eq!(after[512..1024], sector1[..]);
    assert_eq!(after[..512], image[..512]);
    assert_eq!(after[1024..], image[1024..]);
}

#[test]
fn missing_disk_fails_with_a_sentence_naming_it() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-disk.img");
    let Run {
        status,
        serial,
        stderr,
    } = boot_in(
        dir.path(),
        &reset_guest(),
        "",
        serde_json::json!({ "rng": false, "block": [{ "path": missing }] }),
    );
    assert_eq!(status.code(), Some(1), "stderr: {stderr}");
    let path = missing.display().to_string();
    assert!(
        stderr.contains(&format!("Cannot set up the virtio-blk disk {path}: ")),
        "{stderr}"
    );
    assert!(stderr.contains("No such file or directory"), "{stderr}");
    assert!(stderr.contains("Create the image first"), "{stderr}");
    assert!(serial.is_empty(), "the guest never ran");
}

#[test]
fn check_gives_a_verdict() {
    if !kvm_available() {
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_kata-vmm"))
        .arg("check")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(matches!(out.status.code(), Some(0) | Some(2)), "{text}");
    assert!(text.contains("KVM"), "{text}");
}

#[test]
fn bad_config_fails_with_a_sentence() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("vmm.json");
    std::fs::write(&config, r#"{"kernel": "/nonexistent/vmlinux"}"#).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kata-vmm"))
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Without KVM, kata-vmm fails on /dev/kvm before it looks at the kernel.
    if Path::new("/dev/kvm").exists() {
        assert!(stderr.contains("/nonexistent/vmlinux"), "{stderr}");
    }
}

#[test]
fn virtio_fs_guest_reads_a_file_through_virtiofsd() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::write(shared.join("hello.txt"), "shared from the host\n").unwrap();
    let daemon = start_virtiofsd(dir.path(), &shared);
    let Run {
        status,
        serial,
        stderr,
    } = boot_in(
        dir.path(),
        &virtio_fs_guest(),
        "",
        serde_json::json!({
            "rng": false,
            "fs": [{ "socket": daemon.socket, "tag": "kataShared" }],
        }),
    );
    assert_eq!(status.code(), Some(0), "stderr: {stderr}");
    assert!(
        stderr.contains("virtio_mmio.device=4K@0xd0000000:5"),
        "stderr: {stderr}"
    );
    assert_eq!(
        serial,
        "status=0000000f init=00000000 major=00000007 lookup=00000000 open=00000000 \
         read=00000000\ndata: shared from the host\n",
        "stderr: {stderr}"
    );
}

#[test]
fn virtio_fs_without_virtiofsd_fails_before_booting() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("no-virtiofsd.sock");
    let Run { status, stderr, .. } = boot_in(
        dir.path(),
        &reset_guest(),
        "",
        serde_json::json!({ "fs": [{ "socket": socket, "tag": "kataShared" }] }),
    );
    assert_eq!(status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("virtio-fs share") && stderr.contains(&socket.display().to_string()),
        "stderr: {stderr}"
    );
}
