//! vsock packets in descriptor chains: the guest lays out any chain (lengths, flags, next
//! pointers, indirect tables, memory holes) and any bytes; reading a tx packet must either
//! fail or return a header with exactly the payload it announces, and writing an rx packet
//! must either fail or put exactly header and payload where the chain says.
#![no_main]

use arbitrary::Arbitrary;
use kata_fuzz::{guest_addr, guest_memory, RawDesc, Ring};
use libfuzzer_sys::fuzz_target;
use virtio_queue::QueueOwnedT;
use vm_memory::{Bytes, GuestAddress};
use vmm::vsock::packet::{
    read_tx_packet, write_rx_packet, PacketHeader, HDR_SIZE, MAX_PKT_PAYLOAD, OP_RW,
};

const QSIZE: u16 = 16;

#[derive(Arbitrary, Debug)]
struct Input {
    /// Bytes the guest put in memory, at addresses of its choosing.
    writes: Vec<(u32, Vec<u8>)>,
    /// The descriptor table.
    descs: Vec<RawDesc>,
    /// The heads the guest offers.
    heads: Vec<u8>,
    /// A header and payload the device writes into each chain (as an rx chain).
    header: [u8; HDR_SIZE],
    payload: Vec<u8>,
}

fuzz_target!(|input: Input| {
    // Header encoding is a bijection on the 44 bytes.
    let hdr = PacketHeader::decode(&input.header);
    assert_eq!(hdr.encode(), input.header);
    assert_eq!(PacketHeader::decode(&hdr.encode()), hdr);

    let mem = guest_memory();
    for (addr, bytes) in input.writes.iter().take(32) {
        let _ = mem.write_slice(bytes, GuestAddress(guest_addr(*addr)));
    }
    let mut ring = Ring::new(QSIZE, 0x0, 0x1000, 0x2000);
    for (i, d) in input.descs.iter().take(usize::from(QSIZE)).enumerate() {
        let (addr, len, flags, next) = d.resolve(QSIZE);
        ring.set_desc(&mem, i as u16, addr, len, flags, next);
    }
    for head in input.heads.iter().take(usize::from(QSIZE)) {
        ring.publish(&mem, u16::from(*head) % QSIZE);
    }
    let mut queue = ring.queue();
    let mut payload = Vec::new();
    let rx_payload = &input.payload[..input.payload.len().min(MAX_PKT_PAYLOAD)];
    let mut iter = match queue.iter(&mem) {
        Ok(iter) => iter,
        Err(_) => return,
    };
    for chain in iter.by_ref() {
        if let Ok(mut reader) = chain.clone().reader(&mem) {
            let available = reader.available_bytes();
            if let Ok(h) = read_tx_packet(&mut reader, &mut payload) {
                assert!(available >= HDR_SIZE);
                if h.op == OP_RW {
                    assert_eq!(payload.len(), h.len as usize);
                    assert!(payload.len() <= MAX_PKT_PAYLOAD);
                    assert!(payload.len() <= available - HDR_SIZE);
                } else {
                    assert!(payload.is_empty());
                }
            }
        }
        // The same chain as an rx buffer.
        if let Ok(mut writer) = chain.writer(&mem) {
            let room = writer.available_bytes();
            if let Ok(n) = write_rx_packet(&mut writer, &hdr, rx_payload) {
                assert_eq!(n as usize, HDR_SIZE + rx_payload.len());
                assert!(n as usize <= room);
                assert_eq!(writer.bytes_written(), n as usize);
            }
        }
    }
});
