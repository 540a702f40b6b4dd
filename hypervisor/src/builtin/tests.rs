use std::os::unix::fs::MetadataExt;
use std::process::Command;

use super::*;
use crate::backend::Vm;
use crate::test_skip::skipped;
use crate::Hypervisor;

fn config(dir: &Path) -> BuiltinConfig {
    BuiltinConfig {
        path: PathBuf::from("/usr/local/bin/kata-vmm"),
        kernel: dir.join("vmlinux"),
        initrd: dir.join("initrd"),
        kernel_params: "agent.log=debug".into(),
        default_vcpus: 1,
        default_memory: 128,
        sizing: kata_config::PodSizing {
            max_vcpus: 0,
            max_memory: 0,
            vcpus_overhead: 0,
            memory_overhead: kata_config::POD_MEMORY_OVERHEAD_MIB,
            resize_vcpus: 0,
            resize_memory: 0,
        },
        virtio_fs_daemon: std::env::var_os("KATA_VIRTIOFSD")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/usr/local/bin/virtiofsd")),
        virtio_fs_cache: kata_config::VirtioFsCache::Auto,
        virtio_fs_rootfs_cache: kata_config::VirtioFsCache::Always,
        host_processes: kata_config::HostProcesses {
            sandboxed: true,
            uid_start: kata_config::HOST_UID_START,
            uid_count: kata_config::HOST_UID_COUNT,
        },
    }
}

#[test]
fn cmdline_and_vmm_json() {
    let dir = Path::new("/run/vc/sb1");
    let c = config(dir);
    assert_eq!(
        kernel_cmdline(&c, false),
        format!("{BASE_KERNEL_PARAMS} quiet agent.rootfs_share agent.log=debug")
    );
    let layout = BuiltinLayout::new(dir);
    let json: serde_json::Value =
        serde_json::to_value(vmm_config(&c, &layout, true, &[]).unwrap()).unwrap();
    assert_eq!(json["kernel"], "/run/vc/sb1/vmlinux");
    assert_eq!(json["vcpus"], 1);
    assert_eq!(json["memory_mib"], 128);
    // The console goes to the shim's pipe, which it reads into console.log.
    assert_eq!(json["serial_log"], serde_json::Value::Null);
    assert_eq!(json["serial_fd"], 3);
    assert_eq!(json["vsock"]["guest_cid"], 3);
    assert_eq!(json["vsock"]["uds_path"], "/run/vc/sb1/kata.hvsock");
    assert_eq!(json["ready_file"], "/run/vc/sb1/vmm.ready");
    assert_eq!(json["fs"][0]["socket"], "/run/vc/sb1/virtiofsd.sock");
    assert_eq!(json["fs"][0]["tag"], "kataShared");
    assert_eq!(json["fs"][1]["socket"], "/run/vc/sb1/virtiofsd-rootfs.sock");
    assert_eq!(json["fs"][1]["tag"], "kataRootfs");
    assert!(!json["cmdline"].as_str().unwrap().contains("quiet"));
    assert!(json["cmdline"]
        .as_str()
        .unwrap()
        .contains(protocols::AGENT_DEBUG_LOG));
}

/// One cache policy for volumes and root filesystems: one virtio-fs device, and no word
/// telling the agent to look for a second.
#[test]
fn one_policy_means_one_share() {
    let dir = Path::new("/run/vc/sb1");
    let mut c = config(dir);
    c.virtio_fs_rootfs_cache = c.virtio_fs_cache;
    assert!(!kernel_cmdline(&c, false).contains(ROOTFS_SHARE_PARAM));
    let vmm = vmm_config(&c, &BuiltinLayout::new(dir), false, &[]).unwrap();
    assert_eq!(vmm.fs.len(), 1);
    assert_eq!(vmm.fs[0].tag, SHARED_FS_TAG);
}

#[test]
fn the_written_vmm_json_is_what_kata_vmm_reads() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let layout = BuiltinLayout::new(dir.path());
    let written = vmm_config(&c, &layout, false, &[]).unwrap();
    write_vmm_config(&layout.config, &written).unwrap();
    assert_eq!(
        vmm_json::VmConfig::from_file(&layout.config).unwrap(),
        written
    );
}

#[test]
fn a_vmm_json_kata_vmm_would_refuse_is_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.default_vcpus = 300;
    let layout = BuiltinLayout::new(dir.path());
    let e = vmm_config(&c, &layout, false, &[]).unwrap_err().to_string();
    assert!(e.contains("default_vcpus is 300"), "{e}");
    c.default_vcpus = 33;
    let e = vmm_config(&c, &layout, false, &[]).unwrap_err().to_string();
    assert!(e.contains("vcpus is 33, expected 1 to 32"), "{e}");
}

