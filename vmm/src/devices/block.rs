//! virtio-blk (device id 2): a disk backed by a host file or block device.
//!
//! Data moves directly between the file (`pread64`/`pwrite64`) and guest memory: however
//! large a request, the VMM buffers none of its data. A request is read as two byte streams,
//! whatever its descriptor layout: the device-readable one starts with the 16-byte header
//! (and holds the data of a write), the device-writable one ends with the status byte (and
//! holds the data of a read before it).

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use virtio_queue::desc::split::Descriptor;
use virtio_queue::{Queue, QueueT};
use vm_memory::bitmap::BitmapSlice;
use vm_memory::{
    Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, ReadVolatile, VolatileMemoryError,
    VolatileSlice, WriteVolatile,
};

use super::mmio::{VirtioDevice, VIRTIO_F_VERSION_1};
use crate::config::BlockConfig;
use crate::logger::log;

/// The virtio device id of a block device.
pub const VIRTIO_ID_BLOCK: u32 = 2;
/// Feature bit: `seg_max` in the config space is valid.
pub const VIRTIO_BLK_F_SEG_MAX: u64 = 1 << 2;
/// Feature bit: the disk is read-only.
pub const VIRTIO_BLK_F_RO: u64 = 1 << 5;
/// Feature bit: `blk_size` in the config space is valid.
pub const VIRTIO_BLK_F_BLK_SIZE: u64 = 1 << 6;
/// Feature bit: the device handles flush requests.
pub const VIRTIO_BLK_F_FLUSH: u64 = 1 << 9;

/// Request type: read sectors into the device-writable buffers.
pub const VIRTIO_BLK_T_IN: u32 = 0;
/// Request type: write sectors from the device-readable buffers.
pub const VIRTIO_BLK_T_OUT: u32 = 1;
/// Request type: make earlier writes durable.
pub const VIRTIO_BLK_T_FLUSH: u32 = 4;
/// Request type: read the disk's serial.
pub const VIRTIO_BLK_T_GET_ID: u32 = 8;

/// Request status: done.
pub const VIRTIO_BLK_S_OK: u8 = 0;
/// Request status: failed (out of range, read-only disk, malformed, or a host I/O error).
pub const VIRTIO_BLK_S_IOERR: u8 = 1;
/// Request status: unknown request type.
pub const VIRTIO_BLK_S_UNSUPP: u8 = 2;

/// The unit of virtio-blk addresses and of the capacity.
pub const SECTOR_SIZE: u64 = 512;
/// Length of the serial a GET_ID request returns (NUL-padded).
pub const ID_BYTES: usize = 20;

const QUEUE_SIZE: u16 = 256;
/// Indirect descriptors are not offered, so a chain has at most a queue's worth of
/// descriptors; a longer one (through an indirect table anyway) is refused.
const MAX_DESCRIPTORS: usize = QUEUE_SIZE as usize;
/// Data segments per request: the header and the status take a descriptor each.
const SEG_MAX: u32 = QUEUE_SIZE as u32 - 2;
const HEADER_LEN: u64 = 16;
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

/// One non-empty descriptor.
#[derive(Clone, Copy)]
struct Segment {
    addr: GuestAddress,
    len: u32,
}

/// The descriptors of the request being handled, kept so that one pass over the chain (which
/// the guest could change under us) decides everything.
#[derive(Default)]
struct Request {
    readable: Vec<Segment>,
    writable: Vec<Segment>,
    readable_len: u64,
    writable_len: u64,
    /// The last byte of the last device-writable descriptor.
    status: Option<GuestAddress>,
    /// More than [`MAX_DESCRIPTORS`] descriptors.
    too_long: bool,
}

