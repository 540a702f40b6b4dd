//! kata-vmm's virtio-mmio transport and the device models behind it, driven as a guest
//! drives them: any register write or read (feature negotiation, queue layout, status,
//! notifications), any config space access, any bytes in guest memory, descriptor tables
//! and avail rings laid out at the addresses the guest gave. Devices: rng, block (a
//! read-only and a writable disk), vsock, net (on a tap in a private network namespace).
#![no_main]

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::OnceLock;

use arbitrary::Arbitrary;
use kata_fuzz::{guest_addr, guest_memory, scratch_dir, RawDesc};
use libfuzzer_sys::fuzz_target;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm::config::BlockConfig;
use vmm::devices::bus::BusDevice;
use vmm::devices::virtio::block::BlockDevice;
use vmm::devices::virtio::mmio::{
    MmioTransport, VirtioDevice, MMIO_MAGIC_VALUE, STATUS_ACKNOWLEDGE, STATUS_DRIVER,
    STATUS_DRIVER_OK, STATUS_FEATURES_OK,
};
use vmm::devices::virtio::net::tap::Tap;
use vmm::devices::virtio::net::test_utils::link_up;
use vmm::devices::virtio::net::NetDevice;
use vmm::devices::virtio::rng::RngDevice;
use vmm::devices::virtio::vsock::VsockMmioDevice;
use vmm_sys_util::eventfd::EventFd;

#[derive(Arbitrary, Debug)]
enum Device {
    Rng,
    Block {
        read_only: bool,
    },
    Vsock,
    /// On a tap of its own, in a network namespace of the fuzzing thread's own.
    Net,
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// A 4-byte register write at `4 * reg`.
    Write {
        reg: u8,
        value: u32,
    },
    /// A read of any width at `4 * reg`.
    Read {
        reg: u8,
        width: u8,
    },
    /// A config space access.
    ConfigWrite {
        offset: u8,
        data: Vec<u8>,
    },
    ConfigRead {
        offset: u8,
        width: u8,
    },
    /// Bytes in guest memory.
    Mem {
        addr: u32,
        data: Vec<u8>,
    },
    /// The driver lays out queue `index` (its registers, as Linux writes them).
    Queue {
        index: u8,
        size: u16,
        desc: u32,
        avail: u32,
        used: u32,
        ready: bool,
    },
    /// ACKNOWLEDGE, DRIVER, the features, FEATURES_OK, DRIVER_OK, as Linux does.
    Start {
        features: u64,
    },
    /// Descriptor `index` of the queue the driver laid out last for `queue`.
    Desc {
        queue: u8,
        index: u16,
        desc: RawDesc,
    },
    /// Offers `head` on the avail ring and notifies.
    Avail {
        queue: u8,
        head: u16,
        notify: bool,
    },
    /// The device thread reports the host event fd readable.
    HostEvent,
}

/// Where the driver put each queue, so `Desc` and `Avail` land in its rings.
#[derive(Clone, Copy, Default)]
struct Layout {
    size: u16,
    desc: u64,
    avail: u64,
    avail_idx: u16,
}

fn disk() -> PathBuf {
    let path = scratch_dir().join("disk.img");
    if !path.exists() {
        if let Ok(f) = File::create(&path) {
            let _ = f.set_len(64 * 1024);
        }
    }
    path
}

/// The tap of the net device.
const TAP: &str = "kfz0";

/// Moves this thread into a network namespace of its own and makes a persistent tap there,
/// up, once: the frames the guest sends stay out of the host's network, and each input
/// only attaches to the tap (creating one per input would cost more than the input).
fn private_tap() -> bool {
    static DONE: OnceLock<bool> = OnceLock::new();
    *DONE.get_or_init(|| {
        // SAFETY: unshare(2) with a constant flag; it only changes this thread's namespaces.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            return false;
        }
        let Ok(tap) = Tap::open(TAP) else {
            return false;
        };
        // SAFETY: TUNSETPERSIST takes its flag by value on the tap's open fd.
        if unsafe { libc::ioctl(tap.as_raw_fd(), libc::TUNSETPERSIST, 1 as libc::c_ulong) } != 0 {
            return false;
        }
        link_up(TAP);
        true
    })
}

fn net_device() -> Option<NetDevice> {
    if !private_tap() {
        return None;
    }
    let tap = Tap::open(TAP).ok()?;
    Some(NetDevice::new(tap, [0x02, 0, 0, 0, 0, 1]))
}

