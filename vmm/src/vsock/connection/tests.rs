//! Connection state machine tests: a socketpair as the host stream, one-buffer rx chains.

use super::*;
use crate::vsock::test_utils::RxChain;

const CID: u64 = 3;

fn guest_hdr(op: u16, local: u32, peer: u32) -> PacketHeader {
    PacketHeader {
        src_cid: CID,
        dst_cid: HOST_CID,
        src_port: peer,
        dst_port: local,
        type_: TYPE_STREAM,
        op,
        buf_alloc: 64 * 1024,
        ..Default::default()
    }
}

fn local_conn() -> (VsockConnection, UnixStream) {
    let (a, b) = UnixStream::pair().expect("socketpair");
    a.set_nonblocking(true).expect("nonblocking");
    (VsockConnection::new_local(CID, 1 << 30, 1024, a), b)
}

fn established() -> (VsockConnection, UnixStream) {
    let (mut c, mut host) = local_conn();
    let rx = RxChain::new(4096);
    rx.fill(&mut c).expect("request");
    c.on_packet(&guest_hdr(OP_RESPONSE, 1 << 30, 1024), &[]);
    let mut ok = [0u8; 14];
    host.read_exact(&mut ok).expect("OK line");
    assert_eq!(&ok, b"OK 1073741824\n");
    (c, host)
}

#[test]
fn host_connect_sends_request_then_ok_on_response() {
    let (mut c, _host) = local_conn();
    assert!(c.is_unannounced());
    let rx = RxChain::new(4096);
    let (hdr, _) = rx.fill(&mut c).expect("request packet");
    assert_eq!(hdr.op, OP_REQUEST);
    assert_eq!((hdr.src_cid, hdr.dst_cid), (HOST_CID, CID));
    assert_eq!((hdr.src_port, hdr.dst_port), (1 << 30, 1024));
    assert_eq!(hdr.buf_alloc, HOST_BUF_ALLOC);
    assert!(!c.is_unannounced());
    assert_eq!(c.state(), ConnState::LocalInit);
    drop(established());
}

#[test]
fn guest_rst_to_request_closes_without_rst() {
    let (mut c, mut host) = local_conn();
    RxChain::new(4096).fill(&mut c).expect("request");
    c.on_packet(&guest_hdr(OP_RST, 1 << 30, 1024), &[]);
    assert!(c.is_closed());
    assert!(c.take_rst().is_none());
    drop(c);
    let mut buf = [0u8; 8];
    assert_eq!(host.read(&mut buf).expect("eof"), 0, "host sees EOF, no OK");
}

#[test]
fn guest_data_reaches_host_and_counts_forwarded() {
    let (mut c, mut host) = established();
    let mut h = guest_hdr(OP_RW, 1 << 30, 1024);
    h.len = 5;
    c.on_packet(&h, b"hello");
    let mut buf = [0u8; 5];
    host.read_exact(&mut buf).expect("data");
    assert_eq!(&buf, b"hello");
    assert_eq!(c.credit().fwd_cnt, 5);
    assert_eq!(c.credit().buffered, 0);
}

#[test]
fn host_data_goes_out_within_guest_credit() {
    let (mut c, mut host) = established();
    host.write_all(&[7u8; 100]).expect("write");
    let mut h = guest_hdr(OP_CREDIT_UPDATE, 1 << 30, 1024);
    h.buf_alloc = 60;
    c.on_packet(&h, &[]);
    assert!(c.interest().readable);
    c.on_readable();
    assert!(
        !c.interest().readable,
        "no double polling while a read is pending"
    );
    let (hdr, data) = RxChain::new(4096).fill(&mut c).expect("data");
    assert_eq!((hdr.op, hdr.len, data.len()), (OP_RW, 60, 60));
    assert_eq!(c.credit().peer_free(), 0);
    assert!(
        RxChain::new(4096).fill(&mut c).is_none(),
        "credit exhausted"
    );
    assert!(!c.interest().readable);
    h.fwd_cnt = 60;
    c.on_packet(&h, &[]);
    assert!(c.interest().readable);
    c.on_readable();
    let (hdr, _) = RxChain::new(4096).fill(&mut c).expect("rest");
    assert_eq!(hdr.len, 40);
}

