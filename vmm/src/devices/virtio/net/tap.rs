//! A host tap interface opened through `/dev/net/tun`, the backend of virtio-net.
//!
//! Each frame read from or written to the tap starts with a 12-byte virtio 1.x net header
//! (`IFF_VNET_HDR` with `TUNSETVNETHDRSZ` 12), the layout of a virtio-net buffer. We enable no
//! offloads, so the kernel hands us complete, checksummed frames no larger than the MTU.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

/// The virtio 1.x net header (`virtio_net_hdr_v1`) that precedes every frame.
pub const VNET_HDR_LEN: usize = 12;

pub(crate) const TUN_DEVICE: &str = "/dev/net/tun";

/// Errors while opening a tap.
#[derive(Debug, thiserror::Error)]
pub enum TapError {
    /// The name cannot be an interface name.
    #[error(
        "The tap name \"{0}\" is invalid: use 1 to 15 bytes without '/', ':', '%', \
         whitespace or NUL, and not \".\" or \"..\"."
    )]
    InvalidName(String),
    /// `/dev/net/tun` could not be opened.
    #[error("Cannot open {TUN_DEVICE} for tap {tap}: {source}. {hint}")]
    OpenTun {
        /// The tap name.
        tap: String,
        /// The cause.
        #[source]
        source: std::io::Error,
        /// What to do about it.
        hint: String,
    },
    /// TUNSETIFF refused to attach to, or create, the tap.
    #[error("Cannot attach to tap {tap}: {source}. {hint}")]
    Attach {
        /// The tap name.
        tap: String,
        /// The cause.
        #[source]
        source: std::io::Error,
        /// What to do about it.
        hint: String,
    },
    /// The tap refused a setting.
    #[error("Cannot set {what} on tap {tap}: {source}")]
    Configure {
        /// The tap name.
        tap: String,
        /// The setting.
        what: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// An open, non-blocking tap queue. The interface disappears when the last fd of a tap we
/// created closes; a tap created beforehand (persistent) stays.
#[derive(Debug)]
pub struct Tap {
    file: File,
    name: String,
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() < libc::IFNAMSIZ
        && name != "."
        && name != ".."
        && !name
            .bytes()
            .any(|b| matches!(b, b'/' | b':' | b'%' | 0) || b.is_ascii_whitespace())
}

fn open_hint(err: &std::io::Error) -> String {
    match err.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ENODEV) | Some(libc::ENXIO) => format!(
            "The tun driver is missing: load it with `modprobe tun` (and create {TUN_DEVICE} \
             with `mknod {TUN_DEVICE} c 10 200` if the node is missing)"
        ),
        Some(libc::EACCES) | Some(libc::EPERM) => format!(
            "This user may not open {TUN_DEVICE}: run as root or make the node accessible \
             (it is usually mode 0666)"
        ),
        _ => "Check that the tun driver works on this host".into(),
    }
}

fn attach_hint(tap: &str, err: &std::io::Error) -> String {
    match err.raw_os_error() {
        Some(libc::EPERM) => format!(
            "Either {tap} does not exist and creating a tap needs CAP_NET_ADMIN, or it belongs \
             to another user: create it for this user with `ip tuntap add dev {tap} mode tap \
             user $(id -u)`, or run as root"
        ),
        Some(libc::EBUSY) => format!(
            "Another process (another VM?) already has {tap} open: give each VM its own tap"
        ),
        Some(libc::EINVAL) => format!(
            "{tap} exists but is not a single-queue tap (a tun, a multi-queue tap, or another \
             kind of interface): pick another name, or recreate it with `ip tuntap add dev \
             {tap} mode tap`"
        ),
        _ => format!("Check that {tap} can be used as a tap in this network namespace"),
    }
}

