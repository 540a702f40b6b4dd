//! Device models, laid out like the machine: [`bus`] routes port I/O and MMIO exits to
//! devices; [`legacy`] holds the PC devices the guest expects at fixed ports (serial,
//! i8042); [`virtio`] holds the virtio-mmio transport, its queue-notification thread, and
//! one module per virtio device (rng, vsock, fs, block, net).

pub mod bus;
pub mod legacy;
pub mod virtio;
