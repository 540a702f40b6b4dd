//! kata-vmm's virtio-fs frontend against a real virtiofsd, without a VM: a FUSE session
//! driven through the virtio-mmio transport on memfd-backed guest memory, as a guest
//! driver would (the boot test `virtio_fs_guest_reads_a_file_through_virtiofsd` does the
//! same from a guest on KVM).

mod guests;

use std::os::fd::RawFd;
use std::path::Path;

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm::config::FsConfig;
use vmm::devices::bus::BusDevice;
use vmm::devices::virtio::fs::{FsDevice, VIRTIO_ID_FS};
use vmm::devices::virtio::mmio::{
    MmioTransport, STATUS_ACKNOWLEDGE, STATUS_DEVICE_NEEDS_RESET, STATUS_DRIVER, STATUS_DRIVER_OK,
    STATUS_FEATURES_OK,
};
use vmm::vstate::memory::create_guest_memory;
use vmm_sys_util::eventfd::EventFd;

use guests::start_virtiofsd;

fn read32(t: &mut MmioTransport, offset: u64) -> u32 {
    let mut b = [0u8; 4];
    t.read(offset, &mut b);
    u32::from_le_bytes(b)
}

fn write32(t: &mut MmioTransport, offset: u64, v: u32) {
    t.write(offset, &v.to_le_bytes());
}

const FUSE_LOOKUP: u32 = 1;
const FUSE_OPEN: u32 = 14;
const FUSE_READ: u32 = 15;
const FUSE_INIT: u32 = 26;
const QUEUE_SIZE: u16 = 16;
// Request queue (1) layout in guest memory.
const DESC: u64 = 0x10000;
const AVAIL: u64 = 0x11000;
const USED: u64 = 0x12000;
const REQ_BUF: u64 = 0x20000;
const REPLY_BUF: u64 = 0x30000;

struct Driver {
    t: MmioTransport,
    mem: GuestMemoryMmap,
    irq: EventFd,
    host_fd: RawFd,
    next: u16,
    unique: u64,
}

fn set_queue(t: &mut MmioTransport, index: u32, desc: u64, avail: u64, used: u64) {
    write32(t, 0x30, index);
    write32(t, 0x38, u32::from(QUEUE_SIZE));
    write32(t, 0x80, desc as u32);
    write32(t, 0x90, avail as u32);
    write32(t, 0xa0, used as u32);
    write32(t, 0x44, 1);
}

impl Driver {
    fn new(socket: &Path, tag: &str) -> Driver {
        let mem = create_guest_memory(1 << 20).unwrap().memory;
        let device = FsDevice::new(&FsConfig {
            socket: socket.to_path_buf(),
            tag: tag.into(),
            queue_size: QUEUE_SIZE,
        })
        .unwrap();
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let t =
            MmioTransport::new(Box::new(device), mem.clone(), irq.try_clone().unwrap()).unwrap();
        let host_fd = t.host_event_fd().unwrap();
        Driver {
            t,
            mem,
            irq,
            host_fd,
            next: 0,
            unique: 1,
        }
    }

