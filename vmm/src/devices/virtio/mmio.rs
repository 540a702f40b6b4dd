//! The virtio-mmio transport (virtio 1.x, register layout version 2).
//!
//! The guest finds each device through `virtio_mmio.device=4K@<base>:<irq>` on its command
//! line. Queue notifications arrive through ioeventfds (KVM consumes the write to
//! `QueueNotify` and the [`notifier`](super::notifier) thread calls [`MmioTransport::notify`]);
//! interrupts leave through an irqfd.

use std::os::fd::RawFd;

use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use crate::devices::bus::BusDevice;

/// "virt" in little endian.
pub const MMIO_MAGIC_VALUE: u32 = 0x7472_6976;
/// The register layout of virtio 1.x.
pub const MMIO_VERSION: u32 = 2;
/// Our vendor id ("KATA" would be nice; virtio leaves it free).
pub const VENDOR_ID: u32 = 0x4154_414b;
/// Offset of the `QueueNotify` register, where ioeventfds are registered.
pub const QUEUE_NOTIFY_OFFSET: u64 = 0x50;
/// Feature bit: the device complies with virtio 1.x.
pub const VIRTIO_F_VERSION_1: u64 = 1 << 32;

/// Device status bit.
pub const STATUS_ACKNOWLEDGE: u32 = 1;
/// Device status bit.
pub const STATUS_DRIVER: u32 = 2;
/// Device status bit.
pub const STATUS_DRIVER_OK: u32 = 4;
/// Device status bit.
pub const STATUS_FEATURES_OK: u32 = 8;
/// Device status bit: the device hit an error it cannot recover from without a reset.
pub const STATUS_DEVICE_NEEDS_RESET: u32 = 0x40;
/// Device status bit.
pub const STATUS_FAILED: u32 = 0x80;
const INTERRUPT_USED_RING: u32 = 1;
const CONFIG_SPACE_OFFSET: u64 = 0x100;

/// What a device gets when the driver sets DRIVER_OK.
pub struct Activation<'a> {
    /// Guest memory.
    pub mem: &'a GuestMemoryMmap,
    /// The queues as the driver configured them (check `ready()`).
    pub queues: &'a [Queue],
    /// The per-queue notification eventfds (registered with KVM as ioeventfds).
    pub queue_evts: &'a [EventFd],
    /// The features the driver accepted.
    pub driver_features: u64,
}

/// A virtio device behind the transport.
pub trait VirtioDevice: Send {
    /// The virtio device id (4 = entropy source, 19 = vsock, ...).
    fn device_type(&self) -> u32;
    /// The maximum size of each queue; its length is the number of queues.
    fn queue_max_sizes(&self) -> &[u16];
    /// The features the device offers (including [`VIRTIO_F_VERSION_1`]).
    fn device_features(&self) -> u64;
    /// Reads the device configuration space.
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let _ = offset;
        data.fill(0);
    }
    /// Writes the device configuration space.
    fn write_config(&mut self, offset: u64, data: &[u8]) {
        let _ = (offset, data);
    }
    /// Queue `index` was notified: consumes available buffers (of that queue or, for devices
    /// whose queues work together, of any); true if any were used.
    fn process_queue(&mut self, index: usize, queues: &mut [Queue], mem: &GuestMemoryMmap) -> bool;
    /// A host-side fd (sockets, a muxer's epoll) whose readiness the device thread reports
    /// through [`process_host_event`](Self::process_host_event).
    fn host_event_fd(&self) -> Option<RawFd> {
        None
    }
    /// Whether the device thread watches the host event fd edge-triggered. Such a device
    /// must consume everything pending on each report (or until its queues are full, then
    /// resume from the queue notification that brings new buffers), because readiness that
    /// persists is not reported again: a level-triggered fd that the device cannot drain
    /// would spin the device thread.
    fn host_event_edge_triggered(&self) -> bool {
        false
    }
    /// The host event fd is readable; true if buffers were used.
    fn process_host_event(&mut self, queues: &mut [Queue], mem: &GuestMemoryMmap) -> bool {
        let _ = (queues, mem);
        false
    }
    /// The driver set DRIVER_OK. A device served elsewhere (a vhost-user backend) hands the
    /// queues over here; an error fails the device (DEVICE_NEEDS_RESET).
    fn activate(&mut self, activation: Activation<'_>) -> Result<(), String> {
        let _ = activation;
        Ok(())
    }
    /// True if another process consumes the queue notifications (the eventfds handed over
    /// in [`activate`](Self::activate)): the device thread then leaves them alone.
    fn queues_served_elsewhere(&self) -> bool {
        false
    }
    /// The driver reset the device (status 0).
    fn reset(&mut self) {}
}

