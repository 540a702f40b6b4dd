//! The builtin VMM (on rust-vmm crates) and the device models it shares with the QEMU
//! path. It is its own crate so the shim, which only spawns these binaries, stays lean.
//!
//! kata-vmm, read in this order: [`config`] (vmm.json, the type shared with the hypervisor
//! crate through `vmm-contract`) → [`builder`] (assembles a VM, step by step) → [`run`]
//! (confines its threads and runs it; both report [`error::VmmError`]) → [`vstate`] (memory, VM, vCPUs) →
//! [`arch`] (layout, boot protocol, registers, CPUID) → [`devices`] (the buses; legacy
//! serial and i8042; virtio: the mmio transport, rng, vsock glue, virtio-fs through
//! vhost-user, block, net on a tap).
//! [`check`] is `kata-vmm check`; [`seccomp`] and [`signals`] confine and stop the process.
pub mod vsock;

pub mod arch;
pub mod builder;
pub mod check;
/// `vmm.json`, the configuration kata-vmm boots: the one typed contract with the
/// hypervisor crate's builtin backend, which writes it (both use `vmm-contract`).
pub use vmm_contract::vmm_json as config;
pub mod devices;
pub mod error;
pub mod logger;
pub mod run;
pub mod seccomp;
pub mod signals;
pub mod vstate;
