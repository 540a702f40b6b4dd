//! Muxer tests: real unix sockets on the host side, mock split queues on the guest side.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;

use super::*;
use crate::vsock::credit::HOST_BUF_ALLOC;
use crate::vsock::packet::*;
use crate::vsock::test_utils::{big_test_memory, TestQueue};

const CID: u64 = 3;
const RX_BASE: u64 = 0x1000;
const TX_BASE: u64 = 0x8000;
const RX_BUFS: u64 = 0x100_0000;
const TX_BUFS: u64 = 0x200_0000;
const RX_BUF_SIZE: u32 = 4096 + HDR_SIZE as u32;

struct Fixture {
    _dir: tempfile::TempDir,
    uds: PathBuf,
    muxer: VsockMuxer,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let uds = dir.path().join("kata.hvsock");
    let muxer = VsockMuxer::new(CID, &uds).expect("muxer");
    Fixture {
        _dir: dir,
        uds,
        muxer,
    }
}

fn guest_hdr(op: u16, src_port: u32, dst_port: u32) -> PacketHeader {
    PacketHeader {
        src_cid: CID,
        dst_cid: HOST_CID,
        src_port,
        dst_port,
        type_: TYPE_STREAM,
        op,
        buf_alloc: 256 * 1024,
        ..Default::default()
    }
}

fn rw(src_port: u32, dst_port: u32, data: &[u8], fwd_cnt: u32) -> PacketHeader {
    let mut h = guest_hdr(OP_RW, src_port, dst_port);
    h.len = data.len() as u32;
    h.fwd_cnt = fwd_cnt;
    h
}

/// Runs host events until the muxer has something for the guest (the socket work is
/// already done by the time the test calls this; the loop only covers epoll batching).
fn pump_host(m: &mut VsockMuxer) {
    for _ in 0..100 {
        m.process_host_events().expect("host events");
        if m.has_pending_rx() {
            return;
        }
    }
}

/// Dials the hybrid socket, sends CONNECT, and has the guest accept; returns the host
/// stream and the host-side port.
fn host_connect(
    f: &mut Fixture,
    rx: &mut TestQueue,
    tx: &mut TestQueue,
    mem: &vm_memory::GuestMemoryMmap,
) -> (UnixStream, u32) {
    let mut host = UnixStream::connect(&f.uds).expect("dial");
    host.write_all(b"CONNECT 1024\n").expect("connect line");
    pump_host(&mut f.muxer);
    rx.add_rx_buffers(1, RX_BUF_SIZE);
    assert!(f.muxer.process_rx(&mut rx.queue, mem).expect("rx"));
    let pkts = rx.take_rx_packets();
    assert_eq!(pkts.len(), 1);
    let req = pkts[0].0;
    assert_eq!(req.op, OP_REQUEST);
    tx.add_tx_packet(&guest_hdr(OP_RESPONSE, 1024, req.src_port), &[]);
    f.muxer.process_tx(&mut tx.queue, mem).expect("tx");
    let mut line = vec![0u8; format!("OK {}\n", req.src_port).len()];
    host.read_exact(&mut line).expect("OK line");
    assert_eq!(line, format!("OK {}\n", req.src_port).as_bytes());
    (host, req.src_port)
}

#[test]
fn a_payload_in_several_buffers_reaches_the_host_whole_and_in_order() {
    // A guest that splices a pipe into its socket sends each page as a buffer of its
    // own after the header's: the host stream must get the bytes joined, in order.
    let mem = big_test_memory();
    let mut f = fixture();
    let mut rx = TestQueue::new(&mem, RX_BASE, RX_BUFS);
    let mut tx = TestQueue::new(&mem, TX_BASE, TX_BUFS);
    let (mut host, port) = host_connect(&mut f, &mut rx, &mut tx, &mem);

    let data: Vec<u8> = (0..9000u32).map(|i| (i % 251) as u8).collect();
    let pieces: Vec<&[u8]> = vec![&data[..100], &data[100..4196], &data[4196..]];
    tx.add_tx_packet_in_pieces(&rw(1024, port, &data, 0), &pieces);
    assert!(f.muxer.process_tx(&mut tx.queue, &mem).expect("tx"));
    let mut got = vec![0u8; data.len()];
    host.read_exact(&mut got).expect("host read");
    assert_eq!(got, data);
    assert_eq!(
        tx.take_used().len(),
        2,
        "the response and the split packet returned"
    );
}

