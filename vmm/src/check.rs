//! `kata-vmm check`: can this host's KVM run kata-vmm at full speed, and if not, why not.
//!
//! It uses the project's one KVM probe (`vmm_contract::kvm`): the same test guest, the same
//! threshold and the same per-boot cache as the builtin backend's refusal of a slow KVM,
//! QEMU's `auto` accelerator and `kata-runtime check`, so none of them can disagree. A
//! check probes afresh (at most about 250 ms) and refreshes that cache.

use std::path::Path;

pub use vmm_contract::kvm::KvmVerdict as Verdict;

/// Runs the check: a fresh probe of `/dev/kvm`, remembered for this boot (a cache that
/// cannot be written only means the next sandbox probes again).
pub fn check() -> Verdict {
    vmm_contract::kvm::probe_and_remember(Path::new(vmm_contract::kvm::PROBE_CACHE)).0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdict_exit_codes_and_text() {
        assert_eq!(Verdict::FullSpeed { rate: 1e9 }.exit_code(), 0);
        let slow = Verdict::Slow {
            rate: 1.3e6,
            reason: "emulated.".into(),
        };
        assert_eq!(slow.exit_code(), 2);
        assert!(slow.describe().contains("1.3 M"));
        assert_eq!(Verdict::Unusable { reason: "x".into() }.exit_code(), 1);
    }

    #[test]
    fn check_reaches_a_verdict_on_this_host() {
        if std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            .is_err()
        {
            vmm_contract::test_skip::skipped("needs a /dev/kvm it can open");
            return;
        }
        let started = std::time::Instant::now();
        let v = check();
        assert!(!matches!(v, Verdict::Unusable { .. }), "{}", v.describe());
        assert!(
            started.elapsed() < std::time::Duration::from_secs(2),
            "the check took {:?}",
            started.elapsed()
        );
    }
}
