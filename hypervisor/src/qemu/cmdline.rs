//! Command lines of QEMU and its vhost-user helpers: pure functions from configuration
//! to argv, so they can be unit-tested and shown in logs.

use std::path::Path;

use kata_config::QemuConfig;

use super::layout::RunDirLayout;
use crate::accel::Accel;
use crate::console::CONSOLE_FD;
use crate::jail::{fd_path, FIRST_TAP_FD, INITRD_FD, KERNEL_FD};
use crate::kernel_cmdline::KernelCmdline;
use crate::SHARED_FS_TAG;
use protocols::{ROOTFS_FS_TAG, ROOTFS_SHARE_PARAM};

/// The guest kernel command line before the user's `kernel_params`. `reboot=t` with
/// `-no-reboot` makes a guest reboot (or panic, with `panic=-1`) end QEMU.
/// `no_timer_check`, as Kata's guests have it: on a loaded host the vCPU may not run
/// during the kernel's IO-APIC timer check, which then panics ("IO-APIC + timer doesn't
/// work!"); seen with 20 sandboxes starting at once on 2 cores.
///
/// `page_reporting.page_reporting_order=5`: free page reporting (the balloon below)
/// hands back free blocks of 128 KiB and up instead of the kernel's default, its page
/// block (4 MiB in our guest kernel), so that memory a workload frees piecemeal (socket
/// buffers, slab, page cache) goes back to the host too.
///
/// `io_delay=none`: the legacy drivers' "slow" port writes (PIC, PIT, RTC) are followed
/// by a write to port 0x80 that only old hardware needed, each an exit to the VMM under
/// KVM.
pub const BASE_KERNEL_PARAMS: &str =
    "console=ttyS0 reboot=t panic=-1 no_timer_check page_reporting.page_reporting_order=5 io_delay=none";
/// The guest CID (the only guest of its vsock backend).
pub const GUEST_CID: u32 = 3;
/// Descriptors per virtio-fs request queue.
const FS_QUEUE_SIZE: u32 = 1024;
/// TCG's translation cache, in MiB. QEMU's default lets it grow to 1 GiB per VM; this
/// leaves room for what a sandbox's boot and a short workload translate (a smaller cache
/// is flushed mid-boot, which slows it), while a long-running, code-hungry workload
/// recycles the cache instead of growing it.
pub const TCG_TB_SIZE_MIB: u32 = 64;
/// The guest CPU under TCG: everything QEMU can emulate, less the "fast string" hints
/// (ERMS, FSRM, FZRM, FSRS, FSRC). On hardware they make `rep movsb`/`rep stosb` the
/// fastest copy, so a guest that sees them copies and clears memory a byte per
/// iteration: the kernel's clear_page, memset, memcpy and copy to and from user space,
/// and glibc's large memcpy. TCG emulates each iteration as a guest memory access of
/// its own, so bytes cost eight times what quadwords do. Without the hints the guest
/// uses quadword loops: `dd if=/dev/zero of=/dev/null bs=1M count=256` in a guest fell
/// from 0.31 to 0.03 s, and the same through a pipe from 1.8 to 0.64 s. Under KVM the
/// guest gets the host's CPU, hints and all.
pub const TCG_CPU: &str = "max,erms=off,fsrm=off,fzrm=off,fsrs=off,fsrc=off";
/// The memory balloon: free page reporting, where the guest hands back the pages it
/// frees (in blocks of 128 KiB and up, a few seconds later), so a sandbox's host memory
/// follows what its guest uses now, not the most it ever used; and, in a VM booted with
/// room to grow, the memory its pod is not given (`super::balloon`).
const BALLOON: &str = "virtio-balloon-device,free-page-reporting=on";

/// Everything the QEMU command line depends on.
pub struct QemuLaunch<'a> {
    pub config: &'a QemuConfig,
    pub layout: &'a RunDirLayout,
    pub accel: Accel,
    pub sandbox_id: &'a str,
    pub debug: bool,
    /// NICs on taps (QEMU runs in the pod's network namespace, where they are).
    pub net: &'a [crate::NetDevice],
    /// Under TCG, the words that give the guest its clock (see `accel::tsc`).
    pub tcg_clock: Option<&'a str>,
    /// QEMU runs confined (see `crate::jail`): with its seccomp sandbox, the kernel and
    /// initrd on descriptors [`KERNEL_FD`] and [`INITRD_FD`], NIC `i`'s tap on
    /// [`FIRST_TAP_FD`]` + i`.
    pub confined: bool,
}

