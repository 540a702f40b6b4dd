//! The virtio-vsock packet header (virtio spec 1.2, 5.10.6) and moving packets between
//! descriptor chains and the device model.
//!
//! The header is 44 bytes, little-endian, and precedes the payload in every chain. This module
//! only encodes and decodes; what a packet means is up to `connection` and `muxer`.

use std::io::{self, Read, Write};

use thiserror::Error;
use virtio_queue::{Reader, Writer};
use vm_memory::bitmap::BitmapSlice;

/// Size of the packet header in guest memory.
pub const HDR_SIZE: usize = 44;
/// The only socket type supported: a stream.
pub const TYPE_STREAM: u16 = 1;
/// Largest payload accepted from the guest in one packet (Linux's own limit).
pub const MAX_PKT_PAYLOAD: usize = 64 * 1024;

/// Packet operations.
pub const OP_REQUEST: u16 = 1;
pub const OP_RESPONSE: u16 = 2;
pub const OP_RST: u16 = 3;
pub const OP_SHUTDOWN: u16 = 4;
pub const OP_RW: u16 = 5;
pub const OP_CREDIT_UPDATE: u16 = 6;
pub const OP_CREDIT_REQUEST: u16 = 7;

/// `SHUTDOWN` flags: the sender will receive no more / send no more.
pub const SHUTDOWN_RCV: u32 = 1;
pub const SHUTDOWN_SEND: u32 = 2;
pub const SHUTDOWN_BOTH: u32 = SHUTDOWN_RCV | SHUTDOWN_SEND;

/// Errors of reading or writing packets in descriptor chains.
#[derive(Debug, Error)]
pub enum PacketError {
    #[error("the descriptor chain holds {0} bytes, fewer than the 44-byte vsock header")]
    ChainTooShort(usize),
    #[error(
        "the packet header announces {0} payload bytes, more than the 64 KiB a packet may carry"
    )]
    PayloadTooLarge(u32),
    #[error("the packet header announces {announced} payload bytes but the chain holds only {available}")]
    PayloadTruncated { announced: u32, available: usize },
    #[error("the rx descriptor chain has {0} writable bytes, too few for a vsock header")]
    RxBufferTooShort(usize),
    #[error("could not access the descriptor chain in guest memory: {0}")]
    Chain(#[from] virtio_queue::Error),
    #[error("could not copy the packet from or to guest memory: {0}")]
    Memory(#[from] io::Error),
}

/// A decoded packet header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PacketHeader {
    pub src_cid: u64,
    pub dst_cid: u64,
    pub src_port: u32,
    pub dst_port: u32,
    pub len: u32,
    pub type_: u16,
    pub op: u16,
    pub flags: u32,
    pub buf_alloc: u32,
    pub fwd_cnt: u32,
}

impl PacketHeader {
    /// Decodes the 44 little-endian header bytes.
    pub fn decode(b: &[u8; HDR_SIZE]) -> Self {
        let u64_at = |o: usize| u64::from_le_bytes(le_array(&b[o..o + 8]));
        let u32_at = |o: usize| u32::from_le_bytes(le_array(&b[o..o + 4]));
        let u16_at = |o: usize| u16::from_le_bytes(le_array(&b[o..o + 2]));
        PacketHeader {
            src_cid: u64_at(0),
            dst_cid: u64_at(8),
            src_port: u32_at(16),
            dst_port: u32_at(20),
            len: u32_at(24),
            type_: u16_at(28),
            op: u16_at(30),
            flags: u32_at(32),
            buf_alloc: u32_at(36),
            fwd_cnt: u32_at(40),
        }
    }

