//! kata-vmm's one error type: what the builder's steps, the run loop and the signal wait
//! report. Its own module so that none of them imports another for it.

use std::path::PathBuf;

use crate::arch::x86_64::layout::{IRQ_BASE, IRQ_MAX};
use crate::arch::x86_64::BootError;
use crate::devices::bus::BusError;
use crate::devices::virtio::mmio::MmioError;
use crate::devices::virtio::notifier::NotifierError;
use crate::seccomp::SeccompError;
use crate::vstate::memory::MemoryError;
use crate::vstate::vcpu::VcpuError;
use crate::vstate::vm::VmError;

/// What can go wrong while kata-vmm builds, starts or runs a VM.
#[derive(Debug, thiserror::Error)]
pub enum VmmError {
    /// Guest memory.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// The VM.
    #[error(transparent)]
    Vm(#[from] VmError),
    /// A vCPU.
    #[error(transparent)]
    Vcpu(#[from] VcpuError),
    /// Boot structures.
    #[error(transparent)]
    Boot(#[from] BootError),
    /// A bus conflict.
    #[error(transparent)]
    Bus(#[from] BusError),
    /// A virtio transport.
    #[error(transparent)]
    Mmio(#[from] MmioError),
    /// The device thread.
    #[error(transparent)]
    Notifier(#[from] NotifierError),
    /// A file named in the config could not be opened.
    #[error("Cannot open {path}: {source}")]
    Open {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The kernel could not be loaded.
    #[error("Cannot load the kernel {path}: {source}")]
    LoadKernel {
        /// The kernel.
        path: PathBuf,
        /// The cause.
        #[source]
        source: linux_loader::loader::Error,
    },
    /// The initrd could not be copied into guest memory.
    #[error("Cannot load the initrd {path}: {reason}")]
    LoadInitrd {
        /// The initrd.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The command line is too long or malformed.
    #[error("The kernel command line is invalid: {0}")]
    Cmdline(String),
    /// More virtio devices than interrupt lines.
    #[error("Too many virtio devices: interrupt lines {IRQ_BASE} to {IRQ_MAX} are all taken.")]
    OutOfIrqs,
    /// KVM refused an irqfd or ioeventfd.
    #[error("Cannot wire {what} into KVM: {source}")]
    Wire {
        /// What was being registered.
        what: String,
        /// The cause.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// The vsock device (its hybrid socket) could not be set up.
    #[error("Cannot set up the vsock device with its socket {path}: {reason}")]
    Vsock {
        /// The hybrid vsock socket.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A virtio device could not be set up.
    #[error("Cannot set up the {what}: {reason}")]
    Device {
        /// Which device ("virtio-blk disk /img", ...).
        what: String,
        /// What went wrong, and what to do.
        reason: String,
    },
    /// A seccomp filter could not be built or installed: the VM does not run unfiltered.
    #[error(transparent)]
    Seccomp(#[from] SeccompError),
    /// An OS call failed.
    #[error("Cannot {what}: {source}")]
    Os {
        /// What was being done.
        what: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Maps an OS error to [`VmmError::Os`] saying what was being done.
pub(crate) fn os_err(what: &'static str) -> impl FnOnce(std::io::Error) -> VmmError {
    move |source| VmmError::Os { what, source }
}