    /// ACKNOWLEDGE → FEATURES_OK (VERSION_1 only) → both queues → DRIVER_OK.
    fn start(&mut self) {
        let t = &mut self.t;
        write32(t, 0x70, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
        write32(t, 0x24, 1);
        write32(t, 0x20, 1);
        write32(
            t,
            0x70,
            STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK,
        );
        set_queue(t, 0, 0x4000, 0x5000, 0x6000);
        set_queue(t, 1, DESC, AVAIL, USED);
        write32(
            t,
            0x70,
            STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK | STATUS_DRIVER_OK,
        );
    }

    /// Sends one FUSE request on the request queue; returns (out header error, body).
    fn call(&mut self, opcode: u32, nodeid: u64, body: &[u8]) -> (i32, Vec<u8>) {
        let mut req = Vec::new();
        let len = 40 + body.len() as u32;
        req.extend_from_slice(&len.to_le_bytes());
        req.extend_from_slice(&opcode.to_le_bytes());
        req.extend_from_slice(&self.unique.to_le_bytes());
        req.extend_from_slice(&nodeid.to_le_bytes());
        req.extend_from_slice(&[0u8; 16]); // uid, gid, pid, extlen, padding
        req.extend_from_slice(body);
        self.mem.write_slice(&req, GuestAddress(REQ_BUF)).unwrap();
        // Two descriptors: the request (readable) → the reply buffer (writable).
        let slot = self.next % QUEUE_SIZE;
        let (d0, d1) = (u64::from(slot) * 2, u64::from(slot) * 2 + 1);
        let desc = |i: u64, addr: u64, len: u32, flags: u16, next: u16| {
            let at = DESC + (i % u64::from(QUEUE_SIZE)) * 16;
            self.mem.write_obj(addr, GuestAddress(at)).unwrap();
            self.mem.write_obj(len, GuestAddress(at + 8)).unwrap();
            self.mem.write_obj(flags, GuestAddress(at + 12)).unwrap();
            self.mem.write_obj(next, GuestAddress(at + 14)).unwrap();
        };
        let d1_index = (d1 % u64::from(QUEUE_SIZE)) as u16;
        desc(d0, REQ_BUF, req.len() as u32, 1 /* NEXT */, d1_index);
        desc(d1, REPLY_BUF, 0x8000, 2 /* WRITE */, 0);
        let head = (d0 % u64::from(QUEUE_SIZE)) as u16;
        self.mem
            .write_obj(head, GuestAddress(AVAIL + 4 + u64::from(slot) * 2))
            .unwrap();
        self.next = self.next.wrapping_add(1);
        self.mem
            .write_obj(self.next, GuestAddress(AVAIL + 2))
            .unwrap();
        write32(&mut self.t, 0x50, 1);
        // Wait for virtiofsd's call, then let the transport raise the interrupt.
        let mut pfd = libc::pollfd {
            fd: self.host_fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, 10_000) };
        assert_eq!(n, 1, "virtiofsd did not answer opcode {opcode}");
        self.t.host_event();
        assert_eq!(self.irq.read().unwrap(), 1, "interrupt raised");
        assert_eq!(
            read32(&mut self.t, 0x60) & 1,
            1,
            "used-ring interrupt status"
        );
        write32(&mut self.t, 0x64, 1);
        let used_idx: u16 = self.mem.read_obj(GuestAddress(USED + 2)).unwrap();
        assert_eq!(used_idx, self.next);
        let elem = USED + 4 + u64::from(slot) * 8;
        assert_eq!(
            self.mem.read_obj::<u32>(GuestAddress(elem)).unwrap(),
            u32::from(head)
        );
        let used_len = self.mem.read_obj::<u32>(GuestAddress(elem + 4)).unwrap() as usize;
        let mut reply = vec![0u8; used_len];
        self.mem
            .read_slice(&mut reply, GuestAddress(REPLY_BUF))
            .unwrap();
        assert!(used_len >= 16, "reply shorter than a FUSE out header");
        let out_len = u32::from_le_bytes(reply[0..4].try_into().unwrap()) as usize;
        assert_eq!(out_len, used_len, "FUSE length = used length");
        let error = i32::from_le_bytes(reply[4..8].try_into().unwrap());
        let unique = u64::from_le_bytes(reply[8..16].try_into().unwrap());
        assert_eq!(unique, self.unique);
        self.unique += 1;
        (error, reply[16..].to_vec())
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

#[test]
fn virtiofsd_serves_a_fuse_session_through_our_frontend() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::write(shared.join("hello.txt"), "hello through virtio-fs\n").unwrap();
    let daemon = start_virtiofsd(dir.path(), &shared);
    let mut d = Driver::new(&daemon.socket, "kataShared");
    assert_eq!(read32(&mut d.t, 0x8), VIRTIO_ID_FS);
    let mut tag = [0u8; 40];
    d.t.read(0x100, &mut tag);
    assert_eq!(&tag[..10], b"kataShared");
    assert!(tag[10..36].iter().all(|b| *b == 0));
    assert_eq!(u32::from_le_bytes(tag[36..40].try_into().unwrap()), 1);
    d.start();
    assert_eq!(read32(&mut d.t, 0x70) & STATUS_DEVICE_NEEDS_RESET, 0);

    // FUSE_INIT 7.31
    let mut init = Vec::new();
    for v in [7u32, 31, 0x20000, 0] {
        init.extend_from_slice(&v.to_le_bytes());
    }
    let (err, out) = d.call(FUSE_INIT, 0, &init);
    assert_eq!(err, 0);
    assert_eq!(
        u32::from_le_bytes(out[0..4].try_into().unwrap()),
        7,
        "major"
    );

    let (err, out) = d.call(FUSE_LOOKUP, 1, b"hello.txt\0");
    assert_eq!(err, 0, "lookup");
    let node = u64_at(&out, 0);
    assert!(node > 1);
    let size = u64_at(&out, 40 + 8); // fuse_attr.size, after ino
    assert_eq!(size, 24);

    let (err, _) = d.call(FUSE_LOOKUP, 1, b"missing\0");
    assert_eq!(err, -libc::ENOENT, "lookup of a missing file");

    let (err, out) = d.call(FUSE_OPEN, node, &[0u8; 8]);
    assert_eq!(err, 0, "open");
    let fh = u64_at(&out, 0);
    let mut read = Vec::new();
    read.extend_from_slice(&fh.to_le_bytes());
    read.extend_from_slice(&0u64.to_le_bytes());
    read.extend_from_slice(&4096u32.to_le_bytes());
    read.extend_from_slice(&[0u8; 20]);
    let (err, out) = d.call(FUSE_READ, node, &read);
    assert_eq!(err, 0, "read");
    assert_eq!(out, b"hello through virtio-fs\n");

    // A reset stops the rings; a new DRIVER_OK hands them over again.
    write32(&mut d.t, 0x70, 0);
    d.next = 0;
    d.mem.write_obj(0u16, GuestAddress(AVAIL + 2)).unwrap();
    d.mem.write_obj(0u16, GuestAddress(USED + 2)).unwrap();
    d.start();
    let (err, out) = d.call(FUSE_INIT, 0, &init);
    assert_eq!(
        (err, u32::from_le_bytes(out[0..4].try_into().unwrap())),
        (0, 7)
    );
}

#[test]
fn a_missing_socket_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nobody.sock");
    let err = FsDevice::new(&FsConfig {
        socket: socket.clone(),
        tag: "t".into(),
        queue_size: 16,
    })
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains(&socket.display().to_string()), "{err}");
    assert!(err.contains("virtiofsd"), "{err}");
}
