//! virtio-blk (device id 2): a disk backed by a host file or block device.
//!
//! Data moves directly between the file (`pread64`/`pwrite64`) and guest memory: however
//! large a request, the VMM buffers none of its data. A request is read as two byte streams,
//! whatever its descriptor layout: the device-readable one starts with the 16-byte header
//! (and holds the data of a write), the device-writable one ends with the status byte (and
//! holds the data of a read before it).
//!
//! Files: [`request`] turns a descriptor chain into those two streams and reads the header;
//! [`disk`] moves bytes between the disk file and guest memory; [`device`] opens the disk
//! and serves the queue (the virtio-mmio transport's `VirtioDevice`).

mod device;
mod disk;
mod request;
#[cfg(test)]
mod tests;

pub use device::{BlockDevice, BlockError};

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

/// Size of the one request queue.
const QUEUE_SIZE: u16 = 256;
