//! Assembles a VM from a [`VmConfig`], in the order the machine needs it: memory and the
//! VM ([`Vmm::build`]'s first step), the legacy devices on the I/O bus, the virtio devices
//! on the MMIO bus (each announced on the kernel command line), the kernel, initrd and boot
//! structures, then the vCPUs. Each step is a function of its own; [`crate::run`] runs
//! what this returns.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use kvm_ioctls::IoEventAddress;
use linux_loader::cmdline::Cmdline;
use linux_loader::loader::elf::{Elf, PvhBootCapability};
use linux_loader::loader::{load_cmdline, KernelLoader};
use vm_memory::{Address, GuestAddress, GuestMemoryMmap, ReadVolatile};
use vmm_sys_util::eventfd::EventFd;

use crate::arch::x86_64::layout::{
    CMDLINE_MAX_SIZE, CMDLINE_START, HIMEM_START, I8042_PORT_BASE, I8042_PORT_SIZE, IRQ_BASE,
    IRQ_MAX, MMIO_DEVICE_SIZE, MMIO_MEM_START, SERIAL_IRQ, SERIAL_PORT_BASE, SERIAL_PORT_SIZE,
};
use crate::arch::x86_64::regs::BootProtocol;
use crate::arch::x86_64::{
    configure_linux_boot, configure_pvh_boot, initrd_load_addr, InitrdConfig,
};
use crate::config::VmConfig;
use crate::devices::bus::Bus;
use crate::devices::legacy::i8042::I8042Device;
use crate::devices::legacy::serial::SerialDevice;
use crate::devices::virtio::block::BlockDevice;
use crate::devices::virtio::fs::FsDevice;
use crate::devices::virtio::mmio::{MmioTransport, VirtioDevice, QUEUE_NOTIFY_OFFSET};
use crate::devices::virtio::net::NetDevice;
use crate::devices::virtio::notifier::QueueNotifier;
use crate::devices::virtio::rng::RngDevice;
use crate::devices::virtio::vsock::VsockMmioDevice;
use crate::error::{os_err, VmmError};
use crate::logger::log;
use crate::vstate::exit::ExitEvent;
use crate::vstate::memory::create_guest_memory;
use crate::vstate::vcpu::Vcpu;
use crate::vstate::vm::Vm;

/// A built VM, ready to run.
pub struct Vmm {
    // Field order is drop order: vCPUs and the VM go before the memory they map.
    pub(crate) vcpus: Vec<Vcpu>,
    pub(crate) vm: Vm,
    pub(crate) memory: GuestMemoryMmap,
    pub(crate) io_bus: Arc<Bus>,
    pub(crate) mmio_bus: Arc<Bus>,
    pub(crate) notifier: QueueNotifier,
    pub(crate) exit: Arc<ExitEvent>,
    pub(crate) seccomp: bool,
    pub(crate) ready_file: Option<PathBuf>,
    /// The final kernel command line, devices included.
    pub cmdline: String,
}

/// Where the guest starts: the protocol and entry point of the loaded kernel.
struct Boot {
    protocol: BootProtocol,
    entry: u64,
    cmdline: String,
}

impl Vmm {
    /// Builds the VM: memory, KVM, devices, kernel, initrd, boot structures, vCPUs.
    pub fn build(config: &VmConfig) -> Result<Self, VmmError> {
        let exit = Arc::new(ExitEvent::new().map_err(os_err("create the exit eventfd"))?);
        let memory = create_guest_memory(config.memory_mib << 20)?.memory;
        let vm = Vm::new()?;
        vm.register_memory(&memory)?;
        let io_bus = attach_legacy_devices(&vm, config, &exit)?;
        let mut mmio_bus = Bus::new();
        let mut notifier = QueueNotifier::new()?;
        let mut cmdline = base_cmdline(config)?;
        attach_virtio_devices(
            &vm,
            &memory,
            &mut mmio_bus,
            &mut notifier,
            &mut cmdline,
            virtio_devices(config)?,
        )?;
        let boot = load_boot(&memory, config, cmdline)?;
        let vcpus = create_vcpus(&vm, &memory, config.vcpus, &boot)?;
        log(
            "info",
            &format!(
                "built the VM: {} vCPU(s), {} MiB, {:?} entry at {:#x}, cmdline \"{}\"",
                config.vcpus, config.memory_mib, boot.protocol, boot.entry, boot.cmdline
            ),
        );
        Ok(Vmm {
            vcpus,
            vm,
            memory,
            io_bus: Arc::new(io_bus),
            mmio_bus: Arc::new(mmio_bus),
            notifier,
            exit,
            seccomp: config.seccomp,
            ready_file: config.ready_file.clone(),
            cmdline: boot.cmdline,
        })
    }
}