    /// Encodes the header as the 44 bytes the guest expects.
    pub fn encode(&self) -> [u8; HDR_SIZE] {
        let mut b = [0u8; HDR_SIZE];
        b[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        b[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..30].copy_from_slice(&self.type_.to_le_bytes());
        b[30..32].copy_from_slice(&self.op.to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        b
    }

    /// The header of a reply to `self`: addresses and ports swapped, no payload.
    pub fn reply(&self, op: u16) -> Self {
        PacketHeader {
            src_cid: self.dst_cid,
            dst_cid: self.src_cid,
            src_port: self.dst_port,
            dst_port: self.src_port,
            type_: TYPE_STREAM,
            op,
            ..Default::default()
        }
    }
}

/// Copies a slice of exactly N bytes into an array (callers slice to N).
fn le_array<const N: usize>(s: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(s);
    a
}

/// Reads a guest-to-host packet (header and payload) from a tx chain.
pub fn read_tx_packet<B: BitmapSlice>(
    reader: &mut Reader<'_, B>,
    payload: &mut Vec<u8>,
) -> Result<PacketHeader, PacketError> {
    let available = reader.available_bytes();
    if available < HDR_SIZE {
        return Err(PacketError::ChainTooShort(available));
    }
    let mut raw = [0u8; HDR_SIZE];
    reader.read_exact(&mut raw)?;
    let hdr = PacketHeader::decode(&raw);
    payload.clear();
    if hdr.op != OP_RW {
        return Ok(hdr);
    }
    if hdr.len as usize > MAX_PKT_PAYLOAD {
        return Err(PacketError::PayloadTooLarge(hdr.len));
    }
    let available = reader.available_bytes();
    if (hdr.len as usize) > available {
        return Err(PacketError::PayloadTruncated {
            announced: hdr.len,
            available,
        });
    }
    payload.resize(hdr.len as usize, 0);
    reader.read_exact(payload)?;
    Ok(hdr)
}

/// Writes a host-to-guest packet into an rx chain; returns the bytes written.
pub fn write_rx_packet<B: BitmapSlice>(
    writer: &mut Writer<'_, B>,
    hdr: &PacketHeader,
    payload: &[u8],
) -> Result<u32, PacketError> {
    let available = writer.available_bytes();
    if available < HDR_SIZE + payload.len() {
        return Err(PacketError::RxBufferTooShort(available));
    }
    writer.write_all(&hdr.encode())?;
    writer.write_all(payload)?;
    // Bounded by the 64 KiB payload cap plus the header.
    Ok((HDR_SIZE + payload.len()) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> PacketHeader {
        PacketHeader {
            src_cid: 2,
            dst_cid: 3,
            src_port: 1 << 30,
            dst_port: 1024,
            len: 5,
            type_: TYPE_STREAM,
            op: OP_RW,
            flags: SHUTDOWN_SEND,
            buf_alloc: 256 * 1024,
            fwd_cnt: 0xdead_beef,
        }
    }

    #[test]
    fn header_round_trips() {
        let h = sample();
        assert_eq!(PacketHeader::decode(&h.encode()), h);
    }

    #[test]
    fn header_layout_is_little_endian_at_spec_offsets() {
        let b = sample().encode();
        assert_eq!(&b[0..8], &[2, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[8..16], &[3, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[16..20], &[0, 0, 0, 0x40]);
        assert_eq!(&b[20..24], &[0, 4, 0, 0]);
        assert_eq!(&b[24..28], &[5, 0, 0, 0]);
        assert_eq!(&b[28..30], &[1, 0]);
        assert_eq!(&b[30..32], &[5, 0]);
        assert_eq!(&b[32..36], &[2, 0, 0, 0]);
        assert_eq!(&b[36..40], &[0, 0, 4, 0]);
        assert_eq!(&b[40..44], &[0xef, 0xbe, 0xad, 0xde]);
    }

    #[test]
    fn reply_swaps_addresses() {
        let r = sample().reply(OP_RST);
        assert_eq!((r.src_cid, r.dst_cid), (3, 2));
        assert_eq!((r.src_port, r.dst_port), (1024, 1 << 30));
        assert_eq!((r.op, r.len, r.type_), (OP_RST, 0, TYPE_STREAM));
    }
}
