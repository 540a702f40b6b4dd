//! virtio-net (device id 1) on a host tap: queue 0 receives, queue 1 transmits, no control
//! queue and no offloads.
//!
//! A virtio-net buffer and a tap frame share one layout, the 12-byte `virtio_net_hdr_v1`
//! followed by the Ethernet frame, so frames pass through with only the header checked. The
//! tap is watched edge-triggered: a report drains it until it would block or the guest has no
//! receive buffer left; the frame that found no buffer waits in the device, and the receive
//! queue's next notification (new buffers) delivers it and resumes draining.

use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestMemoryMmap};

use super::mmio::{VirtioDevice, VIRTIO_F_VERSION_1};
use super::tap::{Tap, TapError, VNET_HDR_LEN};
use crate::config::{parse_mac, ConfigError, NetConfig};
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
const VIRTIO_NET_HDR_F_NEEDS_CSUM: u8 = 1;
/// Header `gso_type`: no segmentation offload.
const VIRTIO_NET_HDR_GSO_NONE: u8 = 0;
/// Offset of `num_buffers` in the header.
const NUM_BUFFERS_OFFSET: usize = 10;
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
#[cfg(test)]
#[path = "../../tests/net/mod.rs"]
mod host_net;

#[cfg(test)]
mod tests {
    use super::host_net::{self, link_up, PacketSocket};
    use super::*;
    use crate::devices::bus::BusDevice;
    use crate::devices::mmio::tests::{read32, test_mem, write32, AVAIL, DESC, USED};
    use crate::devices::mmio::{
        MmioTransport, STATUS_ACKNOWLEDGE, STATUS_DRIVER, STATUS_DRIVER_OK, STATUS_FAILED,
        STATUS_FEATURES_OK,
    };
    use crate::devices::notifier::QueueNotifier;
    use crate::devices::tap::tests::{taps_available, unique_name};
    use std::sync::{Arc, Mutex};
    use vm_memory::GuestAddress;
    use vmm_sys_util::epoll::EpollEvent;
    use vmm_sys_util::eventfd::EventFd;

    const GUEST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
    const HOST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
    const RING_SIZE: u16 = 16;
    const DESC_F_NEXT: u16 = 1;
    const DESC_F_WRITE: u16 = 2;

    /// The driver side of one split virtqueue in test memory.
    struct Ring {
        desc: u64,
        avail: u64,
        used: u64,
        next_desc: u16,
        avail_idx: u16,
    }

    impl Ring {
        fn new(desc: u64, avail: u64, used: u64) -> Self {
            Ring {
                desc,
                avail,
                used,
                next_desc: 0,
                avail_idx: 0,
            }
        }

        /// Makes `parts` (address, length, device-writable) one chain and offers it.
        fn push(&mut self, mem: &GuestMemoryMmap, parts: &[(u64, u32, bool)]) -> u16 {
            let head = self.next_desc;
            for (i, (addr, len, writable)) in parts.iter().enumerate() {
                let index = self.next_desc;
                self.next_desc = (self.next_desc + 1) % RING_SIZE;
                let mut flags = if *writable { DESC_F_WRITE } else { 0 };
                if i + 1 < parts.len() {
                    flags |= DESC_F_NEXT;
                }
                let d = self.desc + u64::from(index) * 16;
                mem.write_obj(*addr, GuestAddress(d)).unwrap();
                mem.write_obj(*len, GuestAddress(d + 8)).unwrap();
                mem.write_obj(flags, GuestAddress(d + 12)).unwrap();
                mem.write_obj(self.next_desc, GuestAddress(d + 14)).unwrap();
            }
            let slot = u64::from(self.avail_idx % RING_SIZE);
            mem.write_obj(head, GuestAddress(self.avail + 4 + slot * 2))
                .unwrap();
            self.avail_idx = self.avail_idx.wrapping_add(1);
            mem.write_obj(self.avail_idx, GuestAddress(self.avail + 2))
                .unwrap();
            head
        }

        fn used_idx(&self, mem: &GuestMemoryMmap) -> u16 {
            mem.read_obj(GuestAddress(self.used + 2)).unwrap()
        }

        /// Used element `i`: (head, length).
        fn used(&self, mem: &GuestMemoryMmap, i: u16) -> (u32, u32) {
            let e = self.used + 4 + u64::from(i % RING_SIZE) * 8;
            (
                mem.read_obj(GuestAddress(e)).unwrap(),
                mem.read_obj(GuestAddress(e + 4)).unwrap(),
            )
        }
    }