/// The I/O bus: the serial console (on its IRQ) and the i8042, whose reset line ends the VM.
fn attach_legacy_devices(
    vm: &Vm,
    config: &VmConfig,
    exit: &Arc<ExitEvent>,
) -> Result<Bus, VmmError> {
    let mut io_bus = Bus::new();
    let serial_irq = EventFd::new(libc::EFD_NONBLOCK).map_err(os_err("create an eventfd"))?;
    vm.fd()
        .register_irqfd(&serial_irq, SERIAL_IRQ)
        .map_err(|source| VmmError::Wire {
            what: "the serial irqfd".into(),
            source,
        })?;
    let serial = SerialDevice::new(serial_irq, serial_output(config)?);
    io_bus.insert(
        Arc::new(Mutex::new(serial)),
        u64::from(SERIAL_PORT_BASE),
        u64::from(SERIAL_PORT_SIZE),
    )?;
    io_bus.insert(
        Arc::new(Mutex::new(I8042Device::new(exit.clone()))),
        u64::from(I8042_PORT_BASE),
        u64::from(I8042_PORT_SIZE),
    )?;
    Ok(io_bus)
}

/// The virtio devices vmm.json asks for, in slot order: rng, vsock, then one virtio-fs per
/// share, one virtio-blk per disk, one virtio-net per tap.
fn virtio_devices(config: &VmConfig) -> Result<Vec<Box<dyn VirtioDevice>>, VmmError> {
    let mut virtio: Vec<Box<dyn VirtioDevice>> = Vec::new();
    if config.rng {
        virtio.push(Box::new(RngDevice::default()));
    }
    if let Some(vsock) = &config.vsock {
        let device = VsockMmioDevice::new(vsock.guest_cid, &vsock.uds_path).map_err(|e| {
            VmmError::Vsock {
                path: vsock.uds_path.clone(),
                reason: e.to_string(),
            }
        })?;
        virtio.push(Box::new(device));
    }
    for fs in &config.fs {
        let device = FsDevice::new(fs).map_err(|e| VmmError::Device {
            what: format!("virtio-fs share \"{}\"", fs.tag),
            reason: e.to_string(),
        })?;
        virtio.push(Box::new(device));
    }
    for disk in &config.block {
        let device = BlockDevice::new(disk).map_err(|e| VmmError::Device {
            what: format!("virtio-blk disk {}", disk.path.display()),
            reason: e.to_string(),
        })?;
        virtio.push(Box::new(device));
    }
    for net in &config.net {
        let device = NetDevice::from_config(net).map_err(|e| VmmError::Device {
            what: format!("virtio-net on tap {}", net.tap),
            reason: e.to_string(),
        })?;
        let mac = device.mac().map(|b| format!("{b:02x}")).join(":");
        log(
            "info",
            &format!("virtio-net on tap {} with guest MAC {mac}", net.tap),
        );
        virtio.push(Box::new(device));
    }
    Ok(virtio)
}

fn cmdline_err(e: impl std::fmt::Display) -> VmmError {
    VmmError::Cmdline(e.to_string())
}

/// The command line vmm.json gives, before the devices announce themselves on it.
fn base_cmdline(config: &VmConfig) -> Result<Cmdline, VmmError> {
    let mut cmdline = Cmdline::new(CMDLINE_MAX_SIZE).map_err(cmdline_err)?;
    if !config.cmdline.trim().is_empty() {
        cmdline
            .insert_str(config.cmdline.trim())
            .map_err(cmdline_err)?;
    }
    Ok(cmdline)
}

/// Puts each device on the MMIO bus at its slot and announces it on the command line.
fn attach_virtio_devices(
    vm: &Vm,
    memory: &GuestMemoryMmap,
    mmio_bus: &mut Bus,
    notifier: &mut QueueNotifier,
    cmdline: &mut Cmdline,
    devices: Vec<Box<dyn VirtioDevice>>,
) -> Result<(), VmmError> {
    for (slot, device) in devices.into_iter().enumerate() {
        let arg = add_virtio_device(vm, memory, mmio_bus, notifier, slot as u32, device)?;
        cmdline.insert_str(&arg).map_err(cmdline_err)?;
    }
    Ok(())
}

/// The kernel and initrd into guest memory, the command line beside them, and the boot
/// structures (zero page or PVH start info) that point the guest at all three.
fn load_boot(
    memory: &GuestMemoryMmap,
    config: &VmConfig,
    cmdline: Cmdline,
) -> Result<Boot, VmmError> {
    let (protocol, entry, kernel_end) = load_kernel(memory, &config.kernel)?;
    let initrd = match &config.initrd {
        Some(path) => Some(load_initrd(memory, path, kernel_end)?),
        None => None,
    };
    load_cmdline(memory, GuestAddress(CMDLINE_START), &cmdline).map_err(cmdline_err)?;
    let cmdline = cmdline
        .as_cstring()
        .map_err(cmdline_err)?
        .into_string()
        .map_err(cmdline_err)?;
    match protocol {
        BootProtocol::Linux64 => configure_linux_boot(
            memory,
            GuestAddress(CMDLINE_START),
            cmdline.len() + 1,
            initrd,
            config.vcpus,
        )?,
        BootProtocol::Pvh => {
            configure_pvh_boot(memory, GuestAddress(CMDLINE_START), initrd, config.vcpus)?
        }
    }
    Ok(Boot {
        protocol,
        entry,
        cmdline,
    })
}