#[test]
fn early_connect_waits_until_the_guest_offers_rx_buffers() {
    let mem = big_test_memory();
    let mut f = fixture();
    let mut rx = TestQueue::new(&mem, RX_BASE, RX_BUFS);
    let mut host = UnixStream::connect(&f.uds).expect("dial");
    host.write_all(b"CONNECT 1024\n").expect("connect line");
    pump_host(&mut f.muxer);
    assert!(f.muxer.has_pending_rx());

    // The driver is not there yet: no buffers. The request must survive.
    assert!(!f.muxer.process_rx(&mut rx.queue, &mem).expect("rx"));
    f.muxer.process_host_events().expect("host events");
    assert!(f.muxer.has_pending_rx());

    rx.add_rx_buffers(4, RX_BUF_SIZE);
    assert!(f.muxer.process_rx(&mut rx.queue, &mem).expect("rx"));
    let pkts = rx.take_rx_packets();
    assert_eq!(
        pkts.len(),
        1,
        "only the REQUEST, the other buffers stay available"
    );
    let req = pkts[0].0;
    assert_eq!(
        (req.op, req.src_cid, req.dst_cid, req.dst_port),
        (OP_REQUEST, HOST_CID, CID, 1024)
    );
    assert!(!f.muxer.has_pending_rx());
}

#[test]
fn host_connection_carries_data_both_ways() {
    let mem = big_test_memory();
    let mut f = fixture();
    let mut rx = TestQueue::new(&mem, RX_BASE, RX_BUFS);
    let mut tx = TestQueue::new(&mem, TX_BASE, TX_BUFS);
    let (mut host, port) = host_connect(&mut f, &mut rx, &mut tx, &mem);

    host.write_all(b"ping").expect("host write");
    pump_host(&mut f.muxer);
    rx.add_rx_buffers(2, RX_BUF_SIZE);
    f.muxer.process_rx(&mut rx.queue, &mem).expect("rx");
    let pkts = rx.take_rx_packets();
    assert_eq!(pkts.len(), 1);
    assert_eq!(
        (pkts[0].0.op, pkts[0].0.src_port, pkts[0].0.dst_port),
        (OP_RW, port, 1024)
    );
    assert_eq!(pkts[0].1, b"ping");

    tx.add_tx_packet(&rw(1024, port, b"pong", 4), b"pong");
    assert!(f.muxer.process_tx(&mut tx.queue, &mem).expect("tx"));
    let mut buf = [0u8; 4];
    host.read_exact(&mut buf).expect("host read");
    assert_eq!(&buf, b"pong");
    assert_eq!(tx.take_used().len(), 2, "both tx chains returned");

    // Guest closes: SHUTDOWN both -> host sees EOF, guest gets the closing RST.
    let mut sd = guest_hdr(OP_SHUTDOWN, 1024, port);
    sd.flags = SHUTDOWN_BOTH;
    tx.add_tx_packet(&sd, &[]);
    f.muxer.process_tx(&mut tx.queue, &mem).expect("tx");
    assert_eq!(host.read(&mut buf).expect("eof"), 0);
    f.muxer.process_rx(&mut rx.queue, &mem).expect("rx");
    let pkts = rx.take_rx_packets();
    assert_eq!(pkts.len(), 1);
    assert_eq!(pkts[0].0.op, OP_RST);
    assert_eq!(f.muxer.connection_count(), 0);
}

#[test]
fn guest_connects_to_host_port_socket() {
    let mem = big_test_memory();
    let mut f = fixture();
    let mut rx = TestQueue::new(&mem, RX_BASE, RX_BUFS);
    let mut tx = TestQueue::new(&mem, TX_BASE, TX_BUFS);
    let mut name = f.uds.clone().into_os_string();
    name.push("_5000");
    let listener = UnixListener::bind(PathBuf::from(name)).expect("port listener");

    tx.add_tx_packet(&guest_hdr(OP_REQUEST, 40000, 5000), &[]);
    tx.add_tx_packet(&guest_hdr(OP_REQUEST, 40001, 5001), &[]);
    f.muxer.process_tx(&mut tx.queue, &mem).expect("tx");
    rx.add_rx_buffers(4, RX_BUF_SIZE);
    f.muxer.process_rx(&mut rx.queue, &mem).expect("rx");
    let pkts = rx.take_rx_packets();
    assert_eq!(pkts.len(), 2);
    let ops: Vec<(u16, u32)> = pkts.iter().map(|p| (p.0.op, p.0.dst_port)).collect();
    assert!(ops.contains(&(OP_RESPONSE, 40000)), "{ops:?}");
    assert!(
        ops.contains(&(OP_RST, 40001)),
        "no listener on _5001: {ops:?}"
    );

    let (mut host, _) = listener.accept().expect("accept");
    tx.add_tx_packet(&rw(40000, 5000, b"hi", 0), b"hi");
    f.muxer.process_tx(&mut tx.queue, &mem).expect("tx");
    let mut buf = [0u8; 2];
    host.read_exact(&mut buf).expect("read");
    assert_eq!(&buf, b"hi");
}