/// The kata-vmm binary of this workspace, if it has been built (`cargo build -p vmm`).
fn kata_vmm() -> Option<PathBuf> {
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target");
    ["debug", "release"]
        .iter()
        .map(|p| target.join(p).join("kata-vmm"))
        .find(|p| p.is_file())
}

/// A guest that spins forever: a 64-bit ELF entered at 1 MiB.
fn spin_guest(dir: &Path) -> Option<PathBuf> {
    guest(dir, ".code64\n.globl _start\n_start: jmp _start\n")
}

/// What [`serial_guest`] writes to COM1.
const SERIAL_MARKER: &str = "kata-serial-marker";

/// A guest that writes [`SERIAL_MARKER`] and a newline to COM1, then spins.
fn serial_guest(dir: &Path) -> Option<PathBuf> {
    let src = format!(
        ".code64\n.globl _start\n_start:\n lea msg(%rip), %rsi\n mov $0x3f8, %dx\n\
         1: movb (%rsi), %al\n test %al, %al\n jz 2f\n out %al, %dx\n inc %rsi\n jmp 1b\n\
         2: jmp 2b\nmsg: .asciz \"{SERIAL_MARKER}\\n\"\n"
    );
    guest(dir, &src)
}

/// `source` (x86-64 assembly with `_start`) as a 64-bit ELF entered at 1 MiB.
fn guest(dir: &Path, source: &str) -> Option<PathBuf> {
    let src = dir.join("guest.S");
    std::fs::write(&src, source).ok()?;
    let obj = dir.join("guest.o");
    let elf = dir.join("vmlinux");
    let ok = Command::new("as")
        .args(["--64", "-o"])
        .arg(&obj)
        .arg(&src)
        .status()
        .ok()?
        .success()
        && Command::new("ld")
            .args(["-m", "elf_x86_64", "-Ttext=0x100000", "-e", "_start", "-o"])
            .arg(&elf)
            .arg(&obj)
            .status()
            .ok()?
            .success();
    ok.then_some(elf)
}

/// A backend running kata-vmm on the tiny guest `guest` assembles under `dir`, or None
/// (the skip said why) without kata-vmm, /dev/kvm or binutils.
fn tiny_guest_backend(
    dir: &Path,
    guest: fn(&Path) -> Option<PathBuf>,
) -> Option<(Vm<Builtin>, VmConfig)> {
    let Some(vmm) = kata_vmm() else {
        skipped("needs kata-vmm built (cargo build -p vmm)");
        return None;
    };
    if !Path::new("/dev/kvm").exists() {
        skipped("needs /dev/kvm");
        return None;
    }
    let Some(kernel) = guest(dir) else {
        skipped("needs binutils (as, ld)");
        return None;
    };
    std::fs::write(dir.join("initrd"), b"not a real initrd").unwrap();
    Some(backend_in(dir, vmm, kernel))
}

/// A backend running `vmm` on `kernel`, with run and shared dirs made under `dir`.
fn backend_in(dir: &Path, vmm: PathBuf, kernel: PathBuf) -> (Vm<Builtin>, VmConfig) {
    let run_dir = dir.join("run");
    std::fs::create_dir(&run_dir).unwrap();
    let shared = dir.join("shared");
    std::fs::create_dir(&shared).unwrap();
    let mut c = config(dir);
    c.path = vmm;
    c.kernel = kernel;
    let vm = VmConfig {
        sandbox_id: "sb1".into(),
        run_dir,
        shared_dir: shared,
        debug: false,
        ..Default::default()
    };
    let mut backend = Builtin::new(c, crate::discard_logger());
    // Tiny guests run on an emulated KVM too.
    backend.require_full_speed = false;
    (Vm::new(backend), vm)
}

