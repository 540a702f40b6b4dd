//! virtio-fs (device id 26) through a vhost-user frontend: virtiofsd serves the queues in
//! its own process, reading and writing guest RAM through the memfd we share with it.
//!
//! Our part is the control plane. At build time we connect to virtiofsd's socket, take
//! ownership and read its features. When the driver sets DRIVER_OK we send the memory
//! table, each queue's size and addresses (as our own virtual addresses, which virtiofsd
//! translates through the table), the KVM ioeventfd of each queue as its kick, and an
//! eventfd of ours as its call. Kicks then go from the guest straight to virtiofsd. Calls
//! come back through us: virtio-mmio needs the interrupt status register set before the
//! interrupt line is raised, so the device thread watches the call eventfds (one epoll fd,
//! our host event fd) and the transport raises the interrupt.

use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_queue::{Queue, QueueT};
use vm_memory::{Address, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::mmio::{Activation, VirtioDevice, VIRTIO_F_VERSION_1};
use crate::config::FsConfig;
use crate::logger::log;

/// The virtio device id of a file system device.
pub const VIRTIO_ID_FS: u32 = 26;
/// The high-priority queue and one request queue.
const NUM_QUEUES: usize = 2;
/// Length of the tag field in the configuration space.
const TAG_LEN: usize = 36;
/// virtio ring features a vhost-user backend implements on its own.
const VIRTIO_RING_F_INDIRECT_DESC: u64 = 1 << 28;
const VIRTIO_RING_F_EVENT_IDX: u64 = 1 << 29;
/// What we pass through to the driver, if the backend offers it.
const GUEST_FEATURES: u64 =
    VIRTIO_F_VERSION_1 | VIRTIO_RING_F_INDIRECT_DESC | VIRTIO_RING_F_EVENT_IDX;

/// Errors while connecting to the vhost-user backend.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// The socket could not be reached.
    #[error("cannot connect to the vhost-user socket {path} ({source}); is virtiofsd running with --socket-path {path}?")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// The cause.
        #[source]
        source: vhost::Error,
    },
    /// A vhost-user request failed.
    #[error("the vhost-user backend at {path} failed {step}: {source}")]
    Request {
        /// The socket.
        path: PathBuf,
        /// What we asked for.
        step: &'static str,
        /// The cause.
        #[source]
        source: vhost::Error,
    },
    /// The backend lacks a feature we need.
    #[error("the vhost-user backend at {path} does not offer {what}; use a virtio 1.x virtiofsd")]
    Feature {
        /// The socket.
        path: PathBuf,
        /// The missing feature.
        what: &'static str,
    },
    /// An eventfd or epoll could not be created.
    #[error("cannot create the interrupt eventfds of virtio-fs: {0}")]
    Os(#[source] std::io::Error),
}

/// virtio-fs whose queues a vhost-user daemon serves.
pub struct FsDevice {
    frontend: Frontend,
    socket: PathBuf,
    config: [u8; TAG_LEN + 4],
    sizes: [u16; NUM_QUEUES],
    backend_features: u64,
    protocol_features: bool,
    /// One call eventfd per queue, and an epoll set over them.
    calls: Vec<EventFd>,
    call_epoll: Epoll,
    active: bool,
}

fn request<T>(
    path: &Path,
    step: &'static str,
    result: Result<T, vhost::Error>,
) -> Result<T, FsError> {
    result.map_err(|source| FsError::Request {
        path: path.to_path_buf(),
        step,
        source,
    })
}