#[test]
fn strays_get_rst_and_rst_gets_nothing() {
    let mem = big_test_memory();
    let mut f = fixture();
    let mut rx = TestQueue::new(&mem, RX_BASE, RX_BUFS);
    let mut tx = TestQueue::new(&mem, TX_BASE, TX_BUFS);
    tx.add_tx_packet(&rw(1, 2, b"x", 0), b"x");
    tx.add_tx_packet(&guest_hdr(OP_RST, 3, 4), &[]);
    let mut wrong_type = guest_hdr(OP_REQUEST, 5, 6);
    wrong_type.type_ = 2;
    tx.add_tx_packet(&wrong_type, &[]);
    f.muxer.process_tx(&mut tx.queue, &mem).expect("tx");
    rx.add_rx_buffers(4, RX_BUF_SIZE);
    f.muxer.process_rx(&mut rx.queue, &mem).expect("rx");
    let pkts = rx.take_rx_packets();
    let rsts: Vec<(u16, u32, u32)> = pkts
        .iter()
        .map(|p| (p.0.op, p.0.src_port, p.0.dst_port))
        .collect();
    assert_eq!(rsts, vec![(OP_RST, 2, 1), (OP_RST, 6, 5)]);
}

#[test]
fn reset_keeps_unannounced_host_connections() {
    let mem = big_test_memory();
    let mut f = fixture();
    let mut rx = TestQueue::new(&mem, RX_BASE, RX_BUFS);
    let mut tx = TestQueue::new(&mem, TX_BASE, TX_BUFS);
    let (mut announced, _) = host_connect(&mut f, &mut rx, &mut tx, &mem);
    let mut early = UnixStream::connect(&f.uds).expect("dial");
    early.write_all(b"CONNECT 1024\n").expect("connect line");
    pump_host(&mut f.muxer);
    assert_eq!(f.muxer.connection_count(), 2);

    f.muxer.reset();
    assert_eq!(f.muxer.connection_count(), 1);
    let mut buf = [0u8; 1];
    assert_eq!(
        announced.read(&mut buf).expect("eof"),
        0,
        "the announced one is closed"
    );

    let mut rx = TestQueue::new(&mem, RX_BASE + 0x4000, RX_BUFS + 0x80_0000);
    rx.add_rx_buffers(2, RX_BUF_SIZE);
    f.muxer.process_rx(&mut rx.queue, &mem).expect("rx");
    let pkts = rx.take_rx_packets();
    assert_eq!(pkts.len(), 1);
    assert_eq!(pkts[0].0.op, OP_REQUEST);
    drop(early);
}

