//! Test guest memory and queues for the vsock device model.

use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::connection::VsockConnection;
use super::packet::{PacketHeader, HDR_SIZE};

/// Where test packet buffers start in test guest memory (queues live below).
const BUF_BASE: u64 = 0x10_0000;

pub fn test_memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x100_0000)]).expect("test guest memory")
}

/// One writable buffer to let a connection write a single packet into.
pub struct RxChain {
    mem: GuestMemoryMmap,
    size: u32,
}

impl RxChain {
    pub fn new(size: u32) -> Self {
        RxChain {
            mem: test_memory(),
            size,
        }
    }

    /// Lets `conn` fill the buffer; returns the packet, or `None` if it wrote nothing.
    pub fn fill(&self, conn: &mut VsockConnection) -> Option<(PacketHeader, Vec<u8>)> {
        let vq = MockSplitQueue::new(&self.mem, 16);
        let desc = SplitDescriptor::new(BUF_BASE, self.size, VRING_DESC_F_WRITE as u16, 0);
        let chain = vq
            .build_desc_chain(&[RawDescriptor::from(desc)])
            .expect("rx chain");
        let mut writer = chain.writer(&self.mem).expect("writer");
        let mut scratch = vec![0u8; 64 * 1024];
        let n = conn.fill_rx(&mut writer, &mut scratch).expect("fill_rx")?;
        Some(read_packet(&self.mem, BUF_BASE, n))
    }
}

/// Reads a packet of `n` bytes written at `addr`.
pub fn read_packet(mem: &GuestMemoryMmap, addr: u64, n: u32) -> (PacketHeader, Vec<u8>) {
    let mut raw = [0u8; HDR_SIZE];
    mem.read_slice(&mut raw, GuestAddress(addr))
        .expect("header");
    let hdr = PacketHeader::decode(&raw);
    let mut data = vec![0u8; n as usize - HDR_SIZE];
    mem.read_slice(&mut data, GuestAddress(addr + HDR_SIZE as u64))
        .expect("payload");
    (hdr, data)
}

/// Queue size of `TestQueue`s.
const QSIZE: u16 = 256;
/// Each descriptor index owns one 64 KiB buffer slot.
const SLOT: u64 = 0x1_0000;

/// Test memory big enough for two `TestQueue`s at `TX_BASE` / `RX_BASE`.
pub fn big_test_memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x300_0000)]).expect("test guest memory")
}

/// A split queue on test memory that a test fills like a driver would. Descriptor indexes
/// and buffers are recycled in order, so up to 256 buffers may be outstanding.
pub struct TestQueue<'a> {
    mem: &'a GuestMemoryMmap,
    vq: MockSplitQueue<'a, GuestMemoryMmap>,
    avail: u64,
    used: u64,
    buf_base: u64,
    /// Next descriptor index (mod QSIZE) and avail index.
    next_desc: u16,
    avail_idx: u16,
    /// Used entries already returned by `take_used`.
    seen_used: u16,
    pub queue: Queue,
}

impl<'a> TestQueue<'a> {
    /// A queue whose rings live at `base` and buffers at `buf_base` (16 MiB).
    pub fn new(mem: &'a GuestMemoryMmap, base: u64, buf_base: u64) -> Self {
        // The mock lays out the descriptor table; the rings are placed here because the
        // mock's used ring overlaps the second half of a 256-entry avail ring.
        let vq = MockSplitQueue::create(mem, GuestAddress(base), QSIZE);
        let avail = base + 16 * u64::from(QSIZE);
        let used = (avail + 6 + 2 * u64::from(QSIZE)).next_multiple_of(4);
        let mut queue = Queue::new(QSIZE).expect("queue");
        queue.set_size(QSIZE);
        queue.set_desc_table_address(Some(base as u32), Some((base >> 32) as u32));
        queue.set_avail_ring_address(Some(avail as u32), Some((avail >> 32) as u32));
        queue.set_used_ring_address(Some(used as u32), Some((used >> 32) as u32));
        queue.set_ready(true);
        TestQueue {
            mem,
            vq,
            avail,
            used,
            buf_base,
            next_desc: 0,
            avail_idx: 0,
            seen_used: 0,
            queue,
        }
    }