/// The transport state of one virtio-mmio device.
pub struct MmioTransport {
    device: Box<dyn VirtioDevice>,
    mem: GuestMemoryMmap,
    queues: Vec<Queue>,
    queue_evts: Vec<EventFd>,
    irq: EventFd,
    queue_select: u32,
    device_features_select: u32,
    driver_features_select: u32,
    driver_features: u64,
    status: u32,
    interrupt_status: u32,
    config_generation: u32,
}

/// Errors while creating a transport.
#[derive(Debug, thiserror::Error)]
pub enum MmioError {
    /// A queue could not be created.
    #[error("Cannot create virtqueue {index} of a virtio device of type {device_type}: {source}")]
    Queue {
        /// Queue index.
        index: usize,
        /// Device type.
        device_type: u32,
        /// The cause.
        #[source]
        source: virtio_queue::Error,
    },
    /// An eventfd could not be created.
    #[error("Cannot create an eventfd for a virtio-mmio device: {0}")]
    EventFd(#[source] std::io::Error),
}

impl MmioTransport {
    /// A transport for `device` over `mem`, signalling interrupts on `irq`.
    pub fn new(
        device: Box<dyn VirtioDevice>,
        mem: GuestMemoryMmap,
        irq: EventFd,
    ) -> Result<Self, MmioError> {
        let device_type = device.device_type();
        let mut queues = Vec::new();
        let mut queue_evts = Vec::new();
        for (index, max) in device.queue_max_sizes().iter().enumerate() {
            queues.push(Queue::new(*max).map_err(|source| MmioError::Queue {
                index,
                device_type,
                source,
            })?);
            queue_evts.push(EventFd::new(libc::EFD_NONBLOCK).map_err(MmioError::EventFd)?);
        }
        Ok(MmioTransport {
            device,
            mem,
            queues,
            queue_evts,
            irq,
            queue_select: 0,
            device_features_select: 0,
            driver_features_select: 0,
            driver_features: 0,
            status: 0,
            interrupt_status: 0,
            config_generation: 0,
        })
    }

    /// The per-queue notification eventfds, to register as ioeventfds at
    /// `base + QUEUE_NOTIFY_OFFSET` with the queue index as datamatch.
    pub fn queue_evts(&self) -> &[EventFd] {
        &self.queue_evts
    }

    /// The device status register.
    pub fn status(&self) -> u32 {
        self.status
    }

    /// The virtio device id.
    pub fn device_type(&self) -> u32 {
        self.device.device_type()
    }

    fn is_activated(&self) -> bool {
        self.status & (STATUS_DRIVER_OK | STATUS_FAILED | STATUS_DEVICE_NEEDS_RESET)
            == STATUS_DRIVER_OK
    }

    /// Handles a notification for queue `index`: processes it and raises the interrupt if
    /// buffers were used.
    pub fn notify(&mut self, index: usize) {
        if !self.is_activated() {
            return;
        }
        if self.device.queues_served_elsewhere() {
            // Only reached when KVM did not take the write itself (tests, or a value no
            // ioeventfd matches): pass the kick on to whoever serves the queue.
            if let Some(evt) = self.queue_evts.get(index) {
                let _ = evt.write(1);
            }
            return;
        }
        if !self.queues.get(index).is_some_and(|q| q.ready()) {
            return;
        }
        if self
            .device
            .process_queue(index, &mut self.queues, &self.mem)
        {
            self.signal_used();
        }
    }

    /// Handles readiness of the device's host event fd.
    pub fn host_event(&mut self) {
        if !self.is_activated() {
            return;
        }
        if self.device.process_host_event(&mut self.queues, &self.mem) {
            self.signal_used();
        }
    }

    /// True if another process consumes this device's queue notifications.
    pub fn queues_served_elsewhere(&self) -> bool {
        self.device.queues_served_elsewhere()
    }

    /// The device's host event fd, if it has one.
    pub fn host_event_fd(&self) -> Option<RawFd> {
        self.device.host_event_fd()
    }

    /// Whether the device wants its host event fd watched edge-triggered.
    pub fn host_event_edge_triggered(&self) -> bool {
        self.device.host_event_edge_triggered()
    }

