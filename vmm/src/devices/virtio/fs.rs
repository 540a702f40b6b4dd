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
