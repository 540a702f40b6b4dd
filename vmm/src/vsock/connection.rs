//! One vsock stream between a guest port and a host unix stream: its state machine, its
//! buffering of guest data for a slow host reader, and its credit accounting.
//!
//! A connection never touches queues or epoll: the muxer hands it packets from the guest
//! (`on_packet`), host readiness (`on_readable`, `on_writable`, `on_hup`), and rx buffers to
//! fill (`fill_rx`), then asks what it wants next (`pending_rx`, `interest`, `is_closed`).

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;

use log::debug;
use virtio_queue::Writer;
use vm_memory::bitmap::BitmapSlice;

use super::credit::{Credit, HOST_BUF_ALLOC};
use super::packet::{
    self, PacketError, PacketHeader, HDR_SIZE, MAX_PKT_PAYLOAD, OP_CREDIT_REQUEST,
    OP_CREDIT_UPDATE, OP_REQUEST, OP_RESPONSE, OP_RST, OP_RW, OP_SHUTDOWN, SHUTDOWN_BOTH,
    SHUTDOWN_RCV, SHUTDOWN_SEND, TYPE_STREAM,
};
use super::HOST_CID;

/// Where a connection is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnState {
    /// The host dialled through the hybrid socket; the guest has not answered the REQUEST.
    LocalInit,
    /// Data flows both ways (each way until its SHUTDOWN).
    Established,
    /// The guest reset the connection while guest data still waited for the host: that
    /// data was accepted (credited), so it is delivered before the host stream closes.
    /// A guest whose close outlived its timeout (8 s in Linux) while the host read
    /// slowly resets, and the end of a process's output must not be lost to that.
    Draining,
    /// Finished; the muxer drops it (and sends an RST first if `rst_needed`).
    Closed,
}

/// Packets a connection has to send to the guest, besides data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Pending {
    request: bool,
    response: bool,
    credit_update: bool,
    shutdown: Option<u32>,
    /// The host stream may have data (or EOF) to read.
    read: bool,
}

/// What the connection wants to hear about its host stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Interest {
    pub readable: bool,
    pub writable: bool,
}

/// One guest-port to host-stream connection.
#[derive(Debug)]
pub struct VsockConnection {
    guest_cid: u64,
    /// Host side port (the guest's `dst_port` when it sends to us).
    local_port: u32,
    /// Guest side port.
    peer_port: u32,
    stream: UnixStream,
    state: ConnState,
    credit: Credit,
    pending: Pending,
    /// Guest data (and the hybrid `OK` line) not yet written to the host stream.
    tx_buf: VecDeque<u8>,
    /// Bytes at the front of `tx_buf` that are ours (the `OK` line), not the guest's.
    tx_ctl_bytes: usize,
    /// SHUTDOWN flags the guest has sent.
    peer_shutdown: u32,
    /// The host stream hit EOF and the guest was told.
    host_eof: bool,
    /// The host stream hung up: it is no longer polled, only drained.
    host_hup: bool,
    /// The guest must get an RST for this connection when it is dropped.
    rst_needed: bool,
    request_sent: bool,
    /// What the guest last did wrong on this connection, for the muxer to log (through its
    /// rate limit: a guest can repeat it at will).
    violation: Option<String>,
}

impl VsockConnection {
    /// A connection the host opened with `CONNECT <peer_port>` on the hybrid socket.
    pub fn new_local(guest_cid: u64, local_port: u32, peer_port: u32, stream: UnixStream) -> Self {
        let mut conn = Self::new(
            guest_cid,
            local_port,
            peer_port,
            stream,
            ConnState::LocalInit,
        );
        conn.pending.request = true;
        conn
    }

    /// A connection the guest asked for with a REQUEST, already dialled on the host.
    pub fn new_peer(guest_cid: u64, request: &PacketHeader, stream: UnixStream) -> Self {
        let mut conn = Self::new(
            guest_cid,
            request.dst_port,
            request.src_port,
            stream,
            ConnState::Established,
        );
        conn.credit
            .update_from_peer(request.buf_alloc, request.fwd_cnt);
        conn.pending.response = true;
        conn
    }

