//! The virtio-blk device: opens the disk (with advice when it cannot), answers the config
//! space, and carries out each request of the queue.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use virtio_queue::desc::split::Descriptor;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestMemoryBackend, GuestMemoryMmap, ReadVolatile, WriteVolatile};

use super::disk::DiskCursor;
use super::request::{for_each_piece, Completion, Failure, Header, Request, HEADER_LEN};
use super::*;
use crate::config::BlockConfig;
use crate::devices::virtio::mmio::{VirtioDevice, VIRTIO_F_VERSION_1};
use crate::logger::log;

/// Data segments per request: the header and the status take a descriptor each.
const SEG_MAX: u32 = QUEUE_SIZE as u32 - 2;
/// capacity, size_max, seg_max, geometry, blk_size.
const CONFIG_LEN: usize = 24;

/// Errors while opening a disk.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    /// The image could not be opened.
    #[error("Cannot open the disk image {path} {mode}: {source}. {advice}")]
    Open {
        /// The image.
        path: PathBuf,
        /// "for reading" or "for reading and writing".
        mode: &'static str,
        /// What to do about it.
        advice: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The path names something that is not a disk.
    #[error("The disk image {path} is a {kind}: point it at a regular file or a block device.")]
    NotADisk {
        /// The path.
        path: PathBuf,
        /// What it is ("directory", ...).
        kind: &'static str,
    },
    /// The size could not be read.
    #[error("Cannot read the size of the disk image {path}: {source}")]
    Size {
        /// The image.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The serial does not fit in a GET_ID reply.
    #[error("The serial of the disk {path} is {len} bytes long; at most {ID_BYTES} fit.")]
    Serial {
        /// The image.
        path: PathBuf,
        /// Its length.
        len: usize,
    },
}

/// A virtio-blk disk on a host file or block device.
pub struct BlockDevice {
    file: File,
    path: PathBuf,
    /// In sectors.
    capacity: u64,
    read_only: bool,
    id: [u8; ID_BYTES],
    config: [u8; CONFIG_LEN],
    sizes: [u16; 1],
    request: Request,
    host_error_logged: bool,
}

fn open_advice(e: &io::Error, read_only: bool) -> &'static str {
    match e.kind() {
        io::ErrorKind::NotFound => {
            "Create the image first, or fix its path in the VM configuration."
        }
        io::ErrorKind::PermissionDenied if read_only => "Let kata-vmm read it.",
        io::ErrorKind::PermissionDenied => {
            "Let kata-vmm read and write it, or make the disk \"read_only\"."
        }
        _ if e.raw_os_error() == Some(libc::EROFS) => {
            "Its file system is read-only: make the disk \"read_only\"."
        }
        _ => "Check the path and the file's permissions.",
    }
}

impl BlockDevice {
    /// Opens the disk `config` describes: read-write, or read-only if it says so.
    pub fn new(config: &BlockConfig) -> Result<Self, BlockError> {
        let path = &config.path;
        let read_only = config.read_only;
        let mut id = [0u8; ID_BYTES];
        if let Some(serial) = &config.serial {
            let bytes = serial.as_bytes();
            id.get_mut(..bytes.len())
                .ok_or(BlockError::Serial {
                    path: path.clone(),
                    len: bytes.len(),
                })?
                .copy_from_slice(bytes);
        }
        let open_error = |source: io::Error| BlockError::Open {
            path: path.clone(),
            mode: if read_only {
                "for reading"
            } else {
                "for reading and writing"
            },
            advice: open_advice(&source, read_only),
            source,
        };
        // Looked at before opening: opening a FIFO would block.
        let kind = std::fs::metadata(path).map_err(open_error)?.file_type();
        let not_a_disk = if kind.is_dir() {
            Some("directory")
        } else if kind.is_fifo() {
            Some("FIFO")
        } else if kind.is_socket() {
            Some("socket")
        } else if kind.is_char_device() {
            Some("character device")
        } else {
            None
        };
        if let Some(kind) = not_a_disk {
            return Err(BlockError::NotADisk {
                path: path.clone(),
                kind,
            });
        }
        let mut file = OpenOptions::new()
            .read(true)
            .write(!read_only)
            .open(path)
            .map_err(open_error)?;
        // Seeking to the end works for block devices too, whose metadata says 0 bytes.
        let size = file
            .seek(SeekFrom::End(0))
            .map_err(|source| BlockError::Size {
                path: path.clone(),
                source,
            })?;
        Ok(Self::with_file(
            file,
            path,
            size / SECTOR_SIZE,
            read_only,
            id,
        ))
    }

    fn with_file(
        file: File,
        path: &Path,
        capacity: u64,
        read_only: bool,
        id: [u8; ID_BYTES],
    ) -> Self {
        let mut config = [0u8; CONFIG_LEN];
        config[0..8].copy_from_slice(&capacity.to_le_bytes());
        // size_max (8..12) stays 0: VIRTIO_BLK_F_SIZE_MAX is not offered. Geometry
        // (16..20) stays 0: VIRTIO_BLK_F_GEOMETRY is not offered.
        config[12..16].copy_from_slice(&SEG_MAX.to_le_bytes());
        config[20..24].copy_from_slice(&(SECTOR_SIZE as u32).to_le_bytes());
        BlockDevice {
            file,
            path: path.to_path_buf(),
            capacity,
            read_only,
            id,
            config,
            sizes: [QUEUE_SIZE],
            request: Request::default(),
            host_error_logged: false,
        }
    }

