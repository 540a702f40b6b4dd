//! The VM pool ("factory"): booted, idle VMs kept ready so that a sandbox starts without
//! a boot (`[factory] vm_cache_number`).
//!
//! [`pool`] is the pool directory's format and the claim, shared by the factory daemon
//! and the shims that take its VMs; [`cli`] is `containerd-shim-kata-v2 factory
//! init|status|destroy` (run by `kata-runtime factory`), and [`daemon`] the factory daemon
//! that `init` runs.

pub mod cli;
pub mod daemon;
pub mod pool;
