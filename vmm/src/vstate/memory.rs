//! Guest RAM, backed by a memfd so that vhost-user daemons (virtiofsd, a vsock backend) can
//! map the same pages from the file descriptor we hand them.

use std::fs::File;
use std::os::fd::FromRawFd;
use std::sync::Arc;

use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap};

use crate::arch::x86_64::arch_memory_regions;

/// Errors while creating guest memory.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// memfd_create failed.
    #[error("Cannot create the guest memory file (memfd_create): {0}")]
    Memfd(#[source] std::io::Error),
    /// The memfd could not be sized.
    #[error("Cannot size the guest memory file to {size} bytes: {source}")]
    Truncate {
        /// The wanted size.
        size: u64,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A region could not be mapped.
    #[error("Cannot map a guest memory region of {size} bytes at {addr:#x}: {source}")]
    Map {
        /// Guest-physical address.
        addr: u64,
        /// Size.
        size: usize,
        /// The cause.
        #[source]
        source: vm_memory::mmap::FromRangesError,
    },
    /// The regions overlap or are not ordered.
    #[error("Cannot assemble the guest memory regions: {0}")]
    Collection(#[source] vm_memory::GuestRegionCollectionError),
}

/// Guest memory and the file that backs it.
pub struct GuestRam {
    /// The mapped guest memory.
    pub memory: GuestMemoryMmap,
    /// The memfd, shared with vhost-user backends.
    pub file: Arc<File>,
}

fn memfd(name: &std::ffi::CStr) -> Result<File, MemoryError> {
    // SAFETY: `name` is a valid NUL-terminated string; the return value is checked.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(MemoryError::Memfd(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just returned by memfd_create and is owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Creates `size` bytes of guest RAM in one memfd, mapped shared, laid out by
/// [`arch_memory_regions`].
pub fn create_guest_memory(size: u64) -> Result<GuestRam, MemoryError> {
    let file = memfd(c"kata-vmm-guest-ram")?;
    file.set_len(size)
        .map_err(|source| MemoryError::Truncate { size, source })?;
    let file = Arc::new(file);
    let mut offset = 0u64;
    let mut regions = Vec::new();
    for (addr, len) in arch_memory_regions(size) {
        let region = GuestRegionMmap::from_range(
            addr,
            len,
            Some(FileOffset::from_arc(file.clone(), offset)),
        )
        .map_err(|source| MemoryError::Map {
            addr: addr.0,
            size: len,
            source,
        })?;
        regions.push(region);
        offset += len as u64;
    }
    let memory = GuestMemoryMmap::from_regions(regions).map_err(MemoryError::Collection)?;
    Ok(GuestRam { memory, file })
}

/// The region list as (guest address, size, host address), for KVM memory slots.
pub fn regions_for_kvm(memory: &GuestMemoryMmap) -> Vec<(GuestAddress, u64, u64)> {
    use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
    memory
        .iter()
        .map(|r| (r.start_addr(), r.len(), r.as_ptr() as u64))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestMemoryBackend};

    #[test]
    fn memfd_backed_memory_is_shared_with_the_file() {
        use std::os::unix::fs::FileExt;
        let ram = create_guest_memory(4 << 20).unwrap();
        ram.memory
            .write_obj(0xdead_beef_u32, GuestAddress(0x1000))
            .unwrap();
        let mut buf = [0u8; 4];
        ram.file.read_exact_at(&mut buf, 0x1000).unwrap();
        assert_eq!(u32::from_le_bytes(buf), 0xdead_beef);
        assert_eq!(ram.memory.num_regions(), 1);
        assert_eq!(regions_for_kvm(&ram.memory)[0].1, 4 << 20);
    }
}
