//! The verdict on this host's KVM, from one run of the test guest ([`super::probe`]).
//!
//! The one classification the whole project uses: the QEMU backend's `auto` accelerator,
//! the builtin backend's refusal of a slow KVM, `kata-vmm check` and `kata-runtime check`
//! all read a [`KvmVerdict`], so they cannot disagree.

use std::time::Duration;

/// Below this many guest instructions per second, KVM is not running at hardware speed.
/// Hardware KVM runs the test loop at well over 1 G/s; the emulated KVM seen on nested
/// hosts without hardware virtualisation manages about 1.3 M/s.
pub const FULL_SPEED_INSTRUCTIONS_PER_SEC: f64 = 50e6;

/// What one run of the test guest measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GuestRun {
    /// Guest instructions executed (all of them if `finished`, else up to the kick).
    pub instructions: u64,
    /// Time spent in `KVM_RUN` (from the first entry to HLT or to the kick).
    pub elapsed: Duration,
    /// Whether the guest reached HLT before the deadline.
    pub finished: bool,
}

impl GuestRun {
    /// Guest instructions per second.
    pub fn rate(&self) -> f64 {
        self.instructions as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Whether, and how well, this host's KVM runs guests.
#[derive(Debug, Clone, PartialEq)]
pub enum KvmVerdict {
    /// KVM runs guests at hardware speed.
    FullSpeed {
        /// Measured guest instructions per second.
        rate: f64,
    },
    /// KVM works but too slowly for a Linux guest.
    Slow {
        /// Measured guest instructions per second.
        rate: f64,
        /// Why, as a sentence.
        reason: String,
    },
    /// KVM cannot run a guest at all (no `/dev/kvm`, no permission, a missing capability).
    Unusable {
        /// Why, as a sentence.
        reason: String,
    },
}

impl KvmVerdict {
    /// Classifies one probe: `Err` is what stopped the guest from running at all.
    pub fn from_run(run: Result<GuestRun, String>, deadline: Duration) -> Self {
        let run = match run {
            Ok(run) => run,
            Err(reason) => return Self::Unusable { reason },
        };
        let rate = run.rate();
        if !run.finished {
            return Self::Slow {
                rate,
                reason: format!(
                    "the test guest did not reach HLT within {} ms.",
                    deadline.as_millis()
                ),
            };
        }
        if rate >= FULL_SPEED_INSTRUCTIONS_PER_SEC {
            Self::FullSpeed { rate }
        } else {
            Self::Slow {
                rate,
                reason: "guest code is emulated instead of run natively, as under a nested KVM \
                         without hardware virtualisation."
                    .into(),
            }
        }
    }

    /// Whether KVM can run a Linux guest in useful time.
    pub fn is_full_speed(&self) -> bool {
        matches!(self, Self::FullSpeed { .. })
    }

    /// The process exit code for `kata-vmm check`: 0 full speed, 2 slow, 1 unusable.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::FullSpeed { .. } => 0,
            Self::Slow { .. } => 2,
            Self::Unusable { .. } => 1,
        }
    }

    /// A sentence for people.
    pub fn describe(&self) -> String {
        match self {
            Self::FullSpeed { rate } => format!(
                "KVM runs guests at full speed here ({:.0} M guest instructions/s): kata-vmm can be used.",
                rate / 1e6
            ),
            Self::Slow { rate, reason } => format!(
                "KVM works but not at full speed ({:.1} M guest instructions/s; hardware KVM does over {:.0} M/s): {reason} Small test guests run; a Linux guest will not boot in useful time. Use the QEMU backend with accel=tcg on this host.",
                rate / 1e6,
                FULL_SPEED_INSTRUCTIONS_PER_SEC / 1e6
            ),
            Self::Unusable { reason } => format!("kata-vmm cannot run here: {reason}"),
        }
    }

    /// The lines of the per-boot cache file (see `super::read_cache`).
    pub(crate) fn cache_fields(&self) -> String {
        let (kind, rate, reason) = match self {
            Self::FullSpeed { rate } => ("full-speed", *rate, ""),
            Self::Slow { rate, reason } => ("slow", *rate, reason.as_str()),
            Self::Unusable { reason } => ("unusable", 0.0, reason.as_str()),
        };
        let reason = reason.replace('\n', " ");
        format!("verdict={kind}\nrate={rate}\nreason={reason}\n")
    }

    /// The inverse of [`Self::cache_fields`]; `None` for anything it did not write.
    pub(crate) fn from_cache_fields(field: impl Fn(&str) -> Option<String>) -> Option<Self> {
        let rate = field("rate")?.parse::<f64>().ok()?;
        let reason = field("reason")?;
        match field("verdict")?.as_str() {
            "full-speed" => Some(Self::FullSpeed { rate }),
            "slow" => Some(Self::Slow { rate, reason }),
            "unusable" => Some(Self::Unusable { reason }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEADLINE: Duration = Duration::from_millis(250);

    fn run(instructions: u64, ms: u64, finished: bool) -> Result<GuestRun, String> {
        Ok(GuestRun {
            instructions,
            elapsed: Duration::from_millis(ms),
            finished,
        })
    }

    #[test]
    fn fast_finished_run_is_full_speed() {
        let v = KvmVerdict::from_run(run(10_000_000, 4, true), DEADLINE);
        assert!(v.is_full_speed(), "{v:?}");
        assert_eq!(v.exit_code(), 0);
        assert!(v.describe().contains("2500 M"), "{}", v.describe());
    }

    #[test]
    fn finished_but_below_threshold_is_slow() {
        // 10 M instructions in 240 ms: about 42 M/s, under the 50 M/s line.
        let v = KvmVerdict::from_run(run(10_000_000, 240, true), DEADLINE);
        assert!(matches!(v, KvmVerdict::Slow { .. }), "{v:?}");
        assert_eq!(v.exit_code(), 2);
        assert!(v.describe().contains("emulated"), "{}", v.describe());
    }

    #[test]
    fn interrupted_run_is_slow_with_the_measured_rate() {
        let v = KvmVerdict::from_run(run(325_000, 250, false), DEADLINE);
        assert!(v.describe().contains("1.3 M"), "{}", v.describe());
        assert!(v.describe().contains("within 250 ms"), "{}", v.describe());
        assert_eq!(v.exit_code(), 2);
    }

    #[test]
    fn failure_to_run_is_unusable() {
        let v = KvmVerdict::from_run(Err("cannot open /dev/kvm: ENOENT.".into()), DEADLINE);
        assert_eq!(v.exit_code(), 1);
        assert!(v.describe().contains("/dev/kvm"));
    }

    #[test]
    fn cache_fields_round_trip() {
        for v in [
            KvmVerdict::FullSpeed { rate: 2.5e9 },
            KvmVerdict::Slow {
                rate: 1.3e6,
                reason: "emulated.".into(),
            },
            KvmVerdict::Unusable {
                reason: "no /dev/kvm.".into(),
            },
        ] {
            let text = v.cache_fields();
            let field = |key: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
                    .map(str::to_string)
            };
            assert_eq!(KvmVerdict::from_cache_fields(field), Some(v));
        }
        assert_eq!(KvmVerdict::from_cache_fields(|_| None), None);
    }
}
