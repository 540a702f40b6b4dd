//! The project's one KVM probe, and QEMU's accelerator choice from it.
//!
//! [`probe_kvm`] runs a tiny real-mode guest on `/dev/kvm` (the probe lives in
//! `vmm_contract::kvm`, which kata-vmm shares) for at most [`PROBE_DEADLINE`] and
//! classifies the run as a [`KvmVerdict`]. Some
//! hosts expose a `/dev/kvm` that answers every ioctl but emulates the guest far too
//! slowly to boot Linux; this catches them. `auto` picks KVM only on a full-speed verdict.
//! The verdict is cached per boot in [`PROBE_CACHE`] (keyed by the kernel's boot id) so
//! only the first sandbox after boot pays for the probe; `kata-vmm check` and
//! `kata-runtime check` probe afresh and refresh the cache, so what they report is what
//! the next sandbox uses.

pub mod tsc;

pub use vmm_contract::kvm::{
    GuestRun, KvmVerdict, FULL_SPEED_INSTRUCTIONS_PER_SEC, PROBE_CACHE, PROBE_DEADLINE,
};

use std::fmt;
use std::path::Path;

use kata_config::Accelerator;
use slog::{info, warn, Logger};
use vmm_contract::kvm;

/// The accelerator QEMU runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// `accel=kvm`, `-cpu host`.
    Kvm,
    /// `accel=tcg`, `-cpu max`.
    Tcg,
}

impl Accel {
    /// QEMU's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kvm => "kvm",
            Self::Tcg => "tcg",
        }
    }
}

impl fmt::Display for Accel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The accelerator chosen and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccelChoice {
    pub accel: Accel,
    pub reason: String,
}

/// What QEMU's security policy says of TCG, for the shim's log and `kata-runtime check`.
pub const TCG_IS_NOT_A_BOUNDARY: &str = "under TCG, QEMU's emulator, the VM is not an \
isolation boundary (QEMU's security policy gives TCG no security guarantee): a guest that \
exploits a bug in QEMU's emulation runs code as QEMU on this host; do not run untrusted \
workloads without KVM";

/// Resolves the configured accelerator; `auto` probes (or reads the cache), and so does
/// `kvm`, which is refused where KVM cannot run guests at full speed: the sandbox would
/// not boot, and `kvm` is what users set so as never to run under TCG. Blocks for at most
/// about [`PROBE_DEADLINE`] plus the time to interrupt the probe.
pub fn choose(configured: Accelerator, logger: &Logger) -> Result<AccelChoice, String> {
    let cache = Path::new(PROBE_CACHE);
    let choice = choose_with(configured, || cached_verdict(cache, logger))?;
    info!(logger, "accelerator chosen"; "accelerator" => choice.accel.as_str(), "reason" => &choice.reason);
    if choice.accel == Accel::Tcg {
        warn!(logger, "{TCG_IS_NOT_A_BOUNDARY}");
    }
    Ok(choice)
}

