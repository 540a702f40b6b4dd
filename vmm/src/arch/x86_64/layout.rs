//! Every guest-physical address the VMM relies on, in one place.
//!
//! ```text
//! 0x0000_0500  GDT (4 entries), then the IDT (empty)
//! 0x0000_6000  PVH hvm_start_info (PVH boot only)
//! 0x0000_7000  zero page (Linux boot) / PVH memory map (PVH boot)
//! 0x0000_8ff0  initial stack pointer
//! 0x0000_9000  PML4, 0xa000 PDPT, 0xb000 PD (identity map of the first 1 GiB only, as
//!              Firecracker: Linux builds its own tables before touching MMIO; a 64-bit
//!              test guest cannot reach the MMIO gap, a PVH one (paging off) can)
//! 0x0002_0000  kernel command line
//! 0x0009_fc00  EBDA (not RAM in the e820 map): its first KiB holds the MP floating pointer
//!              and the MP configuration table (vCPUs, IOAPIC, IRQ routing)
//! 0x0010_0000  high memory: the kernel is loaded here or above
//!   ...        initrd at the top of low memory
//! 0xd000_0000  virtio-mmio devices, 4 KiB each (the 32-bit MMIO gap up to 4 GiB)
//! 0xfec0_0000  IOAPIC, 0xfee0_0000 LAPIC (in-kernel)
//! 4 GiB        RAM that did not fit below the MMIO gap
//! ```

/// The GDT used to enter long mode (or 32-bit protected mode for PVH).
pub const BOOT_GDT_START: u64 = 0x500;
/// Number of GDT entries: null, code, data, TSS.
pub const BOOT_GDT_MAX: usize = 4;
/// An empty IDT: the guest installs its own before enabling interrupts.
pub const BOOT_IDT_START: u64 = 0x520;

/// The PVH `hvm_start_info` structure.
pub const PVH_INFO_START: u64 = 0x6000;
/// The PVH module list (the initrd), right after `hvm_start_info`.
pub const PVH_MODLIST_START: u64 = 0x6040;
/// The PVH memory map; PVH and Linux boot are exclusive, so it may share the zero page's place.
pub const PVH_MEMMAP_START: u64 = 0x7000;

/// The Linux zero page (`struct boot_params`).
pub const ZERO_PAGE_START: u64 = 0x7000;
/// Initial stack pointer of the boot vCPU.
pub const BOOT_STACK_POINTER: u64 = 0x8ff0;

/// Page map level 4 table of the identity map.
pub const PML4_START: u64 = 0x9000;
/// Page directory pointer table of the identity map.
pub const PDPTE_START: u64 = 0xa000;
/// Page directory (2 MiB pages) of the identity map.
pub const PDE_START: u64 = 0xb000;

/// The kernel command line.
pub const CMDLINE_START: u64 = 0x20000;
/// Room for the command line, NUL included (the kernel's COMMAND_LINE_SIZE).
pub const CMDLINE_MAX_SIZE: usize = 2048;

/// Start of the extended BIOS data area; RAM below it is usable by the guest.
pub const EBDA_START: u64 = 0x9fc00;
/// The MP floating pointer, followed by the MP configuration table: the first KiB of the
/// EBDA, where Linux looks for them.
pub const MPTABLE_START: u64 = EBDA_START;
/// Room for the MP floating pointer and configuration table.
pub const MPTABLE_MAX_SIZE: usize = 0x400;
/// Start of high memory; the kernel is loaded at or above it.
pub const HIMEM_START: u64 = 0x100000;

/// Start of the 32-bit MMIO gap, where virtio-mmio devices live.
pub const MMIO_MEM_START: u64 = 0xd000_0000;
/// First address past the 32-bit address space.
pub const FIRST_ADDR_PAST_32BITS: u64 = 1 << 32;
/// Size of one virtio-mmio device window.
pub const MMIO_DEVICE_SIZE: u64 = 0x1000;

/// The in-kernel IOAPIC's registers.
pub const IOAPIC_START: u64 = 0xfec0_0000;
/// The in-kernel local APICs' registers (the architectural default base).
pub const LAPIC_START: u64 = 0xfee0_0000;

/// KVM's TSS (three pages), just below the BIOS area at the top of 4 GiB.
pub const KVM_TSS_ADDRESS: u64 = 0xfffb_d000;
/// KVM's identity map page, right below the TSS.
pub const KVM_IDENTITY_MAP_ADDRESS: u64 = 0xfffb_c000;

/// The serial port COM1.
pub const SERIAL_PORT_BASE: u16 = 0x3f8;
/// Number of COM1 registers.
pub const SERIAL_PORT_SIZE: u16 = 8;
/// COM1's interrupt line.
pub const SERIAL_IRQ: u32 = 4;
/// The i8042 controller's data and command ports (0x60, 0x64).
pub const I8042_PORT_BASE: u16 = 0x60;
/// The i8042 port window (0x60..=0x64).
pub const I8042_PORT_SIZE: u16 = 5;
/// First interrupt line given to virtio-mmio devices.
pub const IRQ_BASE: u32 = 5;
/// Last usable IOAPIC interrupt line.
pub const IRQ_MAX: u32 = 23;