#[tokio::test]
async fn starts_and_stops_kata_vmm_by_pid() {
    let dir = tempfile::tempdir().unwrap();
    let Some((mut backend, vm)) = tiny_guest_backend(dir.path(), spin_guest) else {
        return;
    };
    let info = backend.start_vm(&vm).await.unwrap();
    // kata-vmm and the two virtiofsds (share and rootfs share) its virtio-fs frontends
    // are connected to.
    assert_eq!(info.helper_pids.len(), 2, "{info:?}");
    let mut pids = vec![info.vmm_pid];
    pids.extend(&info.helper_pids);
    assert_eq!(backend.pids(), pids);
    assert!(info.agent_socket.exists());
    for pid in &pids {
        assert!(procinfo::pid::is_running(*pid));
    }
    // kata-vmm runs as the sandbox's uid, without privileges, with /dev/kvm its own.
    let status = std::fs::read_to_string(format!("/proc/{}/status", info.vmm_pid)).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    let uid = field("Uid")[0].parse::<u32>().unwrap();
    assert!(uid >= kata_config::HOST_UID_START, "{status}");
    assert_eq!(field("Uid"), [uid.to_string().as_str(); 4], "{status}");
    assert_eq!(field("CapEff"), ["0000000000000000"], "{status}");
    assert_eq!(field("CapBnd"), ["0000000000000000"], "{status}");
    assert_eq!(field("NoNewPrivs"), ["1"], "{status}");
    let kvm = std::fs::metadata(format!("/proc/{}/root/dev/kvm", info.vmm_pid)).unwrap();
    assert_eq!((kvm.uid(), kvm.mode() & 0o777), (uid, 0o600));
    let run = std::fs::metadata(&vm.run_dir).unwrap();
    assert_eq!((run.uid(), run.mode() & 0o777), (uid, 0o700));
    let claim = Path::new(crate::jail::ID_CLAIMS_DIR).join(uid.to_string());
    assert!(claim.exists());
    assert!(matches!(
        backend.start_vm(&vm).await,
        Err(Error::AlreadyRunning(_))
    ));
    backend.stop_vm().await.unwrap();
    for pid in &pids {
        assert!(!procinfo::pid::is_running(*pid));
    }
    assert!(backend.pids().is_empty());
    assert!(!info.agent_socket.exists());
    assert!(!claim.exists(), "the uid is given back at stop");
    backend.stop_vm().await.unwrap();
}

/// kata-vmm writes the serial console to the shim's pipe, which the shim keeps in
/// console.log (bounded: see `crate::console`).
#[tokio::test]
async fn the_serial_console_reaches_console_log() {
    let dir = tempfile::tempdir().unwrap();
    let Some((mut backend, vm)) = tiny_guest_backend(dir.path(), serial_guest) else {
        return;
    };
    let info = backend.start_vm(&vm).await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut seen = String::new();
    while std::time::Instant::now() < deadline {
        seen = std::fs::read_to_string(&info.console_log).unwrap_or_default();
        if seen.contains(SERIAL_MARKER) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    backend.stop_vm().await.unwrap();
    assert_eq!(seen, format!("{SERIAL_MARKER}\n"));
}

#[tokio::test]
async fn missing_kernel_is_reported_before_spawning() {
    let dir = tempfile::tempdir().unwrap();
    let mut backend = Vm::new(Builtin::new(config(dir.path()), crate::discard_logger()));
    let vm = VmConfig {
        sandbox_id: "sb1".into(),
        run_dir: dir.path().to_path_buf(),
        shared_dir: dir.path().to_path_buf(),
        debug: false,
        ..Default::default()
    };
    let e = backend.start_vm(&vm).await.unwrap_err().to_string();
    assert!(e.contains("vmlinux does not exist"), "{e}");
    assert!(backend.pids().is_empty());
}

#[tokio::test]
async fn a_vmm_that_fails_to_start_leaves_no_virtiofsd_behind() {
    let Some(vmm) = kata_vmm() else {
        skipped("needs kata-vmm built (cargo build -p vmm)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Files that exist but that kata-vmm cannot load: it exits during the build.
    std::fs::write(dir.path().join("vmlinux"), b"not an ELF").unwrap();
    std::fs::write(dir.path().join("initrd"), b"not an initrd").unwrap();
    let (mut backend, vm) = backend_in(dir.path(), vmm, dir.path().join("vmlinux"));
    let run_dir = vm.run_dir.clone();
    let e = backend.start_vm(&vm).await.unwrap_err().to_string();
    assert!(e.contains("kata-vmm"), "{e}");
    assert!(backend.pids().is_empty());
    // The virtiofsds were started first; they must be gone along with their sockets.
    for name in ["virtiofsd.sock", "virtiofsd-rootfs.sock"] {
        let socket = run_dir.join(name);
        assert!(!socket.exists(), "{name} left behind");
        let out = Command::new("pgrep")
            .args(["-f", &socket.display().to_string()])
            .output()
            .unwrap();
        assert!(out.stdout.is_empty(), "virtiofsd survived: {:?}", out);
    }
}

#[tokio::test]
async fn a_block_device_is_refused_saying_kata_vmm_cannot_attach_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut vm = Vm::new(Builtin::new(config(dir.path()), crate::discard_logger()));
    let file = std::fs::File::open("/dev/null").unwrap();
    let e = vm
        .add_block_device(file.into(), true)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("kata-vmm") && e.contains("RuntimeClass kata"),
        "{e}"
    );
}
