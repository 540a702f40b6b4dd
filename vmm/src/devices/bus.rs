//! Address buses (port I/O and MMIO) that route a vCPU's accesses to device models.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// A device model reachable through a bus.
pub trait BusDevice: Send {
    /// Reads `data.len()` bytes at `offset` from the device's base.
    fn read(&mut self, offset: u64, data: &mut [u8]);
    /// Writes `data` at `offset` from the device's base.
    fn write(&mut self, offset: u64, data: &[u8]);
}

/// Errors while building a bus.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// Two devices claim overlapping ranges.
    #[error("The bus range {base:#x}+{len:#x} overlaps a device already inserted.")]
    Overlap {
        /// Base of the new range.
        base: u64,
        /// Its length.
        len: u64,
    },
    /// An empty range.
    #[error("A bus range at {0:#x} has zero length.")]
    ZeroLength(u64),
}

type SharedDevice = Arc<Mutex<dyn BusDevice>>;

/// A set of non-overlapping address ranges, each owned by one device.
#[derive(Default)]
pub struct Bus {
    devices: BTreeMap<u64, (u64, SharedDevice)>,
}

impl Bus {
    /// An empty bus.
    pub fn new() -> Self {
        Self::default()
    }

    /// Inserts `device` at `[base, base + len)`.
    pub fn insert(&mut self, device: SharedDevice, base: u64, len: u64) -> Result<(), BusError> {
        if len == 0 {
            return Err(BusError::ZeroLength(base));
        }
        let overlaps_previous = self
            .devices
            .range(..=base)
            .next_back()
            .is_some_and(|(b, (l, _))| b + l > base);
        let overlaps_next = self
            .devices
            .range(base..)
            .next()
            .is_some_and(|(b, _)| *b < base + len);
        if overlaps_previous || overlaps_next {
            return Err(BusError::Overlap { base, len });
        }
        self.devices.insert(base, (len, device));
        Ok(())
    }

    fn resolve(&self, addr: u64) -> Option<(u64, &SharedDevice)> {
        let (base, (len, device)) = self.devices.range(..=addr).next_back()?;
        (addr < base + len).then_some((addr - base, device))
    }

    /// Dispatches a read; false (and `data` all ones, as on an empty bus) if nobody is there.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        if let Some((offset, device)) = self.resolve(addr) {
            if let Ok(mut device) = device.lock() {
                device.read(offset, data);
                return true;
            }
        }
        data.fill(0xff);
        false
    }

    /// Dispatches a write; false if nobody is there.
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        if let Some((offset, device)) = self.resolve(addr) {
            if let Ok(mut device) = device.lock() {
                device.write(offset, data);
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Echo(u8);
    impl BusDevice for Echo {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(self.0 + offset as u8);
        }
        fn write(&mut self, _offset: u64, data: &[u8]) {
            self.0 = data[0];
        }
    }

    #[test]
    fn routes_by_range_and_rejects_overlaps() {
        let mut bus = Bus::new();
        bus.insert(Arc::new(Mutex::new(Echo(0x10))), 0x100, 0x10)
            .unwrap();
        assert!(bus.insert(Arc::new(Mutex::new(Echo(0))), 0x10f, 4).is_err());
        assert!(bus
            .insert(Arc::new(Mutex::new(Echo(0))), 0xf0, 0x11)
            .is_err());
        bus.insert(Arc::new(Mutex::new(Echo(0))), 0x110, 4).unwrap();
        let mut b = [0u8; 1];
        assert!(bus.read(0x102, &mut b));
        assert_eq!(b[0], 0x12);
        assert!(bus.write(0x100, &[0x20]));
        bus.read(0x100, &mut b);
        assert_eq!(b[0], 0x20);
        assert!(!bus.read(0x200, &mut b));
        assert_eq!(b[0], 0xff);
    }
}