#[test]
fn host_to_guest_stream_respects_credit_and_arrives_in_order() {
    const TOTAL: usize = 2 * 1024 * 1024;
    let mem = big_test_memory();
    let mut f = fixture();
    let mut rx = TestQueue::new(&mem, RX_BASE, RX_BUFS);
    let mut tx = TestQueue::new(&mem, TX_BASE, TX_BUFS);
    let (mut host, port) = host_connect(&mut f, &mut rx, &mut tx, &mem);
    let writer = std::thread::spawn(move || {
        let data: Vec<u8> = (0..TOTAL).map(|i| (i % 251) as u8).collect();
        host.write_all(&data).expect("host write");
        // Closing ends the stream with a SHUTDOWN.
    });

    // The guest's receive buffer is small: the muxer may never have more in flight.
    let guest_buf_alloc: u32 = 64 * 1024;
    let mut fwd_cnt: u32 = 0;
    let mut received = Vec::with_capacity(TOTAL);
    let mut ended = false;
    let mut credit_hdr = guest_hdr(OP_CREDIT_UPDATE, 1024, port);
    credit_hdr.buf_alloc = guest_buf_alloc;
    tx.add_tx_packet(&credit_hdr, &[]);
    f.muxer.process_tx(&mut tx.queue, &mem).expect("tx");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !ended {
        assert!(
            std::time::Instant::now() < deadline,
            "stream stalled at {} bytes",
            received.len()
        );
        f.muxer.process_host_events().expect("host events");
        rx.top_up_rx_buffers(8, RX_BUF_SIZE);
        f.muxer.process_rx(&mut rx.queue, &mem).expect("rx");
        for (hdr, data) in rx.take_rx_packets() {
            match hdr.op {
                OP_RW => {
                    let in_flight = received.len() as u32 + hdr.len - fwd_cnt;
                    assert!(in_flight <= guest_buf_alloc, "credit overrun: {in_flight}");
                    received.extend_from_slice(&data);
                }
                OP_SHUTDOWN => ended = true,
                op => panic!("unexpected op {op}"),
            }
        }
        // The guest application reads everything and says so.
        if received.len() as u32 != fwd_cnt {
            fwd_cnt = received.len() as u32;
            credit_hdr.fwd_cnt = fwd_cnt;
            tx.add_tx_packet(&credit_hdr, &[]);
            f.muxer.process_tx(&mut tx.queue, &mem).expect("tx");
        }
    }
    writer.join().expect("writer thread");
    assert_eq!(received.len(), TOTAL);
    assert!(received
        .iter()
        .enumerate()
        .all(|(i, b)| *b == (i % 251) as u8));
}

#[test]
fn guest_to_host_stream_gets_credit_updates() {
    let mem = big_test_memory();
    let mut f = fixture();
    let mut rx = TestQueue::new(&mem, RX_BASE, RX_BUFS);
    let mut tx = TestQueue::new(&mem, TX_BASE, TX_BUFS);
    let (mut host, port) = host_connect(&mut f, &mut rx, &mut tx, &mem);
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        host.read_to_end(&mut all).expect("host read");
        all
    });
    let chunk = vec![0x5au8; 4096];
    let total = 4 * HOST_BUF_ALLOC as usize;
    let mut sent = 0usize;
    let mut host_fwd: u32 = 0;
    let mut credit_updates = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while sent < total {
        assert!(
            std::time::Instant::now() < deadline,
            "stream stalled at {sent} bytes"
        );
        // Respect the host's announced credit like a driver does.
        let free = HOST_BUF_ALLOC - (sent as u32 - host_fwd);
        if free as usize >= chunk.len() {
            tx.add_tx_packet(&rw(1024, port, &chunk, 0), &chunk);
            sent += chunk.len();
            f.muxer.process_tx(&mut tx.queue, &mem).expect("tx");
            tx.take_used();
        }
        f.muxer.process_host_events().expect("host events");
        rx.top_up_rx_buffers(1, RX_BUF_SIZE);
        f.muxer.process_rx(&mut rx.queue, &mem).expect("rx");
        for (hdr, _) in rx.take_rx_packets() {
            host_fwd = hdr.fwd_cnt;
            if hdr.op == OP_CREDIT_UPDATE {
                credit_updates += 1;
            }
        }
    }
    let mut sd = guest_hdr(OP_SHUTDOWN, 1024, port);
    sd.flags = SHUTDOWN_BOTH;
    tx.add_tx_packet(&sd, &[]);
    while f.muxer.connection_count() > 0 {
        assert!(std::time::Instant::now() < deadline, "close stalled");
        f.muxer.process_tx(&mut tx.queue, &mem).expect("tx");
        f.muxer.process_host_events().expect("host events");
    }
    let all = reader.join().expect("reader thread");
    assert_eq!(all.len(), total);
    assert!(
        credit_updates > 0,
        "the guest must hear about freed buffer space"
    );
}

/// The most lines `kinds` rate-limited kinds of warning may log since `started`: one each
/// at first, and one more each per interval gone by.
fn line_bound(kinds: u64, started: std::time::Instant) -> u64 {
    use crate::vsock::log_limit::LOG_INTERVAL;
    kinds * (1 + started.elapsed().as_secs() / LOG_INTERVAL.as_secs())
}

