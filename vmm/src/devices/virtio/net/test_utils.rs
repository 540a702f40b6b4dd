//! The host's side of a tap, for tests only (the net unit tests, and the boot tests
//! through the `test-utils` feature): whether taps can be made here, unique tap names, a
//! quiet link-up, and an AF_PACKET socket that sends and receives frames of a local
//! experimental EtherType on the interface. Helpers panic on failure, as tests do.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use vmm_contract::test_skip::skipped;

use super::tap::TUN_DEVICE;

/// Whether this process can create taps (root with a working tun driver); if not, the
/// test is reported as skipped.
pub fn taps_available() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    (root && std::path::Path::new(TUN_DEVICE).exists())
        || skipped(&format!("needs root and {TUN_DEVICE} to create taps"))
}

/// A tap name no other test (or test process) uses: `kvt<pid>n<counter>`.
pub fn unique_name() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "kvt{}n{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A local experimental EtherType: nothing else on the tap speaks it.
pub const ETHERTYPE: u16 = 0x88b5;

/// Disables IPv6 on `name` (no router solicitations or MLD reports) and brings it up.
pub fn link_up(name: &str) {
    // Absent when IPv6 is off on the host, which is just as quiet.
    let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6"), "1");
    // SAFETY: socket(2) with constant arguments.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    assert!(raw >= 0, "{}", std::io::Error::last_os_error());
    // SAFETY: `raw` is a new socket that nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ifreq is plain data; all zeroes is valid.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS fills the flags of the ifreq, valid for the call.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) };
    assert_eq!(rc, 0, "{name}: {}", std::io::Error::last_os_error());
    // SAFETY: SIOCGIFFLAGS set the flags member of the union.
    let flags = unsafe { ifr.ifr_ifru.ifru_flags };
    ifr.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads the ifreq, valid for the call.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr) };
    assert_eq!(rc, 0, "{name}: {}", std::io::Error::last_os_error());
}

/// Whether the interface `name` exists.
pub fn interface_exists(name: &str) -> bool {
    std::path::Path::new("/sys/class/net").join(name).exists()
}

/// An AF_PACKET socket on one interface for [`ETHERTYPE`] frames.
pub struct PacketSocket {
    fd: OwnedFd,
}

impl PacketSocket {
    /// Binds to `ifname`; receiving gives up after `timeout`.
    pub fn bind(ifname: &str, timeout: Duration) -> Self {
        let cname = CString::new(ifname).unwrap();
        // SAFETY: `cname` is a NUL-terminated string.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        assert_ne!(ifindex, 0, "no interface {ifname}");
        let proto = ETHERTYPE.to_be();
        // SAFETY: socket(2) with constant arguments.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                i32::from(proto),
            )
        };
        assert!(raw >= 0, "{}", std::io::Error::last_os_error());
        // SAFETY: `raw` is a new socket that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: sockaddr_ll is plain data; all zeroes is valid.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: the address is a sockaddr_ll of the given size, valid for the call.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        let tv = libc::timeval {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_usec: 0,
        };
        // SAFETY: SO_RCVTIMEO reads a timeval of the given size.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            )
        };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        PacketSocket { fd }
    }

    /// Sends one frame out of the interface.
    pub fn send(&self, frame: &[u8]) {
        // SAFETY: the buffer is valid for reads of its length.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        assert_eq!(
            n,
            frame.len() as isize,
            "{}",
            std::io::Error::last_os_error()
        );
    }

    /// Receives one frame that came in on the interface.
    pub fn recv(&self) -> Vec<u8> {
        let mut buf = vec![0u8; 4096];
        // SAFETY: the buffer is valid for writes of its length.
        let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        assert!(n >= 0, "no frame: {}", std::io::Error::last_os_error());
        buf.truncate(n as usize);
        buf
    }
}

/// An Ethernet frame of [`ETHERTYPE`] carrying `payload`.
pub fn frame(dst: [u8; 6], src: [u8; 6], payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&ETHERTYPE.to_be_bytes());
    f.extend_from_slice(payload);
    f
}
