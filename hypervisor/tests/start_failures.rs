//! start_vm failures with stand-in programs (no guest needed): the error names the step
//! and quotes its log, a virtiofsd that cannot confine itself fails the start (it is
//! never run unconfined), and nothing started before the failing step is left running.

use hypervisor::{new_hypervisor, Hypervisor};

mod common;
use common::{Binaries, Sandbox, SERIAL, VIRTIOFSD};

fn failing_qemu(sb: &Sandbox) -> std::path::PathBuf {
    sb.script(
        "qemu",
        "echo 'fake qemu: cannot start the machine' >&2\nexit 1",
    )
}

/// start_vm with a QEMU that fails and a virtiofsd that, when its arguments match the
/// shell `case` pattern `when`, prints `says` and exits with `status` (else it is the real
/// one): the backend, and the error as text.
async fn start_with_failing_virtiofsd(
    sb: &Sandbox,
    when: &str,
    says: &str,
    status: u8,
) -> (Box<dyn Hypervisor>, String) {
    let virtiofsd = sb.script(
        "virtiofsd",
        &format!(
            "case \"$*\" in {when}) echo '{says}' >&2; exit {status};; esac\n\
             exec {VIRTIOFSD} \"$@\""
        ),
    );
    let bins = Binaries {
        qemu: failing_qemu(sb),
        virtiofsd,
        ..Binaries::default()
    };
    let (kernel, initrd) = fake_guest(sb);
    let cfg = sb.config_with(&bins, &kernel, &initrd);
    let mut hv = new_hypervisor(&cfg, hypervisor::discard_logger());
    let err = hv.start_vm(&sb.vm_config()).await.unwrap_err().to_string();
    (hv, err)
}

/// A virtiofsd that cannot make its namespaces (as in some containers) fails the start
/// with its own words and what to do; no virtiofsd is ever started unconfined.
#[tokio::test]
async fn virtiofsd_that_cannot_confine_itself_fails_the_start() {
    let _serial = SERIAL.lock().await;
    if !common::helpers_installed() {
        return;
    }
    let sb = Sandbox::new();
    let (hv, err) = start_with_failing_virtiofsd(
        &sb,
        // The share's (the rootfs share's starts beside it and is stopped).
        "*/virtiofsd.sock*'--sandbox namespace'*",
        "fake: unshare: Operation not permitted",
        1,
    )
    .await;
    eprintln!("{err}");
    assert!(
        err.starts_with("starting virtiofsd failed: it exited with status 1"),
        "{err}"
    );
    assert!(err.contains("never started without them"), "{err}");
    assert!(
        err.contains("virtiofsd.log:\nfake: unshare: Operation not permitted"),
        "{err}"
    );
    let fs_log = std::fs::read_to_string(sb.vm_config().run_dir.join("virtiofsd.log")).unwrap();
    assert!(
        !fs_log.contains("Waiting for vhost-user socket"),
        "a virtiofsd was started after the confined one failed:\n{fs_log}"
    );
    assert!(hv.pids().is_empty());
    assert_eq!(sb.leftovers(), Vec::<i32>::new());
}

/// The installed virtiofsd takes the confinement options every start gives it (see
/// `virtiofsd::CONFINEMENT`) and serves.
#[tokio::test]
async fn virtiofsd_runs_confined() {
    let _serial = SERIAL.lock().await;
    if !common::helpers_installed() {
        return;
    }
    let sb = Sandbox::new();
    // The real virtiofsd (the pattern matches no command line), which must accept the
    // confinement options and listen; the start then fails at QEMU.
    let (_hv, err) = start_with_failing_virtiofsd(&sb, "--never--", "", 0).await;
    // Past the virtiofsds: each made its socket, so each took the options.
    assert!(err.starts_with("starting qemu failed"), "{err}");
    assert_eq!(sb.leftovers(), Vec::<i32>::new());
}

/// The rootfs share's virtiofsd dies (in both sandbox modes) while the share's virtiofsd
/// and the vsock backend start beside it: the error names it and quotes its own log, and
/// the other two are stopped.
#[tokio::test]
async fn dying_rootfs_virtiofsd_is_reported_and_the_other_helpers_stopped() {
    let _serial = SERIAL.lock().await;
    if !common::helpers_installed() {
        return;
    }
    let sb = Sandbox::new();
    let (hv, err) = start_with_failing_virtiofsd(
        &sb,
        "*virtiofsd-rootfs.sock*",
        "fake: the rootfs share cannot start",
        3,
    )
    .await;
    eprintln!("{err}");
    assert!(
        err.starts_with("starting virtiofsd of the rootfs share failed: it exited with status 3"),
        "{err}"
    );
    assert!(
        err.contains("virtiofsd-rootfs.log:\nfake: the rootfs share cannot start"),
        "{err}"
    );
    assert!(hv.pids().is_empty());
    assert_eq!(sb.leftovers(), Vec::<i32>::new());
}

#[tokio::test]
async fn dying_vsock_backend_is_reported_with_its_log() {
    let _serial = SERIAL.lock().await;
    if !common::helpers_installed() {
        return;
    }
    let sb = Sandbox::new();
    let bins = Binaries {
        qemu: failing_qemu(&sb),
        vsock: sb.script("vsock", "echo 'fake vsock: bad --vm option' >&2\nexit 2"),
        ..Binaries::default()
    };
    let (kernel, initrd) = fake_guest(&sb);
    let cfg = sb.config_with(&bins, &kernel, &initrd);
    let mut hv = new_hypervisor(&cfg, hypervisor::discard_logger());
    let err = hv.start_vm(&sb.vm_config()).await.unwrap_err().to_string();
    eprintln!("{err}");
    assert!(
        err.starts_with(
            "starting the vsock backend failed: it exited with status 2 before listening on"
        ),
        "{err}"
    );
    assert!(
        err.contains("vhost-vsock.log:\nfake vsock: bad --vm option"),
        "{err}"
    );
    // virtiofsd had started; it must be gone.
    assert_eq!(sb.leftovers(), Vec::<i32>::new());
}

#[tokio::test]
async fn missing_binary_is_reported() {
    let _serial = SERIAL.lock().await;
    let sb = Sandbox::new();
    let bins = Binaries {
        virtiofsd: "/nonexistent/virtiofsd".into(),
        ..Binaries::default()
    };
    let (kernel, initrd) = fake_guest(&sb);
    let cfg = sb.config_with(&bins, &kernel, &initrd);
    let mut hv = new_hypervisor(&cfg, hypervisor::discard_logger());
    let err = hv.start_vm(&sb.vm_config()).await.unwrap_err().to_string();
    assert!(
        err.starts_with("starting virtiofsd failed: cannot execute /nonexistent/virtiofsd"),
        "{err}"
    );
    assert_eq!(sb.leftovers(), Vec::<i32>::new());
}

/// Empty stand-ins for the guest files: these tests fail before QEMU would read them.
fn fake_guest(sb: &Sandbox) -> (std::path::PathBuf, std::path::PathBuf) {
    let kernel = sb.dir.path().join("vmlinux");
    let initrd = sb.dir.path().join("initrd");
    std::fs::write(&kernel, b"").unwrap();
    std::fs::write(&initrd, b"").unwrap();
    (kernel, initrd)
}
