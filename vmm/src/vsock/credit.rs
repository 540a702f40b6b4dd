//! Credit-based flow control of one vsock stream (virtio spec 1.2, 5.10.6.3).
//!
//! Each side announces `buf_alloc` (its receive buffer) and `fwd_cnt` (bytes it has consumed)
//! in every header. A sender may have at most `peer_buf_alloc - (tx_cnt - peer_fwd_cnt)` bytes
//! in flight. All counters wrap at 2^32, as on the wire.

/// Receive buffer we announce to the guest: bytes of guest data we hold for a host stream
/// that is slower than the guest, and so (with the guest's own buffer, see
/// [`Credit::guest_window`]) the window guest output flows in. The agent gives its stdio
/// streams' sockets the same 1 MiB: container stdout through `ctr` ran at 80 MB/s in a
/// 256 KiB window and 95 MB/s in 1 MiB (TCG, one vCPU; 4 MiB gave no more). Memory is
/// spent only while a host reader lags, and given back once it has caught up.
pub const HOST_BUF_ALLOC: u32 = 1024 * 1024;

/// Flow-control counters of one connection, both directions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Credit {
    /// Host-to-guest payload bytes sent so far.
    pub tx_cnt: u32,
    /// The guest's receive buffer, as last announced.
    pub peer_buf_alloc: u32,
    /// Host-to-guest bytes the guest has consumed, as last announced.
    pub peer_fwd_cnt: u32,
    /// Guest-to-host bytes we have forwarded to the host stream.
    pub fwd_cnt: u32,
    /// `fwd_cnt` as the guest last saw it.
    pub last_fwd_cnt_sent: u32,
    /// Guest-to-host bytes received and not yet forwarded (our buffer's fill).
    pub buffered: u32,
}

impl Credit {
    /// Records the credit fields of a packet from the guest.
    pub fn update_from_peer(&mut self, buf_alloc: u32, fwd_cnt: u32) {
        self.peer_buf_alloc = buf_alloc;
        self.peer_fwd_cnt = fwd_cnt;
    }

    /// Bytes the guest can still take: `peer_buf_alloc - (tx_cnt - peer_fwd_cnt)`.
    pub fn peer_free(&self) -> u32 {
        let in_flight = self.tx_cnt.wrapping_sub(self.peer_fwd_cnt);
        self.peer_buf_alloc.saturating_sub(in_flight)
    }

    /// Accounts `n` bytes sent to the guest.
    pub fn sent(&mut self, n: u32) {
        self.tx_cnt = self.tx_cnt.wrapping_add(n);
    }

    /// Whether `n` more guest bytes fit the buffer we announced.
    pub fn can_accept(&self, n: u32) -> bool {
        u64::from(self.buffered) + u64::from(n) <= u64::from(HOST_BUF_ALLOC)
    }

    /// Accounts `n` guest bytes received into our buffer.
    pub fn received(&mut self, n: u32) {
        self.buffered = self.buffered.saturating_add(n);
    }

    /// Accounts `n` buffered guest bytes written to the host stream.
    pub fn forwarded(&mut self, n: u32) {
        self.fwd_cnt = self.fwd_cnt.wrapping_add(n);
        self.buffered = self.buffered.saturating_sub(n);
    }

    /// Stamps our credit fields into an outgoing header and remembers what the guest saw.
    pub fn stamp(&mut self) -> (u32, u32) {
        self.last_fwd_cnt_sent = self.fwd_cnt;
        (HOST_BUF_ALLOC, self.fwd_cnt)
    }

    /// How much guest data may be in flight towards us. Linux guests (since the fix
    /// "vsock/virtio: cap TX credit to local buffer size", in 6.1.y stable too) send at
    /// most `min(our buf_alloc, their own buf_alloc)` ahead of the `fwd_cnt` they last
    /// heard, and stamp their own `buf_alloc` (the socket's `SO_VM_SOCKETS_BUFFER_SIZE`)
    /// in every header. Older guests use ours alone; the smaller value suits both.
    pub fn guest_window(&self) -> u32 {
        match self.peer_buf_alloc {
            0 => HOST_BUF_ALLOC,
            peer => peer.min(HOST_BUF_ALLOC),
        }
    }

    /// Whether the guest's view of our free space is stale enough to warrant a
    /// `CREDIT_UPDATE` of its own: half of its window was freed since it last heard. A
    /// threshold above the window would leave a guest waiting for credit forever (it does
    /// not ask for it); one far below it would cost an interrupt per packet.
    pub fn needs_update(&self) -> bool {
        let unannounced = self.fwd_cnt.wrapping_sub(self.last_fwd_cnt_sent);
        unannounced > 0 && unannounced >= self.guest_window() / 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_free_follows_the_spec_formula() {
        let mut c = Credit::default();
        assert_eq!(
            c.peer_free(),
            0,
            "no credit before the guest announces a buffer"
        );
        c.update_from_peer(4096, 0);
        assert_eq!(c.peer_free(), 4096);
        c.sent(1000);
        assert_eq!(c.peer_free(), 3096);
        c.update_from_peer(4096, 1000);
        assert_eq!(c.peer_free(), 4096);
        c.sent(4096);
        assert_eq!(c.peer_free(), 0);
    }

    #[test]
    fn counters_wrap_at_32_bits() {
        let mut c = Credit {
            tx_cnt: u32::MAX - 9,
            peer_fwd_cnt: u32::MAX - 9,
            peer_buf_alloc: 100,
            ..Default::default()
        };
        c.sent(30);
        assert_eq!(c.tx_cnt, 20);
        assert_eq!(c.peer_free(), 70);
        c.update_from_peer(100, 10);
        assert_eq!(c.peer_free(), 90);
    }

    #[test]
    fn shrinking_peer_buffer_never_underflows() {
        let mut c = Credit::default();
        c.update_from_peer(1000, 0);
        c.sent(900);
        c.update_from_peer(500, 0);
        assert_eq!(c.peer_free(), 0);
    }

    #[test]
    fn our_buffer_limits_guest_data_and_credit_updates_follow_forwarding() {
        let mut c = Credit::default();
        assert!(c.can_accept(HOST_BUF_ALLOC));
        c.received(HOST_BUF_ALLOC);
        assert!(!c.can_accept(1));
        assert!(!c.needs_update());
        c.forwarded(HOST_BUF_ALLOC / 2);
        assert!(c.can_accept(HOST_BUF_ALLOC / 2));
        assert!(c.needs_update());
        assert_eq!(c.stamp(), (HOST_BUF_ALLOC, HOST_BUF_ALLOC / 2));
        assert!(!c.needs_update());
    }

    /// A guest whose own buffer is smaller than ours sends no more than its buffer
    /// ahead: credit updates must come before it runs dry, or it waits forever.
    #[test]
    fn updates_follow_the_guests_smaller_window() {
        let mut c = Credit::default();
        let small = 64 * 1024;
        c.update_from_peer(small, 0);
        assert_eq!(c.guest_window(), small);
        c.received(small);
        c.forwarded(small / 2 - 1);
        assert!(!c.needs_update());
        c.forwarded(1);
        assert!(c.needs_update(), "half the guest's window is free again");
        c.stamp();
        assert!(!c.needs_update());
        // A guest larger than us is held to our buffer.
        c.update_from_peer(u32::MAX, 0);
        assert_eq!(c.guest_window(), HOST_BUF_ALLOC);
        // Nothing freed, nothing to say, whatever the window.
        c.update_from_peer(1, 0);
        assert!(!c.needs_update());
    }
}
