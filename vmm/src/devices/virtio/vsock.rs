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
use crate::vsock::log_limit::LogLimiter;
use crate::vsock::{MuxerError, VsockDevice, NUM_QUEUES, RX_QUEUE, TX_QUEUE};

const QUEUE_SIZE: u16 = 256;

/// virtio-vsock behind virtio-mmio.
pub struct VsockMmioDevice {
    inner: VsockDevice,
    sizes: [u16; NUM_QUEUES],
    /// The guest can make each of these fail at every kick (a broken ring stays broken):
    /// one line per interval each, with a count.
    rx_warnings: LogLimiter,
    tx_warnings: LogLimiter,
    host_warnings: LogLimiter,
}

/// Logs `what: e` at warn if `limiter` lets it through.
fn warn_limited(limiter: &mut LogLimiter, what: &str, e: &MuxerError) {
    if let Some(line) = limiter.line(|| format!("{what}: {e}")) {
        log("warn", &line);
    }
}

impl VsockMmioDevice {
    /// A device for guest `guest_cid` whose hybrid socket listens at `uds_path`.
    pub fn new(guest_cid: u64, uds_path: &Path) -> Result<Self, MuxerError> {
        Ok(VsockMmioDevice {
            inner: VsockDevice::new(guest_cid, uds_path)?,
            sizes: [QUEUE_SIZE; NUM_QUEUES],
            rx_warnings: LogLimiter::default(),
            tx_warnings: LogLimiter::default(),
            host_warnings: LogLimiter::default(),
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
                warn_limited(&mut self.rx_warnings, "vsock rx", &e);
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
                    Err(e) => warn_limited(&mut self.tx_warnings, "vsock tx", &e),
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
            warn_limited(&mut self.host_warnings, "vsock host events", &e);
        }
        self.fill_rx(queues, mem)
    }

    fn reset(&mut self) {
        self.inner.reset();
    }
}
