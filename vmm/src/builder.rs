//! Assembles a VM from a [`VmConfig`] and runs it until the guest powers off, resets, or we
//! are asked to stop (SIGTERM, SIGINT, SIGHUP).

use std::fs::File;
use std::io::Write;
use std::os::unix::thread::JoinHandleExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Barrier, Mutex};
use std::thread::JoinHandle;

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
    configure_linux_boot, configure_pvh_boot, initrd_load_addr, BootError, InitrdConfig,
};
use crate::config::VmConfig;
use crate::devices::bus::{Bus, BusError};
use crate::devices::legacy::i8042::I8042Device;
use crate::devices::legacy::serial::SerialDevice;
use crate::devices::virtio::block::BlockDevice;
use crate::devices::virtio::fs::FsDevice;
use crate::devices::virtio::mmio::{MmioError, MmioTransport, VirtioDevice, QUEUE_NOTIFY_OFFSET};
use crate::devices::virtio::net::NetDevice;
use crate::devices::virtio::notifier::{NotifierError, QueueNotifier};
use crate::devices::virtio::rng::RngDevice;
use crate::devices::virtio::vsock::VsockMmioDevice;
use crate::logger::log;
use crate::seccomp::{self, Filter, SeccompError};
use crate::signals::{StopSignals, Wake};
use crate::vstate::exit::{ExitEvent, ExitReason};
use crate::vstate::memory::{create_guest_memory, MemoryError};
use crate::vstate::vcpu::{install_kick_handler, kick_signal, Vcpu, VcpuContext, VcpuError};
use crate::vstate::vm::{Vm, VmError};

/// How often the main thread kicks vCPUs so that a single vCPU halted with interrupts off
/// is noticed.
const HALT_CHECK_INTERVAL_MS: i32 = 1000;

