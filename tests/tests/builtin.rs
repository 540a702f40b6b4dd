//! The builtin VMM through containerd: `hypervisor_name = "builtin"` makes the shim run
//! each sandbox in kata-vmm, with virtiofsd behind its virtio-fs.
//!
//! Where this host's KVM runs guests at full speed (`kata-vmm check` exits 0), the
//! container must run in the guest kernel. Where it does not (an emulated KVM, as on the
//! development machine: Linux would crawl until the agent's dial timeout), `ctr run` must
//! fail at once with an error that says why and what to do, and leave no VMM, virtiofsd,
//! mount or directory behind.

use std::process::Command;

use e2e_tests::*;

fn kvm_full_speed() -> bool {
    let vmm = std::path::Path::new(&std::env::var("KATA_TEST_SHIM_DIR").unwrap_or_default())
        .join("kata-vmm");
    Command::new(&vmm)
        .arg("check")
        .output()
        .unwrap_or_else(|e| panic!("running {} check: {e}", vmm.display()))
        .status
        .success()
}

#[test]
fn a_container_runs_in_kata_vmm_or_fails_cleanly() {
    if !std::path::Path::new("/dev/kvm").exists() {
        eprintln!("no /dev/kvm: the builtin VMM cannot run here");
        return;
    }
    let full_speed = kvm_full_speed();
    let c = Containerd::start_with("builtin", Backend::Builtin { dial_timeout: 5 });
    let out = c.run("bvm1", &["--rm"], &["uname", "-r"]);
    if full_speed {
        assert!(
            out.status.success(),
            "ctr run under kata-vmm failed: {}\n{}",
            stderr(&out),
            c.log_tail()
        );
        let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let guest = stdout(&out);
        assert!(!guest.trim().is_empty());
        assert_ne!(
            guest.trim(),
            host.trim(),
            "the container saw the host kernel"
        );
    } else {
        assert!(
            !out.status.success(),
            "ctr run succeeded on a KVM that `kata-vmm check` calls too slow"
        );
        let err = stderr(&out);
        assert!(
            err.contains("full speed") && err.contains("hypervisor_name = \"qemu\""),
            "the error does not say why and what to do: {err}"
        );
    }
    assert_no_leftovers("bvm1");
}
