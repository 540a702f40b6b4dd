//! The builtin VMM (on rust-vmm crates) and the device models it shares with the QEMU
//! path. It is its own crate so the shim, which only spawns these binaries, stays lean.
//!
//! kata-vmm, read in this order: [`config`] (vmm.json) → [`builder`] (assembles and runs a
//! VM) → [`vstate`] (memory, VM, vCPUs) → [`arch`] (layout, boot protocol, registers,
//! CPUID) → [`devices`] (buses, serial, i8042, virtio-mmio, rng, vsock glue, virtio-fs
//! through vhost-user, block, net on a tap).
//! [`check`] is `kata-vmm check`; [`seccomp`] and [`signals`] confine and stop the process.
pub mod vsock;

pub mod arch;
pub mod builder;
pub mod check;
pub mod config;
pub mod devices;
pub mod logger;
pub mod seccomp;
pub mod signals;
pub mod vstate;
