//! COM1 (0x3f8, IRQ 4): a 16550A from vm-superio whose output goes to a log file and whose
//! interrupt is an eventfd registered with KVM as an irqfd.

use std::io::Write;

use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use crate::devices::bus::BusDevice;

/// An interrupt line driven through an eventfd (an irqfd in KVM).
pub struct EventFdTrigger(EventFd);

impl EventFdTrigger {
    /// Wraps `evt`.
    pub fn new(evt: EventFd) -> Self {
        EventFdTrigger(evt)
    }
}

impl Trigger for EventFdTrigger {
    type E = std::io::Error;

    fn trigger(&self) -> std::io::Result<()> {
        self.0.write(1)
    }
}

/// The serial port as a bus device.
pub struct SerialDevice<W: Write + Send> {
    serial: Serial<EventFdTrigger, vm_superio::serial::NoEvents, W>,
}

impl<W: Write + Send> SerialDevice<W> {
    /// A serial port raising `irq` and writing its output to `out`.
    pub fn new(irq: EventFd, out: W) -> Self {
        SerialDevice {
            serial: Serial::new(EventFdTrigger::new(irq), out),
        }
    }

    /// The output sink.
    pub fn writer(&self) -> &W {
        self.serial.writer()
    }
}

impl<W: Write + Send> BusDevice for SerialDevice<W> {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if data.len() != 1 {
            data.fill(0xff);
            return;
        }
        data[0] = self.serial.read(offset as u8);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if data.len() != 1 {
            return;
        }
        // Output errors (a full disk) must not stop the guest: the byte is dropped.
        let _ = self.serial.write(offset as u8, data[0]);
        let _ = self.serial.writer_mut().flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_written_to_thr_reach_the_sink_and_raise_the_irq() {
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let mut dev = SerialDevice::new(irq.try_clone().unwrap(), Vec::new());
        // Enable the "transmitter holding register empty" interrupt.
        dev.write(1, &[0x02]);
        dev.write(0, b"h");
        dev.write(0, b"i");
        assert_eq!(dev.writer().as_slice(), b"hi");
        assert!(irq.read().unwrap() >= 1);
        let mut lsr = [0u8];
        dev.read(5, &mut lsr);
        assert_ne!(lsr[0] & 0x20, 0, "THR empty");
    }
}
