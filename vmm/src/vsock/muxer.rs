//! The vsock muxer: routes packets between the guest's rx/tx queues and the host's unix
//! streams, one `VsockConnection` per (host port, guest port) pair.
//!
//! Host-side I/O readiness comes from the muxer's own epoll fd, which the transport (the
//! vhost-user backend, or the builtin VMM's event loop) polls and then calls
//! `process_host_events`. Packets for the guest wait in the muxer until the transport calls
//! `process_rx` with a queue that has buffers: a host `CONNECT` that arrives before the guest
//! driver has set up its queues is kept, not lost, and goes out with the first rx buffers.
//!
//! Whatever the guest does, the muxer's memory stays bounded (as Firecracker's muxer does):
//! at most [`MAX_CONNECTIONS`] connections (a guest REQUEST beyond gets an RST, a host
//! CONNECT beyond is closed), [`MAX_HANDSHAKES`] host connections waiting for their CONNECT
//! line (newer ones are closed), [`MAX_RST_QUEUE`] RSTs waiting for rx buffers (newer ones
//! are dropped: the guest's connect then times out instead of being refused), and the rx
//! queue holds each connection at most once. Each connection buffers at most the credit it
//! announced ([`HOST_BUF_ALLOC`](super::credit::HOST_BUF_ALLOC)). The warnings a guest can
//! repeat at will are rate-limited ([`super::log_limit`]).

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::unix::io::{AsRawFd, RawFd};
use std::path::Path;

use log::{debug, log, Level};
use thiserror::Error;
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};
use vm_memory::GuestMemory;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use super::connection::{Interest, VsockConnection};
use super::log_limit::LogLimiter;
use super::packet::{self, PacketHeader, MAX_PKT_PAYLOAD, OP_REQUEST, OP_RST, TYPE_STREAM};
use super::unix::{Handshake, HybridListener, PendingHandshake, UnixError};
use super::HOST_CID;

/// First host port handed to host-initiated connections (as Firecracker does, far above
/// the ports services listen on).
const FIRST_LOCAL_PORT: u32 = 1 << 30;
/// Epoll events handled per `epoll_wait`.
const EVENT_BATCH: usize = 32;
/// Most connections at once, host- and guest-initiated.
pub const MAX_CONNECTIONS: usize = 1024;
/// Most host connections that have not yet sent their `CONNECT` line.
pub const MAX_HANDSHAKES: usize = 64;
/// Most RSTs waiting for rx buffers.
pub const MAX_RST_QUEUE: usize = 256;

/// The caps of one muxer (the constants above; tests lower them).
#[derive(Clone, Copy, Debug)]
struct Limits {
    connections: usize,
    handshakes: usize,
    rst_queue: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections: MAX_CONNECTIONS,
            handshakes: MAX_HANDSHAKES,
            rst_queue: MAX_RST_QUEUE,
        }
    }
}

/// The rate limits of the lines a guest can cause again and again, one per kind.
#[derive(Debug, Default)]
struct Warnings {
    /// Malformed tx packets and rx buffers, packets that cannot be written.
    malformed: LogLimiter,
    /// Guest connects to host ports nobody listens on.
    refused: LogLimiter,
    /// Guest connections to host ports (each one otherwise a line).
    connected: LogLimiter,
    /// Protocol violations on a connection.
    protocol: LogLimiter,
    /// Work dropped at a cap.
    dropped: LogLimiter,
}

impl Warnings {
    fn emitted(&self) -> u64 {
        [
            &self.malformed,
            &self.refused,
            &self.connected,
            &self.protocol,
            &self.dropped,
        ]
        .iter()
        .map(|l| l.emitted())
        .sum()
    }
}

/// Logs `message` at `level` if `limiter` lets a line through now.
fn log_limited(limiter: &mut LogLimiter, level: Level, message: impl FnOnce() -> String) {
    if let Some(line) = limiter.line(message) {
        log!(level, "{line}");
    }
}