    fn slot(&self, index: u16) -> u64 {
        self.buf_base + u64::from(index) * SLOT
    }

    fn take_desc(&mut self) -> u16 {
        let i = self.next_desc;
        self.next_desc = (self.next_desc + 1) % QSIZE;
        i
    }

    fn publish(&mut self, head: u16) {
        let ring = self.avail + 4 + u64::from(self.avail_idx % QSIZE) * 2;
        self.mem
            .write_obj(head.to_le(), GuestAddress(ring))
            .expect("avail ring");
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.mem
            .write_obj(
                self.avail_idx.to_le(),
                GuestAddress(self.vq.avail_addr().0 + 2),
            )
            .expect("avail idx");
    }

    /// Offers `count` writable rx buffers of `size` bytes (at most 64 KiB).
    pub fn add_rx_buffers(&mut self, count: u16, size: u32) {
        for _ in 0..count {
            let i = self.take_desc();
            let desc = SplitDescriptor::new(self.slot(i), size, VRING_DESC_F_WRITE as u16, 0);
            self.vq
                .desc_table()
                .store(i, RawDescriptor::from(desc))
                .expect("desc");
            self.publish(i);
        }
    }

    /// Tops the queue up to `count` outstanding rx buffers of `size` bytes.
    pub fn top_up_rx_buffers(&mut self, count: u16, size: u32) {
        let outstanding = self.avail_idx.wrapping_sub(self.seen_used);
        if outstanding < count {
            self.add_rx_buffers(count - outstanding, size);
        }
    }

    /// Puts a packet on the (tx) queue as a header descriptor and a payload descriptor.
    pub fn add_tx_packet(&mut self, hdr: &PacketHeader, payload: &[u8]) {
        let pieces: &[&[u8]] = if payload.is_empty() { &[] } else { &[payload] };
        self.add_tx_packet_in_pieces(hdr, pieces);
    }

    /// Puts a packet on the (tx) queue as a header descriptor followed by one descriptor
    /// per payload piece, as a Linux guest sends pages spliced into its socket (the skb's
    /// frags, each a buffer of its own).
    pub fn add_tx_packet_in_pieces(&mut self, hdr: &PacketHeader, pieces: &[&[u8]]) {
        let h = self.take_desc();
        self.mem
            .write_slice(&hdr.encode(), GuestAddress(self.slot(h)))
            .expect("header");
        let mut descs = vec![(h, HDR_SIZE as u32)];
        for piece in pieces {
            let p = self.take_desc();
            self.mem
                .write_slice(piece, GuestAddress(self.slot(p)))
                .expect("payload");
            descs.push((p, piece.len() as u32));
        }
        for (i, &(index, len)) in descs.iter().enumerate() {
            let (flags, next) = match descs.get(i + 1) {
                Some(&(next, _)) => (VRING_DESC_F_NEXT as u16, next),
                None => (0, 0),
            };
            let desc = SplitDescriptor::new(self.slot(index), len, flags, next);
            self.vq
                .desc_table()
                .store(index, RawDescriptor::from(desc))
                .expect("desc");
        }
        self.publish(h);
    }

    /// Used entries added since the last call, as (descriptor id, length).
    pub fn take_used(&mut self) -> Vec<(u32, u32)> {
        let idx: u16 = self
            .mem
            .read_obj(GuestAddress(self.used + 2))
            .expect("used idx");
        let mut out = Vec::new();
        while self.seen_used != idx {
            let elem = self.used + 4 + u64::from(self.seen_used % QSIZE) * 8;
            let id: u32 = self.mem.read_obj(GuestAddress(elem)).expect("used id");
            let len: u32 = self.mem.read_obj(GuestAddress(elem + 4)).expect("used len");
            out.push((u32::from_le(id), u32::from_le(len)));
            self.seen_used = self.seen_used.wrapping_add(1);
        }
        out
    }

    /// Packets the device wrote into rx buffers since the last call.
    pub fn take_rx_packets(&mut self) -> Vec<(PacketHeader, Vec<u8>)> {
        self.take_used()
            .into_iter()
            .map(|(id, len)| read_packet(self.mem, self.slot(id as u16), len))
            .collect()
    }
}