impl FsDevice {
    /// Connects to the backend at `config.socket` and negotiates what does not depend on
    /// the driver.
    pub fn new(config: &FsConfig) -> Result<Self, FsError> {
        let path = config.socket.as_path();
        let mut frontend =
            Frontend::connect(path, NUM_QUEUES as u64).map_err(|source| FsError::Connect {
                path: path.to_path_buf(),
                source,
            })?;
        request(path, "SET_OWNER", frontend.set_owner())?;
        let backend_features = request(path, "GET_FEATURES", frontend.get_features())?;
        if backend_features & VIRTIO_F_VERSION_1 == 0 {
            return Err(FsError::Feature {
                path: path.to_path_buf(),
                what: "VIRTIO_F_VERSION_1",
            });
        }
        let protocol_features =
            backend_features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() != 0;
        if protocol_features {
            let offered = request(
                path,
                "GET_PROTOCOL_FEATURES",
                frontend.get_protocol_features(),
            )?;
            let wanted = offered & VhostUserProtocolFeatures::MQ;
            request(
                path,
                "SET_PROTOCOL_FEATURES",
                frontend.set_protocol_features(wanted),
            )?;
            if wanted.contains(VhostUserProtocolFeatures::MQ) {
                let queues = request(path, "GET_QUEUE_NUM", frontend.get_queue_num())?;
                if queues < NUM_QUEUES as u64 {
                    return Err(FsError::Feature {
                        path: path.to_path_buf(),
                        what: "two queues (high priority and requests)",
                    });
                }
            }
        }
        let mut tag = [0u8; TAG_LEN + 4];
        let len = config.tag.len().min(TAG_LEN);
        tag[..len].copy_from_slice(&config.tag.as_bytes()[..len]);
        // num_request_queues
        tag[TAG_LEN..].copy_from_slice(&1u32.to_le_bytes());
        let call_epoll = Epoll::new().map_err(FsError::Os)?;
        let mut calls = Vec::new();
        for index in 0..NUM_QUEUES {
            let call = EventFd::new(libc::EFD_NONBLOCK).map_err(FsError::Os)?;
            call_epoll
                .ctl(
                    ControlOperation::Add,
                    call.as_raw_fd(),
                    EpollEvent::new(EventSet::IN, index as u64),
                )
                .map_err(FsError::Os)?;
            calls.push(call);
        }
        Ok(FsDevice {
            frontend,
            socket: path.to_path_buf(),
            config: tag,
            sizes: [config.queue_size; NUM_QUEUES],
            backend_features,
            protocol_features,
            calls,
            call_epoll,
            active: false,
        })
    }

    fn memory_table(mem: &GuestMemoryMmap) -> Result<Vec<VhostUserMemoryRegionInfo>, String> {
        let mut regions = Vec::new();
        for region in mem.iter() {
            let Some(file) = region.file_offset() else {
                return Err(format!(
                    "guest memory at {:#x} is not backed by a file a vhost-user backend can map",
                    region.start_addr().raw_value()
                ));
            };
            regions.push(VhostUserMemoryRegionInfo {
                guest_phys_addr: region.start_addr().raw_value(),
                memory_size: region.len(),
                userspace_addr: region.as_ptr() as u64,
                mmap_offset: file.start(),
                mmap_handle: file.file().as_raw_fd(),
            });
        }
        Ok(regions)
    }

    fn host_address(mem: &GuestMemoryMmap, addr: u64, what: &str) -> Result<u64, String> {
        mem.get_host_address(GuestAddress(addr))
            .map(|p| p as u64)
            .map_err(|e| format!("the {what} at {addr:#x} is not in guest memory: {e}"))
    }

    fn hand_over(&mut self, a: &Activation<'_>) -> Result<(), String> {
        let fail = |step: &str, e: vhost::Error| format!("{step} failed: {e}");
        let mut features = a.driver_features & self.backend_features;
        if self.protocol_features {
            features |= VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        }
        self.frontend
            .set_features(features)
            .map_err(|e| fail("SET_FEATURES", e))?;
        let table = Self::memory_table(a.mem)?;
        self.frontend
            .set_mem_table(&table)
            .map_err(|e| fail("SET_MEM_TABLE", e))?;
        for (index, queue) in a.queues.iter().enumerate() {
            if !queue.ready() {
                continue;
            }
            let (Some(kick), Some(call)) = (a.queue_evts.get(index), self.calls.get(index)) else {
                return Err(format!("queue {index} has no eventfds"));
            };
            let config = VringConfigData {
                queue_max_size: queue.max_size(),
                queue_size: queue.size(),
                flags: 0,
                desc_table_addr: Self::host_address(a.mem, queue.desc_table(), "descriptor table")?,
                used_ring_addr: Self::host_address(a.mem, queue.used_ring(), "used ring")?,
                avail_ring_addr: Self::host_address(a.mem, queue.avail_ring(), "available ring")?,
                log_addr: None,
            };
            self.frontend
                .set_vring_num(index, queue.size())
                .map_err(|e| fail("SET_VRING_NUM", e))?;
            self.frontend
                .set_vring_addr(index, &config)
                .map_err(|e| fail("SET_VRING_ADDR", e))?;
            self.frontend
                .set_vring_base(index, 0)
                .map_err(|e| fail("SET_VRING_BASE", e))?;
            self.frontend
                .set_vring_call(index, call)
                .map_err(|e| fail("SET_VRING_CALL", e))?;
            self.frontend
                .set_vring_kick(index, kick)
                .map_err(|e| fail("SET_VRING_KICK", e))?;
            if self.protocol_features {
                self.frontend
                    .set_vring_enable(index, true)
                    .map_err(|e| fail("SET_VRING_ENABLE", e))?;
            }
        }
        Ok(())
    }
}