fn device(kind: &Device) -> Option<Box<dyn VirtioDevice>> {
    Some(match kind {
        Device::Rng => Box::new(RngDevice::default()),
        Device::Block { read_only } => Box::new(
            BlockDevice::new(&BlockConfig {
                path: disk(),
                read_only: *read_only,
                serial: Some("fuzz".into()),
            })
            .ok()?,
        ),
        Device::Net => Box::new(net_device()?),
        Device::Vsock => {
            Box::new(VsockMmioDevice::new(3, &scratch_dir().join("mmio-vsock.sock")).ok()?)
        }
    })
}

fn write_reg(t: &mut MmioTransport, offset: u64, value: u32) {
    t.write(offset, &value.to_le_bytes());
}

fn run(t: &mut MmioTransport, mem: &GuestMemoryMmap, layouts: &mut [Layout; 4], op: &Op) {
    match op {
        Op::Write { reg, value } => write_reg(t, u64::from(*reg) * 4, *value),
        Op::Read { reg, width } => {
            let mut data = vec![0u8; usize::from(*width % 9)];
            t.read(u64::from(*reg) * 4, &mut data);
        }
        Op::ConfigWrite { offset, data } => t.write(0x100 + u64::from(*offset), data),
        Op::ConfigRead { offset, width } => {
            let mut data = vec![0u8; usize::from(*width)];
            t.read(0x100 + u64::from(*offset), &mut data);
        }
        Op::Mem { addr, data } => {
            let _ = mem.write_slice(data, GuestAddress(guest_addr(*addr)));
        }
        Op::Queue {
            index,
            size,
            desc,
            avail,
            used,
            ready,
        } => {
            let index = *index % 4;
            let (desc, avail, used) = (guest_addr(*desc), guest_addr(*avail), guest_addr(*used));
            write_reg(t, 0x30, u32::from(index));
            write_reg(t, 0x38, u32::from(*size));
            for (lo, addr) in [(0x80, desc), (0x90, avail), (0xa0, used)] {
                write_reg(t, lo, addr as u32);
                write_reg(t, lo + 4, (addr >> 32) as u32);
            }
            write_reg(t, 0x44, u32::from(*ready));
            layouts[usize::from(index)] = Layout {
                size: *size,
                desc,
                avail,
                avail_idx: 0,
            };
        }
        Op::Start { features } => {
            write_reg(t, 0x70, STATUS_ACKNOWLEDGE);
            write_reg(t, 0x70, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
            for sel in 0..2u32 {
                write_reg(t, 0x24, sel);
                write_reg(t, 0x20, (features >> (32 * sel)) as u32);
            }
            let s = STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK;
            write_reg(t, 0x70, s);
            write_reg(t, 0x70, s | STATUS_DRIVER_OK);
        }
        Op::Desc { queue, index, desc } => {
            let l = layouts[usize::from(*queue % 4)];
            if l.size == 0 {
                return;
            }
            let (addr, len, flags, next) = desc.resolve(l.size);
            let mut raw = [0u8; 16];
            raw[0..8].copy_from_slice(&addr.to_le_bytes());
            raw[8..12].copy_from_slice(&len.to_le_bytes());
            raw[12..14].copy_from_slice(&flags.to_le_bytes());
            raw[14..16].copy_from_slice(&next.to_le_bytes());
            let at = l.desc.wrapping_add(16 * u64::from(*index % l.size));
            let _ = mem.write_slice(&raw, GuestAddress(at));
        }
        Op::Avail {
            queue,
            head,
            notify,
        } => {
            let q = usize::from(*queue % 4);
            let l = &mut layouts[q];
            if l.size == 0 {
                return;
            }
            let slot = l
                .avail
                .wrapping_add(4 + 2 * u64::from(l.avail_idx % l.size));
            let _ = mem.write_obj(head.to_le(), GuestAddress(slot));
            l.avail_idx = l.avail_idx.wrapping_add(1);
            let _ = mem.write_obj(l.avail_idx.to_le(), GuestAddress(l.avail.wrapping_add(2)));
            if *notify {
                write_reg(t, 0x50, q as u32);
            }
        }
        Op::HostEvent => t.host_event(),
    }
}

fuzz_target!(|input: (Device, Vec<Op>)| {
    let (kind, ops) = input;
    let Some(dev) = device(&kind) else {
        return;
    };
    let Ok(irq) = EventFd::new(libc::EFD_NONBLOCK) else {
        return;
    };
    let mem = guest_memory();
    let Ok(mut t) = MmioTransport::new(dev, mem.clone(), irq) else {
        return;
    };
    let mut layouts = [Layout::default(); 4];
    for op in ops.iter().take(256) {
        run(&mut t, &mem, &mut layouts, op);
        // The identification registers never change, whatever the driver did.
        let mut magic = [0u8; 4];
        t.read(0, &mut magic);
        assert_eq!(u32::from_le_bytes(magic), MMIO_MAGIC_VALUE);
    }
});