fn packet_ops(pkts: &[(PacketHeader, Vec<u8>)]) -> (usize, usize) {
    let rsts = pkts.iter().filter(|p| p.0.op == OP_RST).count();
    let responses = pkts.iter().filter(|p| p.0.op == OP_RESPONSE).count();
    (rsts, responses)
}

#[test]
fn a_flood_of_stray_packets_keeps_the_rst_queue_at_its_cap_and_logs_little() {
    let mem = big_test_memory();
    let mut f = fixture();
    let started = std::time::Instant::now();
    // No rx buffers: every RST waits. Ten times the cap of them.
    for i in 0..(10 * MAX_RST_QUEUE as u32) {
        f.muxer
            .on_guest_packet(&rw(2000 + i, 7, b"x", 0), b"x")
            .expect("stray");
    }
    assert_eq!(f.muxer.rst_queue.len(), MAX_RST_QUEUE);
    let logged = f.muxer.warnings_logged();
    assert!(
        (1..=line_bound(1, started)).contains(&logged),
        "{logged} lines"
    );

    // The queued ones go out, and the muxer answers strays again afterwards.
    let mut rx = TestQueue::new(&mem, RX_BASE, RX_BUFS);
    rx.add_rx_buffers(255, RX_BUF_SIZE);
    f.muxer.process_rx(&mut rx.queue, &mem).expect("rx");
    rx.add_rx_buffers(255, RX_BUF_SIZE);
    f.muxer.process_rx(&mut rx.queue, &mem).expect("rx");
    let pkts = rx.take_rx_packets();
    assert_eq!(packet_ops(&pkts), (MAX_RST_QUEUE, 0));
    assert!(!f.muxer.has_pending_rx());
    f.muxer
        .on_guest_packet(&rw(9, 7, b"x", 0), b"x")
        .expect("stray");
    assert_eq!(f.muxer.rst_queue.len(), 1);
}

#[test]
fn a_flood_of_refused_guest_connects_is_answered_within_the_caps_and_logs_little() {
    let mut f = fixture();
    let started = std::time::Instant::now();
    // Nobody listens on <uds>_4000: each REQUEST is refused with an RST.
    for i in 0..(10 * MAX_RST_QUEUE as u32) {
        f.muxer
            .on_guest_packet(&guest_hdr(OP_REQUEST, 3000 + i, 4000), &[])
            .expect("request");
    }
    assert_eq!(f.muxer.connection_count(), 0);
    assert_eq!(f.muxer.rst_queue.len(), MAX_RST_QUEUE);
    // Two kinds: refusals, and RSTs dropped at the cap.
    let logged = f.muxer.warnings_logged();
    assert!(
        (2..=line_bound(2, started)).contains(&logged),
        "{logged} lines"
    );
}

#[test]
fn guest_connections_beyond_the_cap_are_refused() {
    let mem = big_test_memory();
    let mut f = fixture();
    f.muxer.limits.connections = 8;
    let mut port_socket = f.uds.clone().into_os_string();
    port_socket.push("_5000");
    let _listener = UnixListener::bind(PathBuf::from(port_socket)).expect("port 5000");
    for i in 0..20 {
        f.muxer
            .on_guest_packet(&guest_hdr(OP_REQUEST, 100 + i, 5000), &[])
            .expect("request");
    }
    assert_eq!(f.muxer.connection_count(), 8);
    let mut rx = TestQueue::new(&mem, RX_BASE, RX_BUFS);
    rx.add_rx_buffers(64, RX_BUF_SIZE);
    f.muxer.process_rx(&mut rx.queue, &mem).expect("rx");
    assert_eq!(packet_ops(&rx.take_rx_packets()), (12, 8));

    // A host CONNECT at the cap is closed without reaching the guest.
    let mut host = UnixStream::connect(&f.uds).expect("dial");
    host.write_all(b"CONNECT 1024\n").expect("connect line");
    for _ in 0..10 {
        f.muxer.process_host_events().expect("host events");
    }
    let mut buf = [0u8; 8];
    assert_eq!(host.read(&mut buf).expect("read"), 0, "closed by the muxer");
    assert_eq!(f.muxer.connection_count(), 8);
    assert!(!f.muxer.has_pending_rx());
}