impl Tap {
    /// Attaches to the tap `name`, creating a non-persistent one if there is none, with
    /// 12-byte virtio net headers and no offloads.
    pub fn open(name: &str) -> Result<Self, TapError> {
        if !valid_name(name) {
            return Err(TapError::InvalidName(name.into()));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(TUN_DEVICE)
            .map_err(|source| TapError::OpenTun {
                tap: name.into(),
                hint: open_hint(&source),
                source,
            })?;
        let fd = file.as_raw_fd();

        // SAFETY: ifreq is plain data (a name array and a union of integers and arrays); all
        // zeroes is a valid value.
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        // The name was checked to be shorter than IFNAMSIZ, so a terminating NUL remains.
        for (dst, src) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
            *dst = src as libc::c_char;
        }
        ifr.ifr_ifru.ifru_flags =
            (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short;
        // SAFETY: TUNSETIFF reads and writes one ifreq, which `ifr` is and which outlives
        // the call; `fd` is our open /dev/net/tun.
        if unsafe { libc::ioctl(fd, libc::TUNSETIFF, &mut ifr) } < 0 {
            let source = std::io::Error::last_os_error();
            return Err(TapError::Attach {
                tap: name.into(),
                hint: attach_hint(name, &source),
                source,
            });
        }

        let configure = |what| TapError::Configure {
            tap: name.into(),
            what,
            source: std::io::Error::last_os_error(),
        };
        let hdr_len = VNET_HDR_LEN as libc::c_int;
        // SAFETY: TUNSETVNETHDRSZ reads one int through the pointer, which is valid for the
        // call.
        if unsafe { libc::ioctl(fd, libc::TUNSETVNETHDRSZ, &hdr_len) } < 0 {
            return Err(configure("the virtio net header size"));
        }
        // SAFETY: TUNSETOFFLOAD takes its flags by value; 0 turns every offload off.
        if unsafe { libc::ioctl(fd, libc::TUNSETOFFLOAD, 0 as libc::c_ulong) } < 0 {
            return Err(configure("the offloads"));
        }
        Ok(Tap {
            file,
            name: name.into(),
        })
    }

    /// The interface name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Reads one frame (header first) into `buf`; `WouldBlock` when none is queued. A frame
    /// longer than `buf` is cut short by the kernel.
    pub fn read(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        (&self.file).read(buf)
    }

    /// Writes one frame (header first).
    pub fn write(&self, frame: &[u8]) -> std::io::Result<usize> {
        (&self.file).write(frame)
    }
}

impl AsRawFd for Tap {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_utils::{interface_exists, taps_available, unique_name};
    use super::*;

    #[test]
    fn names_are_checked_before_the_kernel_sees_them() {
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a:b",
            "tap%d",
            "a b",
            "a-name-of-16-byt",
        ] {
            let err = Tap::open(bad).unwrap_err();
            assert!(matches!(err, TapError::InvalidName(_)), "{bad}: {err}");
            assert!(err.to_string().contains(&format!("\"{bad}\"")), "{err}");
        }
        assert!(valid_name("a-name-of-15-by"));
    }

    #[test]
    fn open_creates_a_tap_that_goes_away_on_close() {
        if !taps_available() {
            return;
        }
        let name = unique_name();
        let tap = Tap::open(&name).unwrap();
        assert_eq!(tap.name(), name);
        assert!(interface_exists(&name));
        // Non-blocking: nothing queued on a down interface.
        let mut buf = [0u8; 64];
        let err = tap.read(&mut buf).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::WouldBlock);
        // SAFETY: F_GETFD on an fd we own.
        let fd_flags = unsafe { libc::fcntl(tap.as_raw_fd(), libc::F_GETFD) };
        assert_ne!(fd_flags & libc::FD_CLOEXEC, 0);
        // A single-queue tap has one user.
        let err = Tap::open(&name).unwrap_err();
        assert!(matches!(err, TapError::Attach { .. }), "{err}");
        assert!(err.to_string().contains(&name), "{err}");
        assert!(err.to_string().contains("already has"), "{err}");
        drop(tap);
        assert!(!interface_exists(&name));
    }

    #[test]
    fn an_interface_that_is_not_a_tap_is_refused_with_advice() {
        if !taps_available() {
            return;
        }
        let err = Tap::open("lo").unwrap_err();
        assert!(matches!(err, TapError::Attach { .. }), "{err}");
        let text = err.to_string();
        assert!(text.contains("tap lo"), "{text}");
        assert!(text.contains("ip tuntap add"), "{text}");
    }
}
