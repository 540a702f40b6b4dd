//! Skipping a test that cannot run on this host, visibly: for the tests of this workspace
//! (`hypervisor`'s, `vmm`'s and this crate's), not for production code.
//!
//! libtest captures what a passing test prints, so a test that returns early after an
//! `eprintln!` reads as passed and its note is lost. [`skipped`] writes past the capture,
//! straight to the process's stderr, so `SKIPPED: <test>: <why>` shows in `cargo test` and
//! CI output. Where everything must run (a CI host with KVM, taps and the helpers),
//! `KATA_TEST_NO_SKIP=1` turns every skip into a failure.
//!
//! Requirements known before the run (a tool the tests always need) belong in
//! `#[ignore = "needs …"]` instead; this is for what only the host can tell.

use std::io::Write;

/// Set to `1` to fail, rather than skip, tests whose requirements this host lacks.
pub const NO_SKIP_ENV: &str = "KATA_TEST_NO_SKIP";

/// Reports the current test as skipped because `why` (e.g. "needs /dev/kvm"), and
/// returns `false`, so that a requirement check reads `available() || skipped("needs …")`.
///
/// Panics if [`NO_SKIP_ENV`] is `1`.
pub fn skipped(why: &str) -> bool {
    let current = std::thread::current();
    let test = current.name().unwrap_or("a test");
    if std::env::var_os(NO_SKIP_ENV).is_some_and(|v| v == "1") {
        panic!("{test} cannot run here: it {why}, and {NO_SKIP_ENV}=1 forbids skipping it");
    }
    // Not eprintln!: libtest would capture it and show it only if the test failed.
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED: {test}: {why}");
    false
}