#[test]
fn silent_hybrid_clients_beyond_the_cap_are_closed() {
    let mut f = fixture();
    f.muxer.limits.handshakes = 4;
    let mut clients: Vec<UnixStream> = (0..10)
        .map(|_| UnixStream::connect(&f.uds).expect("dial"))
        .collect();
    for _ in 0..10 {
        f.muxer.process_host_events().expect("host events");
    }
    assert_eq!(f.muxer.handshakes.len(), 4);
    let mut closed = 0;
    for c in &mut clients {
        c.set_nonblocking(true).expect("nonblocking");
        if matches!(c.read(&mut [0u8; 1]), Ok(0)) {
            closed += 1;
        }
    }
    assert_eq!(closed, 6);
}

#[test]
fn a_flood_of_malformed_tx_packets_logs_little() {
    let mem = big_test_memory();
    let mut f = fixture();
    let mut tx = TestQueue::new(&mem, TX_BASE, TX_BUFS);
    let started = std::time::Instant::now();
    let mut truncated = rw(1, 2, b"", 0);
    truncated.len = 100; // announced, never sent
    for _ in 0..10 {
        for _ in 0..200 {
            tx.add_tx_packet(&truncated, &[]);
        }
        f.muxer.process_tx(&mut tx.queue, &mem).expect("tx");
        assert_eq!(tx.take_used().len(), 200, "every packet is returned");
    }
    assert!(
        !f.muxer.has_pending_rx(),
        "nothing answers a malformed packet"
    );
    let logged = f.muxer.warnings_logged();
    assert!(
        (1..=line_bound(1, started)).contains(&logged),
        "{logged} lines"
    );
}

#[test]
fn repeated_protocol_violations_reset_each_connection_and_log_little() {
    let mut f = fixture();
    let mut port_socket = f.uds.clone().into_os_string();
    port_socket.push("_5000");
    let _listener = UnixListener::bind(PathBuf::from(port_socket)).expect("port 5000");
    let started = std::time::Instant::now();
    for i in 0..50 {
        f.muxer
            .on_guest_packet(&guest_hdr(OP_REQUEST, 100 + i, 5000), &[])
            .expect("request");
        // A second REQUEST on the established connection is a violation: it is reset.
        f.muxer
            .on_guest_packet(&guest_hdr(OP_REQUEST, 100 + i, 5000), &[])
            .expect("violation");
    }
    assert_eq!(f.muxer.connection_count(), 0, "every connection was reset");
    assert_eq!(
        f.muxer.rst_queue.len(),
        50,
        "each reset is told to the guest"
    );
    // Two kinds: the connections (info) and the violations (warn).
    let logged = f.muxer.warnings_logged();
    assert!(
        (2..=line_bound(2, started)).contains(&logged),
        "{logged} lines"
    );
    assert_eq!(f.muxer.warnings.protocol.emitted(), 1);
}

/// Found by the vsock fuzz target (fuzz/, `virtio_mmio`): a driver whose avail index runs
/// more than a queue's size ahead made `process_tx` and `process_rx` spin forever (no
/// chain could be popped, yet the notification check kept reporting more). Now the queue
/// is reported broken and the device thread goes on.
#[test]
fn an_avail_index_beyond_the_queue_size_is_an_error_not_a_spin() {
    use vm_memory::{Bytes, GuestAddress};
    let mut f = fixture();
    let mem = big_test_memory();
    let mut rx = TestQueue::new(&mem, RX_BASE, RX_BUFS);
    let mut tx = TestQueue::new(&mem, TX_BASE, TX_BUFS);
    let runaway = |q: &TestQueue<'_>| {
        mem.write_obj(1000u16.to_le(), GuestAddress(q.queue.avail_ring() + 2))
            .expect("avail idx");
    };
    runaway(&tx);
    let r = f.muxer.process_tx(&mut tx.queue, &mem);
    assert!(
        matches!(r, Err(MuxerError::Queue { queue: "tx", .. })),
        "{r:?}"
    );
    // A stray packet leaves an RST waiting for an rx buffer.
    f.muxer
        .on_guest_packet(&guest_hdr(OP_RW, 7, 9999), &[])
        .expect("stray");
    assert!(f.muxer.has_pending_rx());
    runaway(&rx);
    let r = f.muxer.process_rx(&mut rx.queue, &mem);
    assert!(
        matches!(r, Err(MuxerError::Queue { queue: "rx", .. })),
        "{r:?}"
    );
}