/// QEMU's seccomp filter: no obsolete system calls, no privilege changes, no new
/// processes or programs (a QMP `migrate` to `exec:` fails), no scheduler or resource
/// changes.
pub const QEMU_SANDBOX: &str =
    "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny";

/// Added under TCG only (bench/README.md has the measurements):
/// - `virtiofs.clear_reply_pages` (our kernel patch, `guest/patches/`): the guest CPU
///   zeroes each page before virtiofsd fills it. TCG drops translations only on writes it
///   sees, and virtiofsd writes through its own mapping, so a reused page could run stale
///   code. Cheaper than `init_on_alloc=1`, which a kernel without the patch needs instead.
/// - `nolapic_timer`: the LAPIC timer's calibration against the PIT is slow under TCG;
///   the PIT serves as clock event device. KVM needs no calibration and keeps it.
/// - `keep_initmem` (our kernel patch): the kernel keeps its translated init sections
///   instead of freeing them, since the first stores into freed code pages take TCG's slow
///   path. Under KVM freeing costs nothing and the memory is worth more.
pub const TCG_KERNEL_PARAMS: &str = "virtiofs.clear_reply_pages=1 nolapic_timer keep_initmem";

/// With the SCSI controller (`block_device_hotplug`): the guest kernel does not scan
/// its 256 targets at boot, which are empty (disks come later), nor on QEMU's hotplug
/// event; it scans a target when the agent asks, once the shim has added a disk there.
pub const SCSI_SCAN_PARAM: &str = "scsi_mod.scan=manual";

/// The guest kernel command line.
pub fn kernel_cmdline(
    config: &QemuConfig,
    accel: Accel,
    debug: bool,
    tcg_clock: Option<&str>,
) -> String {
    let tcg = accel == Accel::Tcg;
    let mut line = KernelCmdline::new(BASE_KERNEL_PARAMS, debug);
    // A VM with room to grow has every vCPU it may be given; the kernel brings up the
    // boot size, the agent the rest when the pod is resized (`cpuN/online`).
    let maxcpus = format!("maxcpus={}", config.default_vcpus);
    line.push_if(tcg, TCG_KERNEL_PARAMS)
        .push_if(tcg, tcg_clock.unwrap_or_default())
        .push_if(config.sizing.resize_vcpus > 0, &maxcpus)
        .push_if(config.rootfs_share().is_some(), ROOTFS_SHARE_PARAM)
        .push_if(config.block_device_hotplug, SCSI_SCAN_PARAM);
    line.finish(&config.kernel_params)
}

