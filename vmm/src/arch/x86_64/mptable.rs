//! Intel MultiProcessor tables (MP specification 1.4): how a guest booted without ACPI finds
//! its vCPUs, the IOAPIC and the routing of the ISA interrupt lines.
//!
//! The MP floating pointer and the configuration table that follows it are written at
//! [`MPTABLE_START`], the first KiB of the EBDA, which is the last KiB below 640 KiB that
//! Linux scans when it has no ACPI tables. The table holds, in the order the specification
//! recommends:
//! - one processor entry per vCPU: APIC id = vCPU index (as [`super::cpuid`] reports it),
//!   vCPU 0 the bootstrap processor;
//! - one ISA bus;
//! - the in-kernel IOAPIC at [`IOAPIC_START`], with the first APIC id no vCPU uses;
//! - ISA IRQ n → IOAPIC pin n for n in 0..=[`IRQ_MAX`]: KVM's default GSI routing (set up by
//!   `KVM_CREATE_IRQCHIP`, which we never replace) wires GSI n to IOAPIC pin n, and the
//!   in-kernel PIT raises GSI 0, so the timer is on pin 0, not on the pin 2 that a PC's
//!   8259 cascade would suggest; the serial line and the virtio-mmio lines follow the same
//!   rule. Their flags conform to the ISA bus (edge, active high), which suits lines that
//!   irqfds pulse;
//! - LINT0 as ExtINT and LINT1 as NMI on every local APIC, as [`super::interrupts`] programs
//!   them.

use vm_memory::{ByteValued, Bytes, GuestAddress, GuestMemoryMmap};

use super::layout::{IOAPIC_START, IRQ_MAX, LAPIC_START, MPTABLE_MAX_SIZE, MPTABLE_START};
use super::BootError;

/// "_MP_": the floating pointer's signature.
pub const MPF_SIGNATURE: [u8; 4] = *b"_MP_";
/// "PCMP": the configuration table's signature.
pub const MPC_SIGNATURE: [u8; 4] = *b"PCMP";
/// MP specification revision 1.4.
const MP_SPEC_REV: u8 = 4;
/// OEM id of the configuration table (8 bytes, space padded).
pub const MPC_OEM: [u8; 8] = *b"KATA-VMM";
/// Product id of the configuration table (12 bytes, space padded).
pub const MPC_PRODUCT: [u8; 12] = *b"KVM SMP     ";

/// Entry types of the configuration table.
const MP_PROCESSOR: u8 = 0;
const MP_BUS: u8 = 1;
const MP_IOAPIC: u8 = 2;
const MP_INTSRC: u8 = 3;
const MP_LINTSRC: u8 = 4;

/// The usable flag of a processor entry.
pub const CPU_ENABLED: u8 = 1 << 0;
/// The bootstrap processor flag of a processor entry.
pub const CPU_BOOTSTRAP: u8 = 1 << 1;
/// Local APIC version that KVM's in-kernel LAPIC reports.
pub const LAPIC_VERSION: u8 = 0x14;
/// CPU signature of the processor entries: family 6, model 0, stepping 0. A guest reads the
/// real one from CPUID; Linux ignores this one.
const CPU_SIGNATURE: u32 = 0x600;
/// Feature flags of the processor entries (CPUID.1:EDX): an FPU and an on-chip APIC.
const CPU_FEATURES: u32 = (1 << 0) | (1 << 9);

/// IOAPIC entry flag: usable.
const IOAPIC_ENABLED: u8 = 1;
/// IOAPIC version that KVM's in-kernel IOAPIC reports.
pub const IOAPIC_VERSION: u8 = 0x11;

/// The only bus, and its type.
const ISA_BUS_ID: u8 = 0;
const ISA_BUS_TYPE: [u8; 6] = *b"ISA   ";

/// A vectored interrupt, programmed in the IOAPIC's redirection entry.
pub const INT_TYPE_INT: u8 = 0;
/// A non-maskable interrupt.
pub const INT_TYPE_NMI: u8 = 1;
/// An external (8259) interrupt.
pub const INT_TYPE_EXTINT: u8 = 3;
/// Polarity and trigger mode as the bus defines them (ISA: active high, edge).
const INT_FLAGS_CONFORMING: u16 = 0;
/// Destination of a local interrupt entry meaning "every local APIC".
pub const ALL_LAPICS: u8 = 0xff;