#[derive(Debug, Error)]
pub enum MuxerError {
    #[error(transparent)]
    Unix(#[from] UnixError),
    #[error("could not create the vsock muxer's epoll instance: {0}")]
    EpollCreate(io::Error),
    #[error("could not {op} fd {fd} in the vsock muxer's epoll set: {source}")]
    EpollCtl {
        op: &'static str,
        fd: RawFd,
        source: io::Error,
    },
    #[error("waiting on the vsock muxer's epoll set failed: {0}")]
    EpollWait(io::Error),
    #[error("accepting on the hybrid vsock socket failed: {0}")]
    Accept(io::Error),
    #[error("the vsock {queue} queue is broken: {source}")]
    Queue {
        queue: &'static str,
        source: virtio_queue::Error,
    },
}

/// A connection's identity: host port and guest port.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct ConnKey {
    pub local_port: u32,
    pub peer_port: u32,
}

/// Per-connection bookkeeping of the muxer.
#[derive(Debug)]
struct MuxedConn {
    conn: VsockConnection,
    /// Interest currently registered in epoll; `None` once the fd left the set.
    registered: Option<Interest>,
    in_rx_queue: bool,
}

/// The vsock device's connection multiplexer.
#[derive(Debug)]
pub struct VsockMuxer {
    guest_cid: u64,
    epoll: Epoll,
    listener: HybridListener,
    handshakes: HashMap<RawFd, PendingHandshake>,
    conns: HashMap<ConnKey, MuxedConn>,
    fd_keys: HashMap<RawFd, ConnKey>,
    /// Connections with packets for the guest, in arrival order.
    rx_queue: VecDeque<ConnKey>,
    /// RSTs for packets that matched no connection, or for connections already dropped.
    rst_queue: VecDeque<PacketHeader>,
    next_local_port: u32,
    scratch: Vec<u8>,
    payload: Vec<u8>,
    warnings: Warnings,
    limits: Limits,
}

impl VsockMuxer {
    /// A muxer for guest `guest_cid` whose hybrid socket listens at `uds_path`.
    pub fn new(guest_cid: u64, uds_path: &Path) -> Result<Self, MuxerError> {
        let listener = HybridListener::bind(uds_path)?;
        let epoll = Epoll::new().map_err(MuxerError::EpollCreate)?;
        let muxer = VsockMuxer {
            guest_cid,
            epoll,
            listener,
            handshakes: HashMap::new(),
            conns: HashMap::new(),
            fd_keys: HashMap::new(),
            rx_queue: VecDeque::new(),
            rst_queue: VecDeque::new(),
            next_local_port: FIRST_LOCAL_PORT,
            scratch: vec![0; MAX_PKT_PAYLOAD],
            payload: Vec::with_capacity(MAX_PKT_PAYLOAD),
            warnings: Warnings::default(),
            limits: Limits::default(),
        };
        muxer.epoll_ctl(
            ControlOperation::Add,
            muxer.listener.as_raw_fd(),
            EventSet::IN,
        )?;
        Ok(muxer)
    }

    pub fn guest_cid(&self) -> u64 {
        self.guest_cid
    }

    /// Number of live connections (host- or guest-initiated).
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// Log lines the rate-limited warnings have let through so far.
    pub fn warnings_logged(&self) -> u64 {
        self.warnings.emitted()
    }

    /// Queues an RST for the guest, unless [`MAX_RST_QUEUE`] already wait.
    fn push_rst(&mut self, rst: PacketHeader) {
        let cap = self.limits.rst_queue;
        if self.rst_queue.len() >= cap {
            log_limited(&mut self.warnings.dropped, Level::Warn, || {
                format!(
                    "vsock: {cap} RSTs already wait for the guest's rx buffers; \
                     dropping the one for guest port {}",
                    rst.dst_port
                )
            });
            return;
        }
        self.rst_queue.push_back(rst);
    }