    fn signal_used(&mut self) {
        self.interrupt_status |= INTERRUPT_USED_RING;
        // A failed irqfd write leaves the guest to poll; nothing better to do here.
        let _ = self.irq.write(1);
    }

    fn selected_queue(&mut self) -> Option<&mut Queue> {
        self.queues.get_mut(self.queue_select as usize)
    }

    fn reset(&mut self) {
        self.device.reset();
        for queue in &mut self.queues {
            queue.reset();
        }
        self.queue_select = 0;
        self.device_features_select = 0;
        self.driver_features_select = 0;
        self.driver_features = 0;
        self.status = 0;
        self.interrupt_status = 0;
    }

    fn set_status(&mut self, value: u32) {
        if value == 0 {
            self.reset();
            return;
        }
        let new_bits = value & !self.status;
        if new_bits & STATUS_FEATURES_OK != 0 {
            // A virtio 1.x transport requires VERSION_1, and the driver may not accept
            // features the device did not offer.
            let offered = self.device.device_features();
            let ok = self.driver_features & VIRTIO_F_VERSION_1 != 0
                && self.driver_features & !offered == 0;
            if !ok {
                self.status = value & !STATUS_FEATURES_OK;
                return;
            }
        }
        if new_bits & STATUS_DRIVER_OK != 0 {
            let valid = self
                .queues
                .iter()
                .all(|q| !q.ready() || q.is_valid(&self.mem));
            if self.status & STATUS_FEATURES_OK == 0 || !valid {
                self.status = value | STATUS_FAILED;
                return;
            }
            let activation = Activation {
                mem: &self.mem,
                queues: &self.queues,
                queue_evts: &self.queue_evts,
                driver_features: self.driver_features,
            };
            if let Err(e) = self.device.activate(activation) {
                crate::logger::log(
                    "error",
                    &format!(
                        "cannot activate virtio device type {}: {e}",
                        self.device.device_type()
                    ),
                );
                self.status = value | STATUS_DEVICE_NEEDS_RESET;
                return;
            }
        }
        self.status = value;
    }

    fn read_register(&self, offset: u64) -> u32 {
        let queue = self.queues.get(self.queue_select as usize);
        match offset {
            0x00 => MMIO_MAGIC_VALUE,
            0x04 => MMIO_VERSION,
            0x08 => self.device.device_type(),
            0x0c => VENDOR_ID,
            0x10 => match self.device_features_select {
                0 => self.device.device_features() as u32,
                1 => (self.device.device_features() >> 32) as u32,
                _ => 0,
            },
            0x34 => queue.map_or(0, |q| u32::from(q.max_size())),
            0x44 => queue.map_or(0, |q| u32::from(q.ready())),
            0x60 => self.interrupt_status,
            0x70 => self.status,
            0xfc => self.config_generation,
            _ => 0,
        }
    }

    fn write_register(&mut self, offset: u64, value: u32) {
        // Queue layout may only change before the driver says DRIVER_OK.
        let queue_writable = self.status & STATUS_DRIVER_OK == 0;
        match offset {
            0x14 => self.device_features_select = value,
            0x20 => {
                let shift = match self.driver_features_select {
                    0 => 0,
                    1 => 32,
                    _ => return,
                };
                self.driver_features &= !(0xffff_ffffu64 << shift);
                self.driver_features |= u64::from(value) << shift;
            }
            0x24 => self.driver_features_select = value,
            0x30 => self.queue_select = value,
            0x38 if queue_writable => {
                if let Some(q) = self.selected_queue() {
                    q.set_size(value as u16);
                }
            }
            0x44 if queue_writable => {
                if let Some(q) = self.selected_queue() {
                    q.set_ready(value == 1);
                }
            }
            0x50 => self.notify(value as usize),
            0x64 => self.interrupt_status &= !value,
            0x70 => self.set_status(value),
            0x80 | 0x84 | 0x90 | 0x94 | 0xa0 | 0xa4 if queue_writable => {
                let Some(q) = self.selected_queue() else {
                    return;
                };
                match offset {
                    0x80 => q.set_desc_table_address(Some(value), None),
                    0x84 => q.set_desc_table_address(None, Some(value)),
                    0x90 => q.set_avail_ring_address(Some(value), None),
                    0x94 => q.set_avail_ring_address(None, Some(value)),
                    0xa0 => q.set_used_ring_address(Some(value), None),
                    _ => q.set_used_ring_address(None, Some(value)),
                }
            }
            _ => {}
        }
    }
}

impl BusDevice for MmioTransport {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset >= CONFIG_SPACE_OFFSET {
            self.device.read_config(offset - CONFIG_SPACE_OFFSET, data);
        } else if data.len() == 4 {
            data.copy_from_slice(&self.read_register(offset).to_le_bytes());
        } else {
            data.fill(0);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset >= CONFIG_SPACE_OFFSET {
            self.device.write_config(offset - CONFIG_SPACE_OFFSET, data);
            self.config_generation = self.config_generation.wrapping_add(1);
        } else if let Ok(bytes) = <[u8; 4]>::try_from(data) {
            self.write_register(offset, u32::from_le_bytes(bytes));
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestAddress};

    /// A device that marks every chain used with length 1.
    pub(crate) struct Counter {
        pub sizes: [u16; 1],
    }

    impl VirtioDevice for Counter {
        fn device_type(&self) -> u32 {
            42
        }
        fn queue_max_sizes(&self) -> &[u16] {
            &self.sizes
        }
        fn device_features(&self) -> u64 {
            VIRTIO_F_VERSION_1
        }
        fn read_config(&self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8 + 0x10);
        }
        fn process_queue(&mut self, i: usize, queues: &mut [Queue], mem: &GuestMemoryMmap) -> bool {
            let queue = &mut queues[i];
            let mut used = false;
            while let Some(chain) = queue.pop_descriptor_chain(mem) {
                queue.add_used(mem, chain.head_index(), 1).unwrap();
                used = true;
            }
            used
        }
    }

