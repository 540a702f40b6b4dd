//! Unit tests of parsing and validation.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::*;

const ORIGIN: &str = "/etc/kata-containers/configuration.toml";

fn parse(text: &str) -> Result<Config, Error> {
    Config::from_str(text, ORIGIN)
}

fn err(text: &str) -> String {
    parse(text).unwrap_err().to_string()
}

#[test]
fn empty_file_gives_defaults() {
    let c = parse("").unwrap();
    let q = &c.hypervisor.qemu;
    assert_eq!(q.path, PathBuf::from("/usr/bin/qemu-system-x86_64"));
    assert_eq!(
        q.kernel,
        PathBuf::from("/usr/share/kata-containers/vmlinux")
    );
    assert_eq!(
        q.initrd,
        PathBuf::from("/usr/share/kata-containers/kata-initrd.img")
    );
    assert_eq!(q.kernel_params, "");
    assert_eq!(q.default_vcpus, 1);
    assert_eq!(q.default_memory, 512);
    assert_eq!(q.shared_fs, SharedFs::VirtioFs);
    assert_eq!(
        q.virtio_fs_daemon,
        PathBuf::from("/usr/local/bin/virtiofsd")
    );
    assert_eq!(q.virtio_fs_cache, VirtioFsCache::Auto);
    assert_eq!(q.virtio_fs_rootfs_cache, VirtioFsCache::Always);
    assert_eq!(q.rootfs_share(), Some(VirtioFsCache::Always));
    assert_eq!(
        c.hypervisor.builtin.rootfs_share(),
        Some(VirtioFsCache::Always)
    );
    assert_eq!(q.vsock_backend, PathBuf::from("/usr/local/bin/kata-vsock"));
    assert_eq!(q.accelerator, Accelerator::Auto);
    assert_eq!(c.agent.kata.dial_timeout, Duration::from_secs(30));
    assert!(!c.agent.kata.debug_console_enabled);
    assert!(!c.runtime.enable_debug);
    assert_eq!(c.origin, PathBuf::from(ORIGIN));
}

#[test]
fn shipped_file_parses_and_equals_defaults() {
    let shipped = Config::from_str(SHIPPED_CONFIGURATION, "<defaults>").unwrap();
    assert_eq!(shipped, Config::defaults());
}

#[test]
fn full_file_is_read() {
    let c = parse(
        r#"
[hypervisor.qemu]
path = "/opt/qemu/bin/qemu-system-x86_64"
kernel = "/k/vmlinux"
initrd = "/k/initrd.img"
kernel_params = "agent.log=debug systemd.unit=x"
default_vcpus = 4
default_memory = 2048
shared_fs = "virtio-fs"
virtio_fs_daemon = "/opt/virtiofsd"
virtio_fs_cache = "never"
vsock_backend = "/opt/vsock"
accelerator = "tcg"
[agent.kata]
dial_timeout = 5
debug_console_enabled = true
[runtime]
enable_debug = true
"#,
    )
    .unwrap();
    let q = &c.hypervisor.qemu;
    assert_eq!(q.path, PathBuf::from("/opt/qemu/bin/qemu-system-x86_64"));
    assert_eq!(q.kernel, PathBuf::from("/k/vmlinux"));
    assert_eq!(q.initrd, PathBuf::from("/k/initrd.img"));
    assert_eq!(q.kernel_params, "agent.log=debug systemd.unit=x");
    assert_eq!(q.default_vcpus, 4);
    assert_eq!(q.default_memory, 2048);
    assert_eq!(q.virtio_fs_daemon, PathBuf::from("/opt/virtiofsd"));
    assert_eq!(q.virtio_fs_cache, VirtioFsCache::Never);
    assert_eq!(q.vsock_backend, PathBuf::from("/opt/vsock"));
    assert_eq!(q.accelerator, Accelerator::Tcg);
    assert_eq!(c.agent.kata.dial_timeout, Duration::from_secs(5));
    assert!(c.agent.kata.debug_console_enabled);
    assert!(c.runtime.enable_debug);
}

#[test]
fn partial_sections_keep_other_defaults() {
    let c = parse("[hypervisor.qemu]\ndefault_memory = 1024\n").unwrap();
    assert_eq!(c.hypervisor.qemu.default_memory, 1024);
    assert_eq!(c.hypervisor.qemu.default_vcpus, 1);
    assert_eq!(c.agent.kata.dial_timeout, Duration::from_secs(30));
}

