//! The host's randomness, mixed into the guest's entropy pool.
//!
//! Every sandbox's `CreateSandboxRequest` carries random bytes from the host; the agent
//! adds them with `RNDADDENTROPY` on `/dev/urandom`, crediting them, before it answers.
//! A guest booted ahead of its pod (the VM pool), or ever restored from a template,
//! then draws randomness no other guest shares before any container runs.

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// Where the bytes go.
pub const RANDOM_DEVICE: &str = "/dev/urandom";
/// The most bytes taken at once (the host sends 64).
pub const MAX_BYTES: usize = 4096;

/// `_IOW('R', 0x03, int[2])`: `struct rand_pool_info { int entropy_count; int buf_size;
/// __u32 buf[]; }`.
const RNDADDENTROPY: libc::c_ulong =
    nix::request_code_write!(b'R', 0x03, 2 * std::mem::size_of::<libc::c_int>()) as libc::c_ulong;

/// Why the host's bytes could not be added.
#[derive(Debug, thiserror::Error)]
pub enum EntropyError {
    /// The request carried more than the agent takes (the host's mistake).
    #[error("{0} bytes of entropy is more than the {MAX_BYTES} the agent takes")]
    TooMany(usize),
    /// The device could not be opened.
    #[error("open {}: {source}", device.display())]
    Open {
        device: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The kernel refused the bytes.
    #[error("add entropy through {} (RNDADDENTROPY): {source}", device.display())]
    Refused {
        device: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Adds `bytes` to the kernel's entropy pool through `device`, crediting 8 bits per
/// byte. Empty: nothing to do.
pub fn add(device: &Path, bytes: &[u8]) -> Result<(), EntropyError> {
    if bytes.is_empty() {
        return Ok(());
    }
    if bytes.len() > MAX_BYTES {
        return Err(EntropyError::TooMany(bytes.len()));
    }
    let info = pool_info(bytes);
    let dev = OpenOptions::new()
        .write(true)
        .open(device)
        .map_err(|source| EntropyError::Open {
            device: device.to_path_buf(),
            source,
        })?;
    // SAFETY: RNDADDENTROPY reads a `struct rand_pool_info` whose header says how many
    // bytes follow; `info` holds the header and exactly that many bytes, 4-aligned, and
    // lives across the call.
    if unsafe { libc::ioctl(dev.as_raw_fd(), RNDADDENTROPY, info.as_ptr()) } < 0 {
        return Err(EntropyError::Refused {
            device: device.to_path_buf(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// `struct rand_pool_info` for `bytes`, as 32-bit words (their alignment): the credit in
/// bits, the length in bytes, then the bytes, zero-padded to a whole word.
fn pool_info(bytes: &[u8]) -> Vec<u32> {
    // At most MAX_BYTES: both counts fit an int.
    let len = bytes.len() as u32;
    let mut info = vec![len * 8, len];
    for chunk in bytes.chunks(4) {
        let mut word = [0u8; 4];
        word[..chunk.len()].copy_from_slice(chunk);
        info.push(u32::from_ne_bytes(word));
    }
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_credits_every_byte_and_the_bytes_follow_in_order() {
        let info = pool_info(&[1, 2, 3, 4, 5]);
        assert_eq!(info[0], 40, "bits credited");
        assert_eq!(info[1], 5, "bytes that follow");
        assert_eq!(info[2], u32::from_ne_bytes([1, 2, 3, 4]));
        assert_eq!(info[3], u32::from_ne_bytes([5, 0, 0, 0]));
        assert_eq!(info.len(), 4);
    }

    #[test]
    fn too_many_bytes_are_refused_and_none_is_a_no_op() {
        let e = add(Path::new("/nonexistent"), &[0; MAX_BYTES + 1]).unwrap_err();
        assert!(matches!(e, EntropyError::TooMany(4097)), "{e}");
        assert!(e.to_string().contains("more than the 4096"), "{e}");
        add(Path::new("/nonexistent"), &[]).expect("nothing to add");
    }

    #[test]
    fn a_device_that_is_not_random_is_an_error_naming_it() {
        let e = add(Path::new("/dev/null"), &[7; 64]).unwrap_err();
        assert!(e.to_string().contains("/dev/null (RNDADDENTROPY)"), "{e}");
    }

    #[test]
    fn the_host_kernel_takes_the_bytes() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "RNDADDENTROPY needs root (CAP_SYS_ADMIN)"
        );
        add(Path::new(RANDOM_DEVICE), &[0x5a; 64]).expect("RNDADDENTROPY as root");
    }
}
