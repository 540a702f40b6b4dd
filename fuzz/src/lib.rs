//! What the fuzz targets share: guest memory and split virtqueues laid out in it the way a
//! (possibly hostile) driver would, from fuzzer-chosen descriptors. The shim's agent client
//! is the `agent-client` crate, used as the shim uses it.

use std::path::PathBuf;

use arbitrary::Arbitrary;
use virtio_bindings::virtio_ring::{VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// Guest RAM of the targets: two regions with a hole between them, so that descriptors can
/// name memory that is not RAM.
pub const LOW_RAM: (u64, usize) = (0, 0xc_0000);
pub const HIGH_RAM: (u64, usize) = (0xd_0000, 0x3_0000);
/// One past the highest RAM address.
pub const RAM_END: u64 = 0x10_0000;

/// Guest memory as [`LOW_RAM`] and [`HIGH_RAM`].
pub fn guest_memory() -> GuestMemoryMmap {
    match GuestMemoryMmap::from_ranges(&[
        (GuestAddress(LOW_RAM.0), LOW_RAM.1),
        (GuestAddress(HIGH_RAM.0), HIGH_RAM.1),
    ]) {
        Ok(mem) => mem,
        Err(e) => panic!("cannot map the fuzz targets' guest memory: {e}"),
    }
}

/// A guest address the fuzzer picked: mostly in RAM or just past it, sometimes anywhere.
pub fn guest_addr(raw: u32) -> u64 {
    if raw & 0x8000_0000 != 0 {
        u64::from(raw) << 12
    } else {
        u64::from(raw) % (RAM_END + 0x1000)
    }
}

/// A descriptor as a driver writes it, every field the fuzzer's.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub struct RawDesc {
    pub addr: u32,
    pub len: u32,
    pub flags: u8,
    pub next: u8,
}

impl RawDesc {
    /// The descriptor's fields as stored: address and length mostly within guest RAM, the
    /// flags NEXT, WRITE and INDIRECT in any combination.
    pub fn resolve(&self, qsize: u16) -> (u64, u32, u16, u16) {
        let len = if self.len & 0x8000_0000 != 0 {
            self.len
        } else {
            self.len % 0x2_0000
        };
        let flags = u16::from(self.flags)
            & (VRING_DESC_F_NEXT | VRING_DESC_F_WRITE | VRING_DESC_F_INDIRECT) as u16;
        // `next` mostly within the table, sometimes past it.
        let next = if self.next & 0x80 != 0 {
            u16::from(self.next)
        } else {
            u16::from(self.next) % qsize
        };
        (guest_addr(self.addr), len, flags, next)
    }
}

/// A split virtqueue at fixed guest addresses, driven like a driver: descriptors stored,
/// heads published on the avail ring, used entries read back.
pub struct Ring {
    pub size: u16,
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
    avail_idx: u16,
    seen_used: u16,
}

impl Ring {
    /// A ring of `size` entries with its three parts at `desc`, `avail` and `used`.
    pub fn new(size: u16, desc: u64, avail: u64, used: u64) -> Self {
        Ring {
            size,
            desc,
            avail,
            used,
            avail_idx: 0,
            seen_used: 0,
        }
    }

    /// The device's view of this ring, set up and ready.
    pub fn queue(&self) -> Queue {
        let mut queue = match Queue::new(self.size) {
            Ok(q) => q,
            Err(e) => panic!("cannot make a queue of size {}: {e}", self.size),
        };
        queue.set_size(self.size);
        queue.set_desc_table_address(Some(self.desc as u32), Some((self.desc >> 32) as u32));
        queue.set_avail_ring_address(Some(self.avail as u32), Some((self.avail >> 32) as u32));
        queue.set_used_ring_address(Some(self.used as u32), Some((self.used >> 32) as u32));
        queue.set_ready(true);
        queue
    }

    /// Stores descriptor `index` (modulo the table's size).
    pub fn set_desc(
        &self,
        mem: &GuestMemoryMmap,
        index: u16,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) {
        let at = self.desc + 16 * u64::from(index % self.size);
        let mut raw = [0u8; 16];
        raw[0..8].copy_from_slice(&addr.to_le_bytes());
        raw[8..12].copy_from_slice(&len.to_le_bytes());
        raw[12..14].copy_from_slice(&flags.to_le_bytes());
        raw[14..16].copy_from_slice(&next.to_le_bytes());
        // The rings live in RAM by construction.
        let _ = mem.write_slice(&raw, GuestAddress(at));
    }

    /// Offers the chain starting at `head`.
    pub fn publish(&mut self, mem: &GuestMemoryMmap, head: u16) {
        let slot = self.avail + 4 + 2 * u64::from(self.avail_idx % self.size);
        let _ = mem.write_obj(head.to_le(), GuestAddress(slot));
        self.avail_idx = self.avail_idx.wrapping_add(1);
        let _ = mem.write_obj(self.avail_idx.to_le(), GuestAddress(self.avail + 2));
    }

    /// Chains offered and not yet used.
    pub fn outstanding(&self) -> u16 {
        self.avail_idx.wrapping_sub(self.seen_used)
    }

    /// Used entries since the last call, as (descriptor id, length).
    pub fn take_used(&mut self, mem: &GuestMemoryMmap) -> Vec<(u32, u32)> {
        let idx: u16 = mem
            .read_obj(GuestAddress(self.used + 2))
            .unwrap_or(self.seen_used);
        let mut out = Vec::new();
        while self.seen_used != idx && out.len() < usize::from(self.size) {
            let elem = self.used + 4 + 8 * u64::from(self.seen_used % self.size);
            let id: u32 = mem.read_obj(GuestAddress(elem)).unwrap_or(u32::MAX);
            let len: u32 = mem.read_obj(GuestAddress(elem + 4)).unwrap_or(u32::MAX);
            out.push((u32::from_le(id), u32::from_le(len)));
            self.seen_used = self.seen_used.wrapping_add(1);
        }
        out
    }
}

/// A scratch directory for sockets and disk images, one per fuzzing process.
pub fn scratch_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(
        || match tempfile::Builder::new().prefix("kata-fuzz-").tempdir() {
            Ok(d) => d,
            Err(e) => panic!("cannot create a scratch directory for the fuzz target: {e}"),
        },
    )
    .path()
    .to_path_buf()
}