#[test]
fn every_choice_word_is_accepted() {
    for a in Accelerator::ALL {
        let c = parse(&format!("[hypervisor.qemu]\naccelerator = \"{a}\"\n")).unwrap();
        assert_eq!(c.hypervisor.qemu.accelerator, *a);
    }
    for v in VirtioFsCache::ALL {
        let c = parse(&format!("[hypervisor.qemu]\nvirtio_fs_cache = \"{v}\"\n")).unwrap();
        assert_eq!(c.hypervisor.qemu.virtio_fs_cache, *v);
    }
}

/// The rootfs share exists only when its policy differs from the volumes': one policy
/// for both means one virtiofsd.
#[test]
fn rootfs_share_only_when_the_two_policies_differ() {
    let same = parse("[hypervisor.qemu]\nvirtio_fs_cache = \"always\"\n").unwrap();
    assert_eq!(same.hypervisor.qemu.rootfs_share(), None);
    let same = parse(
        "[hypervisor.builtin]\nvirtio_fs_cache = \"never\"\nvirtio_fs_rootfs_cache = \"never\"\n",
    )
    .unwrap();
    assert_eq!(same.hypervisor.builtin.rootfs_share(), None);
    let differ = parse("[hypervisor.qemu]\nvirtio_fs_rootfs_cache = \"never\"\n").unwrap();
    assert_eq!(
        differ.hypervisor.qemu.rootfs_share(),
        Some(VirtioFsCache::Never)
    );
    assert_eq!(
        err("[hypervisor.builtin]\nvirtio_fs_rootfs_cache = \"forever\"\n"),
        format!(
            "{ORIGIN}: hypervisor.builtin.virtio_fs_rootfs_cache = \"forever\": \
             expected one of never, auto, always"
        )
    );
}

#[test]
fn bad_accelerator_names_file_key_and_choices() {
    assert_eq!(
        err("[hypervisor.qemu]\naccelerator = \"foo\"\n"),
        "/etc/kata-containers/configuration.toml: hypervisor.qemu.accelerator = \"foo\": \
         expected one of auto, kvm, tcg"
    );
}

#[test]
fn bad_shared_fs_and_cache_list_choices() {
    assert_eq!(
        err("[hypervisor.qemu]\nshared_fs = \"virtio-9p\"\n"),
        format!("{ORIGIN}: hypervisor.qemu.shared_fs = \"virtio-9p\": expected one of virtio-fs")
    );
    assert_eq!(
        err("[hypervisor.qemu]\nvirtio_fs_cache = \"metadata\"\n"),
        format!(
            "{ORIGIN}: hypervisor.qemu.virtio_fs_cache = \"metadata\": \
             expected one of never, auto, always"
        )
    );
}

#[test]
fn zero_vcpus_rejected() {
    assert_eq!(
        err("[hypervisor.qemu]\ndefault_vcpus = 0\n"),
        format!(
            "{ORIGIN}: hypervisor.qemu.default_vcpus = 0: expected a number of vCPUs from 1 to 255"
        )
    );
    assert!(err("[hypervisor.qemu]\ndefault_vcpus = 256\n").contains("default_vcpus = 256"));
    assert!(parse("[hypervisor.qemu]\ndefault_vcpus = 255\n").is_ok());
}

#[test]
fn small_memory_rejected() {
    assert_eq!(
        err("[hypervisor.qemu]\ndefault_memory = 63\n"),
        format!("{ORIGIN}: hypervisor.qemu.default_memory = 63: expected at least 64 (MiB)")
    );
    assert!(parse("[hypervisor.qemu]\ndefault_memory = 64\n").is_ok());
}

#[test]
fn zero_dial_timeout_rejected() {
    let msg = err("[agent.kata]\ndial_timeout = 0\n");
    assert!(msg.starts_with(ORIGIN), "{msg}");
    assert!(msg.contains("agent.kata.dial_timeout = 0"), "{msg}");
}

#[test]
fn relative_paths_rejected() {
    for key in [
        "path",
        "kernel",
        "initrd",
        "virtio_fs_daemon",
        "vsock_backend",
    ] {
        let msg = err(&format!("[hypervisor.qemu]\n{key} = \"vmlinux\"\n"));
        assert_eq!(
            msg,
            format!("{ORIGIN}: hypervisor.qemu.{key} = \"vmlinux\": expected an absolute path")
        );
    }
}

