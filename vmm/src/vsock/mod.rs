//! virtio-vsock with hybrid (unix socket) vsock on the host side.
//!
//! The device model is transport-neutral: it works on `virtio_queue::Queue`s over any
//! `vm_memory::GuestMemory`, so the builtin VMM drives it over virtio-mmio and `kata-vsock`
//! (see `vhost_user`) serves it to QEMU as a vhost-user backend.
//!
//! - `packet`: the 44-byte header and copying packets in and out of descriptor chains.
//! - `credit`: credit-based flow control counters.
//! - `connection`: one stream's state machine and buffering.
//! - `unix`: the hybrid socket (`CONNECT <port>` in, `<uds>_<port>` out).
//! - `muxer`: connections <-> rx/tx queues, host readiness through its own epoll fd; its
//!   queues and connection count are capped, its repeated warnings rate-limited (`log_limit`).
//! - `device`: the virtio view (device id, features, config space, queues).
//! - `vhost_user`: the vhost-user backend around the device.

pub mod connection;
pub mod credit;
pub mod device;
pub mod log_limit;
pub mod muxer;
pub mod packet;
pub mod unix;
pub mod vhost_user;

#[cfg(test)]
pub(crate) mod test_utils;

pub use device::VsockDevice;
pub use muxer::{MuxerError, VsockMuxer};

/// The host's CID, as the guest addresses it.
pub const HOST_CID: u64 = 2;
/// Queue indexes of a vsock device.
pub const RX_QUEUE: usize = 0;
pub const TX_QUEUE: usize = 1;
pub const EVENT_QUEUE: usize = 2;
pub const NUM_QUEUES: usize = 3;
