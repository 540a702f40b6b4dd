//! vCPUs: their boot configuration and the run loop, one thread each.
//!
//! A vCPU thread leaves `KVM_RUN` for port and MMIO accesses that no in-kernel device or
//! ioeventfd handles, and for the events that end the VM: a triple fault or reset
//! (`KVM_EXIT_SHUTDOWN`), a system event, or a single vCPU halted with interrupts off, which
//! no interrupt can wake. The main thread kicks vCPUs with [`kick_signal`] so that they look
//! at the stop flag and their halt state.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kvm_bindings::{KVM_MP_STATE_HALTED, KVM_SYSTEM_EVENT_RESET, KVM_SYSTEM_EVENT_SHUTDOWN};
use kvm_ioctls::{VcpuExit, VcpuFd};
use vm_memory::GuestMemoryMmap;

use super::exit::ExitEvent;
use super::vm::{Vm, VmError};
use crate::arch::x86_64::cpuid::filter_cpuid;
use crate::arch::x86_64::interrupts::{set_lint, InterruptError};
use crate::arch::x86_64::msr::{setup_msrs, MsrError};
use crate::arch::x86_64::regs::{setup_fpu, setup_regs, setup_sregs, BootProtocol, RegsError};
use crate::devices::bus::Bus;

const RFLAGS_IF: u64 = 1 << 9;