#[test]
fn multi_line_kernel_params_rejected() {
    let msg = err("[hypervisor.qemu]\nkernel_params = \"a\\nb\"\n");
    assert!(
        msg.contains("hypervisor.qemu.kernel_params = \"a\\nb\": expected a single line"),
        "{msg}"
    );
}

#[test]
fn unknown_key_is_an_error_with_the_file() {
    let msg = err("[hypervisor.qemu]\nmemory = 512\n");
    assert!(msg.starts_with(&format!("{ORIGIN}: ")), "{msg}");
    assert!(msg.contains("unknown field `memory`"), "{msg}");
    assert!(msg.contains("line 2"), "{msg}");
}

#[test]
fn builtin_hypervisor_is_selected_by_name() {
    let c = parse(
        "[runtime]\nhypervisor_name = \"builtin\"\n[hypervisor.builtin]\ndefault_vcpus = 2\n",
    )
    .unwrap();
    assert_eq!(c.runtime.hypervisor_name, crate::HypervisorName::Builtin);
    assert_eq!(c.hypervisor.builtin.default_vcpus, 2);
    assert_eq!(
        c.hypervisor.builtin.path,
        std::path::PathBuf::from("/usr/local/bin/kata-vmm")
    );
    assert_eq!(
        parse("").unwrap().runtime.hypervisor_name,
        crate::HypervisorName::Qemu
    );
    assert!(err("[runtime]\nhypervisor_name = \"clh\"\n").contains("expected one of qemu, builtin"));
    assert!(err("[hypervisor.builtin]\ndefault_vcpus = 33\n").contains("from 1 to 32"));
    assert_eq!(
        c.hypervisor.builtin.virtio_fs_daemon,
        std::path::PathBuf::from("/usr/local/bin/virtiofsd")
    );
    let c = parse("[hypervisor.builtin]\nvirtio_fs_cache = \"never\"\n").unwrap();
    assert_eq!(c.hypervisor.builtin.virtio_fs_cache, VirtioFsCache::Never);
    assert!(
        err("[hypervisor.builtin]\nvirtio_fs_cache = \"sometimes\"\n")
            .contains("hypervisor.builtin.virtio_fs_cache")
    );
}

#[test]
fn unknown_sections_are_errors() {
    assert!(
        err("[hypervisor.firecracker]\npath = \"/x\"\n").contains("unknown field `firecracker`")
    );
    assert!(err("[shim]\n").contains("unknown field `shim`"));
    assert!(err("[runtime]\nenable_tracing = true\n").contains("unknown field `enable_tracing`"));
    assert!(err("[agent.kata]\ndebug = true\n").contains("unknown field `debug`"));
}

#[test]
fn wrong_types_are_errors_with_the_file() {
    let msg = err("[hypervisor.qemu]\ndefault_vcpus = \"2\"\n");
    assert!(msg.starts_with(ORIGIN), "{msg}");
    assert!(
        msg.contains("default_vcpus") || msg.contains("line 2"),
        "{msg}"
    );
    let msg = err("[hypervisor.qemu]\ndefault_memory = -1\n");
    assert!(msg.starts_with(ORIGIN), "{msg}");
    let msg = err("[runtime]\nenable_debug = \"yes\"\n");
    assert!(msg.starts_with(ORIGIN), "{msg}");
}

#[test]
fn broken_toml_is_an_error_with_the_file() {
    let msg = err("[hypervisor.qemu\n");
    assert!(msg.starts_with(ORIGIN), "{msg}");
    assert!(msg.contains("line 1"), "{msg}");
}

