//! virtio-net through the virtio-mmio transport on a real tap (root only), with an
//! AF_PACKET socket as the host's end: frames both ways, malformed and oversized chains,
//! a guest with no receive buffer, reset.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::epoll::EpollEvent;
use vmm_sys_util::eventfd::EventFd;

use super::device::{NUM_BUFFERS_OFFSET, VIRTIO_NET_HDR_F_NEEDS_CSUM};
use super::tap::{Tap, TapError, VNET_HDR_LEN};
use super::test_utils::{self as host_net, link_up, taps_available, unique_name, PacketSocket};
use super::*;
use crate::config::NetConfig;
use crate::devices::bus::BusDevice;
use crate::devices::virtio::mmio::tests::{read32, test_mem, write32, AVAIL, DESC, USED};
use crate::devices::virtio::mmio::{
    MmioTransport, STATUS_ACKNOWLEDGE, STATUS_DRIVER, STATUS_DRIVER_OK, STATUS_FAILED,
    STATUS_FEATURES_OK,
};
use crate::devices::virtio::notifier::QueueNotifier;

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