/// The MP floating pointer structure (16 bytes).
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MpFloatingPointer {
    /// "_MP_".
    pub signature: [u8; 4],
    /// Physical address of the configuration table.
    pub physptr: u32,
    /// Length in 16-byte units: 1.
    pub length: u8,
    /// Specification revision: 4 for 1.4.
    pub spec_rev: u8,
    /// Makes the 16 bytes sum to 0.
    pub checksum: u8,
    /// 0: a configuration table is present (no default configuration).
    pub feature1: u8,
    /// Bit 7: IMCR present; 0, virtual wire mode.
    pub feature2: u8,
    /// Reserved.
    pub feature3_5: [u8; 3],
}

/// The configuration table header (44 bytes).
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MpConfigHeader {
    /// "PCMP".
    pub signature: [u8; 4],
    /// Length of the base table, header included.
    pub length: u16,
    /// Specification revision: 4 for 1.4.
    pub spec_rev: u8,
    /// Makes the base table sum to 0.
    pub checksum: u8,
    /// OEM id.
    pub oem: [u8; 8],
    /// Product id.
    pub product: [u8; 12],
    /// Physical address of an OEM table: none.
    pub oem_ptr: u32,
    /// Size of the OEM table: none.
    pub oem_size: u16,
    /// Number of entries after the header.
    pub entry_count: u16,
    /// Physical address of the local APICs.
    pub lapic_addr: u32,
    /// Length of the extended table: none.
    pub ext_length: u16,
    /// Checksum of the extended table.
    pub ext_checksum: u8,
    /// Reserved.
    pub reserved: u8,
}

/// A processor entry (20 bytes).
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MpProcessor {
    /// 0.
    pub entry_type: u8,
    /// Local APIC id.
    pub apic_id: u8,
    /// Local APIC version.
    pub apic_version: u8,
    /// [`CPU_ENABLED`], [`CPU_BOOTSTRAP`].
    pub flags: u8,
    /// CPUID.1:EAX (family, model, stepping).
    pub signature: u32,
    /// CPUID.1:EDX.
    pub features: u32,
    /// Reserved.
    pub reserved: [u32; 2],
}

/// A bus entry (8 bytes).
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MpBus {
    /// 1.
    pub entry_type: u8,
    /// Bus id, referred to by interrupt entries.
    pub bus_id: u8,
    /// Bus type, space padded: "ISA   ".
    pub bus_type: [u8; 6],
}

/// An IOAPIC entry (8 bytes).
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MpIoApic {
    /// 2.
    pub entry_type: u8,
    /// IOAPIC id.
    pub apic_id: u8,
    /// IOAPIC version.
    pub apic_version: u8,
    /// Bit 0: usable.
    pub flags: u8,
    /// Physical address of the IOAPIC.
    pub address: u32,
}

/// An I/O interrupt (type 3) or local interrupt (type 4) entry (8 bytes).
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MpInterrupt {
    /// 3 (I/O interrupt) or 4 (local interrupt).
    pub entry_type: u8,
    /// [`INT_TYPE_INT`], [`INT_TYPE_NMI`] or [`INT_TYPE_EXTINT`].
    pub int_type: u8,
    /// Polarity (bits 1:0) and trigger mode (bits 3:2); 0 conforms to the bus.
    pub flags: u16,
    /// Source bus id.
    pub src_bus: u8,
    /// Interrupt line on the source bus.
    pub src_irq: u8,
    /// Destination IOAPIC id (type 3) or local APIC id, [`ALL_LAPICS`] for all (type 4).
    pub dst_apic: u8,
    /// Destination IOAPIC pin (type 3) or LINTn (type 4).
    pub dst_pin: u8,
}

// SAFETY: each type is `repr(C, packed)` with integer and byte-array fields only: it has no
// padding, and every bit pattern is a valid value.
unsafe impl ByteValued for MpFloatingPointer {}
// SAFETY: as above.
unsafe impl ByteValued for MpConfigHeader {}
// SAFETY: as above.
unsafe impl ByteValued for MpProcessor {}
// SAFETY: as above.
unsafe impl ByteValued for MpBus {}
// SAFETY: as above.
unsafe impl ByteValued for MpIoApic {}
// SAFETY: as above.
unsafe impl ByteValued for MpInterrupt {}

const MPF_SIZE: usize = std::mem::size_of::<MpFloatingPointer>();
const HEADER_SIZE: usize = std::mem::size_of::<MpConfigHeader>();
const PROCESSOR_SIZE: usize = std::mem::size_of::<MpProcessor>();
const ENTRY_SIZE: usize = 8;
/// I/O interrupt entries: ISA IRQs 0 to [`IRQ_MAX`].
const IO_INTERRUPTS: usize = IRQ_MAX as usize + 1;
/// Local interrupt entries: LINT0 and LINT1.
const LOCAL_INTERRUPTS: usize = 2;

