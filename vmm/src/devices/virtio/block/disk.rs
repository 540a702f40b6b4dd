//! The disk file as guest memory sees it: a cursor whose reads and writes go straight
//! between the file (`pread64`/`pwrite64`) and guest memory slices, with no copy in the VMM.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use vm_memory::bitmap::BitmapSlice;
use vm_memory::{ReadVolatile, VolatileMemoryError, VolatileSlice, WriteVolatile};

/// A position in the disk file; reads and writes happen there and move it forward.
pub(super) struct DiskCursor<'a> {
    pub(super) file: &'a File,
    pub(super) offset: u64,
}

impl DiskCursor<'_> {
    fn file_offset(&self) -> Result<libc::off64_t, VolatileMemoryError> {
        libc::off64_t::try_from(self.offset).map_err(|_| {
            VolatileMemoryError::IOError(io::Error::from_raw_os_error(libc::EOVERFLOW))
        })
    }
}

impl ReadVolatile for DiskCursor<'_> {
    fn read_volatile<B: BitmapSlice>(
        &mut self,
        buf: &mut VolatileSlice<B>,
    ) -> Result<usize, VolatileMemoryError> {
        let offset = self.file_offset()?;
        let guard = buf.ptr_guard_mut();
        // SAFETY: the fd stays open while `self.file` is borrowed, and the guard keeps the
        // `buf.len()` bytes at its pointer mapped and valid for writes during the call.
        let n = unsafe {
            libc::pread64(
                self.file.as_raw_fd(),
                guard.as_ptr().cast(),
                buf.len(),
                offset,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            // Part of the buffer may have been written.
            buf.bitmap().mark_dirty(0, buf.len());
            return Err(VolatileMemoryError::IOError(e));
        }
        let n = n as usize;
        buf.bitmap().mark_dirty(0, n);
        self.offset += n as u64;
        Ok(n)
    }
}

impl WriteVolatile for DiskCursor<'_> {
    fn write_volatile<B: BitmapSlice>(
        &mut self,
        buf: &VolatileSlice<B>,
    ) -> Result<usize, VolatileMemoryError> {
        let offset = self.file_offset()?;
        let guard = buf.ptr_guard();
        // SAFETY: the fd stays open while `self.file` is borrowed, and the guard keeps the
        // `buf.len()` bytes at its pointer mapped and valid for reads during the call.
        let n = unsafe {
            libc::pwrite64(
                self.file.as_raw_fd(),
                guard.as_ptr().cast(),
                buf.len(),
                offset,
            )
        };
        if n < 0 {
            return Err(VolatileMemoryError::IOError(io::Error::last_os_error()));
        }
        self.offset += n as u64;
        Ok(n as usize)
    }
}
