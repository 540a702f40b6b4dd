//! Taps, made through `/dev/net/tun` in the pod's network namespace.
//!
//! The shim makes each tap persistent, so it outlives the descriptor that made it: the
//! tc redirects go on before the VMM exists, and the VMM attaches to the tap by name
//! (QEMU's `-netdev tap,ifname=…`, kata-vmm's `tap`) from the same namespace.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::AsRawFd;

const TUN_DEVICE: &str = "/dev/net/tun";
const TUNSETIFF: libc::c_ulong =
    nix::request_code_write!(b'T', 202, std::mem::size_of::<libc::c_int>()) as libc::c_ulong;
const TUNSETPERSIST: libc::c_ulong =
    nix::request_code_write!(b'T', 203, std::mem::size_of::<libc::c_int>()) as libc::c_ulong;

/// `struct ifreq` with the flags member of its union (40 bytes on Linux).
#[repr(C)]
struct IfReqFlags {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _rest: [u8; 22],
}

/// Makes the persistent tap `name` in the calling thread's network namespace (a tap of
/// that name that exists already is taken over).
pub fn create_persistent(name: &str) -> io::Result<()> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("tap name {name:?} must be 1 to 15 bytes"),
        ));
    }
    let tun = OpenOptions::new()
        .read(true)
        .write(true)
        .open(TUN_DEVICE)
        .map_err(|e| io::Error::new(e.kind(), format!("open {TUN_DEVICE}: {e}")))?;
    let mut req = IfReqFlags {
        name: [0; libc::IFNAMSIZ],
        flags: (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short,
        _rest: [0; 22],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: TUNSETIFF reads a `struct ifreq`, which `req` lays out (name, flags, and
    // the rest of the union zeroed) and which lives across the call.
    if unsafe { libc::ioctl(tun.as_raw_fd(), TUNSETIFF, &mut req) } < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("create tap {name}: {e}")));
    }
    // SAFETY: TUNSETPERSIST takes an integer argument by value.
    if unsafe { libc::ioctl(tun.as_raw_fd(), TUNSETPERSIST, 1 as libc::c_ulong) } < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("make tap {name} persistent: {e}"),
        ));
    }
    Ok(())
}
