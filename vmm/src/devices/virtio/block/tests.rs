//! virtio-blk through the virtio-mmio transport, on test guest memory and a temporary
//! disk file: every request type, any descriptor layout, malformed chains, open errors.

use std::path::PathBuf;

use virtio_queue::desc::split::Descriptor;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use super::request::MAX_DESCRIPTORS;
use super::*;
use crate::config::BlockConfig;
use crate::devices::bus::BusDevice;
use crate::devices::virtio::mmio::tests::{
    handshake, push_chain, read32, test_mem, write32, USED, WRITE,
};
use crate::devices::virtio::mmio::MmioTransport;

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
    let (status, used) = disk.submit(&[(HDR, 16, 0), (NOT_RAM, 512, WRITE), (STATUS, 1, WRITE)]);
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