    fn new(
        guest_cid: u64,
        local_port: u32,
        peer_port: u32,
        stream: UnixStream,
        state: ConnState,
    ) -> Self {
        VsockConnection {
            guest_cid,
            local_port,
            peer_port,
            stream,
            state,
            credit: Credit::default(),
            pending: Pending::default(),
            tx_buf: VecDeque::new(),
            tx_ctl_bytes: 0,
            peer_shutdown: 0,
            host_eof: false,
            host_hup: false,
            rst_needed: false,
            request_sent: false,
            violation: None,
        }
    }

    pub fn state(&self) -> ConnState {
        self.state
    }

    pub fn local_port(&self) -> u32 {
        self.local_port
    }

    pub fn peer_port(&self) -> u32 {
        self.peer_port
    }

    pub fn credit(&self) -> &Credit {
        &self.credit
    }

    pub fn is_closed(&self) -> bool {
        self.state == ConnState::Closed
    }

    /// Whether the guest has seen nothing of this connection yet (it survives a device reset).
    pub fn is_unannounced(&self) -> bool {
        self.state == ConnState::LocalInit && !self.request_sent
    }

    /// The RST to send the guest as this connection goes, if it needs one.
    pub fn take_rst(&mut self) -> Option<PacketHeader> {
        if !std::mem::take(&mut self.rst_needed) {
            return None;
        }
        Some(self.header(OP_RST, 0, 0))
    }

    /// Whether the connection has something for the rx queue.
    pub fn has_pending_rx(&self) -> bool {
        let p = &self.pending;
        p.request || p.response || p.credit_update || p.shutdown.is_some() || p.read
    }

    /// What to poll the host stream for.
    pub fn interest(&self) -> Interest {
        if self.host_hup || self.state == ConnState::Closed {
            return Interest::default();
        }
        if self.state == ConnState::Draining {
            return Interest {
                readable: false,
                writable: true,
            };
        }
        Interest {
            readable: self.state == ConnState::Established
                && !self.pending.read
                && !self.host_eof
                && self.peer_shutdown & SHUTDOWN_RCV == 0
                && self.credit.peer_free() > 0,
            writable: !self.tx_buf.is_empty(),
        }
    }

    /// Ends the connection; the guest is told with an RST (unless it reset it itself).
    fn kill(&mut self) {
        self.rst_needed = self.state != ConnState::Draining;
        self.state = ConnState::Closed;
    }

    /// The protocol violation the last packet was, if it was one (the connection is reset).
    pub fn take_violation(&mut self) -> Option<String> {
        self.violation.take()
    }

    /// Handles a packet the guest sent on this connection.
    pub fn on_packet(&mut self, hdr: &PacketHeader, payload: &[u8]) {
        self.credit.update_from_peer(hdr.buf_alloc, hdr.fwd_cnt);
        self.dispatch(hdr, payload);
        // A hung-up stream is no longer polled: new credit alone must restart draining it.
        if self.host_hup
            && !self.host_eof
            && self.state == ConnState::Established
            && self.credit.peer_free() > 0
        {
            self.pending.read = true;
        }
    }

    fn dispatch(&mut self, hdr: &PacketHeader, payload: &[u8]) {
        match (self.state, hdr.op) {
            // Gone for the guest already: nothing it says matters any more.
            (ConnState::Draining, _) => {}
            (ConnState::Established, OP_RST) if !self.tx_buf.is_empty() => {
                self.state = ConnState::Draining;
                self.pending = Pending::default();
                self.flush_tx();
            }
            (_, OP_RST) => self.state = ConnState::Closed,
            (ConnState::LocalInit, OP_RESPONSE) => {
                self.state = ConnState::Established;
                // The hybrid protocol's answer to CONNECT, ahead of any guest data.
                let ok = format!("OK {}\n", self.local_port);
                self.tx_ctl_bytes = ok.len();
                self.tx_buf.extend(ok.as_bytes());
                self.flush_tx();
            }
            (ConnState::Established, OP_RW) => self.on_guest_data(payload),
            (ConnState::Established, OP_CREDIT_UPDATE) => {}
            (ConnState::Established, OP_CREDIT_REQUEST) => self.pending.credit_update = true,
            (ConnState::Established, OP_SHUTDOWN) => {
                self.peer_shutdown |= hdr.flags & SHUTDOWN_BOTH;
                self.finish_shutdown();
            }
            (state, op) => {
                self.violation = Some(format!(
                    "vsock: guest sent op {op} on port {} -> host port {} in state {state:?}; resetting it",
                    self.peer_port, self.local_port
                ));
                self.kill();
            }
        }
    }

