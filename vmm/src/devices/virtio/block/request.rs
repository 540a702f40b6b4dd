//! A virtio-blk request as the device sees it: one pass over the descriptor chain (which
//! the guest could change under us) collects the device-readable and device-writable
//! segments, the header is read from the first, and the outcome is a [`Completion`].

use std::io;

use virtio_queue::desc::split::Descriptor;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap, VolatileMemoryError};

use super::{QUEUE_SIZE, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK};

/// Indirect descriptors are not offered, so a chain has at most a queue's worth of
/// descriptors; a longer one (through an indirect table anyway) is refused.
pub(super) const MAX_DESCRIPTORS: usize = QUEUE_SIZE as usize;
/// The request header: type (4 bytes), reserved (4), sector (8).
pub(super) const HEADER_LEN: u64 = 16;

/// One non-empty descriptor.
#[derive(Clone, Copy)]
pub(super) struct Segment {
    addr: GuestAddress,
    len: u32,
}

/// The descriptors of the request being handled, kept so that one pass over the chain (which
/// the guest could change under us) decides everything.
#[derive(Default)]
pub(super) struct Request {
    pub(super) readable: Vec<Segment>,
    pub(super) writable: Vec<Segment>,
    pub(super) readable_len: u64,
    pub(super) writable_len: u64,
    /// The last byte of the last device-writable descriptor.
    pub(super) status: Option<GuestAddress>,
    /// More than [`MAX_DESCRIPTORS`] descriptors.
    pub(super) too_long: bool,
}

impl Request {
    pub(super) fn collect(&mut self, chain: impl Iterator<Item = Descriptor>) {
        self.readable.clear();
        self.writable.clear();
        self.readable_len = 0;
        self.writable_len = 0;
        self.status = None;
        self.too_long = false;
        // virtio-queue ends a chain at the queue size (or an indirect table's size) and at
        // 4 GiB in total, so the lengths cannot overflow and the walk is bounded.
        for (count, desc) in chain.enumerate() {
            if desc.len() == 0 {
                continue;
            }
            self.too_long |= count >= MAX_DESCRIPTORS;
            let segment = Segment {
                addr: desc.addr(),
                len: desc.len(),
            };
            let (list, total) = if desc.is_write_only() {
                self.status = desc
                    .addr()
                    .0
                    .checked_add(u64::from(desc.len()) - 1)
                    .map(GuestAddress);
                (&mut self.writable, &mut self.writable_len)
            } else {
                (&mut self.readable, &mut self.readable_len)
            };
            *total += u64::from(desc.len());
            if !self.too_long {
                list.push(segment);
            }
        }
    }
}

/// What a request asks for, from its header.
pub(super) struct Header {
    /// `VIRTIO_BLK_T_*`.
    pub(super) kind: u32,
    /// The first sector it addresses.
    pub(super) sector: u64,
}

impl Request {
    /// The header at the start of the device-readable stream, or `None` if the chain is too
    /// long or too short for one, or names memory that is not RAM.
    pub(super) fn header(&self, mem: &GuestMemoryMmap) -> Option<Header> {
        if self.too_long || self.readable_len < HEADER_LEN {
            return None;
        }
        let mut header = [0u8; HEADER_LEN as usize];
        let mut done = 0;
        for_each_piece(&self.readable, 0, HEADER_LEN, |addr, n| {
            let piece = header.get_mut(done..done + n).ok_or(Failure::Refused)?;
            mem.read_slice(piece, addr).map_err(|_| Failure::Refused)?;
            done += n;
            Ok(())
        })
        .ok()?;
        let [t0, t1, t2, t3, _, _, _, _, s0, s1, s2, s3, s4, s5, s6, s7] = header;
        Some(Header {
            kind: u32::from_le_bytes([t0, t1, t2, t3]),
            sector: u64::from_le_bytes([s0, s1, s2, s3, s4, s5, s6, s7]),
        })
    }
}

/// Why a request failed.
pub(super) enum Failure {
    /// The request asks for something it may not have, or names memory that is not RAM.
    Refused,
    /// The host file failed.
    Host(io::Error),
}

impl From<VolatileMemoryError> for Failure {
    fn from(e: VolatileMemoryError) -> Self {
        match e {
            VolatileMemoryError::IOError(e) => Failure::Host(e),
            _ => Failure::Refused,
        }
    }
}

/// How a request ended: its status, the bytes it put in guest memory before the status byte,
/// and a host error worth reporting.
pub(super) struct Completion {
    pub(super) status: u8,
    pub(super) written: u64,
    pub(super) host_error: Option<io::Error>,
}

impl Completion {
    pub(super) fn new(status: u8) -> Self {
        Completion {
            status,
            written: 0,
            host_error: None,
        }
    }

    pub(super) fn from_result(result: Result<(), Failure>, written: u64) -> Self {
        let (status, host_error) = match result {
            Ok(()) => (VIRTIO_BLK_S_OK, None),
            Err(Failure::Refused) => (VIRTIO_BLK_S_IOERR, None),
            Err(Failure::Host(e)) => (VIRTIO_BLK_S_IOERR, Some(e)),
        };
        Completion {
            status,
            written,
            host_error,
        }
    }
}

/// Calls `f(address, length)` on the pieces of `segments`, taken as one byte stream, that
/// cover `start..start + len`; stops at the first error.
pub(super) fn for_each_piece(
    segments: &[Segment],
    start: u64,
    len: u64,
    mut f: impl FnMut(GuestAddress, usize) -> Result<(), Failure>,
) -> Result<(), Failure> {
    let end = start.checked_add(len).ok_or(Failure::Refused)?;
    let mut pos = 0u64;
    for segment in segments {
        if pos >= end {
            break;
        }
        let segment_end = pos + u64::from(segment.len);
        let (from, to) = (start.max(pos), end.min(segment_end));
        if from < to {
            let addr = segment
                .addr
                .0
                .checked_add(from - pos)
                .ok_or(Failure::Refused)?;
            f(GuestAddress(addr), (to - from) as usize)?;
        }
        pos = segment_end;
    }
    if pos < end {
        return Err(Failure::Refused);
    }
    Ok(())
}