impl VirtioDevice for FsDevice {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_FS
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.sizes
    }

    fn device_features(&self) -> u64 {
        self.backend_features & GUEST_FEATURES
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let start = (offset as usize).min(self.config.len());
        let end = start.saturating_add(data.len()).min(self.config.len());
        data[..end - start].copy_from_slice(&self.config[start..end]);
    }

    fn process_queue(&mut self, _: usize, _: &mut [Queue], _: &GuestMemoryMmap) -> bool {
        // The backend serves the queues; kicks never reach us (see `notify`).
        false
    }

    fn host_event_fd(&self) -> Option<RawFd> {
        Some(self.call_epoll.as_raw_fd())
    }

    fn process_host_event(&mut self, _: &mut [Queue], _: &GuestMemoryMmap) -> bool {
        // Reading resets each counter; several calls become one interrupt.
        let mut called = false;
        for call in &self.calls {
            called |= call.read().is_ok();
        }
        called
    }

    fn activate(&mut self, activation: Activation<'_>) -> Result<(), String> {
        self.hand_over(&activation).map_err(|e| {
            format!(
                "virtio-fs backend {}: {e}; the share is unusable until the guest resets the device",
                self.socket.display()
            )
        })?;
        self.active = true;
        log(
            "info",
            &format!(
                "virtio-fs queues handed to the vhost-user backend {}",
                self.socket.display()
            ),
        );
        Ok(())
    }

    fn queues_served_elsewhere(&self) -> bool {
        true
    }

    fn reset(&mut self) {
        if !self.active {
            return;
        }
        self.active = false;
        // GET_VRING_BASE stops a ring; the backend lets go of it until it is set up again.
        for index in 0..NUM_QUEUES {
            if self.protocol_features {
                let _ = self.frontend.set_vring_enable(index, false);
            }
            if let Err(e) = self.frontend.get_vring_base(index) {
                log(
                    "warn",
                    &format!("virtio-fs reset: stopping queue {index} failed: {e}"),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The frontend against a real virtiofsd: a FUSE session driven through the
    //! virtio-mmio transport on memfd-backed test guest memory.
    use super::*;
    use crate::devices::bus::BusDevice;
    use crate::devices::mmio::tests::{read32, write32};
    use crate::devices::mmio::{
        MmioTransport, STATUS_ACKNOWLEDGE, STATUS_DEVICE_NEEDS_RESET, STATUS_DRIVER,
        STATUS_DRIVER_OK, STATUS_FEATURES_OK,
    };
    use crate::vstate::memory::create_guest_memory;
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};
    use vm_memory::Bytes;

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

    /// virtiofsd on a temp dir, killed by pid when dropped.
    struct Virtiofsd {
        child: Child,
        socket: PathBuf,
        _dir: tempfile::TempDir,
    }

    impl Drop for Virtiofsd {
        fn drop(&mut self) {
            // SAFETY: kill(2) on the pid of our own unreaped child.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
            let _ = self.child.wait();
        }
    }

    fn virtiofsd(files: &[(&str, &str)]) -> Virtiofsd {
        let binary = std::env::var_os("KATA_VIRTIOFSD")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/usr/local/bin/virtiofsd"));
        assert!(
            binary.exists(),
            "{} is missing: run `make setup` (or set KATA_VIRTIOFSD)",
            binary.display()
        );
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        for (name, text) in files {
            std::fs::write(shared.join(name), text).unwrap();
        }
        let socket = dir.path().join("fs.sock");
        let child = Command::new(&binary)
            .arg("--socket-path")
            .arg(&socket)
            .arg("--shared-dir")
            .arg(&shared)
            .args([
                "--sandbox",
                "none",
                "--cache",
                "never",
                "--log-level",
                "error",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while !socket.exists() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no virtiofsd socket"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Virtiofsd {
            child,
            socket,
            _dir: dir,
        }
    }

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
            let t = MmioTransport::new(Box::new(device), mem.clone(), irq.try_clone().unwrap())
                .unwrap();
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
        let daemon = virtiofsd(&[("hello.txt", "hello through virtio-fs\n")]);
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
}
