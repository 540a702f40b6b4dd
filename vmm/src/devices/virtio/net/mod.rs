//! virtio-net (device id 1) on a host tap: queue 0 receives, queue 1 transmits, no control
//! queue and no offloads.
//!
//! A virtio-net buffer and a tap frame share one layout, the 12-byte `virtio_net_hdr_v1`
//! followed by the Ethernet frame, so frames pass through with only the header checked. The
//! tap is watched edge-triggered: a report drains it until it would block or the guest has no
//! receive buffer left; the frame that found no buffer waits in the device, and the receive
//! queue's next notification (new buffers) delivers it and resumes draining.
//!
//! Files: [`device`] is the virtio device (queues, config space, frame delivery); [`tap`]
//! opens the host tap it moves frames to and from; [`test_utils`] (tests only) is the
//! host's side of a tap: an AF_PACKET socket and link setup.

mod device;
pub mod tap;
#[cfg(any(test, feature = "test-utils"))]
pub mod test_utils;
#[cfg(test)]
mod tests;

pub use device::*;