    pub(crate) fn read32(t: &mut MmioTransport, offset: u64) -> u32 {
        let mut b = [0u8; 4];
        t.read(offset, &mut b);
        u32::from_le_bytes(b)
    }

    pub(crate) fn write32(t: &mut MmioTransport, offset: u64, v: u32) {
        t.write(offset, &v.to_le_bytes());
    }

    pub(crate) const DESC: u64 = 0x1000;
    pub(crate) const AVAIL: u64 = 0x2000;
    pub(crate) const USED: u64 = 0x3000;

    /// Drives the driver side of the handshake and sets up queue 0 with `size` entries.
    pub(crate) fn handshake(t: &mut MmioTransport, size: u32) {
        write32(t, 0x70, STATUS_ACKNOWLEDGE);
        write32(t, 0x70, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
        write32(t, 0x24, 1);
        write32(t, 0x20, 1); // VERSION_1
        write32(
            t,
            0x70,
            STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK,
        );
        assert_ne!(read32(t, 0x70) & STATUS_FEATURES_OK, 0);
        write32(t, 0x30, 0);
        write32(t, 0x38, size);
        write32(t, 0x80, DESC as u32);
        write32(t, 0x90, AVAIL as u32);
        write32(t, 0xa0, USED as u32);
        write32(t, 0x44, 1);
        write32(
            t,
            0x70,
            STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK | STATUS_DRIVER_OK,
        );
    }

    /// Puts one descriptor (addr, len, flags) in the ring as avail entry `slot`.
    pub(crate) fn push_buffer(mem: &GuestMemoryMmap, slot: u16, addr: u64, len: u32, flags: u16) {
        let d = DESC + u64::from(slot) * 16;
        mem.write_obj(addr, GuestAddress(d)).unwrap();
        mem.write_obj(len, GuestAddress(d + 8)).unwrap();
        mem.write_obj(flags, GuestAddress(d + 12)).unwrap();
        mem.write_obj(0u16, GuestAddress(d + 14)).unwrap();
        mem.write_obj(slot, GuestAddress(AVAIL + 4 + u64::from(slot) * 2))
            .unwrap();
        mem.write_obj(slot + 1, GuestAddress(AVAIL + 2)).unwrap();
    }

    /// Descriptor flag: another descriptor follows.
    pub(crate) const NEXT: u16 = 1;
    /// Descriptor flag: the device writes this buffer.
    pub(crate) const WRITE: u16 = 2;

    /// Puts a chain of descriptors (addr, len, flags), linked in order from descriptor
    /// `first` on, in the ring as avail entry `slot`; NEXT flags are added.
    pub(crate) fn push_chain(
        mem: &GuestMemoryMmap,
        slot: u16,
        first: u16,
        descs: &[(u64, u32, u16)],
    ) {
        for (i, (addr, len, flags)) in descs.iter().enumerate() {
            let index = first + i as u16;
            let last = i + 1 == descs.len();
            let d = DESC + u64::from(index) * 16;
            mem.write_obj(*addr, GuestAddress(d)).unwrap();
            mem.write_obj(*len, GuestAddress(d + 8)).unwrap();
            let (flags, next) = if last {
                (*flags, 0)
            } else {
                (*flags | NEXT, index + 1)
            };
            mem.write_obj(flags, GuestAddress(d + 12)).unwrap();
            mem.write_obj(next, GuestAddress(d + 14)).unwrap();
        }
        mem.write_obj(first, GuestAddress(AVAIL + 4 + u64::from(slot) * 2))
            .unwrap();
        mem.write_obj(slot + 1, GuestAddress(AVAIL + 2)).unwrap();
    }

    pub(crate) fn test_mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap()
    }

