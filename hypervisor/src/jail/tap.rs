//! The VMM's taps: [`open_tap`] gives QEMU a queue descriptor (`-netdev tap,fd=N`) the
//! shim opened; [`own_tap`] gives kata-vmm, which attaches by name, the tap's ownership.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use super::SandboxIds;
use crate::Error;

/// `struct ifreq` with the flags member of its union (40 bytes on Linux).
#[repr(C)]
struct IfReqFlags {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _rest: [u8; 22],
}

const TUNSETIFF: libc::c_ulong =
    nix::request_code_write!(b'T', 202, std::mem::size_of::<libc::c_int>()) as libc::c_ulong;
const TUNSETOWNER: libc::c_ulong =
    nix::request_code_write!(b'T', 204, std::mem::size_of::<libc::c_int>()) as libc::c_ulong;
const TUNSETGROUP: libc::c_ulong =
    nix::request_code_write!(b'T', 206, std::mem::size_of::<libc::c_int>()) as libc::c_ulong;

/// Attaches to the existing tap `name` in the network namespace `netns` and returns the
/// queue's descriptor (what QEMU's `-netdev tap,fd=N` takes), with the flags the shim made
/// the tap with. When `owner` is given, the tap is also given to that uid and gid, so
/// that an unprivileged VMM may attach to it by name.
pub fn open_tap(netns: &Path, name: &str, owner: Option<&SandboxIds>) -> Result<OwnedFd, Error> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(Error::Unsupported(format!(
            "tap name {name:?} must be 1 to 15 bytes"
        )));
    }
    let ns = File::open(netns).map_err(|source| Error::Place {
        what: "the pod's network namespace",
        path: netns.to_path_buf(),
        source,
    })?;
    let mut req = IfReqFlags {
        name: [0; libc::IFNAMSIZ],
        flags: (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short,
        _rest: [0; 22],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    let ids = owner.map(|o| (o.uid, o.gid));
    let name = name.to_string();
    // A thread of its own enters the namespace (setns affects the calling thread only),
    // and ends there.
    std::thread::spawn(move || -> io::Result<OwnedFd> {
        // SAFETY: setns on a namespace descriptor we own, for this thread alone.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let tun = OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/net/tun")?;
        // SAFETY: TUNSETIFF reads and writes one `struct ifreq`, which `req` lays out and
        // which lives across the call.
        if unsafe { libc::ioctl(tun.as_raw_fd(), TUNSETIFF, &mut req) } < 0 {
            return Err(io::Error::last_os_error());
        }
        if let Some((uid, gid)) = ids {
            for (request, id) in [(TUNSETOWNER, uid), (TUNSETGROUP, gid)] {
                // SAFETY: TUNSETOWNER and TUNSETGROUP take the id by value.
                if unsafe { libc::ioctl(tun.as_raw_fd(), request, id as libc::c_ulong) } < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
        }
        Ok(tun.into())
    })
    .join()
    .map_err(|_| Error::Unsupported(format!("opening tap {name} panicked")))?
    .map_err(|e| Error::Unsupported(format!("cannot open tap {name} for the VMM: {e}")))
}

/// Gives the tap `name` in `netns` to the sandbox's uid and gid (kata-vmm attaches to it
/// by name, without CAP_NET_ADMIN).
pub fn own_tap(netns: &Path, name: &str, ids: &SandboxIds) -> Result<(), Error> {
    open_tap(netns, name, Some(ids)).map(drop)
}
