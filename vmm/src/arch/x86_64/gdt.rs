//! GDT entries and their translation into KVM segment registers.

use kvm_bindings::kvm_segment;

/// Builds a GDT entry from its flags (the access byte in the low 8 bits and the
/// granularity/size nibble in bits 12..16), base and limit.
pub fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    ((u64::from(base) & 0xff00_0000) << (56 - 24))
        | ((u64::from(flags) & 0x0000_f0ff) << 40)
        | ((u64::from(limit) & 0x000f_0000) << (48 - 16))
        | ((u64::from(base) & 0x00ff_ffff) << 16)
        | (u64::from(limit) & 0x0000_ffff)
}

fn get_base(entry: u64) -> u64 {
    (((entry) & 0xff00_0000_0000_0000) >> 32)
        | (((entry) & 0x0000_00ff_0000_0000) >> 16)
        | (((entry) & 0x0000_0000_ffff_0000) >> 16)
}

fn get_limit(entry: u64) -> u32 {
    let limit =
        ((((entry) & 0x000f_0000_0000_0000) >> 32) | ((entry) & 0x0000_0000_0000_ffff)) as u32;
    // With 4 KiB granularity, the limit counts pages.
    if get_g(entry) == 1 {
        (limit << 12) | 0xfff
    } else {
        limit
    }
}

fn get_g(entry: u64) -> u8 {
    ((entry & 0x0080_0000_0000_0000) >> 55) as u8
}

fn get_db(entry: u64) -> u8 {
    ((entry & 0x0040_0000_0000_0000) >> 54) as u8
}

fn get_l(entry: u64) -> u8 {
    ((entry & 0x0020_0000_0000_0000) >> 53) as u8
}

fn get_avl(entry: u64) -> u8 {
    ((entry & 0x0010_0000_0000_0000) >> 52) as u8
}

fn get_p(entry: u64) -> u8 {
    ((entry & 0x0000_8000_0000_0000) >> 47) as u8
}

fn get_dpl(entry: u64) -> u8 {
    ((entry & 0x0000_6000_0000_0000) >> 45) as u8
}

fn get_s(entry: u64) -> u8 {
    ((entry & 0x0000_1000_0000_0000) >> 44) as u8
}

fn get_type(entry: u64) -> u8 {
    ((entry & 0x0000_0f00_0000_0000) >> 40) as u8
}

/// The KVM segment register that loading GDT entry `table_index` would produce.
pub fn kvm_segment_from_gdt(entry: u64, table_index: u8) -> kvm_segment {
    kvm_segment {
        base: get_base(entry),
        limit: get_limit(entry),
        selector: u16::from(table_index) * 8,
        type_: get_type(entry),
        present: get_p(entry),
        dpl: get_dpl(entry),
        db: get_db(entry),
        s: get_s(entry),
        l: get_l(entry),
        g: get_g(entry),
        avl: get_avl(entry),
        padding: 0,
        unusable: match get_p(entry) {
            0 => 1,
            _ => 0,
        },
    }
}

/// The boot GDT for 64-bit Linux boot: null, 64-bit code, data, TSS.
pub fn long_mode_gdt() -> [u64; 4] {
    [
        gdt_entry(0, 0, 0),
        gdt_entry(0xa09b, 0, 0xfffff),
        gdt_entry(0xc093, 0, 0xfffff),
        gdt_entry(0x808b, 0, 0xfffff),
    ]
}

/// The boot GDT for PVH: null, 32-bit flat code, flat data, TSS.
pub fn protected_mode_gdt() -> [u64; 4] {
    [
        gdt_entry(0, 0, 0),
        gdt_entry(0xc09b, 0, 0xffff_ffff),
        gdt_entry(0xc093, 0, 0xffff_ffff),
        gdt_entry(0x008b, 0, 0x67),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_mode_code_segment() {
        let gdt = long_mode_gdt();
        let cs = kvm_segment_from_gdt(gdt[1], 1);
        assert_eq!(cs.selector, 0x8);
        assert_eq!(cs.l, 1, "64-bit code");
        assert_eq!(cs.db, 0, "D must be clear when L is set");
        assert_eq!(cs.present, 1);
        assert_eq!(cs.s, 1);
        assert_eq!(cs.type_, 0xb);
        assert_eq!(cs.g, 1);
        assert_eq!(cs.limit, 0xffff_ffff);
        assert_eq!(cs.base, 0);
        assert_eq!(gdt[1], 0x00af_9b00_0000_ffff);
    }

    #[test]
    fn data_and_tss_segments() {
        let gdt = long_mode_gdt();
        let ds = kvm_segment_from_gdt(gdt[2], 2);
        assert_eq!((ds.selector, ds.type_, ds.db, ds.l), (0x10, 0x3, 1, 0));
        assert_eq!(gdt[2], 0x00cf_9300_0000_ffff);
        let tss = kvm_segment_from_gdt(gdt[3], 3);
        assert_eq!((tss.selector, tss.type_, tss.s), (0x18, 0xb, 0));
    }

    #[test]
    fn protected_mode_code_is_32_bit() {
        let cs = kvm_segment_from_gdt(protected_mode_gdt()[1], 1);
        assert_eq!((cs.l, cs.db, cs.g), (0, 1, 1));
        assert_eq!(cs.limit, 0xffff_ffff);
    }

    #[test]
    fn base_and_limit_round_trip() {
        let e = gdt_entry(0x0093, 0x1234_5678, 0xabcde);
        let s = kvm_segment_from_gdt(e, 5);
        assert_eq!(s.base, 0x1234_5678);
        assert_eq!(s.limit, 0xabcde);
        assert_eq!(s.selector, 40);
        assert_eq!(s.unusable, 0);
    }
}
