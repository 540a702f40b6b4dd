//! What KVM must offer kata-vmm and QEMU's microvm, and the probe that tells whether this
//! host's KVM runs guests at full speed.
//!
//! [`check_requirements`] is the one list of requirements (kata-vmm's VM set-up and the
//! probe both apply it). [`probe_and_remember`] runs a tiny real-mode guest on `/dev/kvm`
//! (see [`probe`]) for at most [`PROBE_DEADLINE`] and classifies the run as a
//! [`KvmVerdict`] (see [`verdict`]); some hosts expose a `/dev/kvm` that answers every
//! ioctl but emulates the guest far too slowly to boot Linux, and this catches them. The
//! verdict is cached per boot in [`PROBE_CACHE`] (keyed by the kernel's boot id) so only
//! the first sandbox after boot pays for the probe.

mod probe;
mod verdict;

pub use verdict::{GuestRun, KvmVerdict, FULL_SPEED_INSTRUCTIONS_PER_SEC};

use std::path::Path;
use std::time::Duration;

use kvm_ioctls::{Cap, Kvm};

/// The KVM API version every KVM since Linux 2.6.22 reports.
pub const KVM_API_VERSION: i32 = 12;

/// What kata-vmm needs of KVM beyond running a vCPU (QEMU's microvm uses the same).
pub const NEEDED_CAPS: [Cap; 6] = [
    Cap::Irqchip,
    Cap::Ioeventfd,
    Cap::Irqfd,
    Cap::UserMemory,
    Cap::SetTssAddr,
    Cap::Pit2,
];

/// A requirement an open `/dev/kvm` does not meet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unmet {
    #[error("KVM API version {0} is not {KVM_API_VERSION}.")]
    ApiVersion(i32),
    #[error("KVM lacks the capability {0:?}.")]
    Cap(Cap),
}

/// Checks the API version and [`NEEDED_CAPS`].
pub fn check_requirements(kvm: &Kvm) -> Result<(), Unmet> {
    let version = kvm.get_api_version();
    if version != KVM_API_VERSION {
        return Err(Unmet::ApiVersion(version));
    }
    match NEEDED_CAPS.iter().find(|c| !kvm.check_extension(**c)) {
        Some(cap) => Err(Unmet::Cap(*cap)),
        None => Ok(()),
    }
}

/// Where the verdict of the probe is kept for the rest of this boot.
pub const PROBE_CACHE: &str = "/run/kata-containers/accel-probe";
/// How long the probe guest may take to reach HLT; real KVM needs a few milliseconds.
/// Short enough that `kata-runtime check` stays under a second on a slow KVM.
pub const PROBE_DEADLINE: Duration = Duration::from_millis(250);
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// Probes `/dev/kvm` now (at most about [`PROBE_DEADLINE`]) and writes the verdict to
/// `cache` for this boot, so that the sandboxes started afterwards follow it. The second
/// value says why the cache could not be written, if it could not.
pub fn probe_and_remember(cache: &Path) -> (KvmVerdict, std::io::Result<()>) {
    let verdict = KvmVerdict::from_run(probe::run_probe_guest(PROBE_DEADLINE), PROBE_DEADLINE);
    let written = match boot_id() {
        Some(boot_id) => write_cache(cache, &boot_id, &verdict),
        None => Ok(()),
    };
    (verdict, written)
}

/// The verdict `cache` holds for this boot, if any.
pub fn cached_verdict(cache: &Path) -> Option<KvmVerdict> {
    boot_id().and_then(|id| read_cache(cache, &id))
}

/// This boot's id (what per-boot caches are keyed by), if the kernel tells it.
pub fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string(BOOT_ID).ok()?.trim().to_string();
    (!id.is_empty()).then_some(id)
}

/// The cache file: a `boot_id=...` line, then [`KvmVerdict::cache_fields`].
fn read_cache(cache: &Path, boot_id: &str) -> Option<KvmVerdict> {
    let text = std::fs::read_to_string(cache).ok()?;
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(str::to_string)
    };
    if field("boot_id")? != boot_id {
        return None;
    }
    KvmVerdict::from_cache_fields(field)
}

fn write_cache(cache: &Path, boot_id: &str, verdict: &KvmVerdict) -> std::io::Result<()> {
    if let Some(dir) = cache.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // Written aside and renamed, so a concurrent reader sees the old file or the new one.
    let tmp = cache.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(
        &tmp,
        format!("boot_id={boot_id}\n{}", verdict.cache_fields()),
    )?;
    std::fs::rename(&tmp, cache)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_round_trip_is_keyed_by_boot_id() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("sub/accel-probe");
        let verdict = KvmVerdict::FullSpeed { rate: 2e9 };
        write_cache(&cache, "boot-1", &verdict).unwrap();
        assert_eq!(read_cache(&cache, "boot-1").unwrap(), verdict);
        assert_eq!(read_cache(&cache, "boot-2"), None);
        std::fs::write(&cache, "garbage").unwrap();
        assert_eq!(read_cache(&cache, "boot-1"), None);
        // The format before the verdict was shared: read as absent, so it is re-probed.
        std::fs::write(&cache, "boot_id=boot-1\naccel=kvm\nreason=x\n").unwrap();
        assert_eq!(read_cache(&cache, "boot-1"), None);
    }

    #[test]
    fn requirements_are_checked_on_a_kvm_that_opens() {
        let Ok(kvm) = Kvm::new() else {
            crate::test_skip::skipped("needs a /dev/kvm it can open");
            return;
        };
        // Any KVM a Linux of this decade offers meets them (the emulated one here too).
        assert_eq!(check_requirements(&kvm), Ok(()));
    }
}