    /// Whether packets wait for rx buffers.
    pub fn has_pending_rx(&self) -> bool {
        !self.rst_queue.is_empty() || !self.rx_queue.is_empty()
    }

    fn epoll_ctl(
        &self,
        op: ControlOperation,
        fd: RawFd,
        events: EventSet,
    ) -> Result<(), MuxerError> {
        let name = match op {
            ControlOperation::Add => "add",
            ControlOperation::Modify => "modify",
            ControlOperation::Delete => "remove",
        };
        // The fd is the event's data: it identifies the listener, handshake or connection.
        self.epoll
            .ctl(op, fd, EpollEvent::new(events, fd as u64))
            .map_err(|source| MuxerError::EpollCtl {
                op: name,
                fd,
                source,
            })
    }

    /// Handles everything host-side that is ready: new host connections, `CONNECT` lines,
    /// readable and writable streams. Never blocks.
    pub fn process_host_events(&mut self) -> Result<(), MuxerError> {
        let mut events = [EpollEvent::default(); EVENT_BATCH];
        loop {
            let n = match self.epoll.wait(0, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(MuxerError::EpollWait(e)),
            };
            for ev in &events[..n] {
                self.handle_host_event(ev.fd(), ev.event_set())?;
            }
            if n < EVENT_BATCH {
                return Ok(());
            }
        }
    }

    fn handle_host_event(&mut self, fd: RawFd, set: EventSet) -> Result<(), MuxerError> {
        if fd == self.listener.as_raw_fd() {
            return self.accept_host_connections();
        }
        if self.handshakes.contains_key(&fd) {
            return self.advance_handshake(fd);
        }
        let Some(&key) = self.fd_keys.get(&fd) else {
            return Ok(());
        };
        if let Some(m) = self.conns.get_mut(&key) {
            if set.intersects(EventSet::HANG_UP | EventSet::ERROR) {
                // Level-triggered HUP would fire forever: take the fd out of the set first.
                if m.registered.take().is_some() {
                    let _ = self
                        .epoll
                        .ctl(ControlOperation::Delete, fd, EpollEvent::default());
                }
                m.conn.on_hup();
            } else {
                if set.contains(EventSet::OUT) {
                    m.conn.on_writable();
                }
                if set.contains(EventSet::IN) {
                    m.conn.on_readable();
                }
            }
        }
        self.refresh(key)
    }

    fn accept_host_connections(&mut self) -> Result<(), MuxerError> {
        while let Some(stream) = self.listener.accept().map_err(MuxerError::Accept)? {
            let cap = self.limits.handshakes;
            if self.handshakes.len() >= cap {
                // Closed at once (`stream` is dropped): left in the backlog it would keep
                // the listener readable.
                log_limited(&mut self.warnings.dropped, Level::Warn, || {
                    format!(
                        "vsock: {cap} hybrid socket clients have not sent their \
                         CONNECT line yet; closing a new one"
                    )
                });
                continue;
            }
            let hs = PendingHandshake::new(stream);
            let fd = hs.as_raw_fd();
            self.epoll_ctl(ControlOperation::Add, fd, EventSet::IN)?;
            self.handshakes.insert(fd, hs);
        }
        Ok(())
    }

    fn advance_handshake(&mut self, fd: RawFd) -> Result<(), MuxerError> {
        let Some(hs) = self.handshakes.get_mut(&fd) else {
            return Ok(());
        };
        let port = match hs.advance() {
            Handshake::Incomplete => return Ok(()),
            Handshake::Connect(port) => port,
            Handshake::Failed(why) => {
                debug!("vsock: dropping a hybrid socket client: {why}");
                self.epoll_ctl(ControlOperation::Delete, fd, EventSet::empty())?;
                self.handshakes.remove(&fd);
                return Ok(());
            }
        };
        let Some(hs) = self.handshakes.remove(&fd) else {
            return Ok(());
        };
        let cap = self.limits.connections;
        if self.conns.len() >= cap {
            self.epoll_ctl(ControlOperation::Delete, fd, EventSet::empty())?;
            log_limited(&mut self.warnings.dropped, Level::Warn, || {
                format!(
                    "vsock: {cap} connections are open; closing the host's \
                     CONNECT {port}"
                )
            });
            return Ok(());
        }
        let local_port = self.allocate_local_port(port);
        let key = ConnKey {
            local_port,
            peer_port: port,
        };
        debug!("vsock: host CONNECT {port} as host port {local_port}");
        let conn = VsockConnection::new_local(self.guest_cid, local_port, port, hs.into_stream());
        // Quiet until the guest answers: nothing to read or write before that.
        self.epoll_ctl(ControlOperation::Modify, fd, EventSet::empty())?;
        self.insert(key, conn, Interest::default());
        self.refresh(key)
    }