    /// Waits (up to 10 s) until `fd` is readable.
    fn wait_readable(fd: RawFd) -> bool {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd, valid for the call.
        unsafe { libc::poll(&mut pfd, 1, 10_000) == 1 }
    }

    /// Whether `fd` is readable right now.
    fn readable_now(fd: RawFd) -> bool {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd, valid for the call.
        unsafe { libc::poll(&mut pfd, 1, 0) == 1 }
    }

    /// An Ethernet frame of [`ETHERTYPE`] with `len` bytes in all, payload bytes counting
    /// up from `seed`.
    fn frame(dst: [u8; 6], src: [u8; 6], len: usize, seed: u8) -> Vec<u8> {
        let payload: Vec<u8> = (0..len.saturating_sub(14))
            .map(|i| seed.wrapping_add(i as u8))
            .collect();
        host_net::frame(dst, src, &payload)
    }

    /// A virtio-net device on a fresh, up tap, activated with both queues, and an AF_PACKET
    /// socket on the same interface. The tap goes away with the transport.
    struct Harness {
        mem: GuestMemoryMmap,
        t: MmioTransport,
        irq: EventFd,
        rx: Ring,
        tx: Ring,
        sock: PacketSocket,
        tap_fd: RawFd,
    }

    impl Harness {
        fn new() -> Option<Self> {
            if !taps_available() {
                return None;
            }
            let name = unique_name();
            let tap = Tap::open(&name).unwrap();
            let tap_fd = tap.as_raw_fd();
            let mem = test_mem();
            let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
            let mut t = MmioTransport::new(
                Box::new(NetDevice::new(tap, GUEST_MAC)),
                mem.clone(),
                irq.try_clone().unwrap(),
            )
            .unwrap();
            link_up(&name);
            let sock = PacketSocket::bind(&name, std::time::Duration::from_secs(10));
            let rx = Ring::new(DESC, AVAIL, USED);
            let tx = Ring::new(0x4000, 0x5000, 0x6000);
            activate(&mut t, &[&rx, &tx]);
            Some(Harness {
                mem,
                t,
                irq,
                rx,
                tx,
                sock,
                tap_fd,
            })
        }

        /// Waits for the tap to have a frame, then reports it as the device thread would.
        fn host_event(&mut self) {
            assert!(wait_readable(self.tap_fd), "nothing arrived on the tap");
            self.t.host_event();
        }

        fn guest_bytes(&self, addr: u64, len: usize) -> Vec<u8> {
            let mut v = vec![0u8; len];
            self.mem.read_slice(&mut v, GuestAddress(addr)).unwrap();
            v
        }

        /// The header a received frame gets: nothing offloaded, one buffer.
        fn rx_header() -> Vec<u8> {
            let mut h = vec![0u8; VNET_HDR_LEN];
            h[NUM_BUFFERS_OFFSET] = 1;
            h
        }
    }