#[test]
fn host_close_sends_shutdown_and_guest_rst_ends() {
    let (mut c, host) = established();
    drop(host);
    c.on_hup();
    let (hdr, _) = RxChain::new(4096).fill(&mut c).expect("shutdown");
    assert_eq!((hdr.op, hdr.flags), (OP_SHUTDOWN, SHUTDOWN_BOTH));
    assert!(!c.has_pending_rx());
    c.on_packet(&guest_hdr(OP_RST, 1 << 30, 1024), &[]);
    assert!(c.is_closed());
    assert!(c.take_rst().is_none());
}

#[test]
fn hung_up_host_is_drained_again_when_credit_returns() {
    let (mut c, mut host) = established();
    host.write_all(&[1u8; 100]).expect("write");
    drop(host);
    let mut h = guest_hdr(OP_CREDIT_UPDATE, 1 << 30, 1024);
    h.buf_alloc = 60;
    c.on_packet(&h, &[]);
    c.on_hup();
    let (hdr, _) = RxChain::new(4096).fill(&mut c).expect("data");
    assert_eq!(hdr.len, 60);
    assert!(
        RxChain::new(4096).fill(&mut c).is_none(),
        "credit exhausted"
    );
    h.fwd_cnt = 60;
    c.on_packet(&h, &[]);
    assert!(
        c.has_pending_rx(),
        "no epoll any more: credit must re-arm the read"
    );
    let (hdr, _) = RxChain::new(4096).fill(&mut c).expect("rest");
    assert_eq!(hdr.len, 40);
    let (hdr, _) = RxChain::new(4096).fill(&mut c).expect("eof");
    assert_eq!((hdr.op, hdr.flags), (OP_SHUTDOWN, SHUTDOWN_BOTH));
}

#[test]
fn host_half_close_sends_shutdown_send_only() {
    let (mut c, host) = established();
    host.shutdown(Shutdown::Write).expect("shutdown");
    c.on_readable();
    let (hdr, _) = RxChain::new(4096).fill(&mut c).expect("shutdown");
    assert_eq!((hdr.op, hdr.flags), (OP_SHUTDOWN, SHUTDOWN_SEND));
}

#[test]
fn guest_full_shutdown_half_closes_host_and_resets() {
    let (mut c, mut host) = established();
    let mut h = guest_hdr(OP_SHUTDOWN, 1 << 30, 1024);
    h.flags = SHUTDOWN_BOTH;
    c.on_packet(&h, &[]);
    assert!(c.is_closed());
    let rst = c.take_rst().expect("rst");
    assert_eq!(
        (rst.op, rst.src_port, rst.dst_port),
        (OP_RST, 1 << 30, 1024)
    );
    let mut buf = [0u8; 1];
    assert_eq!(host.read(&mut buf).expect("eof"), 0);
}

#[test]
fn credit_overrun_resets() {
    let (mut c, _host) = established();
    // Never drained by the host: stall the host socket, then overrun our buffer.
    let chunk = vec![0u8; MAX_PKT_PAYLOAD];
    let mut h = guest_hdr(OP_RW, 1 << 30, 1024);
    h.len = chunk.len() as u32;
    let mut sent = 0u32;
    while !c.is_closed() && sent < 64 * HOST_BUF_ALLOC {
        c.on_packet(&h, &chunk);
        sent += h.len;
    }
    assert!(c.is_closed(), "overrunning the announced buffer resets");
    assert!(c.take_rst().is_some());
}

#[test]
fn credit_request_is_answered() {
    let (mut c, _host) = established();
    c.on_packet(&guest_hdr(OP_CREDIT_REQUEST, 1 << 30, 1024), &[]);
    let (hdr, _) = RxChain::new(4096).fill(&mut c).expect("update");
    assert_eq!((hdr.op, hdr.buf_alloc), (OP_CREDIT_UPDATE, HOST_BUF_ALLOC));
}