impl Request {
    fn collect(&mut self, chain: impl Iterator<Item = Descriptor>) {
        self.readable.clear();
        self.writable.clear();
        self.readable_len = 0;
        self.writable_len = 0;
        self.status = None;
        self.too_long = false;
        // virtio-queue ends a chain at the queue size (or an indirect table's size) and at
        // 4 GiB in total, so the lengths cannot overflow and the walk is bounded.
        for (count, desc) in chain.enumerate() {
            if desc.len() == 0 {
                continue;
            }
            self.too_long |= count >= MAX_DESCRIPTORS;
            let segment = Segment {
                addr: desc.addr(),
                len: desc.len(),
            };
            let (list, total) = if desc.is_write_only() {
                self.status = desc
                    .addr()
                    .0
                    .checked_add(u64::from(desc.len()) - 1)
                    .map(GuestAddress);
                (&mut self.writable, &mut self.writable_len)
            } else {
                (&mut self.readable, &mut self.readable_len)
            };
            *total += u64::from(desc.len());
            if !self.too_long {
                list.push(segment);
            }
        }
    }
}

/// Why a request failed.
enum Failure {
    /// The request asks for something it may not have, or names memory that is not RAM.
    Refused,
    /// The host file failed.
    Host(io::Error),
}

impl From<VolatileMemoryError> for Failure {
    fn from(e: VolatileMemoryError) -> Self {
        match e {
            VolatileMemoryError::IOError(e) => Failure::Host(e),
            _ => Failure::Refused,
        }
    }
}

/// How a request ended: its status, the bytes it put in guest memory before the status byte,
/// and a host error worth reporting.
struct Completion {
    status: u8,
    written: u64,
    host_error: Option<io::Error>,
}

impl Completion {
    fn new(status: u8) -> Self {
        Completion {
            status,
            written: 0,
            host_error: None,
        }
    }

    fn from_result(result: Result<(), Failure>, written: u64) -> Self {
        let (status, host_error) = match result {
            Ok(()) => (VIRTIO_BLK_S_OK, None),
            Err(Failure::Refused) => (VIRTIO_BLK_S_IOERR, None),
            Err(Failure::Host(e)) => (VIRTIO_BLK_S_IOERR, Some(e)),
        };
        Completion {
            status,
            written,
            host_error,
        }
    }
}

/// Calls `f(address, length)` on the pieces of `segments`, taken as one byte stream, that
/// cover `start..start + len`; stops at the first error.
fn for_each_piece(
    segments: &[Segment],
    start: u64,
    len: u64,
    mut f: impl FnMut(GuestAddress, usize) -> Result<(), Failure>,
) -> Result<(), Failure> {
    let end = start.checked_add(len).ok_or(Failure::Refused)?;
    let mut pos = 0u64;
    for segment in segments {
        if pos >= end {
            break;
        }
        let segment_end = pos + u64::from(segment.len);
        let (from, to) = (start.max(pos), end.min(segment_end));
        if from < to {
            let addr = segment
                .addr
                .0
                .checked_add(from - pos)
                .ok_or(Failure::Refused)?;
            f(GuestAddress(addr), (to - from) as usize)?;
        }
        pos = segment_end;
    }
    if pos < end {
        return Err(Failure::Refused);
    }
    Ok(())
}

