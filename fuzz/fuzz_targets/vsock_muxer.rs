//! The vsock muxer as a hostile guest and a busy host drive it: packets of any header
//! (and raw descriptor chains) on the tx queue, rx buffers of any size, host clients that
//! send any handshake line, host services that accept, write, read and hang up, device
//! resets. Every packet the muxer hands the guest must be well-formed and fit its buffer.
#![no_main]

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;

use arbitrary::Arbitrary;
use kata_fuzz::{guest_memory, scratch_dir, RawDesc, Ring};
use libfuzzer_sys::fuzz_target;
use virtio_bindings::virtio_ring::{VRING_DESC_F_INDIRECT, VRING_DESC_F_WRITE};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm::vsock::packet::{PacketHeader, HDR_SIZE, MAX_PKT_PAYLOAD, OP_RW, TYPE_STREAM};
use vmm::vsock::{VsockMuxer, HOST_CID};

const GUEST_CID: u64 = 3;
/// Host ports with a service listening (`<uds>_<port>`).
const SERVICE_PORTS: [u32; 2] = [1024, 1025];
const QSIZE: u16 = 64;
/// Each descriptor index owns a buffer slot of this size.
const SLOT: u64 = 0x1000;
const TX_BUFS: u64 = 0x1_0000;
const RX_BUFS: u64 = 0x5_0000;

#[derive(Arbitrary, Debug)]
enum Cid {
    Guest,
    Host,
    Other(u64),
}

