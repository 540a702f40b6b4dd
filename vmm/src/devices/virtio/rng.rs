//! virtio-rng (device id 4): fills every device-writable buffer with bytes from the host's
//! `getrandom(2)`.

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestMemoryMmap};

use super::mmio::{VirtioDevice, VIRTIO_F_VERSION_1};

/// The virtio device id of an entropy source.
pub const VIRTIO_ID_RNG: u32 = 4;
const QUEUE_SIZE: u16 = 256;
/// A request larger than this gets this much: a guest cannot make us allocate more.
const MAX_REQUEST: usize = 64 * 1024;

/// The entropy device.
pub struct RngDevice {
    sizes: [u16; 1],
}

impl Default for RngDevice {
    fn default() -> Self {
        RngDevice {
            sizes: [QUEUE_SIZE],
        }
    }
}

fn fill_random(buf: &mut [u8]) -> bool {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: the pointer and length describe the unfilled tail of `buf`.
        let n = unsafe { libc::getrandom(buf[done..].as_mut_ptr().cast(), buf.len() - done, 0) };
        if n < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return false;
        }
        done += n as usize;
    }
    true
}

impl VirtioDevice for RngDevice {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_RNG
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.sizes
    }

    fn device_features(&self) -> u64 {
        VIRTIO_F_VERSION_1
    }

    fn process_queue(&mut self, index: usize, queues: &mut [Queue], mem: &GuestMemoryMmap) -> bool {
        let Some(queue) = queues.get_mut(index) else {
            return false;
        };
        let mut used = false;
        while let Some(chain) = queue.pop_descriptor_chain(mem) {
            let head = chain.head_index();
            let mut written = 0u32;
            for desc in chain.writable() {
                let len = (desc.len() as usize).min(MAX_REQUEST - written as usize);
                let mut buf = vec![0u8; len];
                if len == 0 || !fill_random(&mut buf) {
                    break;
                }
                if mem.write_slice(&buf, desc.addr()).is_err() {
                    break;
                }
                written += len as u32;
            }
            // A broken used ring leaves nothing to report to; the guest will see a stall.
            if queue.add_used(mem, head, written).is_err() {
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
    use crate::devices::virtio::mmio::tests::{
        handshake, push_buffer, read32, test_mem, write32, USED,
    };
    use crate::devices::virtio::mmio::MmioTransport;
    use vm_memory::GuestAddress;
    use vmm_sys_util::eventfd::EventFd;

    #[test]
    fn fills_writable_buffers() {
        let mem = test_mem();
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let mut t = MmioTransport::new(
            Box::new(RngDevice::default()),
            mem.clone(),
            irq.try_clone().unwrap(),
        )
        .unwrap();
        assert_eq!(read32(&mut t, 0x8), VIRTIO_ID_RNG);
        handshake(&mut t, 16);
        push_buffer(&mem, 0, 0x8000, 64, 2 /* WRITE */);
        write32(&mut t, 0x50, 0);
        assert_eq!(mem.read_obj::<u16>(GuestAddress(USED + 2)).unwrap(), 1);
        assert_eq!(
            mem.read_obj::<u32>(GuestAddress(USED + 8)).unwrap(),
            64,
            "used len"
        );
        let mut out = [0u8; 64];
        mem.read_slice(&mut out, GuestAddress(0x8000)).unwrap();
        assert!(out.iter().any(|b| *b != 0));
        assert_eq!(irq.read().unwrap(), 1);
    }
}