    fn allocate_local_port(&mut self, peer_port: u32) -> u32 {
        loop {
            let port = self.next_local_port;
            self.next_local_port = self
                .next_local_port
                .checked_add(1)
                .unwrap_or(FIRST_LOCAL_PORT);
            let key = ConnKey {
                local_port: port,
                peer_port,
            };
            if !self.conns.contains_key(&key) {
                return port;
            }
        }
    }

    fn insert(&mut self, key: ConnKey, conn: VsockConnection, registered: Interest) {
        self.fd_keys.insert(conn.as_raw_fd(), key);
        self.conns.insert(
            key,
            MuxedConn {
                conn,
                registered: Some(registered),
                in_rx_queue: false,
            },
        );
    }

    /// After anything happened to a connection: drop it if closed, queue it for rx if it has
    /// packets, and poll its stream for what it now wants.
    fn refresh(&mut self, key: ConnKey) -> Result<(), MuxerError> {
        let Some(m) = self.conns.get_mut(&key) else {
            return Ok(());
        };
        let fd = m.conn.as_raw_fd();
        if m.conn.is_closed() {
            let rst = m.conn.take_rst();
            if m.registered.is_some() {
                let _ = self
                    .epoll
                    .ctl(ControlOperation::Delete, fd, EpollEvent::default());
            }
            self.fd_keys.remove(&fd);
            self.conns.remove(&key);
            if let Some(rst) = rst {
                self.push_rst(rst);
            }
            debug!(
                "vsock: closed host port {} <-> guest port {}",
                key.local_port, key.peer_port
            );
            return Ok(());
        }
        if m.conn.has_pending_rx() && !m.in_rx_queue {
            m.in_rx_queue = true;
            self.rx_queue.push_back(key);
        }
        let want = m.conn.interest();
        match m.registered {
            Some(have) if have != want => {
                m.registered = Some(want);
                let mut set = EventSet::empty();
                if want.readable {
                    set |= EventSet::IN;
                }
                if want.writable {
                    set |= EventSet::OUT;
                }
                self.epoll_ctl(ControlOperation::Modify, fd, set)
            }
            _ => Ok(()),
        }
    }

    /// Handles one packet from the guest.
    pub fn on_guest_packet(
        &mut self,
        hdr: &PacketHeader,
        payload: &[u8],
    ) -> Result<(), MuxerError> {
        if hdr.src_cid != self.guest_cid || hdr.dst_cid != HOST_CID || hdr.type_ != TYPE_STREAM {
            debug!(
                "vsock: guest packet {}:{} -> {}:{} type {} is not for us",
                hdr.src_cid, hdr.src_port, hdr.dst_cid, hdr.dst_port, hdr.type_
            );
            if hdr.op != OP_RST && hdr.src_cid == self.guest_cid {
                self.push_rst(self.reply_rst(hdr));
            }
            return Ok(());
        }
        let key = ConnKey {
            local_port: hdr.dst_port,
            peer_port: hdr.src_port,
        };
        if let Some(m) = self.conns.get_mut(&key) {
            m.conn.on_packet(hdr, payload);
            if let Some(violation) = m.conn.take_violation() {
                log_limited(&mut self.warnings.protocol, Level::Warn, || violation);
            }
            return self.refresh(key);
        }
        match hdr.op {
            OP_REQUEST => self.connect_for_guest(hdr, key),
            OP_RST => Ok(()),
            _ => {
                self.push_rst(self.reply_rst(hdr));
                Ok(())
            }
        }
    }