impl Cid {
    fn value(&self) -> u64 {
        match self {
            Cid::Guest => GUEST_CID,
            Cid::Host => HOST_CID,
            Cid::Other(v) => *v,
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Port {
    Service(u8),
    /// A host-initiated connection's host port (from 1 << 30 up).
    Local(u8),
    Any(u32),
}

impl Port {
    fn value(&self) -> u32 {
        match self {
            Port::Service(i) => SERVICE_PORTS[usize::from(*i) % SERVICE_PORTS.len()],
            Port::Local(i) => (1 << 30) + u32::from(*i % 8),
            Port::Any(p) => *p,
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Packet {
    src_cid: Cid,
    dst_cid: Cid,
    src_port: Port,
    dst_port: Port,
    /// `None`: the payload's length.
    len: Option<u32>,
    /// `None`: a stream.
    type_: Option<u16>,
    op: u8,
    flags: u32,
    buf_alloc: u32,
    fwd_cnt: u32,
    payload: Vec<u8>,
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// A packet on the tx queue, payload split into page-sized descriptors.
    Tx(Packet),
    /// A raw descriptor chain on the tx queue, over whatever memory holds.
    TxRaw { descs: Vec<RawDesc>, bytes: Vec<u8> },
    /// The guest kicks the tx queue.
    KickTx,
    /// The guest tops the rx queue up to `count` buffers of `size` bytes and kicks it.
    Rx { count: u8, size: u16 },
    /// A raw chain offered as an rx buffer.
    RxRaw { descs: Vec<RawDesc> },
    /// A host client dials the hybrid socket and sends `line`.
    HostDial { line: Vec<u8> },
    /// A host stream (client or accepted service connection) writes.
    HostWrite { who: u8, data: Vec<u8> },
    /// A host stream reads what is there.
    HostRead { who: u8 },
    /// A host stream hangs up.
    HostClose { who: u8 },
    /// The transport reports the muxer's epoll fd readable.
    HostEvents,
    /// The driver resets the device.
    Reset,
    /// The driver writes any avail index (one past the queue size made the muxer spin).
    AvailIdx { rx: bool, idx: u16 },
}

struct Harness {
    mem: GuestMemoryMmap,
    muxer: VsockMuxer,
    uds: PathBuf,
    services: Vec<UnixListener>,
    host: Vec<UnixStream>,
    tx: Ring,
    rx: Ring,
    tx_queue: virtio_queue::Queue,
    rx_queue: virtio_queue::Queue,
    next_tx: u16,
    next_rx: u16,
    /// Size of the buffer each rx descriptor index was offered with.
    rx_sizes: Vec<u32>,
    /// Whether the device may have written over the harness's own rings or rx slots since
    /// the last reset: a raw rx chain may name that memory (directly, or through an
    /// indirect table of whatever memory holds), and what the harness reads back then is
    /// the driver's own doing, not the device's.
    clobbered: bool,
}

/// The memory the harness reads back: the rings and the rx slots.
const HARNESS_MEMORY: [(u64, u64); 2] = [(0, 0x2000), (RX_BUFS, RX_BUFS + QSIZE as u64 * SLOT)];

/// Whether the device may write into [`HARNESS_MEMORY`] through raw descriptor `d`.
fn may_clobber(d: &RawDesc) -> bool {
    let (addr, len, flags, _) = d.resolve(QSIZE);
    if flags & VRING_DESC_F_INDIRECT as u16 != 0 {
        return true;
    }
    let end = addr.saturating_add(u64::from(len));
    flags & VRING_DESC_F_WRITE as u16 != 0
        && HARNESS_MEMORY
            .iter()
            .any(|&(start, stop)| addr < stop && start < end)
}

impl Harness {
    fn new() -> Option<Self> {
        let uds = scratch_dir().join("vsock.sock");
        let muxer = VsockMuxer::new(GUEST_CID, &uds).ok()?;
        let mut services = Vec::new();
        for port in SERVICE_PORTS {
            let mut name = uds.clone().into_os_string();
            name.push(format!("_{port}"));
            let _ = std::fs::remove_file(&name);
            let l = UnixListener::bind(&name).ok()?;
            l.set_nonblocking(true).ok()?;
            services.push(l);
        }
        let tx = Ring::new(QSIZE, 0x0, 0x400, 0x800);
        let rx = Ring::new(QSIZE, 0x1000, 0x1400, 0x1800);
        let (tx_queue, rx_queue) = (tx.queue(), rx.queue());
        Some(Harness {
            mem: guest_memory(),
            muxer,
            uds,
            services,
            host: Vec::new(),
            tx,
            rx,
            tx_queue,
            rx_queue,
            next_tx: 0,
            next_rx: 0,
            rx_sizes: vec![0; usize::from(QSIZE)],
            clobbered: false,
        })
    }

    fn take_tx(&mut self) -> u16 {
        let i = self.next_tx;
        self.next_tx = (self.next_tx + 1) % QSIZE;
        i
    }

    fn push_tx(&mut self, p: &Packet) {
        let payload = &p.payload[..p.payload.len().min(MAX_PKT_PAYLOAD)];
        let hdr = PacketHeader {
            src_cid: p.src_cid.value(),
            dst_cid: p.dst_cid.value(),
            src_port: p.src_port.value(),
            dst_port: p.dst_port.value(),
            len: p.len.unwrap_or(payload.len() as u32),
            type_: p.type_.unwrap_or(TYPE_STREAM),
            op: u16::from(p.op % 9),
            flags: p.flags,
            buf_alloc: p.buf_alloc,
            fwd_cnt: p.fwd_cnt,
        };
        let mut pieces = vec![(hdr.encode().to_vec(), self.take_tx())];
        for chunk in payload.chunks(SLOT as usize).take(usize::from(QSIZE) / 2) {
            pieces.push((chunk.to_vec(), self.take_tx()));
        }
        for (i, (bytes, index)) in pieces.iter().enumerate() {
            let addr = TX_BUFS + u64::from(*index) * SLOT;
            let _ = self.mem.write_slice(bytes, GuestAddress(addr));
            let (flags, next) = match pieces.get(i + 1) {
                Some((_, next)) => (1, *next),
                None => (0, 0),
            };
            self.tx
                .set_desc(&self.mem, *index, addr, bytes.len() as u32, flags, next);
        }
        self.tx.publish(&self.mem, pieces[0].1);
    }

    fn push_raw(&mut self, descs: &[RawDesc], bytes: &[u8], rx: bool) {
        let (ring, next) = if rx {
            (&mut self.rx, &mut self.next_rx)
        } else {
            (&mut self.tx, &mut self.next_tx)
        };
        let head = *next;
        if rx && descs.iter().take(8).any(may_clobber) {
            self.clobbered = true;
        }
        for d in descs.iter().take(8) {
            let (addr, len, flags, nxt) = d.resolve(QSIZE);
            ring.set_desc(&self.mem, *next, addr, len, flags, nxt);
            if rx {
                // Unknown: a raw buffer's packets are only checked for their header.
                self.rx_sizes[usize::from(*next)] = u32::MAX;
            }
            *next = (*next + 1) % QSIZE;
        }
        if !rx {
            let _ = self
                .mem
                .write_slice(bytes, GuestAddress(TX_BUFS + u64::from(head) * SLOT));
        }
        ring.publish(&self.mem, head);
    }

    fn kick_tx(&mut self) {
        let _ = self.muxer.process_tx(&mut self.tx_queue, &self.mem);
        // The device returns every tx chain it takes.
        self.tx.take_used(&self.mem);
    }

    fn add_rx(&mut self, count: u16, size: u16) {
        let size = u32::from(size).clamp(1, SLOT as u32);
        let count = count % (QSIZE / 2);
        while self.rx.outstanding() < count {
            let i = self.next_rx;
            self.next_rx = (self.next_rx + 1) % QSIZE;
            self.rx
                .set_desc(&self.mem, i, RX_BUFS + u64::from(i) * SLOT, size, 2, 0);
            self.rx_sizes[usize::from(i)] = size;
            self.rx.publish(&self.mem, i);
        }
    }

    fn kick_rx(&mut self) {
        let _ = self.muxer.process_rx(&mut self.rx_queue, &self.mem);
        let used = self.rx.take_used(&self.mem);
        if self.clobbered {
            return;
        }
        for (k, &(id, len)) in used.iter().enumerate() {
            assert!(id < u32::from(QSIZE), "used id {id} out of the queue");
            if len == 0 {
                continue;
            }
            let size = self.rx_sizes[id as usize];
            assert!(len <= size, "a {len}-byte packet in a {size}-byte buffer");
            // A buffer the device filled again later in this batch holds only its last
            // packet (a hostile driver's avail index past what it published offers stale
            // ring entries, so the same head many times).
            if size == u32::MAX || used[k + 1..].iter().any(|&(later, _)| later == id) {
                continue;
            }
            assert!(len as usize >= HDR_SIZE, "a used rx buffer of {len} bytes");
            let mut raw = [0u8; HDR_SIZE];
            let addr = GuestAddress(RX_BUFS + u64::from(id) * SLOT);
            if self.mem.read_slice(&mut raw, addr).is_err() {
                continue;
            }
            let hdr = PacketHeader::decode(&raw);
            assert_eq!(hdr.src_cid, HOST_CID, "{hdr:?}");
            assert_eq!(hdr.dst_cid, GUEST_CID, "{hdr:?}");
            assert_eq!(hdr.type_, TYPE_STREAM, "{hdr:?}");
            assert!((1..=7).contains(&hdr.op), "{hdr:?}");
            let payload = len as usize - HDR_SIZE;
            if hdr.op == OP_RW {
                assert_eq!(hdr.len as usize, payload, "{hdr:?}");
                assert!(payload <= MAX_PKT_PAYLOAD);
            } else {
                assert_eq!((hdr.len, payload), (0, 0), "{hdr:?}");
            }
        }
    }

    fn accept_services(&mut self) {
        for l in &self.services {
            while let Ok((s, _)) = l.accept() {
                let _ = s.set_nonblocking(true);
                self.host.push(s);
            }
        }
    }

    fn host_stream(&mut self, who: u8) -> Option<usize> {
        self.accept_services();
        if self.host.is_empty() {
            return None;
        }
        Some(usize::from(who) % self.host.len())
    }

    fn run(&mut self, op: &Op) {
        match op {
            Op::Tx(p) => self.push_tx(p),
            Op::TxRaw { descs, bytes } => self.push_raw(descs, bytes, false),
            Op::KickTx => self.kick_tx(),
            Op::Rx { count, size } => {
                self.add_rx(u16::from(*count), *size);
                self.kick_rx();
            }
            Op::RxRaw { descs } => {
                self.push_raw(descs, &[], true);
                self.kick_rx();
            }
            Op::HostDial { line } => {
                if let Ok(mut s) = UnixStream::connect(&self.uds) {
                    let _ = s.set_nonblocking(true);
                    let _ = s.write(&line[..line.len().min(4096)]);
                    self.host.push(s);
                }
            }
            Op::HostWrite { who, data } => {
                if let Some(i) = self.host_stream(*who) {
                    let _ = self.host[i].write(data);
                }
            }
            Op::HostRead { who } => {
                if let Some(i) = self.host_stream(*who) {
                    let mut buf = [0u8; 0x4000];
                    let _ = self.host[i].read(&mut buf);
                }
            }
            Op::HostClose { who } => {
                if let Some(i) = self.host_stream(*who) {
                    self.host.swap_remove(i);
                }
            }
            Op::HostEvents => {
                let _ = self.muxer.process_host_events();
            }
            Op::AvailIdx { rx, idx } => {
                let ring = if *rx { &self.rx } else { &self.tx };
                let _ = self
                    .mem
                    .write_obj(idx.to_le(), GuestAddress(ring.avail + 2));
            }
            Op::Reset => {
                self.muxer.reset();
                self.tx_queue = self.tx.queue();
                self.rx_queue = self.rx.queue();
                self.tx = Ring::new(QSIZE, 0x0, 0x400, 0x800);
                self.rx = Ring::new(QSIZE, 0x1000, 0x1400, 0x1800);
                let _ = self.mem.write_slice(&[0u8; 0x2000], GuestAddress(0));
                self.next_tx = 0;
                self.next_rx = 0;
                self.clobbered = false;
            }
        }
    }
}

fuzz_target!(|ops: Vec<Op>| {
    let Some(mut h) = Harness::new() else {
        return;
    };
    for op in ops.iter().take(128) {
        h.run(op);
    }
    // Whatever the guest did, the muxer still serves: everything waiting is delivered
    // well-formed once the guest offers buffers.
    let _ = h.muxer.process_host_events();
    h.add_rx(QSIZE / 2 - 1, SLOT as u16);
    h.kick_rx();
});
