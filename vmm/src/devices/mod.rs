//! Device models: the port I/O and MMIO buses, legacy devices (serial, i8042), the
//! virtio-mmio transport with its queue-notification worker, and virtio devices (rng, vsock,
//! block).

pub mod block;
pub mod bus;
pub mod fs;
pub mod i8042;
pub mod mmio;
pub mod net;
pub mod notifier;
pub mod rng;
pub mod serial;
pub mod tap;
pub mod vsock_mmio;
