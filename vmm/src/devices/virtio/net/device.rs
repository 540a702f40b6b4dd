//! The virtio-net device: queue 0 receives, queue 1 transmits; frames pass between the
//! guest's buffers and the tap with only the header checked.

use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestMemoryMmap};

use super::tap::{Tap, TapError, VNET_HDR_LEN};
use crate::config::{parse_mac, ConfigError, NetConfig};
use crate::devices::virtio::mmio::{VirtioDevice, VIRTIO_F_VERSION_1};
use crate::logger::log;

/// The virtio device id of a network card.
pub const VIRTIO_ID_NET: u32 = 1;
/// Feature bit: the config space holds the MAC address.
pub const VIRTIO_NET_F_MAC: u64 = 1 << 5;
/// Feature bit: the config space holds the link status.
pub const VIRTIO_NET_F_STATUS: u64 = 1 << 16;
/// Link status bit in the config space: the link is up.
pub const VIRTIO_NET_S_LINK_UP: u16 = 1;
/// The receive queue.
pub const RX_QUEUE: usize = 0;
/// The transmit queue.
pub const TX_QUEUE: usize = 1;
/// The largest frame we move, its header included: room for a 64 KiB IP packet behind an
/// Ethernet header. Longer transmit chains are dropped.
pub const MAX_BUFFER_LEN: usize = 65562;

const QUEUE_SIZE: u16 = 256;
const ETH_HLEN: usize = 14;
/// The shortest buffer worth passing on: a header and an Ethernet header.
const MIN_BUFFER_LEN: usize = VNET_HDR_LEN + ETH_HLEN;
/// Header flag: the frame carries a partial checksum for the receiver to complete.
pub(super) const VIRTIO_NET_HDR_F_NEEDS_CSUM: u8 = 1;
/// Header `gso_type`: no segmentation offload.
const VIRTIO_NET_HDR_GSO_NONE: u8 = 0;
/// Offset of `num_buffers` in the header.
pub(super) const NUM_BUFFERS_OFFSET: usize = 10;
/// At most one drop message per direction in this interval.
const DROP_LOG_INTERVAL: Duration = Duration::from_secs(5);

