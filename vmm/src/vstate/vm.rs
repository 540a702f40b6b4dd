//! The KVM VM: in-kernel irqchip and PIT, KVM's private TSS and identity map pages, memory
//! slots, and the interrupt/notification eventfds wired into KVM.

use kvm_bindings::{
    kvm_pit_config, kvm_userspace_memory_region, CpuId, KVM_MAX_CPUID_ENTRIES,
    KVM_PIT_SPEAKER_DUMMY,
};
use kvm_ioctls::{Cap, Kvm, VmFd};
use vm_memory::GuestMemoryMmap;

use super::memory::regions_for_kvm;
use crate::arch::x86_64::layout::{KVM_IDENTITY_MAP_ADDRESS, KVM_TSS_ADDRESS};

/// Errors while creating or configuring the VM.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// /dev/kvm could not be opened.
    #[error("Cannot open /dev/kvm: {0}")]
    OpenKvm(#[source] kvm_ioctls::Error),
    /// KVM does not offer what the VMM needs (`vmm_contract::kvm::check_requirements`).
    #[error("{0} The VMM cannot run on it.")]
    Unmet(#[from] vmm_contract::kvm::Unmet),
    /// KVM_CREATE_VM failed.
    #[error("Cannot create the KVM VM: {0}")]
    CreateVm(#[source] kvm_ioctls::Error),
    /// KVM_SET_TSS_ADDR failed.
    #[error("Cannot set KVM's TSS address: {0}")]
    SetTss(#[source] kvm_ioctls::Error),
    /// KVM_SET_IDENTITY_MAP_ADDR failed.
    #[error("Cannot set KVM's identity map address: {0}")]
    SetIdentityMap(#[source] kvm_ioctls::Error),
    /// KVM_CREATE_IRQCHIP failed.
    #[error("Cannot create the in-kernel interrupt controllers: {0}")]
    CreateIrqchip(#[source] kvm_ioctls::Error),
    /// KVM_CREATE_PIT2 failed.
    #[error("Cannot create the in-kernel PIT: {0}")]
    CreatePit(#[source] kvm_ioctls::Error),
    /// KVM_SET_USER_MEMORY_REGION failed.
    #[error("Cannot register guest memory slot {slot} with KVM: {source}")]
    MemorySlot {
        /// The slot.
        slot: u32,
        /// The cause.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// KVM_GET_SUPPORTED_CPUID failed.
    #[error("Cannot get the CPUID that KVM supports: {0}")]
    SupportedCpuid(#[source] kvm_ioctls::Error),
}

/// A KVM VM with its interrupt controllers.
pub struct Vm {
    kvm: Kvm,
    fd: VmFd,
}

impl Vm {
    /// Creates the VM with irqchip, PIT, TSS and identity map.
    pub fn new() -> Result<Self, VmError> {
        let kvm = Kvm::new().map_err(VmError::OpenKvm)?;
        vmm_contract::kvm::check_requirements(&kvm)?;
        let fd = kvm.create_vm().map_err(VmError::CreateVm)?;
        fd.set_tss_address(KVM_TSS_ADDRESS as usize)
            .map_err(VmError::SetTss)?;
        fd.set_identity_map_address(KVM_IDENTITY_MAP_ADDRESS)
            .map_err(VmError::SetIdentityMap)?;
        fd.create_irq_chip().map_err(VmError::CreateIrqchip)?;
        // The PC speaker port is answered by a dummy so that guests probing it do not exit.
        let pit = kvm_pit_config {
            flags: KVM_PIT_SPEAKER_DUMMY,
            ..Default::default()
        };
        fd.create_pit2(pit).map_err(VmError::CreatePit)?;
        Ok(Vm { kvm, fd })
    }

    /// Registers every region of `memory` as a KVM memory slot.
    pub fn register_memory(&self, memory: &GuestMemoryMmap) -> Result<(), VmError> {
        for (slot, (addr, size, host)) in regions_for_kvm(memory).into_iter().enumerate() {
            let slot = slot as u32;
            let region = kvm_userspace_memory_region {
                slot,
                guest_phys_addr: addr.0,
                memory_size: size,
                userspace_addr: host,
                flags: 0,
            };
            // SAFETY: the host range is a live mapping owned by `memory`, which the builder
            // keeps alive for as long as the VM (the VM fd is dropped before or with it at exit).
            unsafe { self.fd.set_user_memory_region(region) }
                .map_err(|source| VmError::MemorySlot { slot, source })?;
        }
        Ok(())
    }

    /// The CPUID entries KVM can virtualise on this host.
    pub fn supported_cpuid(&self) -> Result<CpuId, VmError> {
        self.kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(VmError::SupportedCpuid)
    }

    /// Whether KVM emulates the LAPIC TSC deadline timer.
    pub fn has_tsc_deadline(&self) -> bool {
        self.kvm.check_extension(Cap::TscDeadlineTimer)
    }

    /// The VM file descriptor.
    pub fn fd(&self) -> &VmFd {
        &self.fd
    }
}