    #[test]
    fn identification_registers() {
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let mut t = MmioTransport::new(Box::new(Counter { sizes: [16] }), test_mem(), irq).unwrap();
        assert_eq!(read32(&mut t, 0x0), 0x7472_6976);
        assert_eq!(read32(&mut t, 0x4), 2);
        assert_eq!(read32(&mut t, 0x8), 42);
        assert_eq!(read32(&mut t, 0x34), 16);
        write32(&mut t, 0x14, 1);
        assert_eq!(read32(&mut t, 0x10), 1, "VERSION_1 in the high word");
        let mut cfg = [0u8; 2];
        t.read(0x102, &mut cfg);
        assert_eq!(cfg, [0x12, 0x12]);
        write32(&mut t, 0x30, 5);
        assert_eq!(read32(&mut t, 0x34), 0, "no such queue");
    }

    #[test]
    fn features_ok_requires_version_1() {
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let mut t = MmioTransport::new(Box::new(Counter { sizes: [16] }), test_mem(), irq).unwrap();
        write32(&mut t, 0x70, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
        write32(
            &mut t,
            0x70,
            STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK,
        );
        assert_eq!(read32(&mut t, 0x70) & STATUS_FEATURES_OK, 0);
        // Accepting a feature that was not offered is refused too.
        write32(&mut t, 0x24, 0);
        write32(&mut t, 0x20, 1 << 5);
        write32(&mut t, 0x24, 1);
        write32(&mut t, 0x20, 1);
        write32(
            &mut t,
            0x70,
            STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK,
        );
        assert_eq!(read32(&mut t, 0x70) & STATUS_FEATURES_OK, 0);
    }

    #[test]
    fn notify_uses_buffers_and_interrupts_then_reset_clears() {
        let mem = test_mem();
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let mut t = MmioTransport::new(
            Box::new(Counter { sizes: [16] }),
            mem.clone(),
            irq.try_clone().unwrap(),
        )
        .unwrap();
        // Before DRIVER_OK a notification does nothing.
        push_buffer(&mem, 0, 0x8000, 8, 2);
        write32(&mut t, 0x50, 0);
        assert!(irq.read().is_err(), "no interrupt before activation");
        handshake(&mut t, 16);
        assert_eq!(read32(&mut t, 0x70) & STATUS_FAILED, 0);
        assert_eq!(read32(&mut t, 0x44), 1);
        write32(&mut t, 0x50, 0);
        assert_eq!(
            mem.read_obj::<u16>(GuestAddress(USED + 2)).unwrap(),
            1,
            "used idx"
        );
        assert_eq!(read32(&mut t, 0x60), 1);
        assert_eq!(irq.read().unwrap(), 1);
        write32(&mut t, 0x64, 1);
        assert_eq!(read32(&mut t, 0x60), 0);
        write32(&mut t, 0x70, 0);
        assert_eq!(read32(&mut t, 0x70), 0);
        assert_eq!(read32(&mut t, 0x44), 0, "queue reset");
    }

    #[test]
    fn driver_ok_with_a_bad_queue_fails_the_device() {
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let mut t = MmioTransport::new(Box::new(Counter { sizes: [16] }), test_mem(), irq).unwrap();
        write32(&mut t, 0x70, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
        write32(&mut t, 0x24, 1);
        write32(&mut t, 0x20, 1);
        write32(
            &mut t,
            0x70,
            STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK,
        );
        write32(&mut t, 0x38, 16);
        write32(&mut t, 0x80, 0xfff_0000); // outside guest memory
        write32(&mut t, 0x44, 1);
        write32(
            &mut t,
            0x70,
            STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK | STATUS_DRIVER_OK,
        );
        assert_ne!(read32(&mut t, 0x70) & STATUS_FAILED, 0);
    }
}