/// One vCPU per vmm.json's `vcpus`, each with registers set for the boot protocol.
fn create_vcpus(
    vm: &Vm,
    memory: &GuestMemoryMmap,
    count: u8,
    boot: &Boot,
) -> Result<Vec<Vcpu>, VmmError> {
    let mut vcpus = Vec::new();
    for id in 0..count {
        let vcpu = Vcpu::new(vm, id)?;
        vcpu.configure(vm, memory, count, boot.protocol, boot.entry)?;
        vcpus.push(vcpu);
    }
    Ok(vcpus)
}

fn open(path: &Path) -> Result<File, VmmError> {
    File::open(path).map_err(|source| VmmError::Open {
        path: path.to_path_buf(),
        source,
    })
}

fn serial_output(config: &VmConfig) -> Result<Box<dyn Write + Send>, VmmError> {
    if let Some(fd) = config.serial_fd {
        // SAFETY: F_GETFD only reads the descriptor table.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            return Err(VmmError::Open {
                path: PathBuf::from(format!("the inherited descriptor {fd} (serial_fd)")),
                source: std::io::Error::last_os_error(),
            });
        }
        // SAFETY: `fd` is open (checked above) and was passed to this process for the
        // serial output alone (vmm.json's `serial_fd`); nothing else here owns it.
        return Ok(Box::new(unsafe {
            <File as std::os::fd::FromRawFd>::from_raw_fd(fd)
        }));
    }
    match config.serial_log.as_deref() {
        Some(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|source| VmmError::Open {
                    path: path.to_path_buf(),
                    source,
                })?;
            Ok(Box::new(file))
        }
        None => Ok(Box::new(std::io::sink())),
    }
}

fn load_kernel(mem: &GuestMemoryMmap, path: &Path) -> Result<(BootProtocol, u64, u64), VmmError> {
    let mut file = open(path)?;
    let result =
        Elf::load(mem, None, &mut file, Some(GuestAddress(HIMEM_START))).map_err(|source| {
            VmmError::LoadKernel {
                path: path.to_path_buf(),
                source,
            }
        })?;
    Ok(match result.pvh_boot_cap {
        PvhBootCapability::PvhEntryPresent(entry) => {
            (BootProtocol::Pvh, entry.raw_value(), result.kernel_end)
        }
        _ => (
            BootProtocol::Linux64,
            result.kernel_load.raw_value(),
            result.kernel_end,
        ),
    })
}

fn load_initrd(
    mem: &GuestMemoryMmap,
    path: &Path,
    kernel_end: u64,
) -> Result<InitrdConfig, VmmError> {
    let fail = |reason: String| VmmError::LoadInitrd {
        path: path.to_path_buf(),
        reason,
    };
    let mut file = open(path)?;
    let size = file.metadata().map_err(|e| fail(e.to_string()))?.len();
    let address = initrd_load_addr(mem, size, kernel_end)?;
    let mut remaining = size as usize;
    let mut addr = address;
    use vm_memory::GuestMemoryBackend;
    while remaining > 0 {
        let mut slice = mem
            .get_slice(addr, remaining.min(1 << 20))
            .map_err(|e| fail(e.to_string()))?;
        let n = file
            .read_volatile(&mut slice)
            .map_err(|e| fail(e.to_string()))?;
        if n == 0 {
            return Err(fail("the file ended early".into()));
        }
        remaining -= n;
        addr = addr.unchecked_add(n as u64);
    }
    Ok(InitrdConfig { address, size })
}

/// Adds `device` as a virtio-mmio device at `slot`; returns its cmdline announcement.
fn add_virtio_device(
    vm: &Vm,
    mem: &GuestMemoryMmap,
    mmio_bus: &mut Bus,
    notifier: &mut QueueNotifier,
    slot: u32,
    device: Box<dyn VirtioDevice>,
) -> Result<String, VmmError> {
    let irq = IRQ_BASE + slot;
    if irq > IRQ_MAX {
        return Err(VmmError::OutOfIrqs);
    }
    let base = MMIO_MEM_START + u64::from(slot) * MMIO_DEVICE_SIZE;
    let irq_evt = EventFd::new(libc::EFD_NONBLOCK).map_err(os_err("create an eventfd"))?;
    vm.fd()
        .register_irqfd(&irq_evt, irq)
        .map_err(|source| VmmError::Wire {
            what: format!("the irqfd of IRQ {irq}"),
            source,
        })?;
    let transport = MmioTransport::new(device, mem.clone(), irq_evt)?;
    for (index, evt) in transport.queue_evts().iter().enumerate() {
        vm.fd()
            .register_ioevent(
                evt,
                &IoEventAddress::Mmio(base + QUEUE_NOTIFY_OFFSET),
                index as u32,
            )
            .map_err(|source| VmmError::Wire {
                what: format!("the ioeventfd of queue {index} at {base:#x}"),
                source,
            })?;
    }
    let transport = Arc::new(Mutex::new(transport));
    notifier.add(&transport)?;
    mmio_bus.insert(transport, base, MMIO_DEVICE_SIZE)?;
    Ok(format!("virtio_mmio.device=4K@{base:#x}:{irq}"))
}