/// Errors while setting up a virtio-net device.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// The configured MAC address is malformed.
    #[error(transparent)]
    Mac(#[from] ConfigError),
    /// The tap could not be opened.
    #[error(transparent)]
    Tap(#[from] TapError),
}

/// A locally administered unicast MAC address derived from the tap name (FNV-1a), so that a
/// guest keeps its address across restarts on the same tap.
pub fn mac_from_tap_name(tap: &str) -> [u8; 6] {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in tap.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let b = hash.to_le_bytes();
    // Bit 0 of the first octet clear: unicast; bit 1 set: locally administered.
    [(b[0] & 0xfc) | 0x02, b[1], b[2], b[3], b[4], b[5]]
}

/// Counts dropped frames of one direction and logs them, at most once per interval.
struct DropLog {
    direction: &'static str,
    count: u64,
    last_log: Option<Instant>,
}

impl DropLog {
    fn new(direction: &'static str) -> Self {
        DropLog {
            direction,
            count: 0,
            last_log: None,
        }
    }

    fn record(&mut self, tap: &str, why: &str) {
        self.count += 1;
        if self
            .last_log
            .is_some_and(|t| t.elapsed() < DROP_LOG_INTERVAL)
        {
            return;
        }
        self.last_log = Some(Instant::now());
        log(
            "warn",
            &format!(
                "virtio-net on tap {tap}: dropped a {} frame: {why} ({} dropped so far)",
                self.direction, self.count
            ),
        );
    }
}

/// What became of the pending received frame.
enum Delivery {
    /// It is in the guest's buffer.
    Delivered,
    /// It was dropped; true if a chain was used up along the way.
    Dropped(bool),
    /// No receive buffer (or a broken ring): it stays pending; true if a chain was used up.
    Blocked(bool),
}

/// A virtio-net device on a tap.
pub struct NetDevice {
    tap: Tap,
    /// Config space: the MAC address, then the link status (little endian).
    config: [u8; 8],
    sizes: [u16; 2],
    /// A frame read from the tap, header included, waiting for a receive buffer when
    /// `rx_len` is non-zero.
    rx_buf: Vec<u8>,
    rx_len: usize,
    /// Where a transmit chain is gathered.
    tx_buf: Vec<u8>,
    rx_drops: DropLog,
    tx_drops: DropLog,
}

impl NetDevice {
    /// A device on `tap` with guest address `mac`.
    pub fn new(tap: Tap, mac: [u8; 6]) -> Self {
        let mut config = [0u8; 8];
        config[..6].copy_from_slice(&mac);
        config[6..].copy_from_slice(&VIRTIO_NET_S_LINK_UP.to_le_bytes());
        NetDevice {
            tap,
            config,
            sizes: [QUEUE_SIZE; 2],
            // One spare byte tells a frame of the maximum length from a longer one.
            rx_buf: vec![0; MAX_BUFFER_LEN + 1],
            rx_len: 0,
            tx_buf: vec![0; MAX_BUFFER_LEN],
            rx_drops: DropLog::new("received"),
            tx_drops: DropLog::new("transmitted"),
        }
    }

    /// Opens the configured tap; the MAC is the configured one or [`mac_from_tap_name`].
    pub fn from_config(config: &NetConfig) -> Result<Self, NetError> {
        let mac = match &config.mac {
            Some(text) => parse_mac(text)?,
            None => mac_from_tap_name(&config.tap),
        };
        Ok(NetDevice::new(Tap::open(&config.tap)?, mac))
    }

    /// The guest's MAC address.
    pub fn mac(&self) -> [u8; 6] {
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&self.config[..6]);
        mac
    }

    /// Sends every available transmit chain to the tap.
    fn process_tx(&mut self, queues: &mut [Queue], mem: &GuestMemoryMmap) -> bool {
        let Some(tx) = queues.get_mut(TX_QUEUE).filter(|q| q.ready()) else {
            return false;
        };
        let mut used = false;
        while let Some(chain) = tx.pop_descriptor_chain(mem) {
            let head = chain.head_index();
            match gather(chain, mem, &mut self.tx_buf) {
                Ok(len) => {
                    if let Err(e) = self.tap.write(&self.tx_buf[..len]) {
                        self.tx_drops
                            .record(self.tap.name(), &format!("the tap refused it: {e}"));
                    }
                }
                Err(why) => self.tx_drops.record(self.tap.name(), why),
            }
            // Nothing was written into a transmit buffer.
            if tx.add_used(mem, head, 0).is_err() {
                break;
            }
            used = true;
        }
        used
    }

    /// Moves frames from the tap into receive buffers until the tap is empty or the guest
    /// has no buffer left; the first frame without a buffer stays pending.
    fn process_rx(&mut self, queues: &mut [Queue], mem: &GuestMemoryMmap) -> bool {
        let Some(rx) = queues.get_mut(RX_QUEUE).filter(|q| q.ready()) else {
            return false;
        };
        let mut used = false;
        loop {
            if self.rx_len == 0 && !self.read_frame() {
                break;
            }
            match self.deliver(rx, mem) {
                Delivery::Delivered => {
                    self.rx_len = 0;
                    used = true;
                }
                Delivery::Dropped(u) => {
                    self.rx_len = 0;
                    used |= u;
                }
                Delivery::Blocked(u) => {
                    used |= u;
                    break;
                }
            }
        }
        used
    }

    /// Reads the next acceptable frame from the tap into `rx_buf`; false if there is none
    /// (the tap would block, or failed).
    fn read_frame(&mut self) -> bool {
        loop {
            let len = match self.tap.read(&mut self.rx_buf) {
                Ok(0) => return false,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
                Err(e) => {
                    self.rx_drops
                        .record(self.tap.name(), &format!("reading the tap failed: {e}"));
                    return false;
                }
            };
            if len < MIN_BUFFER_LEN {
                self.rx_drops.record(
                    self.tap.name(),
                    "shorter than a header and an Ethernet header",
                );
                continue;
            }
            if len > MAX_BUFFER_LEN {
                // The read filled the spare byte: the kernel cut a longer frame short.
                self.rx_drops
                    .record(self.tap.name(), "longer than 65562 bytes with its header");
                continue;
            }
            let hdr = &mut self.rx_buf[..VNET_HDR_LEN];
            // With offloads off the kernel completes checksums and segments; a frame that
            // still needs either cannot go to a guest that did not negotiate it.
            if hdr[0] & VIRTIO_NET_HDR_F_NEEDS_CSUM != 0 || hdr[1] != VIRTIO_NET_HDR_GSO_NONE {
                self.rx_drops
                    .record(self.tap.name(), "the host left it to be offloaded");
                continue;
            }
            // No receive offloads were negotiated: every field but num_buffers is zero. The
            // kernel leaves num_buffers as it was; one buffer holds the frame.
            hdr[..NUM_BUFFERS_OFFSET].fill(0);
            hdr[NUM_BUFFERS_OFFSET..].copy_from_slice(&1u16.to_le_bytes());
            self.rx_len = len;
            return true;
        }
    }

    /// Puts the pending frame into the next receive chain.
    fn deliver(&mut self, rx: &mut Queue, mem: &GuestMemoryMmap) -> Delivery {
        let frame = &self.rx_buf[..self.rx_len];
        let mut used = false;
        loop {
            let Some(chain) = rx.pop_descriptor_chain(mem) else {
                return Delivery::Blocked(used);
            };
            let head = chain.head_index();
            let capacity = chain
                .clone()
                .writable()
                .fold(0usize, |sum, d| sum.saturating_add(d.len() as usize));
            if capacity < MIN_BUFFER_LEN {
                // No frame fits: give the chain back empty and try the next one.
                if rx.add_used(mem, head, 0).is_err() {
                    return Delivery::Blocked(used);
                }
                used = true;
                continue;
            }
            if capacity < frame.len() {
                // A smaller frame may fit: leave the chain for the next one.
                rx.go_to_previous_position();
                self.rx_drops.record(
                    self.tap.name(),
                    &format!(
                        "{} bytes with its header, the receive buffer holds {capacity}",
                        frame.len()
                    ),
                );
                return Delivery::Dropped(used);
            }
            let written = scatter(chain, mem, frame);
            let len = if written { frame.len() as u32 } else { 0 };
            if rx.add_used(mem, head, len).is_err() {
                return Delivery::Blocked(used);
            }
            if !written {
                self.rx_drops.record(
                    self.tap.name(),
                    "the receive buffer is outside guest memory",
                );
                return Delivery::Dropped(true);
            }
            return Delivery::Delivered;
        }
    }
}