/// Errors while building or starting the VM.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// Guest memory.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// The VM.
    #[error(transparent)]
    Vm(#[from] VmError),
    /// A vCPU.
    #[error(transparent)]
    Vcpu(#[from] VcpuError),
    /// Boot structures.
    #[error(transparent)]
    Boot(#[from] BootError),
    /// A bus conflict.
    #[error(transparent)]
    Bus(#[from] BusError),
    /// A virtio transport.
    #[error(transparent)]
    Mmio(#[from] MmioError),
    /// The device thread.
    #[error(transparent)]
    Notifier(#[from] NotifierError),
    /// A file named in the config could not be opened.
    #[error("Cannot open {path}: {source}")]
    Open {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The kernel could not be loaded.
    #[error("Cannot load the kernel {path}: {source}")]
    LoadKernel {
        /// The kernel.
        path: PathBuf,
        /// The cause.
        #[source]
        source: linux_loader::loader::Error,
    },
    /// The initrd could not be copied into guest memory.
    #[error("Cannot load the initrd {path}: {reason}")]
    LoadInitrd {
        /// The initrd.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The command line is too long or malformed.
    #[error("The kernel command line is invalid: {0}")]
    Cmdline(String),
    /// More virtio devices than interrupt lines.
    #[error("Too many virtio devices: interrupt lines {IRQ_BASE} to {IRQ_MAX} are all taken.")]
    OutOfIrqs,
    /// KVM refused an irqfd or ioeventfd.
    #[error("Cannot wire {what} into KVM: {source}")]
    Wire {
        /// What was being registered.
        what: String,
        /// The cause.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// The vsock device (its hybrid socket) could not be set up.
    #[error("Cannot set up the vsock device with its socket {path}: {reason}")]
    Vsock {
        /// The hybrid vsock socket.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A virtio device could not be set up.
    #[error("Cannot set up the {what}: {reason}")]
    Device {
        /// Which device ("virtio-blk disk /img", ...).
        what: String,
        /// What went wrong, and what to do.
        reason: String,
    },
    /// A seccomp filter could not be built or installed: the VM does not run unfiltered.
    #[error(transparent)]
    Seccomp(#[from] SeccompError),
    /// An OS call failed.
    #[error("Cannot {what}: {source}")]
    Os {
        /// What was being done.
        what: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

fn os_err(what: &'static str) -> impl FnOnce(std::io::Error) -> BuildError {
    move |source| BuildError::Os { what, source }
}

/// A built VM, ready to run.
pub struct Vmm {
    // Field order is drop order: vCPUs and the VM go before the memory they map.
    vcpus: Vec<(Vcpu, BootProtocol, u64)>,
    vm: Vm,
    memory: GuestMemoryMmap,
    io_bus: Arc<Bus>,
    mmio_bus: Arc<Bus>,
    notifier: QueueNotifier,
    exit: Arc<ExitEvent>,
    seccomp: bool,
    ready_file: Option<PathBuf>,
    /// The final kernel command line, devices included.
    pub cmdline: String,
}

fn open(path: &Path) -> Result<File, BuildError> {
    File::open(path).map_err(|source| BuildError::Open {
        path: path.to_path_buf(),
        source,
    })
}

fn serial_output(config: &VmConfig) -> Result<Box<dyn Write + Send>, BuildError> {
    if let Some(fd) = config.serial_fd {
        // SAFETY: F_GETFD only reads the descriptor table.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            return Err(BuildError::Open {
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
                .map_err(|source| BuildError::Open {
                    path: path.to_path_buf(),
                    source,
                })?;
            Ok(Box::new(file))
        }
        None => Ok(Box::new(std::io::sink())),
    }
}

fn load_kernel(mem: &GuestMemoryMmap, path: &Path) -> Result<(BootProtocol, u64, u64), BuildError> {
    let mut file = open(path)?;
    let result =
        Elf::load(mem, None, &mut file, Some(GuestAddress(HIMEM_START))).map_err(|source| {
            BuildError::LoadKernel {
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
) -> Result<InitrdConfig, BuildError> {
    let fail = |reason: String| BuildError::LoadInitrd {
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
) -> Result<String, BuildError> {
    let irq = IRQ_BASE + slot;
    if irq > IRQ_MAX {
        return Err(BuildError::OutOfIrqs);
    }
    let base = MMIO_MEM_START + u64::from(slot) * MMIO_DEVICE_SIZE;
    let irq_evt = EventFd::new(libc::EFD_NONBLOCK).map_err(os_err("create an eventfd"))?;
    vm.fd()
        .register_irqfd(&irq_evt, irq)
        .map_err(|source| BuildError::Wire {
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
            .map_err(|source| BuildError::Wire {
                what: format!("the ioeventfd of queue {index} at {base:#x}"),
                source,
            })?;
    }
    let transport = Arc::new(Mutex::new(transport));
    notifier.add(&transport)?;
    mmio_bus.insert(transport, base, MMIO_DEVICE_SIZE)?;
    Ok(format!("virtio_mmio.device=4K@{base:#x}:{irq}"))
}

impl Vmm {
    /// Builds the VM: memory, KVM, devices, kernel, initrd, boot structures, vCPUs.
    pub fn build(config: &VmConfig) -> Result<Self, BuildError> {
        let exit = Arc::new(ExitEvent::new().map_err(os_err("create the exit eventfd"))?);
        let ram = create_guest_memory(config.memory_mib << 20)?;
        let memory = ram.memory;
        let vm = Vm::new()?;
        vm.register_memory(&memory)?;

        let mut io_bus = Bus::new();
        let serial_irq = EventFd::new(libc::EFD_NONBLOCK).map_err(os_err("create an eventfd"))?;
        vm.fd()
            .register_irqfd(&serial_irq, SERIAL_IRQ)
            .map_err(|source| BuildError::Wire {
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

        let mut mmio_bus = Bus::new();
        let mut notifier = QueueNotifier::new()?;
        let mut virtio: Vec<Box<dyn VirtioDevice>> = Vec::new();
        if config.rng {
            virtio.push(Box::new(RngDevice::default()));
        }
        if let Some(vsock) = &config.vsock {
            let device = VsockMmioDevice::new(vsock.guest_cid, &vsock.uds_path).map_err(|e| {
                BuildError::Vsock {
                    path: vsock.uds_path.clone(),
                    reason: e.to_string(),
                }
            })?;
            virtio.push(Box::new(device));
        }

        // virtio-fs: one vhost-user frontend per share (config.fs).
        for fs in &config.fs {
            let device = FsDevice::new(fs).map_err(|e| BuildError::Device {
                what: format!("virtio-fs share \"{}\"", fs.tag),
                reason: e.to_string(),
            })?;
            virtio.push(Box::new(device));
        }

        // virtio-blk: one device per disk (config.block).
        for disk in &config.block {
            let device = BlockDevice::new(disk).map_err(|e| BuildError::Device {
                what: format!("virtio-blk disk {}", disk.path.display()),
                reason: e.to_string(),
            })?;
            virtio.push(Box::new(device));
        }

        // virtio-net: one device per tap (config.net).
        for net in &config.net {
            let device = NetDevice::from_config(net).map_err(|e| BuildError::Device {
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

        let mut cmdline =
            Cmdline::new(CMDLINE_MAX_SIZE).map_err(|e| BuildError::Cmdline(e.to_string()))?;
        if !config.cmdline.trim().is_empty() {
            cmdline
                .insert_str(config.cmdline.trim())
                .map_err(|e| BuildError::Cmdline(e.to_string()))?;
        }
        for (slot, device) in virtio.into_iter().enumerate() {
            let arg = add_virtio_device(
                &vm,
                &memory,
                &mut mmio_bus,
                &mut notifier,
                slot as u32,
                device,
            )?;
            cmdline
                .insert_str(&arg)
                .map_err(|e| BuildError::Cmdline(e.to_string()))?;
        }

        let (protocol, entry, kernel_end) = load_kernel(&memory, &config.kernel)?;
        let initrd = match &config.initrd {
            Some(path) => Some(load_initrd(&memory, path, kernel_end)?),
            None => None,
        };
        load_cmdline(&memory, GuestAddress(CMDLINE_START), &cmdline)
            .map_err(|e| BuildError::Cmdline(e.to_string()))?;
        let cmdline = cmdline
            .as_cstring()
            .map_err(|e| BuildError::Cmdline(e.to_string()))?
            .into_string()
            .map_err(|e| BuildError::Cmdline(e.to_string()))?;
        match protocol {
            BootProtocol::Linux64 => configure_linux_boot(
                &memory,
                GuestAddress(CMDLINE_START),
                cmdline.len() + 1,
                initrd,
                config.vcpus,
            )?,
            BootProtocol::Pvh => {
                configure_pvh_boot(&memory, GuestAddress(CMDLINE_START), initrd, config.vcpus)?
            }
        }

        let mut vcpus = Vec::new();
        for id in 0..config.vcpus {
            let vcpu = Vcpu::new(&vm, id)?;
            vcpu.configure(&vm, &memory, config.vcpus, protocol, entry)?;
            vcpus.push((vcpu, protocol, entry));
        }
        log(
            "info",
            &format!(
                "built the VM: {} vCPU(s), {} MiB, {:?} entry at {entry:#x}, cmdline \"{cmdline}\"",
                config.vcpus, config.memory_mib, protocol
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
            cmdline,
        })
    }

    /// Runs the VM until it ends; returns why.
    pub fn run(self) -> Result<ExitReason, BuildError> {
        let Vmm {
            vcpus,
            vm,
            memory,
            io_bus,
            mmio_bus,
            notifier,
            exit,
            seccomp,
            ready_file,
            cmdline: _,
        } = self;
        if !seccomp {
            log(
                "warn",
                "seccomp is off (\"seccomp\": false in vmm.json): the VMM's threads run unfiltered",
            );
        }
        let signals = StopSignals::block()?;
        install_kick_handler().map_err(os_err("install the vCPU kick handler"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let ctx = VcpuContext {
            io_bus,
            mmio_bus,
            exit: exit.clone(),
            stop: stop.clone(),
            cpu_count: vcpus.len() as u8,
        };

        // Each thread installs its filter first thing and says whether it could; the vCPUs
        // then wait at `go` until the main thread is filtered too, so the guest never runs
        // while a thread of ours is unfiltered. A filter that fails ends the VMM.
        let (confined_tx, confined_rx) = mpsc::channel::<Result<(), SeccompError>>();
        let go = Arc::new(Barrier::new(vcpus.len() + 1));
        let confined = confined_tx.clone();
        std::thread::Builder::new()
            .name("kata-vmm-dev".into())
            .spawn(move || {
                let result = confine(seccomp, Filter::Device);
                let ok = result.is_ok();
                let _ = confined.send(result);
                if ok {
                    let e = notifier.run();
                    log("error", &e.to_string());
                }
            })
            .map_err(os_err("start the device thread"))?;

        let mut threads: Vec<JoinHandle<()>> = Vec::new();
        for (mut vcpu, _, _) in vcpus {
            let ctx = ctx.clone();
            let confined = confined_tx.clone();
            let go = go.clone();
            let name = format!("kata-vmm-vcpu{}", vcpu.id());
            let handle = std::thread::Builder::new()
                .name(name)
                .spawn(move || {
                    let result = confine(seccomp, Filter::Vcpu);
                    let ok = result.is_ok();
                    let _ = confined.send(result);
                    if ok {
                        go.wait();
                        vcpu.run(&ctx);
                    }
                })
                .map_err(os_err("start a vCPU thread"))?;
            threads.push(handle);
        }
        drop(confined_tx);
        for _ in 0..=threads.len() {
            confined_rx.recv().map_err(|_| BuildError::Os {
                what: "start the VM's threads",
                source: std::io::Error::other("a thread ended before it was confined"),
            })??;
        }
        if let Some(path) = &ready_file {
            std::fs::write(path, format!("{}\n", std::process::id()))
                .map_err(os_err("write the ready file"))?;
        }
        // Nothing is opened from here on.
        if let Err(e) = confine(seccomp, Filter::VmmMain) {
            if let Some(path) = &ready_file {
                let _ = std::fs::remove_file(path);
            }
            return Err(e.into());
        }
        go.wait();
        log("info", "the VM is running");

        let reason = loop {
            match signals.wait(exit.eventfd(), HALT_CHECK_INTERVAL_MS)? {
                Wake::Exit => {
                    if let Some(reason) = exit.reason() {
                        break reason;
                    }
                }
                Wake::Signal(signo) => {
                    break ExitReason {
                        code: 0,
                        message: format!("stopped by signal {signo}"),
                    }
                }
                Wake::Timeout => kick_all(&threads),
            }
        };
        stop.store(true, Ordering::Release);
        kick_all(&threads);
        // The vCPU threads are not joined: one may be blocked in KVM_RUN for a while, and the
        // process exits right after this anyway. The VM and memory stay alive until then.
        std::mem::forget(vm);
        std::mem::forget(memory);
        Ok(reason)
    }
}

/// Installs `filter` on the calling thread unless vmm.json turned seccomp off.
fn confine(enabled: bool, filter: Filter) -> Result<(), SeccompError> {
    if enabled {
        seccomp::apply(filter)?;
    }
    Ok(())
}

fn kick_all(threads: &[JoinHandle<()>]) {
    for t in threads {
        if t.is_finished() {
            continue;
        }
        // SAFETY: the thread has not been joined (we hold its handle), so its pthread_t is
        // valid; the kick signal has a do-nothing handler installed.
        unsafe { libc::pthread_kill(t.as_pthread_t(), kick_signal()) };
    }
}
