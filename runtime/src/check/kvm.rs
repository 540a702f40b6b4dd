//! The KVM line: the project's one probe (`hypervisor::accel`), judged against what the
//! configuration needs. The builtin VMM and `accelerator = "kvm"` need a full-speed KVM;
//! `auto` falls back to TCG; `tcg` does not use KVM. Either way under TCG is a warning
//! that says what QEMU's security policy says: the VM is then no isolation boundary.

use hypervisor::accel::{KvmVerdict, FULL_SPEED_INSTRUCTIONS_PER_SEC, TCG_IS_NOT_A_BOUNDARY};
use kata_config::{Accelerator, Config, HypervisorName};

use crate::report::Line;

const NAME: &str = "kvm";

/// The line for `verdict` under `config` (whose file is `file`).
pub fn line(verdict: &KvmVerdict, config: &Config, file: &str) -> Line {
    let found = found(verdict);
    if verdict.is_full_speed() {
        return match (
            config.runtime.hypervisor_name,
            config.hypervisor.qemu.accelerator,
        ) {
            (HypervisorName::Qemu, Accelerator::Tcg) => Line::warn(
                NAME,
                format!("{found}, but hypervisor.qemu.accelerator = \"tcg\" does not use it; {TCG_IS_NOT_A_BOUNDARY}"),
                format!("set hypervisor.qemu.accelerator = \"auto\" in {file}"),
            ),
            _ => Line::ok(NAME, found),
        };
    }
    let host_fix = host_fix(verdict);
    match (config.runtime.hypervisor_name, config.hypervisor.qemu.accelerator) {
        (HypervisorName::Builtin, _) => Line::fail(
            NAME,
            format!("{found}; the builtin VMM (kata-vmm) needs a full-speed KVM"),
            format!("{host_fix}; or set hypervisor_name = \"qemu\" under [runtime] in {file} (QEMU falls back to TCG)"),
        ),
        (HypervisorName::Qemu, Accelerator::Kvm) => Line::fail(
            NAME,
            format!("{found}; hypervisor.qemu.accelerator = \"kvm\" needs a full-speed KVM"),
            format!("{host_fix}; or set hypervisor.qemu.accelerator = \"auto\" in {file} (TCG where KVM is not usable)"),
        ),
        (HypervisorName::Qemu, Accelerator::Auto) => Line::warn(
            NAME,
            format!("{found}; sandboxes run under TCG, several times slower, and {TCG_IS_NOT_A_BOUNDARY}"),
            host_fix,
        ),
        (HypervisorName::Qemu, Accelerator::Tcg) => Line::warn(
            NAME,
            format!("{found}; not used: hypervisor.qemu.accelerator = \"tcg\", and {TCG_IS_NOT_A_BOUNDARY}"),
            format!("for untrusted workloads: {host_fix}, then set hypervisor.qemu.accelerator = \"auto\" in {file}"),
        ),
    }
}

fn found(verdict: &KvmVerdict) -> String {
    match verdict {
        KvmVerdict::FullSpeed { rate } => {
            format!("KVM runs guests at full speed ({:.0} M guest instructions/s)", rate / 1e6)
        }
        KvmVerdict::Slow { rate, reason } => format!(
            "KVM is too slow for a Linux guest: {:.1} M guest instructions/s where hardware KVM does over {:.0} M/s ({})",
            rate / 1e6,
            FULL_SPEED_INSTRUCTIONS_PER_SEC / 1e6,
            reason.trim_end_matches('.')
        ),
        KvmVerdict::Unusable { reason } => {
            format!("KVM cannot run guests: {}", reason.trim_end_matches('.'))
        }
    }
}

fn host_fix(verdict: &KvmVerdict) -> String {
    match verdict {
        KvmVerdict::Slow { .. } => {
            "this KVM emulates guest code, as a nested KVM without hardware \
            support does: enable nested virtualisation with hardware support on the host of this \
            VM, or run on bare metal"
                .into()
        }
        _ => {
            "make /dev/kvm usable: enable VT-x/AMD-V in the firmware (in a VM: nested \
            virtualisation on its host), load kvm_intel or kvm_amd, and run as root or in group kvm"
                .into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Status;

    fn config(text: &str) -> Config {
        Config::from_str(text, "/etc/kata-containers/configuration.toml").unwrap()
    }

    fn slow() -> KvmVerdict {
        KvmVerdict::Slow {
            rate: 1.3e6,
            reason: "the test guest did not reach HLT within 250 ms.".into(),
        }
    }

    const FILE: &str = "/etc/kata-containers/configuration.toml";

    #[test]
    fn a_slow_kvm_is_a_warning_with_auto() {
        let line = line(&slow(), &config(""), FILE);
        assert_eq!(line.status, Status::Warn);
        assert!(
            line.detail.contains("1.3 M guest instructions/s"),
            "{}",
            line.detail
        );
        assert!(line.detail.contains("TCG"), "{}", line.detail);
        assert!(
            line.detail.contains("not an isolation boundary"),
            "{}",
            line.detail
        );
        assert!(line.fix.unwrap().contains("nested virtualisation"));
    }

    #[test]
    fn a_slow_kvm_fails_the_builtin_backend_and_forced_kvm() {
        let builtin = line(
            &slow(),
            &config("[runtime]\nhypervisor_name = \"builtin\""),
            FILE,
        );
        assert_eq!(builtin.status, Status::Fail);
        assert!(builtin.fix.unwrap().contains("hypervisor_name = \"qemu\""));
        let forced = line(
            &slow(),
            &config("[hypervisor.qemu]\naccelerator = \"kvm\""),
            FILE,
        );
        assert_eq!(forced.status, Status::Fail);
        assert!(forced
            .fix
            .unwrap()
            .contains(&format!("accelerator = \"auto\" in {FILE}")));
    }

    #[test]
    fn tcg_does_not_need_kvm_but_is_no_boundary() {
        let none = KvmVerdict::Unusable {
            reason: "cannot open /dev/kvm: No such file or directory (os error 2).".into(),
        };
        let line = line(
            &none,
            &config("[hypervisor.qemu]\naccelerator = \"tcg\""),
            FILE,
        );
        assert_eq!(line.status, Status::Warn);
        assert!(line.detail.contains("not used"), "{}", line.detail);
        assert!(
            line.detail.contains("not an isolation boundary"),
            "{}",
            line.detail
        );
    }

    #[test]
    fn full_speed_is_ok_unless_tcg_wastes_it() {
        let fast = KvmVerdict::FullSpeed { rate: 2.4e9 };
        let ok = line(
            &fast,
            &config("[runtime]\nhypervisor_name = \"builtin\""),
            FILE,
        );
        assert_eq!(ok.status, Status::Ok);
        assert!(ok.detail.contains("2400 M"), "{}", ok.detail);
        let wasted = line(
            &fast,
            &config("[hypervisor.qemu]\naccelerator = \"tcg\""),
            FILE,
        );
        assert_eq!(wasted.status, Status::Warn);
    }
}
