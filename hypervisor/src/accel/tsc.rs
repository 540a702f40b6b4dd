//! The host's TSC frequency, for guests under TCG.
//!
//! Under TCG a guest's TSC is the host's (QEMU answers `rdtsc` with the host counter), but
//! the guest kernel cannot find its frequency: microvm without ACPI has no HPET or PM
//! timer to calibrate against, and PIT calibration fails under emulation. It then marks
//! the TSC unstable, keeps jiffies as its clocksource (4 ms resolution, no
//! high-resolution timers for the workload) and calibrates its delay loop by counting,
//! about 120 ms of every boot. Told the frequency (`tsc_early_khz`, with `tsc=reliable`
//! since nothing could watch it), the guest has a precise clock at once.
//!
//! The frequency is measured once per host boot (two 10 ms windows against
//! CLOCK_MONOTONIC_RAW, which must agree) and cached in [`TSC_CACHE`], keyed by the boot
//! id like the KVM probe's verdict; only a host whose TSC is invariant (`constant_tsc`
//! and `nonstop_tsc`) gets one.

use std::path::Path;
use std::time::{Duration, Instant};

/// Where the measured frequency is kept for the rest of this boot.
pub const TSC_CACHE: &str = "/run/kata-containers/tsc-khz";
/// How long one measuring window is.
const WINDOW: Duration = Duration::from_millis(10);
/// How far two windows may disagree (parts per million).
const AGREEMENT_PPM: u64 = 1000;

/// The kernel command line words that give a TCG guest its clock, if the host's TSC
/// frequency is known.
pub fn tcg_clock_params() -> Option<String> {
    host_tsc_khz().map(|khz| format!("tsc_early_khz={khz} tsc=reliable"))
}

/// The host's TSC frequency in kHz: cached for this boot, or measured (about 20 ms).
/// None where the TSC is not invariant or the measurement did not settle.
pub fn host_tsc_khz() -> Option<u32> {
    let cache = Path::new(TSC_CACHE);
    let boot_id = vmm_contract::kvm::boot_id();
    if let Some(id) = &boot_id {
        if let Some(khz) = read_cache(cache, id) {
            return Some(khz);
        }
    }
    let khz = measure()?;
    if let Some(id) = &boot_id {
        // Best effort: the next sandbox measures again if this fails.
        let _ = write_cache(cache, id, khz);
    }
    Some(khz)
}

fn invariant_tsc() -> bool {
    let Ok(cpuinfo) = std::fs::read_to_string("/proc/cpuinfo") else {
        return false;
    };
    cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .is_some_and(|flags| {
            let words: Vec<&str> = flags.split_whitespace().collect();
            words.contains(&"constant_tsc") && words.contains(&"nonstop_tsc")
        })
}

#[cfg(target_arch = "x86_64")]
fn rdtsc() -> u64 {
    // SAFETY: `rdtsc` exists on every x86_64 CPU and only reads the time-stamp counter.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// TSC ticks per ms over one window.
#[cfg(target_arch = "x86_64")]
fn window() -> u64 {
    let (t0, c0) = (Instant::now(), rdtsc());
    std::thread::sleep(WINDOW);
    let (c1, elapsed) = (rdtsc(), t0.elapsed());
    let ns = elapsed.as_nanos().max(1) as u64;
    c1.saturating_sub(c0).saturating_mul(1_000_000) / ns
}

#[cfg(target_arch = "x86_64")]
fn measure() -> Option<u32> {
    if !invariant_tsc() {
        return None;
    }
    let (a, b) = (window(), window());
    agreed(a, b)
}

#[cfg(not(target_arch = "x86_64"))]
fn measure() -> Option<u32> {
    None
}

/// The frequency two windows agree on, rounded to 1 MHz (TSCs run at whole MHz, and
/// identical values keep guests' command lines identical).
fn agreed(a: u64, b: u64) -> Option<u32> {
    if a == 0 || b == 0 || a.abs_diff(b) * 1_000_000 / a.max(b) > AGREEMENT_PPM {
        return None;
    }
    let khz = (a + b) / 2;
    u32::try_from((khz + 500) / 1000 * 1000).ok()
}

fn read_cache(cache: &Path, boot_id: &str) -> Option<u32> {
    let text = std::fs::read_to_string(cache).ok()?;
    let (id, khz) = text.trim().split_once(' ')?;
    (id == boot_id).then(|| khz.parse().ok()).flatten()
}

fn write_cache(cache: &Path, boot_id: &str, khz: u32) -> std::io::Result<()> {
    if let Some(dir) = cache.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = cache.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, format!("{boot_id} {khz}\n"))?;
    std::fs::rename(&tmp, cache)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_must_agree_and_round_to_a_megahertz() {
        assert_eq!(agreed(2_600_004, 2_599_998), Some(2_600_000));
        assert_eq!(agreed(2_100_400, 2_100_700), Some(2_101_000));
        assert_eq!(agreed(2_600_000, 2_900_000), None, "10% apart");
        assert_eq!(agreed(0, 2_600_000), None);
    }

    #[test]
    fn the_cache_is_keyed_by_boot_id() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = dir.path().join("sub/tsc-khz");
        write_cache(&cache, "boot-1", 2_600_000).expect("write");
        assert_eq!(read_cache(&cache, "boot-1"), Some(2_600_000));
        assert_eq!(read_cache(&cache, "boot-2"), None);
        std::fs::write(&cache, "garbage").expect("write");
        assert_eq!(read_cache(&cache, "boot-1"), None);
    }

    #[test]
    fn a_measured_frequency_is_plausible() {
        // Hosts without an invariant TSC measure nothing, which is the answer there.
        if let Some(khz) = measure() {
            assert!((100_000..20_000_000).contains(&khz), "{khz} kHz");
        } else {
            eprintln!("no invariant TSC on this host: nothing measured");
        }
    }
}