/// Bytes taken by the floating pointer and the configuration table for `cpu_count` vCPUs.
pub const fn mptable_size(cpu_count: usize) -> usize {
    MPF_SIZE
        + HEADER_SIZE
        + cpu_count * PROCESSOR_SIZE
        + (1 + 1 + IO_INTERRUPTS + LOCAL_INTERRUPTS) * ENTRY_SIZE
}

/// The most vCPUs whose table fits in [`MPTABLE_MAX_SIZE`].
pub const fn max_cpus() -> usize {
    (MPTABLE_MAX_SIZE - mptable_size(0)) / PROCESSOR_SIZE
}

/// The value that makes `bytes` sum to 0 modulo 256 once added.
fn checksum(bytes: &[u8]) -> u8 {
    bytes
        .iter()
        .fold(0u8, |sum, b| sum.wrapping_add(*b))
        .wrapping_neg()
}

/// The entries of a configuration table, as bytes, and how many there are.
#[derive(Default)]
struct Entries {
    bytes: Vec<u8>,
    count: u16,
}

impl Entries {
    fn push<T: ByteValued>(&mut self, entry: T) {
        self.bytes.extend_from_slice(entry.as_slice());
        self.count += 1;
    }
}

/// The floating pointer and the configuration table for `cpu_count` vCPUs, as they go into
/// guest memory at [`MPTABLE_START`].
pub fn build_mptable(cpu_count: u8) -> Result<Vec<u8>, BootError> {
    let cpus = usize::from(cpu_count);
    if cpus == 0 || cpus > max_cpus() {
        return Err(BootError::MpTableCpuCount {
            count: cpu_count,
            max: max_cpus(),
        });
    }
    let ioapic_id = cpu_count;
    let mut entries = Entries::default();
    for id in 0..cpu_count {
        let bootstrap = if id == 0 { CPU_BOOTSTRAP } else { 0 };
        let cpu = MpProcessor {
            entry_type: MP_PROCESSOR,
            apic_id: id,
            apic_version: LAPIC_VERSION,
            flags: CPU_ENABLED | bootstrap,
            signature: CPU_SIGNATURE,
            features: CPU_FEATURES,
            reserved: [0; 2],
        };
        entries.push(cpu);
    }
    let bus = MpBus {
        entry_type: MP_BUS,
        bus_id: ISA_BUS_ID,
        bus_type: ISA_BUS_TYPE,
    };
    entries.push(bus);
    let ioapic = MpIoApic {
        entry_type: MP_IOAPIC,
        apic_id: ioapic_id,
        apic_version: IOAPIC_VERSION,
        flags: IOAPIC_ENABLED,
        address: IOAPIC_START as u32,
    };
    entries.push(ioapic);
    for irq in 0..=IRQ_MAX as u8 {
        let source = MpInterrupt {
            entry_type: MP_INTSRC,
            int_type: INT_TYPE_INT,
            flags: INT_FLAGS_CONFORMING,
            src_bus: ISA_BUS_ID,
            src_irq: irq,
            dst_apic: ioapic_id,
            dst_pin: irq,
        };
        entries.push(source);
    }
    for (int_type, lint) in [(INT_TYPE_EXTINT, 0), (INT_TYPE_NMI, 1)] {
        let local = MpInterrupt {
            entry_type: MP_LINTSRC,
            int_type,
            flags: INT_FLAGS_CONFORMING,
            src_bus: ISA_BUS_ID,
            src_irq: 0,
            dst_apic: ALL_LAPICS,
            dst_pin: lint,
        };
        entries.push(local);
    }

    let table_len = HEADER_SIZE + entries.bytes.len();
    let mut header = MpConfigHeader {
        signature: MPC_SIGNATURE,
        length: table_len as u16,
        spec_rev: MP_SPEC_REV,
        checksum: 0,
        oem: MPC_OEM,
        product: MPC_PRODUCT,
        oem_ptr: 0,
        oem_size: 0,
        entry_count: entries.count,
        lapic_addr: LAPIC_START as u32,
        ext_length: 0,
        ext_checksum: 0,
        reserved: 0,
    };
    header.checksum = checksum(header.as_slice()).wrapping_add(checksum(&entries.bytes));

    let mut mpf = MpFloatingPointer {
        signature: MPF_SIGNATURE,
        physptr: (MPTABLE_START + MPF_SIZE as u64) as u32,
        length: 1,
        spec_rev: MP_SPEC_REV,
        ..Default::default()
    };
    mpf.checksum = checksum(mpf.as_slice());

    let mut table = Vec::with_capacity(MPF_SIZE + table_len);
    table.extend_from_slice(mpf.as_slice());
    table.extend_from_slice(header.as_slice());
    table.extend_from_slice(&entries.bytes);
    Ok(table)
}