/// QEMU's arguments (without the program).
pub fn qemu_args(l: &QemuLaunch<'_>) -> Vec<String> {
    // With a resize ceiling the VM has the boot size plus the ceiling, and the balloon
    // (`super::balloon`) keeps the guest to what its pod is given.
    let mem = format!(
        "{}M",
        u64::from(l.config.default_memory) + u64::from(l.config.sizing.resize_memory)
    );
    let vcpus = l.config.default_vcpus + l.config.sizing.resize_vcpus;
    let (cpu, accel) = match l.accel {
        Accel::Kvm => ("host", "kvm".to_string()),
        Accel::Tcg => (TCG_CPU, format!("tcg,tb-size={TCG_TB_SIZE_MIB}")),
    };
    let args = [
        "-name".into(),
        format!("sandbox-{}", opt(l.sandbox_id)),
        "-M".into(),
        // The RTC stays: without it the guest's clock starts at 1970 (under TCG nothing
        // else gives it the date), and its kernel waits about 1 s at boot for the missing
        // CMOS to leave its update cycle.
        // No guest memory in QEMU's core dumps.
        "microvm,acpi=off,x-option-roms=off,memory-backend=mem,dump-guest-core=off".into(),
        "-accel".into(),
        accel,
        "-cpu".into(),
        cpu.into(),
        "-m".into(),
        mem.clone(),
        "-smp".into(),
        vcpus.to_string(),
        // vhost-user backends map guest memory, so it must be shareable.
        "-object".into(),
        format!("memory-backend-memfd,id=mem,size={mem},share=on"),
        "-nodefaults".into(),
        "-no-user-config".into(),
        "-nographic".into(),
        "-no-reboot".into(),
        "-kernel".into(),
        if l.confined {
            path(&fd_path(KERNEL_FD))
        } else {
            path(&l.config.kernel)
        },
        "-initrd".into(),
        if l.confined {
            path(&fd_path(INITRD_FD))
        } else {
            path(&l.config.initrd)
        },
        "-append".into(),
        kernel_cmdline(l.config, l.accel, l.debug, l.tcg_clock),
        // The console goes to a pipe the shim reads into its bounded log (`crate::console`).
        // `append=on`: without it QEMU opens the file with O_TRUNC, which no descriptor of
        // an fd set matches ("Could not open '/dev/fdset/3': Invalid argument").
        "-add-fd".into(),
        format!("fd={CONSOLE_FD},set={CONSOLE_FD}"),
        "-chardev".into(),
        format!("file,id=console,path=/dev/fdset/{CONSOLE_FD},append=on"),
        "-serial".into(),
        "chardev:console".into(),
        "-chardev".into(),
        format!(
            "socket,id=qmp,path={},server=on,wait=off",
            opt_path(&l.layout.qmp_socket)
        ),
        "-mon".into(),
        "chardev=qmp,mode=control".into(),
        "-chardev".into(),
        format!("socket,id=vsock,path={}", opt_path(&l.layout.vsock_socket)),
        "-device".into(),
        "vhost-user-vsock-device,chardev=vsock".into(),
    ];
    let mut args: Vec<String> = args.into();
    if l.confined {
        args.extend(["-sandbox".into(), QEMU_SANDBOX.into()]);
    }
    args.extend(fs_device("fs", &l.layout.fs.socket, SHARED_FS_TAG));
    if l.config.rootfs_share().is_some() {
        args.extend(fs_device(
            "rootfs",
            &l.layout.rootfs_fs.socket,
            ROOTFS_FS_TAG,
        ));
    }
    args.extend(["-device".into(), BALLOON.into()]);
    if l.config.block_device_hotplug {
        // Present from boot: microvm has no bus that takes a controller later.
        args.extend(["-device".into(), super::hotplug::SCSI_CONTROLLER.into()]);
    }
    for (i, nic) in l.net.iter().enumerate() {
        // The tap exists already (the shim made it, with its tc redirects); QEMU attaches
        // to it by name and runs no scripts, or, confined, gets it opened.
        let netdev = if l.confined {
            format!("tap,id=net{i},fd={}", FIRST_TAP_FD + i as i32)
        } else {
            format!(
                "tap,id=net{i},ifname={},script=no,downscript=no",
                opt(&nic.tap)
            )
        };
        args.extend([
            "-netdev".into(),
            netdev,
            "-device".into(),
            format!("virtio-net-device,netdev=net{i},mac={}", opt(&nic.mac)),
        ]);
    }
    args
}

/// A virtio-fs device with `tag`, served by the virtiofsd listening on `socket`.
fn fs_device(id: &str, socket: &Path, tag: &str) -> [String; 4] {
    [
        "-chardev".into(),
        format!("socket,id={id},path={}", opt_path(socket)),
        "-device".into(),
        format!("vhost-user-fs-device,chardev={id},tag={tag},queue-size={FS_QUEUE_SIZE}"),
    ]
}

/// vhost-device-vsock's arguments: one VM, hybrid vsock on the agent socket.
pub fn vsock_backend_args(layout: &RunDirLayout) -> Vec<String> {
    vec![
        "--vm".into(),
        format!(
            "guest-cid={GUEST_CID},socket={},uds-path={}",
            opt_path(&layout.vsock_socket),
            opt_path(&layout.agent_socket)
        ),
    ]
}

/// A path as an argument of its own. Run directories are UTF-8 (checked in `start_vm`).
fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// A path inside a comma-separated option list.
fn opt_path(p: &Path) -> String {
    opt(&p.to_string_lossy())
}

