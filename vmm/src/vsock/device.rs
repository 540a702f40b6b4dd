//! The virtio side of the vsock device: device id, features, config space, and which queue
//! does what. Transports (virtio-mmio in the builtin VMM, vhost-user in `kata-vsock`) hold a
//! `VsockDevice` and call it when a queue is kicked or its muxer's fd is readable.

use std::os::unix::io::{AsRawFd, RawFd};
use std::path::Path;

use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_queue::Queue;
use vm_memory::GuestMemory;

use super::muxer::{MuxerError, VsockMuxer};

/// virtio device id of vsock.
pub const VIRTIO_ID_VSOCK: u32 = 19;
/// Size of the config space: `guest_cid`, a little-endian u64.
pub const CONFIG_SPACE_SIZE: usize = 8;

/// A virtio-vsock device for one guest.
#[derive(Debug)]
pub struct VsockDevice {
    muxer: VsockMuxer,
}

impl VsockDevice {
    /// A device for guest `guest_cid` with its hybrid socket at `uds_path`.
    pub fn new(guest_cid: u64, uds_path: &Path) -> Result<Self, MuxerError> {
        Ok(VsockDevice {
            muxer: VsockMuxer::new(guest_cid, uds_path)?,
        })
    }

    /// Device feature bits any transport offers (transports add their own, such as
    /// EVENT_IDX when their queue handling supports it).
    pub fn device_features() -> u64 {
        1 << VIRTIO_F_VERSION_1
    }

    pub fn guest_cid(&self) -> u64 {
        self.muxer.guest_cid()
    }

    /// The config space bytes: `guest_cid`.
    pub fn config_space(&self) -> [u8; CONFIG_SPACE_SIZE] {
        self.guest_cid().to_le_bytes()
    }

    /// Reads `data.len()` config space bytes at `offset`; bytes past the end read as zero.
    pub fn read_config(&self, offset: u64, data: &mut [u8]) {
        let config = self.config_space();
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = usize::try_from(offset)
                .ok()
                .and_then(|o| o.checked_add(i))
                .and_then(|o| config.get(o).copied())
                .unwrap_or(0);
        }
    }

    /// The tx queue was kicked. Returns whether to notify the guest about it.
    pub fn process_tx<M: GuestMemory>(
        &mut self,
        tx: &mut Queue,
        mem: &M,
    ) -> Result<bool, MuxerError> {
        self.muxer.process_tx(tx, mem)
    }

    /// The rx queue has new buffers, or the muxer has new packets. Returns whether to notify.
    pub fn process_rx<M: GuestMemory>(
        &mut self,
        rx: &mut Queue,
        mem: &M,
    ) -> Result<bool, MuxerError> {
        self.muxer.process_rx(rx, mem)
    }

    /// The muxer's fd is readable.
    pub fn process_host_events(&mut self) -> Result<(), MuxerError> {
        self.muxer.process_host_events()
    }

    /// Whether packets wait for rx buffers.
    pub fn has_pending_rx(&self) -> bool {
        self.muxer.has_pending_rx()
    }

    /// The driver reset the device.
    pub fn reset(&mut self) {
        self.muxer.reset();
    }

    pub fn muxer(&self) -> &VsockMuxer {
        &self.muxer
    }
}

impl AsRawFd for VsockDevice {
    fn as_raw_fd(&self) -> RawFd {
        self.muxer.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_space_holds_guest_cid() {
        let dir = tempfile::tempdir().expect("tempdir");
        let dev = VsockDevice::new(3, &dir.path().join("h.sock")).expect("device");
        let mut cid = [0xffu8; 8];
        dev.read_config(0, &mut cid);
        assert_eq!(u64::from_le_bytes(cid), 3);
        let mut tail = [0xffu8; 4];
        dev.read_config(6, &mut tail);
        assert_eq!(tail, [0, 0, 0, 0]);
        assert_eq!(VsockDevice::device_features(), 1 << 32);
    }
}