/// Writes the MP floating pointer and configuration table for `cpu_count` vCPUs at
/// [`MPTABLE_START`].
pub fn setup_mptable(mem: &GuestMemoryMmap, cpu_count: u8) -> Result<(), BootError> {
    let table = build_mptable(cpu_count)?;
    mem.write_slice(&table, GuestAddress(MPTABLE_START))
        .map_err(BootError::MpTable)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::x86_64::arch_memory_regions;
    use vm_memory::{Address, GuestMemoryBackend};

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&arch_memory_regions(4 << 20)).unwrap()
    }

    fn sum(mem: &GuestMemoryMmap, addr: u64, len: usize) -> u8 {
        let mut buf = vec![0u8; len];
        mem.read_slice(&mut buf, GuestAddress(addr)).unwrap();
        buf.iter().fold(0u8, |s, b| s.wrapping_add(*b))
    }

    /// What a guest finds when it parses the table back out of memory.
    struct Parsed {
        config_addr: u64,
        header: MpConfigHeader,
        end: u64,
        cpus: Vec<MpProcessor>,
        buses: Vec<MpBus>,
        ioapics: Vec<MpIoApic>,
        io_ints: Vec<MpInterrupt>,
        local_ints: Vec<MpInterrupt>,
    }

    /// Scans the first KiB of the EBDA for the floating pointer, as Linux does, checks both
    /// checksums and walks the entries.
    fn parse(mem: &GuestMemoryMmap) -> Parsed {
        let mpf_addr = (MPTABLE_START..MPTABLE_START + 0x400)
            .step_by(16)
            .find(|a| mem.read_obj::<[u8; 4]>(GuestAddress(*a)).unwrap() == MPF_SIGNATURE)
            .expect("no _MP_ signature in the EBDA");
        let mpf: MpFloatingPointer = mem.read_obj(GuestAddress(mpf_addr)).unwrap();
        assert_eq!(sum(mem, mpf_addr, MPF_SIZE), 0, "floating pointer checksum");
        assert_eq!({ mpf.length }, 1);
        assert_eq!({ mpf.spec_rev }, 4);
        assert_eq!(
            { mpf.feature1 },
            0,
            "a configuration table, not a default one"
        );
        let config_addr = u64::from(mpf.physptr);
        let header: MpConfigHeader = mem.read_obj(GuestAddress(config_addr)).unwrap();
        assert_eq!(header.signature, MPC_SIGNATURE);
        assert_eq!(
            sum(mem, config_addr, usize::from(header.length)),
            0,
            "configuration table checksum"
        );
        let mut parsed = Parsed {
            config_addr,
            header,
            end: config_addr + u64::from(header.length),
            cpus: vec![],
            buses: vec![],
            ioapics: vec![],
            io_ints: vec![],
            local_ints: vec![],
        };
        let mut addr = config_addr + HEADER_SIZE as u64;
        for _ in 0..header.entry_count {
            let a = GuestAddress(addr);
            match mem.read_obj::<u8>(a).unwrap() {
                MP_PROCESSOR => {
                    parsed.cpus.push(mem.read_obj(a).unwrap());
                    addr += PROCESSOR_SIZE as u64;
                    continue;
                }
                MP_BUS => parsed.buses.push(mem.read_obj(a).unwrap()),
                MP_IOAPIC => parsed.ioapics.push(mem.read_obj(a).unwrap()),
                MP_INTSRC => parsed.io_ints.push(mem.read_obj(a).unwrap()),
                MP_LINTSRC => parsed.local_ints.push(mem.read_obj(a).unwrap()),
                other => panic!("unknown entry type {other} at {addr:#x}"),
            }
            addr += ENTRY_SIZE as u64;
        }
        assert_eq!(addr, parsed.end, "entries fill the table exactly");
        parsed
    }

    #[test]
    fn structure_sizes_match_the_spec() {
        assert_eq!(std::mem::size_of::<MpFloatingPointer>(), 16);
        assert_eq!(std::mem::size_of::<MpConfigHeader>(), 44);
        assert_eq!(std::mem::size_of::<MpProcessor>(), 20);
        assert_eq!(std::mem::size_of::<MpBus>(), 8);
        assert_eq!(std::mem::size_of::<MpIoApic>(), 8);
        assert_eq!(std::mem::size_of::<MpInterrupt>(), 8);
    }

    #[test]
    fn table_for_two_vcpus_parses_back() {
        let mem = mem();
        setup_mptable(&mem, 2).unwrap();
        let p = parse(&mem);
        assert_eq!(p.config_addr, MPTABLE_START + 16);
        assert_eq!(p.header.oem, MPC_OEM);
        assert_eq!(p.header.product, MPC_PRODUCT);
        assert_eq!({ p.header.lapic_addr }, 0xfee0_0000);
        assert_eq!({ p.header.spec_rev }, 4);
        assert_eq!({ p.header.entry_count }, 2 + 1 + 1 + 24 + 2);
        assert_eq!(p.end - MPTABLE_START, mptable_size(2) as u64);

        assert_eq!(p.cpus.len(), 2);
        for (i, cpu) in p.cpus.iter().enumerate() {
            assert_eq!(usize::from(cpu.apic_id), i);
            assert_eq!(cpu.apic_version, LAPIC_VERSION);
            assert_ne!(cpu.flags & CPU_ENABLED, 0);
            assert_eq!(
                cpu.flags & CPU_BOOTSTRAP != 0,
                i == 0,
                "BSP flag on vCPU {i}"
            );
            assert_eq!({ cpu.signature } >> 8 & 0xf, 6, "family");
            assert_ne!({ cpu.features } & (1 << 9), 0, "APIC feature");
        }

        assert_eq!(p.buses.len(), 1);
        assert_eq!(&p.buses[0].bus_type, b"ISA   ");
        let bus = p.buses[0].bus_id;

        assert_eq!(p.ioapics.len(), 1);
        let ioapic = p.ioapics[0];
        assert_eq!({ ioapic.address }, 0xfec0_0000);
        assert_eq!(ioapic.apic_version, IOAPIC_VERSION);
        assert_eq!(ioapic.flags & 1, 1, "enabled");
        assert!(p.cpus.iter().all(|c| c.apic_id != ioapic.apic_id));

        assert_eq!(p.io_ints.len(), 24);
        for (irq, int) in p.io_ints.iter().enumerate() {
            assert_eq!(int.int_type, INT_TYPE_INT);
            assert_eq!({ int.flags }, 0);
            assert_eq!(int.src_bus, bus);
            assert_eq!(usize::from(int.src_irq), irq);
            assert_eq!(int.dst_apic, ioapic.apic_id);
            assert_eq!(usize::from(int.dst_pin), irq, "identity routing");
        }

        let lints: Vec<(u8, u8, u8)> = p
            .local_ints
            .iter()
            .map(|l| (l.int_type, l.dst_apic, l.dst_pin))
            .collect();
        assert_eq!(
            lints,
            vec![
                (INT_TYPE_EXTINT, ALL_LAPICS, 0),
                (INT_TYPE_NMI, ALL_LAPICS, 1)
            ]
        );
    }

    #[test]
    fn table_for_the_most_vcpus_stays_in_its_area() {
        let mem = mem();
        setup_mptable(&mem, 32).unwrap();
        let p = parse(&mem);
        assert_eq!(p.cpus.len(), 32);
        assert_eq!(
            p.cpus
                .iter()
                .filter(|c| c.flags & CPU_BOOTSTRAP != 0)
                .count(),
            1
        );
        assert_eq!(p.ioapics[0].apic_id, 32);
        assert!(
            p.end <= MPTABLE_START + MPTABLE_MAX_SIZE as u64,
            "{:#x}",
            p.end
        );
        assert!(max_cpus() >= 32);
        // The area is the first KiB of the EBDA, which the e820 map keeps out of RAM.
        assert_eq!(MPTABLE_START, crate::arch::x86_64::layout::EBDA_START);
        assert!(MPTABLE_START.checked_add(MPTABLE_MAX_SIZE as u64).unwrap() <= 0xa0000);
    }

    #[test]
    fn too_many_vcpus_is_a_clear_error() {
        let max = max_cpus();
        let too_many = u8::try_from(max + 1).unwrap();
        let err = build_mptable(too_many).unwrap_err();
        assert!(
            matches!(err, BootError::MpTableCpuCount { count, max: m } if count == too_many && m == max)
        );
        assert!(err.to_string().contains(&format!("{max}")), "{err}");
        assert!(build_mptable(0).is_err());
        assert!(build_mptable(u8::try_from(max).unwrap()).is_ok());
    }

    #[test]
    fn memory_without_the_ebda_is_an_error() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x1000)]).unwrap();
        assert!(mem.last_addr().raw_value() < MPTABLE_START);
        assert!(matches!(setup_mptable(&mem, 1), Err(BootError::MpTable(_))));
    }
}
