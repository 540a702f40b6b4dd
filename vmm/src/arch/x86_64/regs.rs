//! Initial register state of the boot vCPU: general purpose registers, segments, control
//! registers, the boot GDT and the identity-mapped page tables.

use kvm_bindings::{kvm_fpu, kvm_regs, kvm_sregs};
use kvm_ioctls::VcpuFd;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::gdt::{kvm_segment_from_gdt, long_mode_gdt, protected_mode_gdt};
use super::layout::{
    BOOT_GDT_START, BOOT_IDT_START, BOOT_STACK_POINTER, PDE_START, PDPTE_START, PML4_START,
    PVH_INFO_START, ZERO_PAGE_START,
};

const X86_CR0_PE: u64 = 0x1;
const X86_CR0_ET: u64 = 0x10;
const X86_CR0_PG: u64 = 0x8000_0000;
const X86_CR4_PAE: u64 = 0x20;
const EFER_LME: u64 = 0x100;
const EFER_LMA: u64 = 0x400;

/// How the kernel is entered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootProtocol {
    /// 64-bit Linux boot protocol: long mode, `rsi` = zero page.
    Linux64,
    /// PVH: 32-bit protected mode without paging, `ebx` = `hvm_start_info`.
    Pvh,
}

/// Errors while setting up the initial register state.
#[derive(Debug, thiserror::Error)]
pub enum RegsError {
    /// KVM refused the FPU state.
    #[error("Cannot set the vCPU's FPU state: {0}")]
    SetFpu(#[source] kvm_ioctls::Error),
    /// KVM refused the general purpose registers.
    #[error("Cannot set the vCPU's general purpose registers: {0}")]
    SetRegs(#[source] kvm_ioctls::Error),
    /// KVM did not return the special registers.
    #[error("Cannot get the vCPU's special registers: {0}")]
    GetSregs(#[source] kvm_ioctls::Error),
    /// KVM refused the special registers.
    #[error("Cannot set the vCPU's special registers: {0}")]
    SetSregs(#[source] kvm_ioctls::Error),
    /// The GDT, IDT or page tables do not fit in guest memory.
    #[error("Cannot write the boot {0} to guest memory.")]
    WriteTables(&'static str),
}

/// Sets the x87 control word and MXCSR to their power-on values.
pub fn setup_fpu(vcpu: &VcpuFd) -> Result<(), RegsError> {
    let fpu = kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    vcpu.set_fpu(&fpu).map_err(RegsError::SetFpu)
}

/// The general purpose registers at kernel entry.
pub fn boot_regs(protocol: BootProtocol, entry: u64) -> kvm_regs {
    match protocol {
        BootProtocol::Linux64 => kvm_regs {
            rflags: 0x2,
            rip: entry,
            rsp: BOOT_STACK_POINTER,
            rbp: BOOT_STACK_POINTER,
            rsi: ZERO_PAGE_START,
            ..Default::default()
        },
        BootProtocol::Pvh => kvm_regs {
            rflags: 0x2,
            rip: entry,
            rbx: PVH_INFO_START,
            ..Default::default()
        },
    }
}

/// Sets the general purpose registers of the boot vCPU.
pub fn setup_regs(vcpu: &VcpuFd, protocol: BootProtocol, entry: u64) -> Result<(), RegsError> {
    vcpu.set_regs(&boot_regs(protocol, entry))
        .map_err(RegsError::SetRegs)
}

/// Writes the GDT, IDT (and, for 64-bit boot, page tables) to guest memory and sets the
/// segments and control registers to match.
pub fn setup_sregs(
    mem: &GuestMemoryMmap,
    vcpu: &VcpuFd,
    protocol: BootProtocol,
) -> Result<(), RegsError> {
    let mut sregs = vcpu.get_sregs().map_err(RegsError::GetSregs)?;
    configure_segments_and_sregs(mem, &mut sregs, protocol)?;
    if protocol == BootProtocol::Linux64 {
        setup_page_tables(mem, &mut sregs)?;
    }
    vcpu.set_sregs(&sregs).map_err(RegsError::SetSregs)
}

fn write_gdt_table(table: &[u64], mem: &GuestMemoryMmap) -> Result<(), RegsError> {
    for (index, entry) in table.iter().enumerate() {
        let addr = GuestAddress(BOOT_GDT_START + (index as u64) * 8);
        mem.write_obj(*entry, addr)
            .map_err(|_| RegsError::WriteTables("GDT"))?;
    }
    Ok(())
}

/// Fills the segment and control registers for `protocol` and writes GDT and IDT.
pub fn configure_segments_and_sregs(
    mem: &GuestMemoryMmap,
    sregs: &mut kvm_sregs,
    protocol: BootProtocol,
) -> Result<(), RegsError> {
    let gdt = match protocol {
        BootProtocol::Linux64 => long_mode_gdt(),
        BootProtocol::Pvh => protected_mode_gdt(),
    };
    let code_seg = kvm_segment_from_gdt(gdt[1], 1);
    let data_seg = kvm_segment_from_gdt(gdt[2], 2);
    let tss_seg = kvm_segment_from_gdt(gdt[3], 3);

    write_gdt_table(&gdt, mem)?;
    sregs.gdt.base = BOOT_GDT_START;
    sregs.gdt.limit = (std::mem::size_of_val(&gdt) - 1) as u16;

    mem.write_obj(0u64, GuestAddress(BOOT_IDT_START))
        .map_err(|_| RegsError::WriteTables("IDT"))?;
    sregs.idt.base = BOOT_IDT_START;
    sregs.idt.limit = (std::mem::size_of::<u64>() - 1) as u16;

    sregs.cs = code_seg;
    sregs.ds = data_seg;
    sregs.es = data_seg;
    sregs.fs = data_seg;
    sregs.gs = data_seg;
    sregs.ss = data_seg;
    sregs.tr = tss_seg;

    match protocol {
        BootProtocol::Linux64 => {
            sregs.cr0 |= X86_CR0_PE;
            sregs.efer |= EFER_LME | EFER_LMA;
        }
        BootProtocol::Pvh => {
            sregs.cr0 = X86_CR0_PE | X86_CR0_ET;
            sregs.cr4 = 0;
            sregs.efer = 0;
        }
    }
    Ok(())
}

/// The identity map of the first GiB: PML4[0] -> PDPT[0] -> 512 PD entries of 2 MiB.
pub fn page_table_entries() -> (u64, u64, Vec<u64>) {
    let pml4 = PDPTE_START | 0x03;
    let pdpte = PDE_START | 0x03;
    // Present, writable, page size (2 MiB).
    let pde = (0..512u64).map(|i| (i << 21) | 0x83).collect();
    (pml4, pdpte, pde)
}

/// Writes the identity map and points CR3 at it, enabling PAE and paging.
pub fn setup_page_tables(mem: &GuestMemoryMmap, sregs: &mut kvm_sregs) -> Result<(), RegsError> {
    let (pml4, pdpte, pde) = page_table_entries();
    mem.write_obj(pml4, GuestAddress(PML4_START))
        .map_err(|_| RegsError::WriteTables("PML4"))?;
    mem.write_obj(pdpte, GuestAddress(PDPTE_START))
        .map_err(|_| RegsError::WriteTables("PDPT"))?;
    for (i, entry) in pde.iter().enumerate() {
        mem.write_obj(*entry, GuestAddress(PDE_START + (i as u64) * 8))
            .map_err(|_| RegsError::WriteTables("page directory"))?;
    }
    sregs.cr3 = PML4_START;
    sregs.cr4 |= X86_CR4_PAE;
    sregs.cr0 |= X86_CR0_PG;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap()
    }

    #[test]
    fn page_tables_identity_map_first_gib() {
        let mem = test_mem();
        let mut sregs = kvm_sregs::default();
        setup_page_tables(&mem, &mut sregs).unwrap();
        assert_eq!(
            mem.read_obj::<u64>(GuestAddress(PML4_START)).unwrap(),
            0xa003
        );
        assert_eq!(
            mem.read_obj::<u64>(GuestAddress(PDPTE_START)).unwrap(),
            0xb003
        );
        for i in [0u64, 1, 8, 511] {
            let entry: u64 = mem.read_obj(GuestAddress(PDE_START + i * 8)).unwrap();
            assert_eq!(entry, (i << 21) | 0x83, "PD entry {i}");
        }
        assert_eq!(sregs.cr3, PML4_START);
        assert_ne!(sregs.cr4 & X86_CR4_PAE, 0);
        assert_ne!(sregs.cr0 & X86_CR0_PG, 0);
    }

    #[test]
    fn long_mode_sregs_and_gdt_in_memory() {
        let mem = test_mem();
        let mut sregs = kvm_sregs::default();
        configure_segments_and_sregs(&mem, &mut sregs, BootProtocol::Linux64).unwrap();
        for (i, entry) in long_mode_gdt().iter().enumerate() {
            let addr = GuestAddress(BOOT_GDT_START + i as u64 * 8);
            assert_eq!(mem.read_obj::<u64>(addr).unwrap(), *entry);
        }
        assert_eq!(sregs.gdt.limit, 31);
        assert_eq!(sregs.cs.l, 1);
        assert_eq!(sregs.efer & (EFER_LME | EFER_LMA), EFER_LME | EFER_LMA);
        assert_ne!(sregs.cr0 & X86_CR0_PE, 0);
    }

    #[test]
    fn pvh_sregs_are_flat_protected_mode() {
        let mem = test_mem();
        let mut sregs = kvm_sregs {
            cr4: X86_CR4_PAE,
            efer: EFER_LME,
            ..Default::default()
        };
        configure_segments_and_sregs(&mem, &mut sregs, BootProtocol::Pvh).unwrap();
        assert_eq!(sregs.cr0, X86_CR0_PE | X86_CR0_ET);
        assert_eq!((sregs.cr4, sregs.efer), (0, 0));
        assert_eq!((sregs.cs.db, sregs.cs.l), (1, 0));
    }

    #[test]
    fn boot_registers() {
        let r = boot_regs(BootProtocol::Linux64, 0x100_0000);
        assert_eq!(
            (r.rip, r.rsi, r.rsp, r.rflags),
            (0x100_0000, 0x7000, 0x8ff0, 2)
        );
        let r = boot_regs(BootProtocol::Pvh, 0x100_0200);
        assert_eq!((r.rip, r.rbx), (0x100_0200, PVH_INFO_START));
    }
}