    /// The disk size in sectors (a tail shorter than a sector is not addressable).
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The byte offset of `len` bytes at `sector`, if they lie within the disk.
    fn byte_range(&self, sector: u64, len: u64) -> Option<u64> {
        let start = sector.checked_mul(SECTOR_SIZE)?;
        let end = start.checked_add(len)?;
        (end <= self.capacity * SECTOR_SIZE).then_some(start)
    }

    /// Reads `len` bytes at `sector` into the device-writable stream.
    fn read_sectors(&self, mem: &GuestMemoryMmap, sector: u64, len: u64) -> Completion {
        let Some(offset) = self.byte_range(sector, len) else {
            return Completion::new(VIRTIO_BLK_S_IOERR);
        };
        let mut disk = DiskCursor {
            file: &self.file,
            offset,
        };
        let result = for_each_piece(&self.request.writable, 0, len, |addr, n| {
            for slice in mem.get_slices(addr, n) {
                let mut slice = slice.map_err(|_| Failure::Refused)?;
                disk.read_exact_volatile(&mut slice)?;
            }
            Ok(())
        });
        let written = disk.offset - offset;
        Completion::from_result(result, written)
    }

    /// Writes the `len` bytes after the header in the device-readable stream at `sector`.
    fn write_sectors(&self, mem: &GuestMemoryMmap, sector: u64, len: u64) -> Completion {
        if self.read_only {
            return Completion::new(VIRTIO_BLK_S_IOERR);
        }
        let Some(offset) = self.byte_range(sector, len) else {
            return Completion::new(VIRTIO_BLK_S_IOERR);
        };
        let mut disk = DiskCursor {
            file: &self.file,
            offset,
        };
        let result = for_each_piece(&self.request.readable, HEADER_LEN, len, |addr, n| {
            for slice in mem.get_slices(addr, n) {
                let slice = slice.map_err(|_| Failure::Refused)?;
                disk.write_all_volatile(&slice)?;
            }
            Ok(())
        });
        Completion::from_result(result, 0)
    }

    /// Writes the serial (NUL-padded, cut to `room`) into the device-writable stream.
    fn get_id(&self, mem: &GuestMemoryMmap, room: u64) -> Completion {
        let len = room.min(ID_BYTES as u64) as usize;
        let id = &self.id[..len];
        let mut done = 0;
        let result = for_each_piece(&self.request.writable, 0, len as u64, |addr, n| {
            let piece = id.get(done..done + n).ok_or(Failure::Refused)?;
            mem.write_slice(piece, addr).map_err(|_| Failure::Refused)?;
            done += n;
            Ok(())
        });
        Completion::from_result(result, done as u64)
    }

    /// Carries out the collected request.
    fn execute(&self, mem: &GuestMemoryMmap) -> Completion {
        let request = &self.request;
        let Some(Header { kind, sector }) = request.header(mem) else {
            return Completion::new(VIRTIO_BLK_S_IOERR);
        };
        // Room before the status byte; `execute` runs only when there is a status byte.
        let room = request.writable_len.saturating_sub(1);
        match kind {
            VIRTIO_BLK_T_IN => self.read_sectors(mem, sector, room),
            VIRTIO_BLK_T_OUT => self.write_sectors(mem, sector, request.readable_len - HEADER_LEN),
            VIRTIO_BLK_T_FLUSH => {
                Completion::from_result(self.file.sync_data().map_err(Failure::Host), 0)
            }
            VIRTIO_BLK_T_GET_ID => self.get_id(mem, room),
            _ => Completion::new(VIRTIO_BLK_S_UNSUPP),
        }
    }

    /// Handles one chain; returns the used length (data written plus the status byte, or 0
    /// when the chain has no room for a status byte).
    pub(super) fn handle(
        &mut self,
        chain: impl Iterator<Item = Descriptor>,
        mem: &GuestMemoryMmap,
    ) -> u32 {
        self.request.collect(chain);
        let Some(status_addr) = self.request.status else {
            return 0;
        };
        let done = self.execute(mem);
        if let Some(e) = done.host_error {
            if !self.host_error_logged {
                self.host_error_logged = true;
                log(
                    "warn",
                    &format!(
                        "virtio-blk disk {}: {e}; the guest sees an I/O error (later errors \
                         of this disk are not logged)",
                        self.path.display()
                    ),
                );
            }
        }
        if mem.write_obj(done.status, status_addr).is_err() {
            return 0;
        }
        // A chain holds at most 4 GiB, so this fits but for the very last byte.
        u32::try_from(done.written + 1).unwrap_or(u32::MAX)
    }
}

impl VirtioDevice for BlockDevice {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.sizes
    }

    fn device_features(&self) -> u64 {
        let features =
            VIRTIO_F_VERSION_1 | VIRTIO_BLK_F_SEG_MAX | VIRTIO_BLK_F_BLK_SIZE | VIRTIO_BLK_F_FLUSH;
        if self.read_only {
            features | VIRTIO_BLK_F_RO
        } else {
            features
        }
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = offset
                .checked_add(i as u64)
                .and_then(|at| usize::try_from(at).ok())
                .and_then(|at| self.config.get(at))
                .copied()
                .unwrap_or(0);
        }
    }

    fn process_queue(&mut self, index: usize, queues: &mut [Queue], mem: &GuestMemoryMmap) -> bool {
        let Some(queue) = queues.get_mut(index) else {
            return false;
        };
        let mut used = false;
        while let Some(chain) = queue.pop_descriptor_chain(mem) {
            let head = chain.head_index();
            let len = self.handle(chain, mem);
            // A broken used ring leaves nothing to report to; the guest will see a stall.
            if queue.add_used(mem, head, len).is_err() {
                break;
            }
            used = true;
        }
        used
    }
}
