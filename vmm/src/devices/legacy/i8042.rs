//! A minimal i8042 keyboard controller: enough for the guest to find "no keyboard" and to
//! reset the machine by writing 0xfe (pulse the reset line) to the command port 0x64.

use std::sync::Arc;

use crate::devices::bus::BusDevice;
use crate::vstate::exit::ExitEvent;

const DATA_OFFSET: u64 = 0; // port 0x60
const COMMAND_OFFSET: u64 = 4; // port 0x64
const CMD_RESET_CPU: u8 = 0xfe;

/// The controller; a reset request ends the VM with exit code 0.
pub struct I8042Device {
    exit: Arc<ExitEvent>,
}

impl I8042Device {
    /// A controller that reports resets to `exit`.
    pub fn new(exit: Arc<ExitEvent>) -> Self {
        I8042Device { exit }
    }
}

impl BusDevice for I8042Device {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        // Status: output buffer empty, input buffer empty; data: nothing.
        let value = match offset {
            DATA_OFFSET | COMMAND_OFFSET => 0,
            _ => 0xff,
        };
        data.fill(value);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset == COMMAND_OFFSET && data.first() == Some(&CMD_RESET_CPU) {
            self.exit
                .request(0, "the guest reset the machine through the i8042");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_command_ends_the_vm() {
        let exit = Arc::new(ExitEvent::new().unwrap());
        let mut dev = I8042Device::new(exit.clone());
        dev.write(COMMAND_OFFSET, &[0xaa]);
        assert!(exit.reason().is_none());
        let mut status = [0xffu8];
        dev.read(COMMAND_OFFSET, &mut status);
        assert_eq!(status[0], 0);
        dev.write(COMMAND_OFFSET, &[CMD_RESET_CPU]);
        assert_eq!(exit.reason().unwrap().code, 0);
    }
}