    /// The driver's handshake: MAC and STATUS accepted, `rings` as queues 0, 1, ...
    fn activate(t: &mut MmioTransport, rings: &[&Ring]) {
        write32(t, 0x70, STATUS_ACKNOWLEDGE);
        write32(t, 0x70, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
        write32(t, 0x24, 0);
        write32(t, 0x20, (VIRTIO_NET_F_MAC | VIRTIO_NET_F_STATUS) as u32);
        write32(t, 0x24, 1);
        write32(t, 0x20, 1); // VERSION_1
        let features_ok = STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK;
        write32(t, 0x70, features_ok);
        assert_ne!(read32(t, 0x70) & STATUS_FEATURES_OK, 0);
        for (index, ring) in rings.iter().enumerate() {
            write32(t, 0x30, index as u32);
            write32(t, 0x38, u32::from(RING_SIZE));
            write32(t, 0x80, ring.desc as u32);
            write32(t, 0x90, ring.avail as u32);
            write32(t, 0xa0, ring.used as u32);
            write32(t, 0x44, 1);
        }
        write32(t, 0x70, features_ok | STATUS_DRIVER_OK);
        assert_eq!(read32(t, 0x70) & STATUS_FAILED, 0);
    }

    #[test]
    fn derived_macs_are_stable_local_unicast_and_differ_per_tap() {
        let a = mac_from_tap_name("tap0");
        assert_eq!(a, mac_from_tap_name("tap0"));
        assert_ne!(a, mac_from_tap_name("tap1"));
        for name in ["tap0", "tap1", "kata-eth0", "x"] {
            let mac = mac_from_tap_name(name);
            assert_eq!(mac[0] & 0x03, 0x02, "{name}: {mac:02x?}");
        }
    }

    #[test]
    fn config_errors_name_what_is_wrong() {
        let bad_mac = NetConfig {
            tap: "tap0".into(),
            mac: Some("02:00:00:00:00".into()),
        };
        let err = NetDevice::from_config(&bad_mac).err().unwrap();
        assert!(matches!(err, NetError::Mac(_)), "{err}");
        let bad_tap = NetConfig {
            tap: "a/b".into(),
            mac: None,
        };
        let err = NetDevice::from_config(&bad_tap).err().unwrap();
        assert!(
            matches!(err, NetError::Tap(TapError::InvalidName(_))),
            "{err}"
        );
        assert!(err.to_string().contains("\"a/b\""), "{err}");
    }

    #[test]
    fn identification_features_and_config_space() {
        if !taps_available() {
            return;
        }
        let name = unique_name();
        let configured = NetDevice::from_config(&NetConfig {
            tap: name.clone(),
            mac: Some("02:12:34:56:78:9a".into()),
        })
        .unwrap();
        assert_eq!(configured.mac(), [0x02, 0x12, 0x34, 0x56, 0x78, 0x9a]);
        drop(configured);
        let derived = NetDevice::from_config(&NetConfig {
            tap: name.clone(),
            mac: None,
        })
        .unwrap();
        let mac = mac_from_tap_name(&name);
        assert_eq!(derived.mac(), mac);

        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let mut t = MmioTransport::new(Box::new(derived), test_mem(), irq).unwrap();
        assert_eq!(read32(&mut t, 0x8), VIRTIO_ID_NET);
        assert_eq!(read32(&mut t, 0x10), (1 << 5) | (1 << 16));
        write32(&mut t, 0x14, 1);
        assert_eq!(read32(&mut t, 0x10), 1, "VERSION_1");
        for queue in 0..2 {
            write32(&mut t, 0x30, queue);
            assert_eq!(read32(&mut t, 0x34), 256);
        }
        write32(&mut t, 0x30, 2);
        assert_eq!(read32(&mut t, 0x34), 0, "no control queue");

        let mut cfg = [0xffu8; 6];
        t.read(0x100, &mut cfg);
        assert_eq!(cfg, mac);
        let mut status = [0u8; 2];
        t.read(0x106, &mut status);
        assert_eq!(u16::from_le_bytes(status), VIRTIO_NET_S_LINK_UP);
        let mut word = [0u8; 4];
        t.read(0x104, &mut word);
        assert_eq!(word, [mac[4], mac[5], 1, 0]);
        let mut past = [0xffu8; 4];
        t.read(0x108, &mut past);
        assert_eq!(past, [0; 4], "nothing past the status");
    }

    #[test]
    fn transmitted_chains_reach_the_tap_exactly() {
        let Some(mut h) = Harness::new() else {
            return;
        };
        // Header and frame in separate descriptors, the frame split in two.
        let first = frame([0xff; 6], GUEST_MAC, 100, 1);
        h.mem
            .write_slice(&[0u8; VNET_HDR_LEN], GuestAddress(0xc000))
            .unwrap();
        h.mem.write_slice(&first, GuestAddress(0xc100)).unwrap();
        h.tx.push(
            &h.mem,
            &[
                (0xc000, 12, false),
                (0xc100, 40, false),
                (0xc128, 60, false),
            ],
        );
        // Header and frame in one descriptor.
        let second = frame(HOST_MAC, GUEST_MAC, 1514, 7);
        h.mem
            .write_slice(&[0u8; VNET_HDR_LEN], GuestAddress(0xd000))
            .unwrap();
        h.mem.write_slice(&second, GuestAddress(0xd00c)).unwrap();
        h.tx.push(&h.mem, &[(0xd000, 12 + 1514, false)]);
        write32(&mut h.t, 0x50, TX_QUEUE as u32);

        assert_eq!(h.tx.used_idx(&h.mem), 2);
        assert_eq!(h.tx.used(&h.mem, 0), (0, 0));
        assert_eq!(h.tx.used(&h.mem, 1), (3, 0));
        assert_eq!(h.irq.read().unwrap(), 1);
        assert_eq!(h.sock.recv(), first);
        assert_eq!(h.sock.recv(), second);
    }

    #[test]
    fn malformed_transmit_chains_are_used_but_not_sent() {
        let Some(mut h) = Harness::new() else {
            return;
        };
        let good = frame([0xff; 6], GUEST_MAC, 60, 9);
        h.mem
            .write_slice(&[0u8; VNET_HDR_LEN], GuestAddress(0xc000))
            .unwrap();
        h.mem.write_slice(&good, GuestAddress(0xc00c)).unwrap();
        // Shorter than a header and an Ethernet header.
        h.tx.push(&h.mem, &[(0xc000, 20, false)]);
        // Longer than 65562 bytes.
        h.tx.push(
            &h.mem,
            &[
                (0x8000, 0x6000, false),
                (0x8000, 0x6000, false),
                (0x8000, 0x6000, false),
            ],
        );
        // Outside guest memory.
        h.tx.push(&h.mem, &[(0xc000, 12, false), (0x10_0000, 60, false)]);
        // A checksum offload that was not negotiated.
        let mut csum = good.clone();
        csum.splice(
            0..0,
            [VIRTIO_NET_HDR_F_NEEDS_CSUM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        );
        h.mem.write_slice(&csum, GuestAddress(0xe000)).unwrap();
        h.tx.push(&h.mem, &[(0xe000, csum.len() as u32, false)]);
        // Then a good one.
        h.tx.push(&h.mem, &[(0xc000, 12 + 60, false)]);
        write32(&mut h.t, 0x50, TX_QUEUE as u32);

        assert_eq!(h.tx.used_idx(&h.mem), 5, "every chain is used");
        for i in 0..5 {
            assert_eq!(h.tx.used(&h.mem, i).1, 0);
        }
        assert_eq!(h.sock.recv(), good, "only the good frame is sent");
    }

    #[test]
    fn received_frames_land_in_rx_buffers_with_a_plain_header() {
        let Some(mut h) = Harness::new() else {
            return;
        };
        // Header in its own descriptor, then the frame over two more.
        h.rx.push(
            &h.mem,
            &[
                (0x8000, 12, true),
                (0x8100, 1000, true),
                (0x8600, 1000, true),
            ],
        );
        write32(&mut h.t, 0x50, RX_QUEUE as u32);
        assert_eq!(h.rx.used_idx(&h.mem), 0, "nothing to receive yet");
        assert!(h.irq.read().is_err());

        let sent = frame(GUEST_MAC, HOST_MAC, 1400, 3);
        // The kernel may leave bytes it does not fill as they were: make them non-zero.
        h.mem
            .write_slice(&[0xaa; 12], GuestAddress(0x8000))
            .unwrap();
        h.sock.send(&sent);
        h.host_event();

        assert_eq!(h.rx.used_idx(&h.mem), 1);
        assert_eq!(h.rx.used(&h.mem, 0), (0, 12 + 1400));
        assert_eq!(h.guest_bytes(0x8000, 12), Harness::rx_header());
        let mut got = h.guest_bytes(0x8100, 1000);
        got.extend(h.guest_bytes(0x8600, 400));
        assert_eq!(got, sent);
        assert_eq!(h.irq.read().unwrap(), 1);
    }

    #[test]
    fn a_frame_without_a_buffer_waits_for_the_rx_notification() {
        let Some(mut h) = Harness::new() else {
            return;
        };
        let one = frame(GUEST_MAC, HOST_MAC, 200, 1);
        let two = frame(GUEST_MAC, HOST_MAC, 300, 2);
        h.sock.send(&one);
        h.host_event();
        assert_eq!(h.rx.used_idx(&h.mem), 0);
        assert!(h.irq.read().is_err(), "no interrupt without a used buffer");
        assert!(
            !readable_now(h.tap_fd),
            "the device took the frame off the tap and keeps it"
        );
        // Another report while the frame waits changes nothing.
        h.sock.send(&two);
        h.host_event();
        assert_eq!(h.rx.used_idx(&h.mem), 0);

        // New buffers and their notification deliver the waiting frame and the queued one.
        h.rx.push(&h.mem, &[(0x8000, 2048, true)]);
        h.rx.push(&h.mem, &[(0x8800, 2048, true)]);
        write32(&mut h.t, 0x50, RX_QUEUE as u32);
        assert_eq!(h.rx.used_idx(&h.mem), 2);
        assert_eq!(h.rx.used(&h.mem, 0), (0, 12 + 200));
        assert_eq!(h.rx.used(&h.mem, 1), (1, 12 + 300));
        assert_eq!(h.guest_bytes(0x8000, 12), Harness::rx_header());
        assert_eq!(h.guest_bytes(0x800c, 200), one);
        assert_eq!(h.guest_bytes(0x880c, 300), two);
        assert_eq!(h.irq.read().unwrap(), 1);
        assert!(!readable_now(h.tap_fd));
    }

    #[test]
    fn the_device_thread_does_not_spin_on_frames_the_guest_has_no_room_for() {
        let Some(h) = Harness::new() else {
            return;
        };
        let Harness {
            mem,
            t,
            mut rx,
            sock,
            tap_fd,
            ..
        } = h;
        let t = Arc::new(Mutex::new(t));
        let mut notifier = QueueNotifier::new().unwrap();
        notifier.add(&t).unwrap();
        let mut events = vec![EpollEvent::default(); 4];

        let one = frame(GUEST_MAC, HOST_MAC, 200, 1);
        let two = frame(GUEST_MAC, HOST_MAC, 300, 2);
        sock.send(&one);
        sock.send(&two);
        assert!(wait_readable(tap_fd));
        // At most one report per arriving frame; the first frame waits in the device.
        let mut reports = 0;
        for _ in 0..3 {
            reports += notifier.dispatch(100, &mut events).unwrap();
        }
        assert!((1..=2).contains(&reports), "{reports} reports");
        assert!(readable_now(tap_fd), "the second frame waits in the tap");
        let mut reports = 0;
        for _ in 0..5 {
            reports += notifier.dispatch(20, &mut events).unwrap();
        }
        assert_eq!(
            reports, 0,
            "a tap that stays readable is not reported again"
        );

        // The guest's kick after adding buffers resumes delivery through the same thread.
        rx.push(&mem, &[(0x8000, 2048, true)]);
        rx.push(&mem, &[(0x8800, 2048, true)]);
        t.lock().unwrap().queue_evts()[RX_QUEUE].write(1).unwrap();
        assert_eq!(notifier.dispatch(10_000, &mut events).unwrap(), 1);
        assert_eq!(rx.used_idx(&mem), 2);
        let mut got = vec![0u8; 200];
        mem.read_slice(&mut got, GuestAddress(0x800c)).unwrap();
        assert_eq!(got, one);
        let mut got = vec![0u8; 300];
        mem.read_slice(&mut got, GuestAddress(0x880c)).unwrap();
        assert_eq!(got, two);
    }

    #[test]
    fn a_frame_too_big_for_the_buffer_is_dropped_not_truncated() {
        let Some(mut h) = Harness::new() else {
            return;
        };
        // A chain too small for any frame, then one of 100 bytes.
        h.rx.push(&h.mem, &[(0x8000, 8, true)]);
        h.rx.push(&h.mem, &[(0x8800, 100, true)]);
        h.sock.send(&frame(GUEST_MAC, HOST_MAC, 200, 1));
        h.host_event();
        assert_eq!(h.rx.used_idx(&h.mem), 1, "only the useless chain is used");
        assert_eq!(h.rx.used(&h.mem, 0), (0, 0));

        // The 100-byte buffer is still there for a frame that fits.
        let small = frame(GUEST_MAC, HOST_MAC, 60, 5);
        h.sock.send(&small);
        h.host_event();
        assert_eq!(h.rx.used_idx(&h.mem), 2);
        assert_eq!(h.rx.used(&h.mem, 1), (1, 12 + 60));
        assert_eq!(h.guest_bytes(0x880c, 60), small);
    }

    #[test]
    fn reset_discards_the_waiting_frame() {
        let Some(mut h) = Harness::new() else {
            return;
        };
        h.sock.send(&frame(GUEST_MAC, HOST_MAC, 200, 1));
        h.host_event();
        write32(&mut h.t, 0x70, 0);
        h.rx = Ring::new(DESC, AVAIL, USED);
        h.tx = Ring::new(0x4000, 0x5000, 0x6000);
        h.mem.write_obj(0u16, GuestAddress(USED + 2)).unwrap();
        activate(&mut h.t, &[&h.rx, &h.tx]);
        h.rx.push(&h.mem, &[(0x8000, 2048, true)]);
        write32(&mut h.t, 0x50, RX_QUEUE as u32);
        assert_eq!(h.rx.used_idx(&h.mem), 0);
        // The device still receives afterwards.
        let after = frame(GUEST_MAC, HOST_MAC, 80, 4);
        h.sock.send(&after);
        h.host_event();
        assert_eq!(h.rx.used_idx(&h.mem), 1);
        assert_eq!(h.guest_bytes(0x800c, 80), after);
    }
}
