//! `vmm-contract`: what the builtin backend (in `hypervisor`) and `kata-vmm` (in `vmm`)
//! must agree on, in one place both build on.
//!
//! - [`vmm_json`]: the `vmm.json` file the backend writes and kata-vmm boots from.
//! - [`kvm`]: what KVM must offer (API version, capabilities), and the one probe that says
//!   whether this host's KVM runs guests at full speed, with its per-boot cache.
//!
//! A leaf crate on purpose: kata-vmm stays free of the shim's async stack.

pub mod kvm;
#[cfg(any(test, feature = "test-utils"))]
pub mod test_skip;
pub mod vmm_json;
