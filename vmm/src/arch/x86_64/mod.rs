//! x86_64 boot: guest RAM layout, the e820 map, the Linux zero page, the PVH start info and
//! the MP table.

pub mod cpuid;
pub mod gdt;
pub mod interrupts;
pub mod layout;
pub mod mptable;
pub mod msr;
pub mod regs;

use linux_loader::configurator::linux::LinuxBootConfigurator;
use linux_loader::configurator::pvh::PvhBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::bootparam::boot_params;
use linux_loader::start_info::{hvm_memmap_table_entry, hvm_modlist_entry, hvm_start_info};
use vm_memory::{Address, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use layout::{
    CMDLINE_MAX_SIZE, EBDA_START, FIRST_ADDR_PAST_32BITS, HIMEM_START, MMIO_MEM_START,
    PVH_INFO_START, PVH_MEMMAP_START, PVH_MODLIST_START, ZERO_PAGE_START,
};

const E820_RAM: u32 = 1;
const E820_RESERVED: u32 = 2;
const KERNEL_BOOT_FLAG_MAGIC: u16 = 0xaa55;
const KERNEL_HDR_MAGIC: u32 = 0x5372_6448;
const KERNEL_LOADER_OTHER: u8 = 0xff;
const KERNEL_MIN_ALIGNMENT_BYTES: u32 = 0x0100_0000;
const XEN_HVM_START_MAGIC_VALUE: u32 = 0x336e_c578;
const PAGE_SIZE: u64 = 4096;

/// Errors while writing the boot structures.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// Guest memory is too small for the boot structures.
    #[error("Guest memory of {0} bytes is too small: at least 2 MiB are needed.")]
    MemoryTooSmall(u64),
    /// The initrd does not fit below the MMIO gap next to the kernel.
    #[error("The initrd ({size} bytes) does not fit in low memory above the kernel (which ends at {kernel_end:#x}).")]
    InitrdTooLarge {
        /// Size of the initrd.
        size: u64,
        /// First address past the kernel.
        kernel_end: u64,
    },
    /// The zero page could not be written.
    #[error("Cannot write the zero page: {0}")]
    ZeroPage(#[source] linux_loader::configurator::Error),
    /// The PVH start info could not be written.
    #[error("Cannot write the PVH start info: {0}")]
    StartInfo(#[source] linux_loader::configurator::Error),
    /// The MP table cannot describe this many vCPUs in the space reserved for it.
    #[error("The MP table cannot describe {count} vCPUs: it holds 1 to {max} in the first KiB of the EBDA.")]
    MpTableCpuCount {
        /// The vCPUs asked for.
        count: u8,
        /// The most that fit.
        max: usize,
    },
    /// The MP table could not be written.
    #[error("Cannot write the MP table: {0}")]
    MpTable(#[source] vm_memory::GuestMemoryError),
}

/// Where an initrd was placed in guest memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitrdConfig {
    /// Guest-physical load address.
    pub address: GuestAddress,
    /// Size in bytes.
    pub size: u64,
}

/// The RAM regions for `size` bytes of guest memory, skipping the MMIO gap below 4 GiB.
pub fn arch_memory_regions(size: u64) -> Vec<(GuestAddress, usize)> {
    if size <= MMIO_MEM_START {
        vec![(GuestAddress(0), size as usize)]
    } else {
        vec![
            (GuestAddress(0), MMIO_MEM_START as usize),
            (
                GuestAddress(FIRST_ADDR_PAST_32BITS),
                (size - MMIO_MEM_START) as usize,
            ),
        ]
    }
}

/// The e820 map for the guest memory: (address, size, type).
pub fn e820_entries(mem: &GuestMemoryMmap) -> Vec<(u64, u64, u32)> {
    let end = mem.last_addr().raw_value() + 1;
    let mut entries = vec![(0, EBDA_START, E820_RAM)];
    let low_end = end.min(MMIO_MEM_START);
    entries.push((HIMEM_START, low_end - HIMEM_START, E820_RAM));
    if end > FIRST_ADDR_PAST_32BITS {
        entries.push((
            FIRST_ADDR_PAST_32BITS,
            end - FIRST_ADDR_PAST_32BITS,
            E820_RAM,
        ));
    }
    // The MMIO gap holds devices, not RAM; saying so keeps the guest from allocating it.
    entries.push((
        MMIO_MEM_START,
        FIRST_ADDR_PAST_32BITS - MMIO_MEM_START,
        E820_RESERVED,
    ));
    entries
}

/// Where an initrd of `size` bytes goes: page-aligned at the top of low memory.
pub fn initrd_load_addr(
    mem: &GuestMemoryMmap,
    size: u64,
    kernel_end: u64,
) -> Result<GuestAddress, BootError> {
    let low_end = (mem.last_addr().raw_value() + 1).min(MMIO_MEM_START);
    let too_large = BootError::InitrdTooLarge { size, kernel_end };
    let start = low_end.checked_sub(size).ok_or(too_large)?;
    let start = start & !(PAGE_SIZE - 1);
    if start < kernel_end.max(HIMEM_START) {
        return Err(BootError::InitrdTooLarge { size, kernel_end });
    }
    Ok(GuestAddress(start))
}

/// The zero page for the 64-bit Linux boot protocol.
pub fn build_boot_params(
    mem: &GuestMemoryMmap,
    cmdline_addr: GuestAddress,
    cmdline_size: usize,
    initrd: Option<InitrdConfig>,
) -> boot_params {
    let mut params = boot_params::default();
    params.hdr.type_of_loader = KERNEL_LOADER_OTHER;
    params.hdr.boot_flag = KERNEL_BOOT_FLAG_MAGIC;
    params.hdr.header = KERNEL_HDR_MAGIC;
    params.hdr.cmd_line_ptr = cmdline_addr.raw_value() as u32;
    params.hdr.cmdline_size = cmdline_size as u32;
    params.hdr.kernel_alignment = KERNEL_MIN_ALIGNMENT_BYTES;
    if let Some(initrd) = initrd {
        params.hdr.ramdisk_image = initrd.address.raw_value() as u32;
        params.hdr.ramdisk_size = initrd.size as u32;
    }
    let entries = e820_entries(mem);
    for (i, (addr, size, type_)) in entries.iter().enumerate() {
        params.e820_table[i].addr = *addr;
        params.e820_table[i].size = *size;
        params.e820_table[i].r#type = *type_;
    }
    params.e820_entries = entries.len() as u8;
    params
}

/// Writes the zero page at [`ZERO_PAGE_START`] and the MP table for `cpu_count` vCPUs.
pub fn configure_linux_boot(
    mem: &GuestMemoryMmap,
    cmdline_addr: GuestAddress,
    cmdline_size: usize,
    initrd: Option<InitrdConfig>,
    cpu_count: u8,
) -> Result<(), BootError> {
    check_size(mem)?;
    mptable::setup_mptable(mem, cpu_count)?;
    let params = build_boot_params(
        mem,
        cmdline_addr,
        cmdline_size.min(CMDLINE_MAX_SIZE),
        initrd,
    );
    LinuxBootConfigurator::write_bootparams::<GuestMemoryMmap>(
        &BootParams::new::<boot_params>(&params, GuestAddress(ZERO_PAGE_START)),
        mem,
    )
    .map_err(BootError::ZeroPage)
}

/// Writes the PVH `hvm_start_info`, its memory map and module list, and the MP table for
/// `cpu_count` vCPUs.
pub fn configure_pvh_boot(
    mem: &GuestMemoryMmap,
    cmdline_addr: GuestAddress,
    initrd: Option<InitrdConfig>,
    cpu_count: u8,
) -> Result<(), BootError> {
    check_size(mem)?;
    mptable::setup_mptable(mem, cpu_count)?;
    let mut start_info = hvm_start_info {
        magic: XEN_HVM_START_MAGIC_VALUE,
        version: 1,
        cmdline_paddr: cmdline_addr.raw_value(),
        memmap_paddr: PVH_MEMMAP_START,
        ..Default::default()
    };
    let memmap: Vec<hvm_memmap_table_entry> = e820_entries(mem)
        .into_iter()
        .map(|(addr, size, type_)| hvm_memmap_table_entry {
            addr,
            size,
            type_,
            reserved: 0,
        })
        .collect();
    start_info.memmap_entries = memmap.len() as u32;
    let mut params = BootParams::new(&start_info, GuestAddress(PVH_INFO_START));
    if let Some(initrd) = initrd {
        start_info.nr_modules = 1;
        start_info.modlist_paddr = PVH_MODLIST_START;
        params = BootParams::new(&start_info, GuestAddress(PVH_INFO_START));
        let module = hvm_modlist_entry {
            paddr: initrd.address.raw_value(),
            size: initrd.size,
            ..Default::default()
        };
        params.set_modules(&[module], GuestAddress(PVH_MODLIST_START));
    }
    params.set_sections(&memmap, GuestAddress(PVH_MEMMAP_START));
    PvhBootConfigurator::write_bootparams::<GuestMemoryMmap>(&params, mem)
        .map_err(BootError::StartInfo)
}

fn check_size(mem: &GuestMemoryMmap) -> Result<(), BootError> {
    let end = mem.last_addr().raw_value() + 1;
    if end < 2 * HIMEM_START {
        return Err(BootError::MemoryTooSmall(end));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::Bytes;

    fn mem(size: u64) -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&arch_memory_regions(size)).unwrap()
    }

    #[test]
    fn regions_split_around_mmio_gap() {
        assert_eq!(
            arch_memory_regions(128 << 20),
            vec![(GuestAddress(0), 128 << 20)]
        );
        let r = arch_memory_regions(4 << 30);
        assert_eq!(r[0], (GuestAddress(0), 0xd000_0000));
        assert_eq!(r[1], (GuestAddress(1 << 32), (4 << 30) - 0xd000_0000));
    }

    #[test]
    fn zero_page_layout() {
        let mem = mem(128 << 20);
        let initrd = InitrdConfig {
            address: GuestAddress(0x700_0000),
            size: 0x1234,
        };
        configure_linux_boot(&mem, GuestAddress(0x20000), 100, Some(initrd), 1).unwrap();
        let z = ZERO_PAGE_START;
        let read32 = |off: u64| mem.read_obj::<u32>(GuestAddress(z + off)).unwrap();
        // Offsets from the kernel's Documentation/arch/x86/zero-page.rst and boot.rst.
        assert_eq!(
            mem.read_obj::<u8>(GuestAddress(z + 0x1e8)).unwrap(),
            3,
            "e820_entries"
        );
        assert_eq!(read32(0x228), 0x20000, "cmd_line_ptr");
        assert_eq!(read32(0x238), 100, "cmdline_size");
        assert_eq!(read32(0x202), KERNEL_HDR_MAGIC, "header");
        assert_eq!(
            mem.read_obj::<u16>(GuestAddress(z + 0x1fe)).unwrap(),
            0xaa55
        );
        assert_eq!(mem.read_obj::<u8>(GuestAddress(z + 0x210)).unwrap(), 0xff);
        assert_eq!(read32(0x218), 0x700_0000, "ramdisk_image");
        assert_eq!(read32(0x21c), 0x1234, "ramdisk_size");
        // e820_table at 0x2d0, 20 bytes per entry.
        let e = |i: u64, f: u64| {
            mem.read_obj::<u64>(GuestAddress(z + 0x2d0 + i * 20 + f))
                .unwrap()
        };
        assert_eq!((e(0, 0), e(0, 8)), (0, EBDA_START));
        assert_eq!((e(1, 0), e(1, 8)), (HIMEM_START, (128 << 20) - HIMEM_START));
        assert_eq!(read32(0x2d0 + 16), E820_RAM);
        assert_eq!((e(2, 0), e(2, 8)), (MMIO_MEM_START, 0x3000_0000));
        assert_eq!(read32(0x2d0 + 2 * 20 + 16), E820_RESERVED);
        // The MP table is written too.
        assert_eq!(
            mem.read_obj::<[u8; 4]>(GuestAddress(layout::MPTABLE_START))
                .unwrap(),
            *b"_MP_"
        );
    }

    #[test]
    fn e820_with_high_memory() {
        let m = mem((4 << 30) + 0x1000_0000);
        let e = e820_entries(&m);
        assert!(e.contains(&(HIMEM_START, MMIO_MEM_START - HIMEM_START, E820_RAM)));
        assert!(e.contains(&(1 << 32, 0x4000_0000, E820_RAM)));
    }

    #[test]
    fn initrd_goes_to_top_of_low_memory() {
        let m = mem(64 << 20);
        let addr = initrd_load_addr(&m, 0x1801, 0x20_0000).unwrap();
        assert_eq!(addr, GuestAddress((64 << 20) - 0x2000));
        assert!(initrd_load_addr(&m, 63 << 20, 0x20_0000).is_err());
    }

    #[test]
    fn pvh_start_info_layout() {
        let mem = mem(64 << 20);
        let initrd = InitrdConfig {
            address: GuestAddress(0x300_0000),
            size: 0x42,
        };
        configure_pvh_boot(&mem, GuestAddress(0x20000), Some(initrd), 2).unwrap();
        let p = PVH_INFO_START;
        let r32 = |off: u64| mem.read_obj::<u32>(GuestAddress(p + off)).unwrap();
        let r64 = |off: u64| mem.read_obj::<u64>(GuestAddress(p + off)).unwrap();
        assert_eq!(r32(0), XEN_HVM_START_MAGIC_VALUE);
        assert_eq!(r32(4), 1);
        assert_eq!(r32(12), 1, "nr_modules");
        assert_eq!(r64(16), PVH_MODLIST_START);
        assert_eq!(r64(24), 0x20000, "cmdline_paddr");
        assert_eq!(r64(40), PVH_MEMMAP_START);
        assert_eq!(r32(48), 3, "memmap_entries");
        let m64 = |a: u64| mem.read_obj::<u64>(GuestAddress(a)).unwrap();
        assert_eq!(m64(PVH_MODLIST_START), 0x300_0000);
        assert_eq!(m64(PVH_MODLIST_START + 8), 0x42);
        assert_eq!(m64(PVH_MEMMAP_START + 24 + 8), (64 << 20) - HIMEM_START);
        assert_eq!(
            mem.read_obj::<[u8; 4]>(GuestAddress(layout::MPTABLE_START))
                .unwrap(),
            *b"_MP_"
        );
    }

    #[test]
    fn too_many_vcpus_for_the_mp_table_fail_the_boot() {
        let mem = mem(64 << 20);
        let err = configure_pvh_boot(&mem, GuestAddress(0x20000), None, u8::MAX).unwrap_err();
        assert!(matches!(err, BootError::MpTableCpuCount { count: 255, .. }));
        assert!(configure_linux_boot(&mem, GuestAddress(0x20000), 1, None, 200).is_err());
    }
}