fn choose_with(
    configured: Accelerator,
    verdict: impl FnOnce() -> (KvmVerdict, &'static str),
) -> Result<AccelChoice, String> {
    match configured {
        Accelerator::Tcg => Ok(AccelChoice {
            accel: Accel::Tcg,
            reason: "configured as tcg".into(),
        }),
        Accelerator::Auto => {
            let (verdict, note) = verdict();
            Ok(accel_for(&verdict, note))
        }
        Accelerator::Kvm => {
            let (verdict, note) = verdict();
            match accel_for(&verdict, note) {
                AccelChoice {
                    accel: Accel::Kvm, ..
                } => Ok(AccelChoice {
                    accel: Accel::Kvm,
                    reason: "configured as kvm".into(),
                }),
                AccelChoice { reason, .. } => Err(format!(
                    "accelerator = \"kvm\" is configured but {}; the sandbox is not started \
                     under TCG instead, which is not an isolation boundary: make KVM usable \
                     (`kata-runtime check` says how), or set accelerator = \"auto\" to accept \
                     TCG where KVM is missing",
                    reason.trim_start_matches("auto: ")
                )),
            }
        }
    }
}

/// The verdict for this boot (cached, else a fresh probe), and a note on where it came
/// from.
fn cached_verdict(cache: &Path, logger: &Logger) -> (KvmVerdict, &'static str) {
    match kvm::cached_verdict(cache) {
        Some(cached) => (cached, " (cached for this boot)"),
        None => (probe_and_remember(cache, logger), ""),
    }
}

/// KVM on a full-speed verdict, else TCG, with the verdict as the reason.
fn accel_for(verdict: &KvmVerdict, note: &str) -> AccelChoice {
    match verdict {
        KvmVerdict::FullSpeed { rate } => AccelChoice {
            accel: Accel::Kvm,
            reason: format!(
                "auto: a KVM test guest ran at {:.0} M instructions/s{note}",
                rate / 1e6
            ),
        },
        KvmVerdict::Slow { rate, reason } => AccelChoice {
            accel: Accel::Tcg,
            reason: format!(
                "auto: KVM cannot run guests at full speed here ({:.1} M instructions/s; {}){note}",
                rate / 1e6,
                reason.trim_end_matches('.')
            ),
        },
        KvmVerdict::Unusable { reason } => AccelChoice {
            accel: Accel::Tcg,
            reason: format!(
                "auto: KVM cannot run guests here ({}){note}",
                reason.trim_end_matches('.')
            ),
        },
    }
}

/// Probes `/dev/kvm` now (at most about [`PROBE_DEADLINE`]) and refreshes the per-boot
/// cache, so that the sandboxes started afterwards follow this verdict. What
/// `kata-vmm check` and `kata-runtime check` report.
pub fn probe_kvm(logger: &Logger) -> KvmVerdict {
    probe_and_remember(Path::new(PROBE_CACHE), logger)
}

/// The verdict sandboxes use: the cached one for this boot, else a fresh probe.
pub fn kvm_verdict(logger: &Logger) -> KvmVerdict {
    let cache = Path::new(PROBE_CACHE);
    kvm::cached_verdict(cache).unwrap_or_else(|| probe_and_remember(cache, logger))
}

fn probe_and_remember(cache: &Path, logger: &Logger) -> KvmVerdict {
    let (verdict, written) = kvm::probe_and_remember(cache);
    if let Err(e) = written {
        warn!(logger, "cannot cache the KVM probe's verdict"; "path" => cache.display().to_string(), "error" => e.to_string());
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcg_skips_the_probe_and_kvm_needs_a_full_speed_verdict() {
        let no_probe = || -> (KvmVerdict, &'static str) { panic!("probed") };
        assert_eq!(
            choose_with(Accelerator::Tcg, no_probe).unwrap().accel,
            Accel::Tcg
        );
        let full = || (KvmVerdict::FullSpeed { rate: 2e9 }, "");
        assert_eq!(
            choose_with(Accelerator::Kvm, full).unwrap().accel,
            Accel::Kvm
        );
        let missing = || {
            let reason = "/dev/kvm does not exist.".into();
            (KvmVerdict::Unusable { reason }, "")
        };
        let err = choose_with(Accelerator::Kvm, missing).unwrap_err();
        assert!(err.contains("/dev/kvm does not exist"), "{err}");
        assert!(err.contains("not started under TCG"), "{err}");
        assert!(err.contains("accelerator = \"auto\""), "{err}");
        let slow = || {
            let reason = "emulated.".into();
            (
                KvmVerdict::Slow {
                    rate: 1.3e6,
                    reason,
                },
                "",
            )
        };
        assert!(choose_with(Accelerator::Kvm, slow).is_err());
        assert_eq!(
            choose_with(Accelerator::Auto, slow).unwrap().accel,
            Accel::Tcg
        );
    }

    #[test]
    fn only_a_full_speed_verdict_picks_kvm() {
        let slow = KvmVerdict::Slow {
            rate: 1.3e6,
            reason: "emulated.".into(),
        };
        let choice = accel_for(&slow, " (cached for this boot)");
        assert_eq!(choice.accel, Accel::Tcg);
        assert!(choice.reason.contains("1.3 M"), "{}", choice.reason);
        assert!(choice.reason.ends_with("(cached for this boot)"));
        let unusable = KvmVerdict::Unusable {
            reason: "no /dev/kvm.".into(),
        };
        assert_eq!(accel_for(&unusable, "").accel, Accel::Tcg);
    }

    #[test]
    fn auto_probe_is_bounded_and_cached() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("accel-probe");
        let log = crate::discard_logger();
        let first = choose_with(Accelerator::Auto, || cached_verdict(&cache, &log)).unwrap();
        eprintln!("probe verdict: {} ({})", first.accel, first.reason);
        let second = choose_with(Accelerator::Auto, || cached_verdict(&cache, &log)).unwrap();
        assert_eq!(first.accel, second.accel);
        if kvm::boot_id().is_some() {
            assert!(second.reason.contains("cached"), "{}", second.reason);
        } else {
            crate::test_skip::skipped("needs a boot id for the cache assertion");
        }
    }
}