/// A position in the disk file; reads and writes happen there and move it forward.
struct DiskCursor<'a> {
    file: &'a File,
    offset: u64,
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
        if request.too_long || request.readable_len < HEADER_LEN {
            return Completion::new(VIRTIO_BLK_S_IOERR);
        }
        let mut header = [0u8; HEADER_LEN as usize];
        let mut done = 0;
        let read = for_each_piece(&request.readable, 0, HEADER_LEN, |addr, n| {
            let piece = header.get_mut(done..done + n).ok_or(Failure::Refused)?;
            mem.read_slice(piece, addr).map_err(|_| Failure::Refused)?;
            done += n;
            Ok(())
        });
        if read.is_err() {
            return Completion::new(VIRTIO_BLK_S_IOERR);
        }
        let [t0, t1, t2, t3, _, _, _, _, s0, s1, s2, s3, s4, s5, s6, s7] = header;
        let kind = u32::from_le_bytes([t0, t1, t2, t3]);
        let sector = u64::from_le_bytes([s0, s1, s2, s3, s4, s5, s6, s7]);
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
    fn handle(&mut self, chain: impl Iterator<Item = Descriptor>, mem: &GuestMemoryMmap) -> u32 {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::bus::BusDevice;
    use crate::devices::mmio::tests::{
        handshake, push_chain, read32, test_mem, write32, USED, WRITE,
    };
    use crate::devices::mmio::MmioTransport;
    use vmm_sys_util::eventfd::EventFd;

    const HDR: u64 = 0x4000;
    const DATA: u64 = 0x5000;
    const STATUS: u64 = 0x9000;
    /// Past the end of the 64 KiB test memory.
    const NOT_RAM: u64 = 0x2_0000;
    const DISK_LEN: usize = 4 * 512;

    /// Bytes that differ from their neighbours and from zero-filled memory.
    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 251 + 1) as u8).collect()
    }

    struct TestDisk {
        _dir: tempfile::TempDir,
        path: PathBuf,
        mem: GuestMemoryMmap,
        t: MmioTransport,
        irq: EventFd,
        slot: u16,
    }

    fn open_disk(contents: &[u8], read_only: bool, serial: Option<&str>) -> TestDisk {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.img");
        std::fs::write(&path, contents).unwrap();
        let device = BlockDevice::new(&BlockConfig {
            path: path.clone(),
            read_only,
            serial: serial.map(String::from),
        })
        .unwrap();
        let mem = test_mem();
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let mut t =
            MmioTransport::new(Box::new(device), mem.clone(), irq.try_clone().unwrap()).unwrap();
        handshake(&mut t, 16);
        TestDisk {
            _dir: dir,
            path,
            mem,
            t,
            irq,
            slot: 0,
        }
    }

    impl TestDisk {
        /// Submits a chain; returns the byte at STATUS (0xff if untouched) and the used length.
        fn submit(&mut self, descs: &[(u64, u32, u16)]) -> (u8, u32) {
            self.mem.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
            push_chain(&self.mem, self.slot, 0, descs);
            write32(&mut self.t, 0x50, 0);
            let entry = USED + 4 + u64::from(self.slot) * 8;
            self.slot += 1;
            assert_eq!(
                self.mem.read_obj::<u16>(GuestAddress(USED + 2)).unwrap(),
                self.slot,
                "used idx"
            );
            assert_eq!(self.irq.read().unwrap(), 1, "interrupt");
            assert_eq!(self.mem.read_obj::<u32>(GuestAddress(entry)).unwrap(), 0);
            let len = self.mem.read_obj(GuestAddress(entry + 4)).unwrap();
            (self.mem.read_obj(GuestAddress(STATUS)).unwrap(), len)
        }

        fn header(&self, at: u64, kind: u32, sector: u64) {
            self.mem.write_obj(kind, GuestAddress(at)).unwrap();
            self.mem.write_obj(0u32, GuestAddress(at + 4)).unwrap();
            self.mem.write_obj(sector, GuestAddress(at + 8)).unwrap();
        }

        /// Header, data (`flags` 0 or WRITE, left out if `len` is 0), status.
        fn request(&mut self, kind: u32, sector: u64, len: u32, flags: u16) -> (u8, u32) {
            self.header(HDR, kind, sector);
            let mut descs = vec![(HDR, 16, 0)];
            if len > 0 {
                descs.push((DATA, len, flags));
            }
            descs.push((STATUS, 1, WRITE));
            self.submit(&descs)
        }

        fn guest(&self, at: u64, len: usize) -> Vec<u8> {
            let mut buf = vec![0u8; len];
            self.mem.read_slice(&mut buf, GuestAddress(at)).unwrap();
            buf
        }

        fn fill(&self, at: u64, bytes: &[u8]) {
            self.mem.write_slice(bytes, GuestAddress(at)).unwrap();
        }

        fn file(&self) -> Vec<u8> {
            std::fs::read(&self.path).unwrap()
        }
    }

    fn config_bytes(t: &mut MmioTransport, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        t.read(0x100 + offset, &mut buf);
        buf
    }

    #[test]
    fn identity_features_and_config_space() {
        // A 100-byte tail is not a sector.
        let mut disk = open_disk(&pattern(DISK_LEN + 100), false, None);
        let t = &mut disk.t;
        assert_eq!(read32(t, 0x8), VIRTIO_ID_BLOCK);
        write32(t, 0x14, 0);
        assert_eq!(read32(t, 0x10), (1 << 2) | (1 << 6) | (1 << 9));
        write32(t, 0x14, 1);
        assert_eq!(read32(t, 0x10), 1, "VERSION_1");
        write32(t, 0x30, 0);
        assert_eq!(read32(t, 0x34), 256, "queue max size");
        assert_eq!(read32(t, 0x100), 4, "capacity, low word");
        assert_eq!(read32(t, 0x104), 0, "capacity, high word");
        assert_eq!(config_bytes(t, 0, 8), 4u64.to_le_bytes());
        assert_eq!(read32(t, 0x108), 0, "size_max");
        assert_eq!(read32(t, 0x10c), 254, "seg_max");
        assert_eq!(read32(t, 0x110), 0, "geometry");
        assert_eq!(read32(t, 0x114), 512, "blk_size");
        // Fields of 1 and 2 bytes, and unaligned reads.
        assert_eq!(config_bytes(t, 0, 1), [4]);
        assert_eq!(config_bytes(t, 20, 2), [0, 2]);
        assert_eq!(config_bytes(t, 21, 1), [2]);
        assert_eq!(config_bytes(t, 11, 3), [0, 254, 0]);
        assert_eq!(config_bytes(t, 22, 4), [0, 0, 0, 0], "past blk_size");
        assert_eq!(config_bytes(t, u64::MAX - 0x100, 2), [0, 0]);
        // Config writes are ignored.
        t.write(0x100, &[9, 9, 9, 9]);
        assert_eq!(read32(t, 0x100), 4);
    }

    #[test]
    fn read_only_disk_offers_ro() {
        let mut disk = open_disk(&pattern(DISK_LEN), true, None);
        write32(&mut disk.t, 0x14, 0);
        assert_eq!(
            read32(&mut disk.t, 0x10),
            (1 << 2) | (1 << 5) | (1 << 6) | (1 << 9)
        );
    }

    #[test]
    fn reads_sectors_into_guest_memory() {
        let image = pattern(DISK_LEN);
        let mut disk = open_disk(&image, false, None);
        let (status, used) = disk.request(VIRTIO_BLK_T_IN, 1, 1024, WRITE);
        assert_eq!((status, used), (VIRTIO_BLK_S_OK, 1025));
        assert_eq!(disk.guest(DATA, 1024), image[512..1536]);
        // The last sector, in two descriptors of odd sizes.
        disk.header(HDR, VIRTIO_BLK_T_IN, 3);
        let (status, used) = disk.submit(&[
            (HDR, 16, 0),
            (DATA, 100, WRITE),
            (DATA + 0x1000, 412, WRITE),
            (STATUS, 1, WRITE),
        ]);
        assert_eq!((status, used), (VIRTIO_BLK_S_OK, 513));
        assert_eq!(disk.guest(DATA, 100), image[1536..1636]);
        assert_eq!(disk.guest(DATA + 0x1000, 412), image[1636..2048]);
    }

    #[test]
    fn writes_sectors_to_the_file() {
        let image = pattern(DISK_LEN);
        let mut disk = open_disk(&image, false, None);
        disk.fill(DATA, &[0xab; 1024]);
        let (status, used) = disk.request(VIRTIO_BLK_T_OUT, 2, 1024, 0);
        assert_eq!((status, used), (VIRTIO_BLK_S_OK, 1));
        let file = disk.file();
        assert_eq!(file.len(), DISK_LEN);
        assert_eq!(file[..1024], image[..1024]);
        assert!(file[1024..].iter().all(|b| *b == 0xab));
    }

    #[test]
    fn any_descriptor_layout_works() {
        let image = pattern(DISK_LEN);
        let mut disk = open_disk(&image, false, None);
        // A write whose header is split across two descriptors, the second of which also
        // holds the start of the data; the rest of the data follows in another descriptor.
        disk.mem
            .write_obj(VIRTIO_BLK_T_OUT, GuestAddress(HDR))
            .unwrap();
        disk.mem.write_obj(0u32, GuestAddress(HDR + 4)).unwrap();
        disk.mem.write_obj(1u64, GuestAddress(DATA)).unwrap();
        disk.fill(DATA + 8, &[0x11; 200]);
        disk.fill(DATA + 0x1000, &[0x22; 312]);
        let (status, used) = disk.submit(&[
            (HDR, 8, 0),
            (DATA, 208, 0),
            (DATA + 0x1000, 312, 0),
            (STATUS, 1, WRITE),
        ]);
        assert_eq!((status, used), (VIRTIO_BLK_S_OK, 1));
        let file = disk.file();
        assert!(file[512..712].iter().all(|b| *b == 0x11));
        assert!(file[712..1024].iter().all(|b| *b == 0x22));
        assert_eq!(file[1024..], image[1024..]);

        // A read whose data and status share one descriptor.
        disk.header(HDR, VIRTIO_BLK_T_IN, 1);
        let (_, used) = disk.submit(&[(HDR, 16, 0), (DATA + 0x2000, 513, WRITE)]);
        assert_eq!(used, 513);
        assert_eq!(disk.guest(DATA + 0x2000, 512), file[512..1024]);
        assert_eq!(disk.guest(DATA + 0x2000 + 512, 1), [VIRTIO_BLK_S_OK]);

        // A write with header and data in one descriptor.
        disk.header(DATA, VIRTIO_BLK_T_OUT, 3);
        disk.fill(DATA + 16, &[0x33; 512]);
        let (status, used) = disk.submit(&[(DATA, 528, 0), (STATUS, 1, WRITE)]);
        assert_eq!((status, used), (VIRTIO_BLK_S_OK, 1));
        assert!(disk.file()[1536..].iter().all(|b| *b == 0x33));
    }

    #[test]
    fn flush_and_get_id() {
        let mut disk = open_disk(&pattern(DISK_LEN), false, Some("disk0"));
        let (status, used) = disk.request(VIRTIO_BLK_T_FLUSH, 0, 0, 0);
        assert_eq!((status, used), (VIRTIO_BLK_S_OK, 1));
        disk.fill(DATA, &[0xff; 32]);
        let (status, used) = disk.request(VIRTIO_BLK_T_GET_ID, 0, 32, WRITE);
        assert_eq!((status, used), (VIRTIO_BLK_S_OK, 21));
        let mut id = b"disk0".to_vec();
        id.resize(ID_BYTES, 0);
        assert_eq!(disk.guest(DATA, 20), id);
        assert_eq!(
            disk.guest(DATA + 20, 12),
            [0xff; 12],
            "nothing past 20 bytes"
        );
        // A buffer shorter than 20 bytes gets what fits.
        let (status, used) = disk.request(VIRTIO_BLK_T_GET_ID, 0, 3, WRITE);
        assert_eq!((status, used), (VIRTIO_BLK_S_OK, 4));

        let mut anonymous = open_disk(&pattern(DISK_LEN), false, None);
        anonymous.fill(DATA, &[0xff; 20]);
        let (status, _) = anonymous.request(VIRTIO_BLK_T_GET_ID, 0, 20, WRITE);
        assert_eq!(status, VIRTIO_BLK_S_OK);
        assert_eq!(anonymous.guest(DATA, 20), [0; 20]);
    }

    #[test]
    fn requests_past_the_end_fail() {
        let image = pattern(DISK_LEN + 100);
        let mut disk = open_disk(&image, false, None);
        disk.fill(DATA, &[0x5a; 1024]);
        for (kind, sector, len, flags) in [
            (VIRTIO_BLK_T_IN, 4, 512, WRITE),
            (VIRTIO_BLK_T_IN, 4, 1, WRITE),
            (VIRTIO_BLK_T_IN, 3, 1024, WRITE),
            (VIRTIO_BLK_T_IN, u64::MAX, 512, WRITE),
            (VIRTIO_BLK_T_IN, u64::MAX / 512, 1024, WRITE),
            (VIRTIO_BLK_T_OUT, 4, 512, 0),
            (VIRTIO_BLK_T_OUT, 3, 1024, 0),
            (VIRTIO_BLK_T_OUT, u64::MAX, 512, 0),
        ] {
            let (status, used) = disk.request(kind, sector, len, flags);
            assert_eq!(
                (status, used),
                (VIRTIO_BLK_S_IOERR, 1),
                "type {kind} sector {sector} len {len}"
            );
        }
        assert_eq!(disk.guest(DATA, 1024), [0x5a; 1024], "nothing read");
        assert_eq!(disk.file(), image, "nothing written, not even the tail");
        // The last whole sector is fine.
        let (status, _) = disk.request(VIRTIO_BLK_T_IN, 3, 512, WRITE);
        assert_eq!(status, VIRTIO_BLK_S_OK);
    }

    #[test]
    fn read_only_disk_refuses_writes() {
        let image = pattern(DISK_LEN);
        let mut disk = open_disk(&image, true, None);
        disk.fill(DATA, &[0xab; 512]);
        let (status, used) = disk.request(VIRTIO_BLK_T_OUT, 0, 512, 0);
        assert_eq!((status, used), (VIRTIO_BLK_S_IOERR, 1));
        assert_eq!(disk.file(), image);
        let (status, _) = disk.request(VIRTIO_BLK_T_IN, 0, 512, WRITE);
        assert_eq!(status, VIRTIO_BLK_S_OK);
        assert_eq!(disk.guest(DATA, 512), image[..512]);
        let (status, _) = disk.request(VIRTIO_BLK_T_FLUSH, 0, 0, 0);
        assert_eq!(status, VIRTIO_BLK_S_OK);
    }

    #[test]
    fn unknown_types_are_unsupported() {
        let mut disk = open_disk(&pattern(DISK_LEN), false, None);
        // DISCARD, WRITE_ZEROES (not offered), and nonsense.
        for kind in [11, 13, 0xdead_beef] {
            let (status, used) = disk.request(kind, 0, 512, 0);
            assert_eq!((status, used), (VIRTIO_BLK_S_UNSUPP, 1), "type {kind}");
        }
    }

    #[test]
    fn malformed_chains_fail_without_harm() {
        let image = pattern(DISK_LEN);
        let mut disk = open_disk(&image, false, None);
        // A header too short.
        disk.header(HDR, VIRTIO_BLK_T_IN, 0);
        let (status, used) = disk.submit(&[(HDR, 8, 0), (DATA, 512, WRITE), (STATUS, 1, WRITE)]);
        assert_eq!((status, used), (VIRTIO_BLK_S_IOERR, 1));
        // No header at all.
        let (status, used) = disk.submit(&[(STATUS, 1, WRITE)]);
        assert_eq!((status, used), (VIRTIO_BLK_S_IOERR, 1));
        // No place for a status byte: used, with length 0.
        let (status, used) = disk.submit(&[(HDR, 16, 0), (DATA, 512, 0)]);
        assert_eq!((status, used), (0xff, 0));
        // A status byte outside guest memory: the same.
        let (_, used) = disk.submit(&[(HDR, 16, 0), (DATA, 512, WRITE), (NOT_RAM, 1, WRITE)]);
        assert_eq!(used, 0);
        // Data outside guest memory, for a read and a write.
        let (status, used) = disk.request(VIRTIO_BLK_T_IN, 0, 512, WRITE);
        assert_eq!((status, used), (VIRTIO_BLK_S_OK, 513), "still working");
        let (status, used) =
            disk.submit(&[(HDR, 16, 0), (NOT_RAM, 512, WRITE), (STATUS, 1, WRITE)]);
        assert_eq!((status, used), (VIRTIO_BLK_S_IOERR, 1));
        disk.header(HDR, VIRTIO_BLK_T_OUT, 0);
        let (status, _) = disk.submit(&[(HDR, 16, 0), (NOT_RAM, 512, 0), (STATUS, 1, WRITE)]);
        assert_eq!(status, VIRTIO_BLK_S_IOERR);
        // Data running off the end of guest memory: what fits is read and counted.
        disk.header(HDR, VIRTIO_BLK_T_IN, 0);
        let (status, used) = disk.submit(&[
            (HDR, 16, 0),
            (0x1_0000 - 256, 512, WRITE),
            (STATUS, 1, WRITE),
        ]);
        assert_eq!((status, used), (VIRTIO_BLK_S_IOERR, 257));
        assert_eq!(disk.guest(0x1_0000 - 256, 256), image[..256]);
        assert_eq!(disk.file(), image);
    }

    #[test]
    fn too_many_descriptors_fail() {
        let image = pattern(DISK_LEN);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.img");
        std::fs::write(&path, &image).unwrap();
        let mut device = BlockDevice::new(&BlockConfig {
            path,
            read_only: false,
            serial: None,
        })
        .unwrap();
        let mem = test_mem();
        mem.write_obj(VIRTIO_BLK_T_IN, GuestAddress(HDR)).unwrap();
        // Straight to `handle`: a queue of 16 cannot hold such a chain.
        let mut descs = vec![Descriptor::new(HDR, 16, 0, 0)];
        descs.extend((0..MAX_DESCRIPTORS).map(|i| Descriptor::new(DATA + i as u64, 1, 2, 0)));
        descs.push(Descriptor::new(STATUS, 1, 2, 0));
        mem.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
        assert_eq!(device.handle(descs.into_iter(), &mem), 1);
        assert_eq!(
            mem.read_obj::<u8>(GuestAddress(STATUS)).unwrap(),
            VIRTIO_BLK_S_IOERR
        );
        assert_eq!(
            mem.read_obj::<u8>(GuestAddress(DATA)).unwrap(),
            0,
            "nothing read"
        );
    }

    #[test]
    fn open_errors_name_the_file_and_say_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.img");
        let config = BlockConfig {
            path: missing.clone(),
            read_only: false,
            serial: None,
        };
        let e = BlockDevice::new(&config).err().unwrap().to_string();
        assert!(e.contains(&missing.display().to_string()), "{e}");
        assert!(e.contains("for reading and writing"), "{e}");
        assert!(e.contains("Create the image"), "{e}");

        let e = BlockDevice::new(&BlockConfig {
            path: dir.path().to_path_buf(),
            ..config.clone()
        })
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("is a directory"), "{e}");

        std::fs::write(&missing, [0u8; 512]).unwrap();
        let e = BlockDevice::new(&BlockConfig {
            serial: Some("s".repeat(21)),
            ..config.clone()
        })
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("21 bytes"), "{e}");
        let device = BlockDevice::new(&config).unwrap();
        assert_eq!(device.capacity(), 1);
    }
}