/// QEMU (and vhost-device-vsock's `--vm`) split options on ','; QEMU reads ",," as a
/// literal comma.
fn opt(s: &str) -> String {
    s.replace(',', ",,")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> QemuConfig {
        kata_config::Config::from_str(
            r#"
[hypervisor.qemu]
kernel = "/k/vmlinux"
initrd = "/k/initrd.img"
kernel_params = "agent.log=debug"
default_vcpus = 2
default_memory = 256
virtio_fs_cache = "never"
"#,
            "test.toml",
        )
        .unwrap()
        .hypervisor
        .qemu
    }

    /// A TCG launch of sandbox `x` without debug, NICs or clock words.
    fn launch<'a>(config: &'a QemuConfig, layout: &'a RunDirLayout) -> QemuLaunch<'a> {
        QemuLaunch {
            config,
            layout,
            accel: Accel::Tcg,
            sandbox_id: "x",
            debug: false,
            net: &[],
            tcg_clock: None,
            confined: false,
        }
    }

    fn joined(args: &[String]) -> String {
        args.join(" ")
    }

    #[test]
    fn qemu_command_line_for_tcg() {
        let config = config();
        let layout = RunDirLayout::new(Path::new("/run/vc/sb1"));
        let args = qemu_args(&QemuLaunch {
            sandbox_id: "sb1",
            ..launch(&config, &layout)
        });
        assert_eq!(
            joined(&args),
            "-name sandbox-sb1 \
             -M microvm,acpi=off,x-option-roms=off,memory-backend=mem,dump-guest-core=off \
             -accel tcg,tb-size=64 -cpu max,erms=off,fsrm=off,fzrm=off,fsrs=off,fsrc=off \
             -m 256M -smp 2 \
             -object memory-backend-memfd,id=mem,size=256M,share=on \
             -nodefaults -no-user-config -nographic -no-reboot \
             -kernel /k/vmlinux -initrd /k/initrd.img \
             -append console=ttyS0 reboot=t panic=-1 no_timer_check page_reporting.page_reporting_order=5 io_delay=none quiet virtiofs.clear_reply_pages=1 nolapic_timer keep_initmem agent.rootfs_share scsi_mod.scan=manual agent.log=debug \
             -add-fd fd=3,set=3 -chardev file,id=console,path=/dev/fdset/3,append=on -serial chardev:console \
             -chardev socket,id=qmp,path=/run/vc/sb1/qmp.sock,server=on,wait=off \
             -mon chardev=qmp,mode=control \
             -chardev socket,id=vsock,path=/run/vc/sb1/vhost-vsock.sock \
             -device vhost-user-vsock-device,chardev=vsock \
             -chardev socket,id=fs,path=/run/vc/sb1/virtiofsd.sock \
             -device vhost-user-fs-device,chardev=fs,tag=kataShared,queue-size=1024 \
             -chardev socket,id=rootfs,path=/run/vc/sb1/virtiofsd-rootfs.sock \
             -device vhost-user-fs-device,chardev=rootfs,tag=kataRootfs,queue-size=1024 \
             -device virtio-balloon-device,free-page-reporting=on \
             -device virtio-scsi-device,id=scsi0"
        );
        // The kernel command line is one argument.
        let i = args.iter().position(|a| a == "-append").unwrap();
        assert_eq!(
            args[i + 1],
            "console=ttyS0 reboot=t panic=-1 no_timer_check page_reporting.page_reporting_order=5 io_delay=none quiet virtiofs.clear_reply_pages=1 nolapic_timer keep_initmem agent.rootfs_share scsi_mod.scan=manual agent.log=debug"
        );
    }

    #[test]
    fn the_scsi_controller_is_there_only_with_block_device_hotplug() {
        let mut config = config();
        let layout = RunDirLayout::new(Path::new("/run/vc/sb1"));
        let has_controller =
            |c: &QemuConfig| joined(&qemu_args(&launch(c, &layout))).contains("virtio-scsi-device");
        assert!(config.block_device_hotplug, "on by default");
        assert!(has_controller(&config));
        config.block_device_hotplug = false;
        assert!(!has_controller(&config));
    }

    /// A resize ceiling: the VM has the boot size plus the ceiling, and the kernel brings
    /// up only the boot size's vCPUs; without one, neither.
    #[test]
    fn a_resize_ceiling_adds_vcpus_and_memory_the_kernel_keeps_offline() {
        let mut config = config();
        let layout = RunDirLayout::new(Path::new("/r"));
        let plain = joined(&qemu_args(&launch(&config, &layout)));
        assert!(plain.contains("-m 256M -smp 2 "), "{plain}");
        assert!(!plain.contains("maxcpus"), "{plain}");
        config.sizing.resize_vcpus = 3;
        config.sizing.resize_memory = 1024;
        let s = joined(&qemu_args(&launch(&config, &layout)));
        assert!(s.contains("-m 1280M -smp 5 "), "{s}");
        assert!(s.contains("size=1280M,share=on"), "{s}");
        assert!(s.contains(" maxcpus=2 "), "{s}");
    }

    #[test]
    fn kvm_uses_host_cpu_and_debug_drops_quiet() {
        let config = config();
        let layout = RunDirLayout::new(Path::new("/r"));
        let args = qemu_args(&QemuLaunch {
            accel: Accel::Kvm,
            debug: true,
            ..launch(&config, &layout)
        });
        let s = joined(&args);
        assert!(s.contains("-accel kvm -cpu host"), "{s}");
        assert!(s.contains("-cpu host"), "{s}");
        assert!(!s.contains("quiet"), "{s}");
        assert!(s.contains(" agent.log=debug "), "{s}");
    }

    /// One cache policy for volumes and root filesystems: one virtio-fs device, and no
    /// word telling the agent to look for a second.
    #[test]
    fn one_policy_means_one_share() {
        let mut config = config();
        config.virtio_fs_rootfs_cache = config.virtio_fs_cache;
        let layout = RunDirLayout::new(Path::new("/r"));
        let s = joined(&qemu_args(&QemuLaunch {
            accel: Accel::Kvm,
            ..launch(&config, &layout)
        }));
        assert_eq!(s.matches("vhost-user-fs-device").count(), 1, "{s}");
        assert!(s.contains("tag=kataShared"), "{s}");
        assert!(!s.contains("kataRootfs"), "{s}");
        assert!(!s.contains(ROOTFS_SHARE_PARAM), "{s}");
    }

    #[test]
    fn empty_kernel_params_add_nothing() {
        let mut config = config();
        config.kernel_params = "  ".into();
        config.virtio_fs_rootfs_cache = config.virtio_fs_cache;
        config.block_device_hotplug = false;
        assert_eq!(
            kernel_cmdline(&config, Accel::Kvm, false, Some("tsc_early_khz=1")),
            "console=ttyS0 reboot=t panic=-1 no_timer_check page_reporting.page_reporting_order=5 io_delay=none quiet"
        );
    }

    #[test]
    fn commas_in_paths_are_escaped_in_option_lists() {
        let config = config();
        let layout = RunDirLayout::new(Path::new("/run/a,b"));
        let s = joined(&qemu_args(&QemuLaunch {
            sandbox_id: "id,x",
            ..launch(&config, &layout)
        }));
        assert!(s.contains("path=/run/a,,b/qmp.sock"), "{s}");
        assert!(s.contains("-name sandbox-id,,x"), "{s}");
        assert!(joined(&vsock_backend_args(&layout)).contains("socket=/run/a,,b/vhost-vsock.sock"));
    }

    #[test]
    fn each_nic_is_a_tap_netdev_with_the_pods_mac() {
        let config = config();
        let layout = RunDirLayout::new(Path::new("/r"));
        let net = [
            crate::NetDevice {
                tap: "tap0_kata".into(),
                mac: "0a:58:0a:58:00:05".into(),
            },
            crate::NetDevice {
                tap: "tap1_kata".into(),
                mac: "0a:58:0a:59:00:07".into(),
            },
        ];
        let s = joined(&qemu_args(&QemuLaunch {
            net: &net,
            tcg_clock: Some("tsc_early_khz=2600000 tsc=reliable"),
            ..launch(&config, &layout)
        }));
        assert!(
            s.contains("nolapic_timer keep_initmem tsc_early_khz=2600000 tsc=reliable agent.rootfs_share scsi_mod.scan=manual agent.log=debug"),
            "{s}"
        );
        assert!(
            s.ends_with(
                "-netdev tap,id=net0,ifname=tap0_kata,script=no,downscript=no \
                 -device virtio-net-device,netdev=net0,mac=0a:58:0a:58:00:05 \
                 -netdev tap,id=net1,ifname=tap1_kata,script=no,downscript=no \
                 -device virtio-net-device,netdev=net1,mac=0a:58:0a:59:00:07"
            ),
            "{s}"
        );
    }

    #[test]
    fn a_confined_qemu_gets_its_sandbox_and_its_files_as_descriptors() {
        let config = config();
        let layout = RunDirLayout::new(Path::new("/r"));
        let net = [crate::NetDevice {
            tap: "tap0_kata".into(),
            mac: "0a:58:0a:58:00:05".into(),
        }];
        let s = joined(&qemu_args(&QemuLaunch {
            net: &net,
            confined: true,
            ..launch(&config, &layout)
        }));
        assert!(
            s.contains(
                " -sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"
            ),
            "{s}"
        );
        assert!(
            s.contains("-kernel /proc/self/fd/4 -initrd /proc/self/fd/5 "),
            "{s}"
        );
        assert!(s.contains("-netdev tap,id=net0,fd=10 "), "{s}");
        assert!(!s.contains("ifname"), "{s}");
        // Unconfined, none of it.
        let s = joined(&qemu_args(&QemuLaunch {
            net: &net,
            ..launch(&config, &layout)
        }));
        assert!(
            !s.contains("-sandbox") && !s.contains("/proc/self/fd"),
            "{s}"
        );
    }

    #[test]
    fn vsock_backend_command_line() {
        let layout = RunDirLayout::new(Path::new("/run/vc/sb1"));
        assert_eq!(
            vsock_backend_args(&layout),
            vec![
                "--vm".to_string(),
                "guest-cid=3,socket=/run/vc/sb1/vhost-vsock.sock,\
                 uds-path=/run/vc/sb1/kata.hvsock"
                    .to_string()
            ]
        );
    }
}
