//! The VM pool ("factory"): booted, idle VMs kept ready so that a sandbox starts without
//! a boot (`[factory] vm_cache_number`).
//!
//! `kata-vm-factory init|status|destroy`, run by `kata-runtime factory` or its systemd
//! unit, on the `kata-sandbox` library: [`cli`] is the command line, [`daemon`] the
//! factory daemon that `init` runs. The pool directory's format and the claim, shared with
//! the shims that take its VMs, are `kata_sandbox::pool`.

mod cli;
mod daemon;

use std::process::ExitCode;

use kata_sandbox::{log, mount, network, pool, sizing, watchdog};

fn main() -> ExitCode {
    let args: Vec<_> = std::env::args_os().collect();
    cli::main(args.get(1..).unwrap_or_default())
}
