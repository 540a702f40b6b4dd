//! The KVM objects of a running guest: its memory, the VM and the vCPUs.

pub mod exit;
pub mod memory;
pub mod vcpu;
pub mod vm;
