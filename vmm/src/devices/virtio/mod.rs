//! virtio devices on the virtio-mmio transport.
//!
//! [`mmio`] is the transport (registers, queues, interrupts) and the [`VirtioDevice`]
//! trait each device implements; [`notifier`] is the device thread that turns queue kicks
//! and host events into calls on the transport. Devices, in the order the builder adds
//! them: [`rng`], [`vsock`] (glue to [`crate::vsock`]), [`fs`] (a vhost-user frontend to
//! virtiofsd), [`block`] (request parsing, disk I/O, device) and [`net`] (device, tap).
//!
//! [`VirtioDevice`]: mmio::VirtioDevice

pub mod block;
pub mod fs;
pub mod mmio;
pub mod net;
pub mod notifier;
pub mod rng;
pub mod vsock;