    fn reply_rst(&self, hdr: &PacketHeader) -> PacketHeader {
        let mut rst = hdr.reply(OP_RST);
        rst.src_cid = HOST_CID;
        rst.dst_cid = self.guest_cid;
        rst
    }

    fn connect_for_guest(&mut self, hdr: &PacketHeader, key: ConnKey) -> Result<(), MuxerError> {
        let cap = self.limits.connections;
        if self.conns.len() >= cap {
            log_limited(&mut self.warnings.dropped, Level::Warn, || {
                format!(
                    "vsock: {cap} connections are open; refusing guest port {} \
                     -> host port {}",
                    hdr.src_port, hdr.dst_port
                )
            });
            self.push_rst(self.reply_rst(hdr));
            return Ok(());
        }
        match self.listener.connect_host_port(hdr.dst_port) {
            Ok(stream) => {
                log_limited(&mut self.warnings.connected, Level::Info, || {
                    format!(
                        "vsock: guest port {} connected to host port {}",
                        hdr.src_port, hdr.dst_port
                    )
                });
                let conn = VsockConnection::new_peer(self.guest_cid, hdr, stream);
                self.epoll_ctl(ControlOperation::Add, conn.as_raw_fd(), EventSet::empty())?;
                self.insert(key, conn, Interest::default());
                self.refresh(key)
            }
            Err(e) => {
                log_limited(&mut self.warnings.refused, Level::Info, || {
                    format!("vsock: refusing a guest connection: {e}")
                });
                self.push_rst(self.reply_rst(hdr));
                Ok(())
            }
        }
    }

    /// Drains the tx queue. Returns whether the guest should be notified.
    pub fn process_tx<M: GuestMemory>(
        &mut self,
        queue: &mut Queue,
        mem: &M,
    ) -> Result<bool, MuxerError> {
        let qerr = |source| MuxerError::Queue {
            queue: "tx",
            source,
        };
        let mut used = false;
        loop {
            queue.disable_notification(mem).map_err(qerr)?;
            while let Some(chain) = pop_chain(queue, mem).map_err(qerr)? {
                let head = chain.head_index();
                let parsed = chain
                    .reader(mem)
                    .map_err(packet::PacketError::from)
                    .and_then(|mut r| packet::read_tx_packet(&mut r, &mut self.payload));
                queue.add_used(mem, head, 0).map_err(qerr)?;
                used = true;
                match parsed {
                    Ok(hdr) => {
                        let payload = std::mem::take(&mut self.payload);
                        let r = self.on_guest_packet(&hdr, &payload);
                        self.payload = payload;
                        r?;
                    }
                    Err(e) => log_limited(&mut self.warnings.malformed, Level::Warn, || {
                        format!("vsock: dropping a malformed tx packet: {e}")
                    }),
                }
            }
            if !queue.enable_notification(mem).map_err(qerr)? {
                break;
            }
        }
        if used {
            return queue.needs_notification(mem).map_err(qerr);
        }
        Ok(false)
    }

