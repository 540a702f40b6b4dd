//! The model-specific registers a vCPU boots with.

use kvm_bindings::{kvm_msr_entry, Msrs};
use kvm_ioctls::VcpuFd;

const MSR_IA32_SYSENTER_CS: u32 = 0x174;
const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
const MSR_STAR: u32 = 0xc000_0081;
const MSR_LSTAR: u32 = 0xc000_0082;
const MSR_CSTAR: u32 = 0xc000_0083;
const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;
const MSR_IA32_TSC: u32 = 0x10;
const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
const MSR_IA32_MISC_ENABLE_FAST_STRING: u64 = 0x1;
const MSR_MTRR_DEF_TYPE: u32 = 0x2ff;
const MTRR_ENABLE: u64 = 1 << 11;
const MTRR_MEM_TYPE_WB: u64 = 0x6;

/// Errors while setting the boot MSRs.
#[derive(Debug, thiserror::Error)]
pub enum MsrError {
    /// The MSR list could not be built.
    #[error("Cannot build the list of boot MSRs: {0:?}")]
    Build(vmm_sys_util::fam::Error),
    /// KVM refused the MSRs.
    #[error("Cannot set the vCPU's boot MSRs: {0}")]
    Set(#[source] kvm_ioctls::Error),
    /// KVM set only some of them.
    #[error("KVM set only {set} of {expected} boot MSRs.")]
    Partial {
        /// How many KVM set.
        set: usize,
        /// How many were asked.
        expected: usize,
    },
}

fn entry(index: u32, data: u64) -> kvm_msr_entry {
    kvm_msr_entry {
        index,
        data,
        ..Default::default()
    }
}

/// The boot MSR values: syscall MSRs cleared, TSC at 0, fast strings, MTRRs write-back.
pub fn boot_msr_entries() -> Vec<kvm_msr_entry> {
    vec![
        entry(MSR_IA32_SYSENTER_CS, 0),
        entry(MSR_IA32_SYSENTER_ESP, 0),
        entry(MSR_IA32_SYSENTER_EIP, 0),
        entry(MSR_STAR, 0),
        entry(MSR_CSTAR, 0),
        entry(MSR_KERNEL_GS_BASE, 0),
        entry(MSR_SYSCALL_MASK, 0),
        entry(MSR_LSTAR, 0),
        entry(MSR_IA32_TSC, 0),
        entry(MSR_IA32_MISC_ENABLE, MSR_IA32_MISC_ENABLE_FAST_STRING),
        entry(MSR_MTRR_DEF_TYPE, MTRR_ENABLE | MTRR_MEM_TYPE_WB),
    ]
}

/// Sets the boot MSRs on `vcpu`.
pub fn setup_msrs(vcpu: &VcpuFd) -> Result<(), MsrError> {
    let entries = boot_msr_entries();
    let msrs = Msrs::from_entries(&entries).map_err(MsrError::Build)?;
    let set = vcpu.set_msrs(&msrs).map_err(MsrError::Set)?;
    if set != entries.len() {
        return Err(MsrError::Partial {
            set,
            expected: entries.len(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtrr_default_is_write_back_and_enabled() {
        let e = boot_msr_entries();
        let mtrr = e.iter().find(|e| e.index == MSR_MTRR_DEF_TYPE).unwrap();
        assert_eq!(mtrr.data, 0x806);
    }
}