/// Errors while creating or configuring a vCPU.
#[derive(Debug, thiserror::Error)]
pub enum VcpuError {
    /// KVM_CREATE_VCPU failed.
    #[error("Cannot create vCPU {id}: {source}")]
    Create {
        /// The vCPU index.
        id: u8,
        /// The cause.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// The supported CPUID could not be read.
    #[error("Cannot prepare the CPUID of vCPU {0}: {1}")]
    Cpuid(u8, #[source] VmError),
    /// KVM_SET_CPUID2 failed.
    #[error("Cannot set the CPUID of vCPU {0}: {1}")]
    SetCpuid(u8, #[source] kvm_ioctls::Error),
    /// Boot MSRs.
    #[error("vCPU {0}: {1}")]
    Msrs(u8, #[source] MsrError),
    /// Registers.
    #[error("vCPU {0}: {1}")]
    Regs(u8, #[source] RegsError),
    /// Local APIC.
    #[error("vCPU {0}: {1}")]
    Lapic(u8, #[source] InterruptError),
}

/// What a vCPU thread needs besides its own fd.
#[derive(Clone)]
pub struct VcpuContext {
    /// Port I/O devices.
    pub io_bus: Arc<Bus>,
    /// MMIO devices.
    pub mmio_bus: Arc<Bus>,
    /// Where to report the end of the VM.
    pub exit: Arc<ExitEvent>,
    /// Set by the main thread when the VM is being torn down.
    pub stop: Arc<AtomicBool>,
    /// Number of vCPUs in the VM.
    pub cpu_count: u8,
}

/// One vCPU.
pub struct Vcpu {
    fd: VcpuFd,
    id: u8,
}

/// The real-time signal that kicks a vCPU thread out of `KVM_RUN` (SIGRTMIN, as Firecracker).
pub fn kick_signal() -> libc::c_int {
    libc::SIGRTMIN()
}

extern "C" fn noop_signal_handler(_: libc::c_int) {}

/// Installs a do-nothing handler for [`kick_signal`]: its only job is to interrupt `KVM_RUN`.
pub fn install_kick_handler() -> std::io::Result<()> {
    // SAFETY: a zeroed sigaction is a valid value; we fill the handler and flags, and the
    // handler does nothing, so it is async-signal-safe.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = noop_signal_handler as *const () as usize;
        action.sa_flags = 0;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(kick_signal(), &action, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

impl Vcpu {
    /// Creates vCPU `id` in `vm`.
    pub fn new(vm: &Vm, id: u8) -> Result<Self, VcpuError> {
        let fd = vm
            .fd()
            .create_vcpu(u64::from(id))
            .map_err(|source| VcpuError::Create { id, source })?;
        Ok(Vcpu { fd, id })
    }

    /// The vCPU index (also its APIC id).
    pub fn id(&self) -> u8 {
        self.id
    }

    /// Sets CPUID, MSRs, FPU, registers (entering at `entry` by `protocol`) and LAPIC.
    ///
    /// With the in-kernel LAPIC only vCPU 0 starts running: KVM holds the others until the
    /// guest sends them INIT and STARTUP IPIs, which reset their registers to real mode at
    /// the guest's trampoline (the guest finds them in the MP table).
    pub fn configure(
        &self,
        vm: &Vm,
        mem: &GuestMemoryMmap,
        cpu_count: u8,
        protocol: BootProtocol,
        entry: u64,
    ) -> Result<(), VcpuError> {
        let id = self.id;
        let mut cpuid = vm.supported_cpuid().map_err(|e| VcpuError::Cpuid(id, e))?;
        filter_cpuid(&mut cpuid, id, cpu_count, vm.has_tsc_deadline());
        self.fd
            .set_cpuid2(&cpuid)
            .map_err(|e| VcpuError::SetCpuid(id, e))?;
        setup_msrs(&self.fd).map_err(|e| VcpuError::Msrs(id, e))?;
        setup_regs(&self.fd, protocol, entry).map_err(|e| VcpuError::Regs(id, e))?;
        setup_fpu(&self.fd).map_err(|e| VcpuError::Regs(id, e))?;
        setup_sregs(mem, &self.fd, protocol).map_err(|e| VcpuError::Regs(id, e))?;
        set_lint(&self.fd).map_err(|e| VcpuError::Lapic(id, e))?;
        Ok(())
    }

    /// Runs the vCPU until the VM ends or `ctx.stop` is set.
    pub fn run(&mut self, ctx: &VcpuContext) {
        loop {
            if ctx.stop.load(Ordering::Acquire) || ctx.exit.is_requested() {
                return;
            }
            match self.fd.run() {
                Ok(exit) => {
                    let internal = matches!(exit, VcpuExit::InternalError);
                    if let Some((code, mut message)) = handle_exit(self.id, exit, ctx) {
                        if internal {
                            message.push_str(&self.internal_error_details());
                        }
                        ctx.exit.request(code, message);
                        return;
                    }
                }
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                    // Only a lone vCPU can be found dead this way: with several, another
                    // one may still wake this one by INIT/SIPI or NMI (an AP parked in
                    // `cli; hlt`), and their states cannot be read at one instant. An SMP
                    // guest ends by a reset or a power-off instead.
                    if ctx.cpu_count == 1 && self.halted_for_good() {
                        ctx.exit
                            .request(0, "the guest halted with interrupts disabled");
                        return;
                    }
                }
                Err(e) => {
                    ctx.exit
                        .request(1, format!("KVM_RUN failed on vCPU {}: {e}", self.id));
                    return;
                }
            }
        }
    }

    /// KVM's sub-error code and the guest's instruction pointer, for the log.
    fn internal_error_details(&mut self) -> String {
        let run = self.fd.get_kvm_run();
        // SAFETY: the exit reason was KVM_EXIT_INTERNAL_ERROR, so `internal` is the union
        // member KVM filled in.
        let internal = unsafe { run.__bindgen_anon_1.internal };
        let n = (internal.ndata as usize).min(internal.data.len());
        let rip = self.fd.get_regs().map(|r| r.rip).unwrap_or_default();
        format!(
            " (suberror {}, data {:x?}, rip {rip:#x})",
            internal.suberror,
            &internal.data[..n]
        )
    }

    /// True if the vCPU is halted with interrupts masked: nothing but an NMI could wake it,
    /// and nothing in this VMM sends one.
    fn halted_for_good(&self) -> bool {
        let halted = self
            .fd
            .get_mp_state()
            .is_ok_and(|s| s.mp_state == KVM_MP_STATE_HALTED);
        halted && self.fd.get_regs().is_ok_and(|r| r.rflags & RFLAGS_IF == 0)
    }
}

/// Handles one exit; `Some((code, message))` when the VM is over.
fn handle_exit(id: u8, exit: VcpuExit<'_>, ctx: &VcpuContext) -> Option<(i32, String)> {
    match exit {
        VcpuExit::IoIn(port, data) => {
            ctx.io_bus.read(u64::from(port), data);
            None
        }
        VcpuExit::IoOut(port, data) => {
            ctx.io_bus.write(u64::from(port), data);
            None
        }
        VcpuExit::MmioRead(addr, data) => {
            ctx.mmio_bus.read(addr, data);
            None
        }
        VcpuExit::MmioWrite(addr, data) => {
            ctx.mmio_bus.write(addr, data);
            None
        }
        VcpuExit::Hlt => Some((0, format!("vCPU {id} halted"))),
        VcpuExit::Shutdown => Some((0, format!("vCPU {id} shut down (triple fault or reset)"))),
        VcpuExit::SystemEvent(kind, _) => match kind {
            KVM_SYSTEM_EVENT_SHUTDOWN => Some((0, "the guest powered off".into())),
            KVM_SYSTEM_EVENT_RESET => Some((0, "the guest reset".into())),
            other => Some((1, format!("vCPU {id} reported system event {other}"))),
        },
        VcpuExit::FailEntry(reason, cpu) => Some((
            1,
            format!("vCPU {id} failed to enter the guest (reason {reason:#x}, cpu {cpu})"),
        )),
        VcpuExit::InternalError => Some((1, format!("vCPU {id}: KVM internal error"))),
        VcpuExit::Intr => None,
        other => Some((1, format!("vCPU {id}: unexpected exit {other:?}"))),
    }
}