#[test]
fn load_from_reads_a_file_and_names_it_in_errors() {
    let dir = std::env::temp_dir().join(format!("kata-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.toml");
    std::fs::write(&good, "[runtime]\nenable_debug = true\n").unwrap();
    let c = Config::load_from(&good).unwrap();
    assert!(c.runtime.enable_debug);
    assert_eq!(c.origin, good);

    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[hypervisor.qemu]\naccelerator = \"xen\"\n").unwrap();
    let msg = Config::load_from(&bad).unwrap_err().to_string();
    assert!(msg.starts_with(&format!("{}: ", bad.display())), "{msg}");

    let missing = dir.join("missing.toml");
    let msg = Config::load_from(&missing).unwrap_err().to_string();
    assert!(msg.contains("missing.toml: cannot read"), "{msg}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn validate_paths_reports_the_missing_one() {
    let dir = std::env::temp_dir().join(format!("kata-config-paths-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = |name: &str| {
        let p = dir.join(name);
        std::fs::write(&p, "#!/bin/sh\n").unwrap();
        let mut perm = std::fs::metadata(&p).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
        std::fs::set_permissions(&p, perm).unwrap();
        p
    };
    let qemu = exe("qemu");
    let fsd = exe("virtiofsd");
    let vsock = exe("vsock");
    let kernel = dir.join("vmlinux");
    std::fs::write(&kernel, "").unwrap();
    let initrd = dir.join("initrd");
    std::fs::write(&initrd, "").unwrap();
    let text = |kernel: &Path, qemu: &Path| {
        format!(
            "[hypervisor.qemu]\npath = {:?}\nkernel = {:?}\ninitrd = {:?}\n\
             virtio_fs_daemon = {:?}\nvsock_backend = {:?}\n",
            qemu, kernel, initrd, fsd, vsock
        )
    };
    parse(&text(&kernel, &qemu))
        .unwrap()
        .validate_paths()
        .unwrap();

    let missing = dir.join("no-vmlinux");
    let msg = parse(&text(&missing, &qemu))
        .unwrap()
        .validate_paths()
        .unwrap_err()
        .to_string();
    assert_eq!(
        msg,
        format!(
            "{ORIGIN}: hypervisor.qemu.kernel = \"{}\": the file does not exist",
            missing.display()
        )
    );

    // A kernel is a file, not a directory; the QEMU binary must be executable.
    let msg = parse(&text(&dir, &qemu))
        .unwrap()
        .validate_paths()
        .unwrap_err()
        .to_string();
    assert!(msg.ends_with("expected a regular file"), "{msg}");
    let msg = parse(&text(&kernel, &kernel))
        .unwrap()
        .validate_paths()
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("hypervisor.qemu.path") && msg.ends_with("the file is not executable"),
        "{msg}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn defaults_paths_are_checked_not_assumed() {
    // The defaults name real install locations; on a dev host they may be missing, and
    // validate_paths must then say which key, not panic.
    if let Err(e) = Config::defaults().validate_paths() {
        assert!(e.to_string().contains("hypervisor.qemu."), "{e}");
    }
}

#[test]
fn debug_console_is_off_unless_set_to_a_boolean() {
    assert!(
        !parse("[agent.kata]\n")
            .unwrap()
            .agent
            .kata
            .debug_console_enabled
    );
    let on = parse("[agent.kata]\ndebug_console_enabled = true\n").unwrap();
    assert!(on.agent.kata.debug_console_enabled);
    // Kata's spelling only, and a boolean: a string or a misplaced key is an error.
    let msg = err("[agent.kata]\ndebug_console_enabled = \"yes\"\n");
    assert!(msg.starts_with(ORIGIN), "{msg}");
    assert!(msg.contains("debug_console_enabled"), "{msg}");
    assert!(err("[runtime]\ndebug_console_enabled = true\n")
        .contains("unknown field `debug_console_enabled`"));
}

#[test]
fn pod_sizing_defaults_and_caps() {
    let c = parse("").unwrap();
    let want = PodSizing {
        max_vcpus: 0,
        max_memory: 0,
        vcpus_overhead: 0,
        memory_overhead: POD_MEMORY_OVERHEAD_MIB,
        resize_vcpus: 0,
        resize_memory: 0,
    };
    assert_eq!(c.hypervisor.qemu.sizing, want);
    assert_eq!(c.hypervisor.builtin.sizing, want);
    let c = parse("[hypervisor.qemu]\ndefault_maxvcpus = 4\ndefault_maxmemory = 8192\npod_memory_overhead = 128\n").unwrap();
    assert_eq!(
        (
            c.hypervisor.qemu.sizing.max_vcpus,
            c.hypervisor.qemu.sizing.max_memory
        ),
        (4, 8192)
    );
    assert_eq!(c.hypervisor.qemu.sizing.memory_overhead, 128);
    // The resize ceiling: QEMU's only (kata-vmm has no balloon), at most MAX_VCPUS more.
    let c = parse("[hypervisor.qemu]\npod_resize_vcpus = 2\npod_resize_memory = 2048\n").unwrap();
    let s = &c.hypervisor.qemu.sizing;
    assert_eq!((s.resize_vcpus, s.resize_memory), (2, 2048));
    assert!(err("[hypervisor.qemu]\npod_resize_vcpus = 1000\n").contains("pod_resize_vcpus"));
    assert!(err("[hypervisor.builtin]\npod_resize_vcpus = 1\n").contains("pod_resize_vcpus"));
    // A cap below the default size, or past what the VMM can take, is refused.
    let e = err("[hypervisor.qemu]\ndefault_vcpus = 2\ndefault_maxvcpus = 1\n");
    assert!(e.contains("hypervisor.qemu.default_maxvcpus = 1"), "{e}");
    assert!(err("[hypervisor.builtin]\ndefault_maxvcpus = 33\n").contains("to 32"));
    let e = err("[hypervisor.qemu]\ndefault_maxmemory = 256\n");
    assert!(
        e.contains("hypervisor.qemu.default_maxmemory = 256") && e.contains("at least 512"),
        "{e}"
    );
}

#[test]
fn host_processes_are_sandboxed_by_default_and_the_range_is_checked() {
    let c = parse("").unwrap();
    let want = HostProcesses {
        sandboxed: true,
        uid_start: HOST_UID_START,
        uid_count: HOST_UID_COUNT,
    };
    assert_eq!(c.hypervisor.qemu.host_processes, want);
    assert_eq!(c.hypervisor.builtin.host_processes, want);
    let c = parse("[hypervisor.qemu]\nsandbox_host_processes = false\n").unwrap();
    assert!(!c.hypervisor.qemu.host_processes.sandboxed);
    assert!(c.hypervisor.builtin.host_processes.sandboxed);
    let e = err("[hypervisor.qemu]\nhost_uid_start = 1000\n");
    assert!(
        e.contains("hypervisor.qemu.host_uid_start = 1000") && e.contains("at least 65536"),
        "{e}"
    );
    let e = err("[hypervisor.builtin]\nhost_uid_start = 4294967000\nhost_uid_count = 1000\n");
    assert!(
        e.contains("hypervisor.builtin.host_uid_count = 1000") && e.contains("1 to 295"),
        "{e}"
    );
    assert!(err("[hypervisor.qemu]\nhost_uid_count = 0\n").contains("host_uid_count = 0"));
}

#[test]
fn the_pool_is_off_by_default_and_set_with_katas_keys() {
    let c = parse("").unwrap();
    assert_eq!(c.factory.vm_cache_number, 0);
    assert!(!c.factory.enabled());
    assert_eq!(c.factory.vm_cache_dir, PathBuf::from(DEFAULT_VM_CACHE_DIR));
    let c = parse("[factory]\nvm_cache_number = 2\nvm_cache_dir = \"/run/pool\"\n").unwrap();
    assert!(c.factory.enabled());
    assert_eq!(c.factory.vm_cache_number, 2);
    assert_eq!(c.factory.vm_cache_dir, PathBuf::from("/run/pool"));
    let e = err("[factory]\nvm_cache_dir = \"pool\"\n");
    assert!(
        e.contains("factory.vm_cache_dir") && e.contains("absolute"),
        "{e}"
    );
    let e = err("[factory]\nvm_cache_number = 1000\n");
    assert!(
        e.contains("factory.vm_cache_number = 1000") && e.contains("0 (no pool) to 64"),
        "{e}"
    );
    assert!(err("[factory]\nvm_cache_numbr = 1\n").contains("vm_cache_numbr"));
}

#[test]
fn templates_are_refused_with_the_reason_and_the_alternative() {
    assert!(parse("[factory]\nenable_template = false\n").is_ok());
    let e = err("[factory]\nenable_template = true\n");
    assert!(
        e.contains("factory.enable_template = true")
            && e.contains("not supported")
            && e.contains("vhost-user-vsock")
            && e.contains("vm_cache_number"),
        "{e}"
    );
}

/// A configuration file with drop-ins in a directory of its own, removed on drop.
struct DropInDir(PathBuf);

impl DropInDir {
    fn new(name: &str, main: &str, drop_ins: &[(&str, &str)]) -> Self {
        let dir =
            std::env::temp_dir().join(format!("kata-config-dropin-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join(DROP_IN_DIR)).unwrap();
        std::fs::write(dir.join("configuration.toml"), main).unwrap();
        for (file, text) in drop_ins {
            std::fs::write(dir.join(DROP_IN_DIR).join(file), text).unwrap();
        }
        Self(dir)
    }

    fn file(&self) -> PathBuf {
        self.0.join("configuration.toml")
    }

    fn drop_in(&self, name: &str) -> PathBuf {
        self.0.join(DROP_IN_DIR).join(name)
    }
}

impl Drop for DropInDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn drop_ins_apply_in_name_order_over_the_file() {
    let d = DropInDir::new(
        "order",
        "[hypervisor.qemu]\ndefault_vcpus = 2\ndefault_memory = 1024\n",
        &[
            // Written out of order: the names decide.
            (
                "20-later.toml",
                "[hypervisor.qemu]\ndefault_memory = 2048\n",
            ),
            (
                "10-first.toml",
                "[hypervisor.qemu]\ndefault_memory = 768\nkernel = \"/opt/kata/vmlinux\"\n",
            ),
            ("notes.txt", "not toml, not read"),
            (".10-first.toml.swp", "not read"),
        ],
    );
    let (c, layers) = Config::load_layers(&d.file()).unwrap();
    assert_eq!(c.hypervisor.qemu.default_memory, 2048);
    assert_eq!(c.hypervisor.qemu.default_vcpus, 2, "the file's key stays");
    assert_eq!(c.hypervisor.qemu.kernel, PathBuf::from("/opt/kata/vmlinux"));
    assert_eq!(c.origin, d.file());
    let paths: Vec<_> = layers.iter().map(|l| l.path.clone()).collect();
    assert_eq!(
        paths,
        vec![
            d.file(),
            d.drop_in("10-first.toml"),
            d.drop_in("20-later.toml")
        ]
    );
    assert_eq!(
        Config::load_from(&d.file())
            .unwrap()
            .hypervisor
            .qemu
            .default_memory,
        2048
    );
}

#[test]
fn no_drop_in_dir_is_the_file_alone() {
    let d = DropInDir::new("none", "[hypervisor.qemu]\ndefault_vcpus = 3\n", &[]);
    std::fs::remove_dir(d.0.join(DROP_IN_DIR)).unwrap();
    let (c, layers) = Config::load_layers(&d.file()).unwrap();
    assert_eq!(c.hypervisor.qemu.default_vcpus, 3);
    assert_eq!(layers.len(), 1);
}

#[test]
fn a_drop_in_with_an_unknown_key_fails_naming_it() {
    let d = DropInDir::new(
        "unknown",
        "",
        &[("50-op.toml", "[hypervisor.qemu]\ndefault_vcpu = 2\n")],
    );
    let msg = Config::load_from(&d.file()).unwrap_err().to_string();
    assert!(
        msg.starts_with(&d.drop_in("50-op.toml").display().to_string()),
        "{msg}"
    );
    assert!(msg.contains("default_vcpu"), "{msg}");
}

#[test]
fn a_drop_in_with_a_bad_value_fails_naming_it() {
    let d = DropInDir::new(
        "bad",
        "[hypervisor.qemu]\naccelerator = \"tcg\"\n",
        &[
            ("10-ok.toml", "[hypervisor.qemu]\ndefault_vcpus = 2\n"),
            ("20-bad.toml", "[hypervisor.qemu]\naccelerator = \"fast\"\n"),
        ],
    );
    let msg = Config::load_from(&d.file()).unwrap_err().to_string();
    assert!(
        msg.starts_with(&d.drop_in("20-bad.toml").display().to_string()),
        "{msg}"
    );
    assert!(msg.contains("hypervisor.qemu.accelerator"), "{msg}");
    // A wrong type and broken TOML too.
    let d = DropInDir::new(
        "type",
        "",
        &[(
            "10-type.toml",
            "[hypervisor.qemu]\ndefault_vcpus = \"two\"\n",
        )],
    );
    let msg = Config::load_from(&d.file()).unwrap_err().to_string();
    assert!(
        msg.starts_with(&d.drop_in("10-type.toml").display().to_string()),
        "{msg}"
    );
    let d = DropInDir::new("syntax", "", &[("10-broken.toml", "[hypervisor.qemu\n")]);
    let msg = Config::load_from(&d.file()).unwrap_err().to_string();
    assert!(
        msg.starts_with(&d.drop_in("10-broken.toml").display().to_string()),
        "{msg}"
    );
}

#[test]
fn a_bad_main_file_is_named_before_its_drop_ins() {
    let d = DropInDir::new(
        "main",
        "[hypervisor.qemu]\ndefault_vcpus = 0\n",
        &[("10-ok.toml", "[hypervisor.qemu]\ndefault_memory = 1024\n")],
    );
    let msg = Config::load_from(&d.file()).unwrap_err().to_string();
    assert!(msg.starts_with(&d.file().display().to_string()), "{msg}");
}