    /// Fills rx buffers with waiting packets. Returns whether the guest should be notified.
    pub fn process_rx<M: GuestMemory>(
        &mut self,
        queue: &mut Queue,
        mem: &M,
    ) -> Result<bool, MuxerError> {
        let qerr = |source| MuxerError::Queue {
            queue: "rx",
            source,
        };
        let mut used = false;
        while self.has_pending_rx() {
            let Some(chain) = pop_chain(queue, mem).map_err(qerr)? else {
                // Out of buffers: ask for a kick when the guest adds some.
                if queue.enable_notification(mem).map_err(qerr)? {
                    continue;
                }
                break;
            };
            let head = chain.head_index();
            let mut writer = match chain.writer(mem) {
                Ok(w) => w,
                Err(e) => {
                    log_limited(&mut self.warnings.malformed, Level::Warn, || {
                        format!("vsock: dropping a malformed rx buffer: {e}")
                    });
                    queue.add_used(mem, head, 0).map_err(qerr)?;
                    used = true;
                    continue;
                }
            };
            match self.next_rx_packet(&mut writer)? {
                Some(len) => {
                    queue.add_used(mem, head, len).map_err(qerr)?;
                    used = true;
                }
                None => {
                    // A full pass produced nothing (reads would block, credit ran out).
                    queue.go_to_previous_position();
                    break;
                }
            }
        }
        if used {
            return queue.needs_notification(mem).map_err(qerr);
        }
        Ok(false)
    }

    /// Writes the next waiting packet into `writer`; `None` if nothing turned out to wait.
    fn next_rx_packet<B: vm_memory::bitmap::BitmapSlice>(
        &mut self,
        writer: &mut virtio_queue::Writer<'_, B>,
    ) -> Result<Option<u32>, MuxerError> {
        if let Some(rst) = self.rst_queue.pop_front() {
            let r = packet::write_rx_packet(writer, &rst, &[]).map(Some);
            return Ok(log_rx_error(&mut self.warnings.malformed, r));
        }
        // Each queued connection gets one try: one that re-queues itself waits its turn.
        for _ in 0..self.rx_queue.len() {
            let Some(key) = self.rx_queue.pop_front() else {
                break;
            };
            let Some(m) = self.conns.get_mut(&key) else {
                continue;
            };
            m.in_rx_queue = false;
            let r = m.conn.fill_rx(writer, &mut self.scratch);
            self.refresh(key)?;
            if let Some(len) = log_rx_error(&mut self.warnings.malformed, r) {
                return Ok(Some(len));
            }
        }
        Ok(None)
    }

    /// Forgets every connection the guest knows of, after a device reset. Host connections
    /// still waiting for the guest to hear of them are kept and announced when it is back.
    pub fn reset(&mut self) {
        self.rst_queue.clear();
        self.rx_queue.clear();
        let gone: Vec<ConnKey> = self
            .conns
            .iter()
            .filter(|(_, m)| !m.conn.is_unannounced())
            .map(|(k, _)| *k)
            .collect();
        for key in gone {
            if let Some(m) = self.conns.remove(&key) {
                let fd = m.conn.as_raw_fd();
                if m.registered.is_some() {
                    let _ = self
                        .epoll
                        .ctl(ControlOperation::Delete, fd, EpollEvent::default());
                }
                self.fd_keys.remove(&fd);
            }
        }
        for (key, m) in self.conns.iter_mut() {
            m.in_rx_queue = true;
            self.rx_queue.push_back(*key);
        }
    }
}

impl AsRawFd for VsockMuxer {
    /// The epoll fd that becomes readable when host-side work is ready.
    fn as_raw_fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }
}

/// The next chain the driver made available. Unlike `pop_descriptor_chain`, which reports
/// an avail index more than a queue's size ahead as "no chain" while `enable_notification`
/// keeps reporting more, this makes such an index (a broken or hostile driver's) an error:
/// the notification loops of `process_tx` and `process_rx` would spin on it forever.
fn pop_chain<'m, M: GuestMemory>(
    queue: &mut Queue,
    mem: &'m M,
) -> Result<Option<DescriptorChain<&'m M>>, virtio_queue::Error> {
    Ok(queue.iter(mem)?.next())
}

fn log_rx_error(
    limiter: &mut LogLimiter,
    r: Result<Option<u32>, packet::PacketError>,
) -> Option<u32> {
    match r {
        Ok(len) => len,
        Err(e) => {
            log_limited(limiter, Level::Warn, || {
                format!("vsock: could not write a packet to the guest: {e}")
            });
            Some(0)
        }
    }
}

#[cfg(test)]
mod tests;