/// Copies the readable part of a transmit chain into `buf`; its length, or why the chain is
/// dropped.
fn gather(
    chain: DescriptorChain<&GuestMemoryMmap>,
    mem: &GuestMemoryMmap,
    buf: &mut [u8],
) -> Result<usize, &'static str> {
    let mut len = 0usize;
    for desc in chain.readable() {
        let part = desc.len() as usize;
        let end = len + part;
        if end > buf.len() {
            return Err("longer than 65562 bytes with its header");
        }
        mem.read_slice(&mut buf[len..end], desc.addr())
            .map_err(|_| "the buffer is outside guest memory")?;
        len = end;
    }
    if len < MIN_BUFFER_LEN {
        return Err("shorter than a header and an Ethernet header");
    }
    // We offered no transmit offloads, so the guest may not ask for any.
    if buf[0] & VIRTIO_NET_HDR_F_NEEDS_CSUM != 0 || buf[1] != VIRTIO_NET_HDR_GSO_NONE {
        return Err("its header asks for an offload that was not negotiated");
    }
    Ok(len)
}

/// Copies `frame` into the writable descriptors of `chain`, which hold at least that much;
/// false if guest memory refused a write.
fn scatter(chain: DescriptorChain<&GuestMemoryMmap>, mem: &GuestMemoryMmap, frame: &[u8]) -> bool {
    let mut done = 0usize;
    for desc in chain.writable() {
        if done == frame.len() {
            break;
        }
        let part = (desc.len() as usize).min(frame.len() - done);
        if mem
            .write_slice(&frame[done..done + part], desc.addr())
            .is_err()
        {
            return false;
        }
        done += part;
    }
    done == frame.len()
}

impl VirtioDevice for NetDevice {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_NET
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.sizes
    }

    fn device_features(&self) -> u64 {
        VIRTIO_F_VERSION_1 | VIRTIO_NET_F_MAC | VIRTIO_NET_F_STATUS
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let Ok(start) = usize::try_from(offset) else {
            return;
        };
        if let Some(src) = self.config.get(start..) {
            let n = src.len().min(data.len());
            data[..n].copy_from_slice(&src[..n]);
        }
    }

    fn process_queue(&mut self, index: usize, queues: &mut [Queue], mem: &GuestMemoryMmap) -> bool {
        match index {
            TX_QUEUE => self.process_tx(queues, mem),
            // New receive buffers: deliver the pending frame and drain the tap again.
            RX_QUEUE => self.process_rx(queues, mem),
            _ => false,
        }
    }

    fn host_event_fd(&self) -> Option<RawFd> {
        Some(self.tap.as_raw_fd())
    }

    fn host_event_edge_triggered(&self) -> bool {
        true
    }

    fn process_host_event(&mut self, queues: &mut [Queue], mem: &GuestMemoryMmap) -> bool {
        self.process_rx(queues, mem)
    }

    fn reset(&mut self) {
        self.rx_len = 0;
    }
}

// The AF_PACKET and link helpers the boot tests use too.
