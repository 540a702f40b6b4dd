//! Chooses QEMU's accelerator: KVM where it really runs a guest at full speed, else TCG.
//!
//! `auto` runs a tiny real-mode guest on `/dev/kvm` (see [`probe`]) and picks KVM only if
//! it reaches HLT within [`PROBE_DEADLINE`]. Some hosts expose a `/dev/kvm` that answers
//! every ioctl but emulates the guest far too slowly to boot Linux; this catches them.
//! The verdict is cached per boot in [`PROBE_CACHE`] (keyed by the kernel's boot id) so
//! only the first sandbox after boot pays for the probe.

mod probe;

use std::fmt;
use std::path::Path;
use std::time::{Duration, Instant};

use kata_config::Accelerator;
use slog::{info, warn, Logger};

/// Where the verdict of the probe is kept for the rest of this boot.
pub const PROBE_CACHE: &str = "/run/kata-containers/accel-probe";
/// How long the probe guest may take to reach HLT; real KVM needs a few milliseconds.
pub const PROBE_DEADLINE: Duration = Duration::from_millis(250);
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

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

    fn parse(word: &str) -> Option<Self> {
        match word {
            "kvm" => Some(Self::Kvm),
            "tcg" => Some(Self::Tcg),
            _ => None,
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

/// Resolves the configured accelerator; `auto` probes (or reads the cache). Blocks for
/// at most about [`PROBE_DEADLINE`] plus the time to interrupt the probe.
pub fn choose(configured: Accelerator, logger: &Logger) -> AccelChoice {
    let choice = match configured {
        Accelerator::Kvm => AccelChoice {
            accel: Accel::Kvm,
            reason: "configured as kvm".into(),
        },
        Accelerator::Tcg => AccelChoice {
            accel: Accel::Tcg,
            reason: "configured as tcg".into(),
        },
        Accelerator::Auto => choose_auto(Path::new(PROBE_CACHE), logger),
    };
    info!(logger, "accelerator chosen"; "accelerator" => choice.accel.as_str(), "reason" => &choice.reason);
    choice
}

fn choose_auto(cache: &Path, logger: &Logger) -> AccelChoice {
    let boot_id = std::fs::read_to_string(BOOT_ID)
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    if !boot_id.is_empty() {
        if let Some(cached) = read_cache(cache, &boot_id) {
            return cached;
        }
    }
    let started = Instant::now();
    let choice = match probe::run_probe_guest(PROBE_DEADLINE) {
        Ok(()) => AccelChoice {
            accel: Accel::Kvm,
            reason: format!(
                "auto: a KVM test guest reached HLT in {} ms",
                started.elapsed().as_millis()
            ),
        },
        Err(why) => AccelChoice {
            accel: Accel::Tcg,
            reason: format!("auto: KVM cannot run guests at full speed here ({why})"),
        },
    };
    if !boot_id.is_empty() {
        if let Err(e) = write_cache(cache, &boot_id, &choice) {
            warn!(logger, "cannot cache the accelerator probe"; "path" => cache.display().to_string(), "error" => e.to_string());
        }
    }
    choice
}

/// The cache file: `boot_id=...`, `accel=...`, `reason=...` lines.
fn read_cache(cache: &Path, boot_id: &str) -> Option<AccelChoice> {
    let text = std::fs::read_to_string(cache).ok()?;
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(str::to_string)
    };
    if field("boot_id")? != boot_id {
        return None;
    }
    Some(AccelChoice {
        accel: Accel::parse(&field("accel")?)?,
        reason: format!("{} (cached for this boot)", field("reason")?),
    })
}

fn write_cache(cache: &Path, boot_id: &str, choice: &AccelChoice) -> std::io::Result<()> {
    if let Some(dir) = cache.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // Written aside and renamed, so a concurrent reader sees the old file or the new one.
    let tmp = cache.with_extension(format!("tmp.{}", std::process::id()));
    let reason = choice.reason.replace('\n', " ");
    std::fs::write(
        &tmp,
        format!(
            "boot_id={boot_id}\naccel={}\nreason={reason}\n",
            choice.accel
        ),
    )?;
    std::fs::rename(&tmp, cache)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_choices_skip_the_probe() {
        let log = crate::discard_logger();
        assert_eq!(choose(Accelerator::Tcg, &log).accel, Accel::Tcg);
        assert_eq!(choose(Accelerator::Kvm, &log).accel, Accel::Kvm);
    }

    #[test]
    fn cache_round_trip_is_keyed_by_boot_id() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("sub/accel-probe");
        let choice = AccelChoice {
            accel: Accel::Kvm,
            reason: "auto: fast".into(),
        };
        write_cache(&cache, "boot-1", &choice).unwrap();
        let read = read_cache(&cache, "boot-1").unwrap();
        assert_eq!(read.accel, Accel::Kvm);
        assert!(read.reason.starts_with("auto: fast"));
        assert_eq!(read_cache(&cache, "boot-2"), None);
        std::fs::write(&cache, "garbage").unwrap();
        assert_eq!(read_cache(&cache, "boot-1"), None);
    }

    #[test]
    fn auto_probe_is_bounded_and_cached() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("accel-probe");
        let log = crate::discard_logger();
        let first = choose_auto(&cache, &log);
        eprintln!("probe verdict: {} ({})", first.accel, first.reason);
        let second = choose_auto(&cache, &log);
        assert_eq!(first.accel, second.accel);
        assert!(second.reason.contains("cached"), "{}", second.reason);
    }
}
