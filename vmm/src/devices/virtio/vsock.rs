//! Glue between the vsock device model ([`crate::vsock`], written for any transport) and
//! the virtio-mmio transport: which queue kick drives which half of the muxer, and the
//! muxer's epoll fd as the device's host event source.

use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;

use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;

use super::mmio::VirtioDevice;
use crate::logger::log;
use crate::vsock::device::VIRTIO_ID_VSOCK;
use crate::vsock::{MuxerError, VsockDevice, NUM_QUEUES, RX_QUEUE, TX_QUEUE};

const QUEUE_SIZE: u16 = 256;

/// virtio-vsock behind virtio-mmio.
pub struct VsockMmioDevice {
    inner: VsockDevice,
    sizes: [u16; NUM_QUEUES],
}

impl VsockMmioDevice {
    /// A device for guest `guest_cid` whose hybrid socket listens at `uds_path`.
    pub fn new(guest_cid: u64, uds_path: &Path) -> Result<Self, MuxerError> {
        Ok(VsockMmioDevice {
            inner: VsockDevice::new(guest_cid, uds_path)?,
            sizes: [QUEUE_SIZE; NUM_QUEUES],
        })
    }

    /// Moves pending packets into the rx queue, if the driver has set it up.
    fn fill_rx(&mut self, queues: &mut [Queue], mem: &GuestMemoryMmap) -> bool {
        let Some(rx) = queues.get_mut(RX_QUEUE).filter(|q| q.ready()) else {
            return false;
        };
        match self.inner.process_rx(rx, mem) {
            Ok(used) => used,
            Err(e) => {
                log("warn", &format!("vsock rx: {e}"));
                false
            }
        }
    }
}

impl VirtioDevice for VsockMmioDevice {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_VSOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.sizes
    }

    fn device_features(&self) -> u64 {
        VsockDevice::device_features()
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        self.inner.read_config(offset, data);
    }

    fn process_queue(&mut self, index: usize, queues: &mut [Queue], mem: &GuestMemoryMmap) -> bool {
        let mut used = false;
        if index == TX_QUEUE {
            if let Some(tx) = queues.get_mut(TX_QUEUE) {
                match self.inner.process_tx(tx, mem) {
                    Ok(u) => used |= u,
                    Err(e) => log("warn", &format!("vsock tx: {e}")),
                }
            }
        }
        // Both new rx buffers and tx traffic (replies, credit updates) can unblock rx.
        if index == TX_QUEUE || index == RX_QUEUE {
            used |= self.fill_rx(queues, mem);
        }
        used
    }

    fn host_event_fd(&self) -> Option<RawFd> {
        Some(self.inner.as_raw_fd())
    }

    fn process_host_event(&mut self, queues: &mut [Queue], mem: &GuestMemoryMmap) -> bool {
        if let Err(e) = self.inner.process_host_events() {
            log("warn", &format!("vsock host events: {e}"));
        }
        self.fill_rx(queues, mem)
    }

    fn reset(&mut self) {
        self.inner.reset();
    }
}