    fn on_guest_data(&mut self, payload: &[u8]) {
        if self.peer_shutdown & SHUTDOWN_SEND != 0 {
            self.violation = Some(format!(
                "vsock: guest port {} sent data after SHUTDOWN; resetting it",
                self.peer_port
            ));
            self.kill();
            return;
        }
        // Bounded by MAX_PKT_PAYLOAD.
        let len = payload.len() as u32;
        if !self.credit.can_accept(len) {
            self.violation = Some(format!(
                "vsock: guest port {} overran the {HOST_BUF_ALLOC}-byte credit of host port {}; resetting it",
                self.peer_port, self.local_port
            ));
            self.kill();
            return;
        }
        self.credit.received(len);
        let mut rest = payload;
        if self.tx_buf.is_empty() {
            // The common case: nothing is queued, so the bytes go to the host stream as
            // they are, and only what it does not take now is copied into `tx_buf`.
            match write_some(&mut self.stream, payload) {
                Ok(n) => {
                    self.credit.forwarded(n as u32); // n <= len
                    rest = &payload[n..];
                }
                Err(e) => return self.host_write_failed(e),
            }
        }
        self.tx_buf.extend(rest);
        self.flush_tx();
    }

    fn host_write_failed(&mut self, e: io::Error) {
        debug!(
            "vsock: writing to host port {} failed: {e}",
            self.local_port
        );
        self.kill();
    }

    /// The host stream can take more data.
    pub fn on_writable(&mut self) {
        self.flush_tx();
    }

    /// The host stream has data or EOF to read: the next rx buffer will take it.
    pub fn on_readable(&mut self) {
        if self.state == ConnState::Established {
            self.pending.read = true;
        }
    }

    /// The host side hung up (or errored); the fd must no longer be polled.
    pub fn on_hup(&mut self) {
        self.host_hup = true;
        match self.state {
            ConnState::LocalInit if self.request_sent => self.kill(),
            ConnState::LocalInit => self.state = ConnState::Closed,
            // Drain what the host wrote before it went; the read then sees EOF.
            ConnState::Established => self.pending.read = !self.host_eof,
            // Nobody reads what is left.
            ConnState::Draining => self.state = ConnState::Closed,
            ConnState::Closed => {}
        }
    }

