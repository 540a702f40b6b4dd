//! The builtin VMM (on rust-vmm crates) and the device models it shares with the QEMU
//! path. It is its own crate so the shim, which only spawns these binaries, stays lean.