#[test]
fn guest_request_is_answered_with_response() {
    let (a, _b) = UnixStream::pair().expect("socketpair");
    let req = guest_hdr(OP_REQUEST, 52, 7000);
    let mut c = VsockConnection::new_peer(CID, &req, a);
    let (hdr, _) = RxChain::new(4096).fill(&mut c).expect("response");
    assert_eq!(
        (hdr.op, hdr.src_port, hdr.dst_port),
        (OP_RESPONSE, 52, 7000)
    );
    assert_eq!(c.credit().peer_free(), 64 * 1024);
}

#[test]
fn unexpected_op_resets() {
    let (mut c, _host) = local_conn();
    c.on_packet(&guest_hdr(OP_RW, 1 << 30, 1024), b"x");
    assert!(c.is_closed());
    assert!(c.take_rst().is_some());
}

/// A host stream that takes less than the guest sends: the rest waits in our buffer and
/// reaches the host in order once it reads; the buffer is let go once empty, and credit
/// updates come each time half the guest's (smaller) window was freed.
#[test]
fn a_slow_host_gets_every_byte_in_order_and_the_guest_its_credit() {
    let (mut c, mut host) = established();
    host.set_nonblocking(true).expect("nonblocking");
    let window = 256 * 1024;
    let mut h = guest_hdr(OP_RW, 1 << 30, 1024);
    h.buf_alloc = window;
    let data: Vec<u8> = (0..window as usize).map(|i| (i % 251) as u8).collect();
    for chunk in data.chunks(MAX_PKT_PAYLOAD) {
        h.len = chunk.len() as u32;
        c.on_packet(&h, chunk);
    }
    assert!(!c.is_closed());
    assert!(
        c.credit().buffered > 0,
        "the socket pair should not take 256 KiB at once"
    );
    assert!(c.interest().writable);
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut updates = 0;
    while got.len() < data.len() {
        match host.read(&mut buf) {
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => c.on_writable(),
            Err(e) => panic!("read: {e}"),
        }
        if c.has_pending_rx() {
            let (hdr, _) = RxChain::new(4096).fill(&mut c).expect("credit update");
            assert_eq!(hdr.op, OP_CREDIT_UPDATE);
            updates += 1;
        }
    }
    assert!(got == data, "the bytes differ");
    assert_eq!(c.credit().buffered, 0);
    assert!(!c.interest().writable);
    assert!(
        c.tx_buf.capacity() <= MAX_PKT_PAYLOAD,
        "the burst's buffer was kept"
    );
    assert!(updates >= 1, "the guest never heard of the freed space");
    assert_eq!(c.credit().fwd_cnt, window);
}

/// A guest that closes while the host reads slowly resets the connection once its close
/// times out; the bytes it sent before are still delivered, then the host reads EOF.
#[test]
fn a_guest_reset_after_its_close_still_delivers_what_it_sent() {
    let (mut c, mut host) = established();
    host.set_nonblocking(true).expect("nonblocking");
    let mut h = guest_hdr(OP_RW, 1 << 30, 1024);
    h.buf_alloc = 1 << 20;
    let data: Vec<u8> = (0..(512 * 1024)).map(|i| (i % 253) as u8).collect();
    for chunk in data.chunks(MAX_PKT_PAYLOAD) {
        h.len = chunk.len() as u32;
        c.on_packet(&h, chunk);
    }
    assert!(c.credit().buffered > 0, "the host must lag for this test");
    let mut close = guest_hdr(OP_SHUTDOWN, 1 << 30, 1024);
    close.flags = SHUTDOWN_BOTH;
    c.on_packet(&close, &[]);
    c.on_packet(&guest_hdr(OP_RST, 1 << 30, 1024), &[]);
    assert_eq!(c.state(), ConnState::Draining);
    assert!(!c.has_pending_rx(), "nothing more goes to the guest");
    assert!(RxChain::new(4096).fill(&mut c).is_none());
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match host.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                assert!(c.interest().writable);
                c.on_writable();
            }
            Err(e) => panic!("read: {e}"),
        }
    }
    assert!(got == data, "the bytes differ");
    assert!(c.is_closed());
    assert!(c.take_rst().is_none(), "the guest already reset it");
}