    /// Writes buffered guest data to the host stream, as much as it takes.
    fn flush_tx(&mut self) {
        while !self.tx_buf.is_empty() {
            let (front, _) = self.tx_buf.as_slices();
            let n = match write_some(&mut self.stream, front) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => return self.host_write_failed(e),
            };
            self.tx_buf.drain(..n);
            // Our own OK line does not count against the guest's credit.
            let ctl = n.min(self.tx_ctl_bytes);
            self.tx_ctl_bytes -= ctl;
            // n - ctl <= tx_buf's guest bytes <= HOST_BUF_ALLOC.
            self.credit.forwarded((n - ctl) as u32);
        }
        if self.tx_buf.is_empty() && self.tx_buf.capacity() > MAX_PKT_PAYLOAD {
            // A burst the host read slowly must not pin its buffer for the connection's life.
            self.tx_buf = VecDeque::new();
        }
        if self.credit.needs_update() && self.state == ConnState::Established {
            self.pending.credit_update = true;
        }
        self.finish_shutdown();
    }

    /// Passes a guest SHUTDOWN on to the host once buffered data is out.
    fn finish_shutdown(&mut self) {
        if !self.tx_buf.is_empty() {
            return;
        }
        if self.state == ConnState::Draining {
            // Delivered: the host reads the end of the stream; the guest needs no RST.
            let _ = self.stream.shutdown(Shutdown::Write);
            self.state = ConnState::Closed;
            return;
        }
        if self.state != ConnState::Established {
            return;
        }
        if self.peer_shutdown & SHUTDOWN_SEND != 0 {
            let _ = self.stream.shutdown(Shutdown::Write);
        }
        if self.peer_shutdown == SHUTDOWN_BOTH {
            // The guest closed its socket and waits for our RST to finish.
            self.kill();
        }
    }

    fn header(&mut self, op: u16, len: u32, flags: u32) -> PacketHeader {
        let (buf_alloc, fwd_cnt) = self.credit.stamp();
        PacketHeader {
            src_cid: HOST_CID,
            dst_cid: self.guest_cid,
            src_port: self.local_port,
            dst_port: self.peer_port,
            len,
            type_: TYPE_STREAM,
            op,
            flags,
            buf_alloc,
            fwd_cnt,
        }
    }

    /// Writes the connection's next packet into an rx chain, reading host data through
    /// `scratch`. Returns the bytes written, or `None` if it had nothing to send after all.
    pub fn fill_rx<B: BitmapSlice>(
        &mut self,
        writer: &mut Writer<'_, B>,
        scratch: &mut [u8],
    ) -> Result<Option<u32>, PacketError> {
        if matches!(self.state, ConnState::Closed | ConnState::Draining) {
            return Ok(None);
        }
        if std::mem::take(&mut self.pending.request) {
            self.request_sent = true;
            let hdr = self.header(OP_REQUEST, 0, 0);
            return packet::write_rx_packet(writer, &hdr, &[]).map(Some);
        }
        if std::mem::take(&mut self.pending.response) {
            let hdr = self.header(OP_RESPONSE, 0, 0);
            return packet::write_rx_packet(writer, &hdr, &[]).map(Some);
        }
        if let Some(flags) = self.pending.shutdown.take() {
            let hdr = self.header(OP_SHUTDOWN, 0, flags);
            return packet::write_rx_packet(writer, &hdr, &[]).map(Some);
        }
        if self.pending.read {
            if let Some(n) = self.fill_rx_data(writer, scratch)? {
                return Ok(Some(n));
            }
        }
        if std::mem::take(&mut self.pending.credit_update) {
            let hdr = self.header(OP_CREDIT_UPDATE, 0, 0);
            return packet::write_rx_packet(writer, &hdr, &[]).map(Some);
        }
        Ok(None)
    }

    fn fill_rx_data<B: BitmapSlice>(
        &mut self,
        writer: &mut Writer<'_, B>,
        scratch: &mut [u8],
    ) -> Result<Option<u32>, PacketError> {
        let room = writer.available_bytes().saturating_sub(HDR_SIZE);
        let credit = self.credit.peer_free() as usize;
        let max = room.min(credit).min(scratch.len()).min(MAX_PKT_PAYLOAD);
        if room == 0 {
            // A buffer too small for header and data: let the muxer drop it, keep the data.
            return Err(PacketError::RxBufferTooShort(writer.available_bytes()));
        }
        if max == 0 {
            // No credit: wait for the guest's CREDIT_UPDATE.
            self.pending.read = false;
            return Ok(None);
        }
        match self.stream.read(&mut scratch[..max]) {
            Ok(0) => {
                self.pending.read = false;
                self.host_eof = true;
                // A full close also ends the guest's sending; a half close only ours.
                let flags = if self.host_hup || peer_hung_up(self.stream.as_raw_fd()) {
                    SHUTDOWN_BOTH
                } else {
                    SHUTDOWN_SEND
                };
                let hdr = self.header(OP_SHUTDOWN, 0, flags);
                packet::write_rx_packet(writer, &hdr, &[]).map(Some)
            }
            Ok(n) => {
                // n <= MAX_PKT_PAYLOAD.
                let len = n as u32;
                let hdr = self.header(OP_RW, len, 0);
                let written = packet::write_rx_packet(writer, &hdr, &scratch[..n])?;
                self.credit.sent(len);
                Ok(Some(written))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.pending.read = false;
                Ok(None)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
            Err(e) => {
                debug!("vsock: reading host port {} failed: {e}", self.local_port);
                self.pending.read = false;
                self.kill();
                Ok(None)
            }
        }
    }
}

impl AsRawFd for VsockConnection {
    fn as_raw_fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }
}

/// Writes `data` to the non-blocking `stream` until it would block; returns how much it
/// took. Errors are the stream's own (the peer went away, ...).
fn write_some(stream: &mut UnixStream, data: &[u8]) -> io::Result<usize> {
    let mut written = 0;
    while written < data.len() {
        match stream.write(&data[written..]) {
            Ok(0) => break,
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(written)
}

/// Whether the other end of a unix stream is gone for good (not just half-closed).
fn peer_hung_up(fd: RawFd) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    };
    // SAFETY: `pfd` is a valid pollfd for the duration of the call, count 1, no timeout.
    let r = unsafe { libc::poll(&mut pfd, 1, 0) };
    r == 1 && pfd.revents & libc::POLLHUP != 0
}

#[cfg(test)]
mod tests;
