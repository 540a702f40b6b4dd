//! Local APIC setup: LINT0 as ExtINT (the PIC's output) and LINT1 as NMI, as a PC wires them.

use kvm_bindings::kvm_lapic_state;
use kvm_ioctls::VcpuFd;

const APIC_LVT0: usize = 0x350;
const APIC_LVT1: usize = 0x360;
const APIC_MODE_NMI: u32 = 0x4;
const APIC_MODE_EXTINT: u32 = 0x7;

/// Errors while programming the local APIC.
#[derive(Debug, thiserror::Error)]
pub enum InterruptError {
    /// KVM did not return the LAPIC state.
    #[error("Cannot get the vCPU's local APIC state: {0}")]
    GetLapic(#[source] kvm_ioctls::Error),
    /// KVM refused the LAPIC state.
    #[error("Cannot set the vCPU's local APIC state: {0}")]
    SetLapic(#[source] kvm_ioctls::Error),
}

/// Reads a 32-bit LAPIC register from the KVM LAPIC page.
pub fn get_klapic_reg(klapic: &kvm_lapic_state, offset: usize) -> u32 {
    let bytes: [u8; 4] = std::array::from_fn(|i| klapic.regs[offset + i] as u8);
    u32::from_le_bytes(bytes)
}

/// Writes a 32-bit LAPIC register into the KVM LAPIC page.
pub fn set_klapic_reg(klapic: &mut kvm_lapic_state, offset: usize, value: u32) {
    for (i, b) in value.to_le_bytes().iter().enumerate() {
        klapic.regs[offset + i] = *b as _;
    }
}

fn set_delivery_mode(reg: u32, mode: u32) -> u32 {
    (reg & !0x700) | (mode << 8)
}

/// Programs LINT0 as ExtINT and LINT1 as NMI in a LAPIC page.
pub fn set_lint_modes(klapic: &mut kvm_lapic_state) {
    let lvt0 = get_klapic_reg(klapic, APIC_LVT0);
    set_klapic_reg(klapic, APIC_LVT0, set_delivery_mode(lvt0, APIC_MODE_EXTINT));
    let lvt1 = get_klapic_reg(klapic, APIC_LVT1);
    set_klapic_reg(klapic, APIC_LVT1, set_delivery_mode(lvt1, APIC_MODE_NMI));
}

/// Configures LINT0 and LINT1 of `vcpu`'s local APIC.
pub fn set_lint(vcpu: &VcpuFd) -> Result<(), InterruptError> {
    let mut klapic = vcpu.get_lapic().map_err(InterruptError::GetLapic)?;
    set_lint_modes(&mut klapic);
    vcpu.set_lapic(&klapic).map_err(InterruptError::SetLapic)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lint_delivery_modes() {
        let mut klapic = kvm_lapic_state::default();
        set_klapic_reg(&mut klapic, APIC_LVT0, 0x0001_0700);
        set_lint_modes(&mut klapic);
        assert_eq!(get_klapic_reg(&klapic, APIC_LVT0), 0x0001_0700);
        assert_eq!(get_klapic_reg(&klapic, APIC_LVT1), 0x400);
    }
}
