//! The CPUID a vCPU sees: what KVM supports (`KVM_GET_SUPPORTED_CPUID`), with the hypervisor
//! bit set, per-vCPU APIC ids, a flat topology (one socket, one thread per core) and the
//! leaves that KVM cannot virtualise here removed or zeroed.

use kvm_bindings::{kvm_cpuid_entry2, CpuId};

const LEAF_FEATURES: u32 = 0x1;
const LEAF_CACHE_PARAMS: u32 = 0x4;
const LEAF_THERMAL: u32 = 0x6;
const LEAF_PMU: u32 = 0xa;
const LEAF_TOPOLOGY: u32 = 0xb;
const LEAF_TOPOLOGY_V2: u32 = 0x1f;

const ECX_HYPERVISOR_BIT: u32 = 1 << 31;
const ECX_TSC_DEADLINE_BIT: u32 = 1 << 24;
const EDX_HTT_BIT: u32 = 1 << 28;
const ECX_EPB_BIT: u32 = 1 << 3;

/// Topology level types in leaf 0xb ECX[15:8].
const LEVEL_TYPE_THREAD: u32 = 1;
const LEVEL_TYPE_CORE: u32 = 2;

/// Bits of the APIC id used for the core number, enough for `cpu_count` cores.
fn core_id_bits(cpu_count: u8) -> u32 {
    u32::from(cpu_count.max(1))
        .next_power_of_two()
        .trailing_zeros()
}

/// Adjusts one CPUID entry for vCPU `cpu_id` of `cpu_count`.
fn filter_entry(entry: &mut kvm_cpuid_entry2, cpu_id: u8, cpu_count: u8, tsc_deadline: bool) {
    let apic_id = u32::from(cpu_id);
    match entry.function {
        LEAF_FEATURES => {
            entry.ecx |= ECX_HYPERVISOR_BIT;
            if tsc_deadline {
                entry.ecx |= ECX_TSC_DEADLINE_BIT;
            }
            // EBX: [31:24] initial APIC id, [23:16] logical processors per package,
            // [15:8] CLFLUSH line size (kept).
            entry.ebx = (apic_id << 24) | (u32::from(cpu_count) << 16) | (entry.ebx & 0xffff);
            if cpu_count > 1 {
                entry.edx |= EDX_HTT_BIT;
            } else {
                entry.edx &= !EDX_HTT_BIT;
            }
        }
        LEAF_CACHE_PARAMS => {
            // EAX[31:26]: cores per package - 1; EAX[25:14]: threads sharing this cache - 1.
            let cache_level = (entry.eax >> 5) & 0x7;
            let sharing = if cache_level >= 3 {
                u32::from(cpu_count.max(1)) - 1
            } else {
                0
            };
            entry.eax =
                (entry.eax & 0x3fff) | (sharing << 14) | ((u32::from(cpu_count.max(1)) - 1) << 26);
        }
        LEAF_THERMAL => {
            // The energy/performance bias MSR is not emulated.
            entry.ecx &= !ECX_EPB_BIT;
        }
        LEAF_PMU => {
            // No virtual PMU: a nested or emulated KVM cannot count events reliably.
            entry.eax = 0;
            entry.ebx = 0;
            entry.ecx = 0;
            entry.edx = 0;
        }
        LEAF_TOPOLOGY | LEAF_TOPOLOGY_V2 => {
            entry.edx = apic_id;
            match entry.index {
                0 => {
                    entry.eax = 0;
                    entry.ebx = 1;
                    entry.ecx = (LEVEL_TYPE_THREAD << 8) | entry.index;
                }
                1 => {
                    entry.eax = core_id_bits(cpu_count);
                    entry.ebx = u32::from(cpu_count);
                    entry.ecx = (LEVEL_TYPE_CORE << 8) | entry.index;
                }
                _ => {
                    entry.eax = 0;
                    entry.ebx = 0;
                    entry.ecx = entry.index;
                }
            }
        }
        _ => {}
    }
}

/// Filters the supported CPUID for vCPU `cpu_id` of `cpu_count`. `tsc_deadline` says whether
/// KVM emulates the TSC deadline timer (`KVM_CAP_TSC_DEADLINE_TIMER`).
pub fn filter_cpuid(cpuid: &mut CpuId, cpu_id: u8, cpu_count: u8, tsc_deadline: bool) {
    for entry in cpuid.as_mut_slice() {
        filter_entry(entry, cpu_id, cpu_count, tsc_deadline);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(
        function: u32,
        index: u32,
        eax: u32,
        ebx: u32,
        ecx: u32,
        edx: u32,
    ) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            index,
            eax,
            ebx,
            ecx,
            edx,
            ..Default::default()
        }
    }

    fn sample() -> CpuId {
        CpuId::from_entries(&[
            entry(0x1, 0, 0x806ec, 0x0010_0800, 0, 0),
            entry(0x4, 0, 0x121, 0, 0, 0),
            entry(0x4, 3, 0x163, 0, 0, 0),
            entry(0x6, 0, 0, 0, 0x9, 0),
            entry(0xa, 0, 0x0730_0404, 0, 0, 0x603),
            entry(0xb, 0, 7, 7, 7, 7),
            entry(0xb, 1, 7, 7, 7, 7),
            entry(0xb, 2, 7, 7, 7, 7),
        ])
        .unwrap()
    }

    fn find(cpuid: &CpuId, function: u32, index: u32) -> kvm_cpuid_entry2 {
        *cpuid
            .as_slice()
            .iter()
            .find(|e| e.function == function && e.index == index)
            .unwrap()
    }

    #[test]
    fn hypervisor_bit_and_apic_id() {
        let mut cpuid = sample();
        filter_cpuid(&mut cpuid, 2, 4, true);
        let leaf1 = find(&cpuid, 1, 0);
        assert_ne!(leaf1.ecx & ECX_HYPERVISOR_BIT, 0);
        assert_ne!(leaf1.ecx & ECX_TSC_DEADLINE_BIT, 0);
        assert_eq!(leaf1.ebx >> 24, 2, "APIC id");
        assert_eq!((leaf1.ebx >> 16) & 0xff, 4, "logical processors");
        assert_eq!((leaf1.ebx >> 8) & 0xff, 8, "CLFLUSH size kept");
        assert_ne!(leaf1.edx & EDX_HTT_BIT, 0);
    }

    #[test]
    fn topology_leaf() {
        let mut cpuid = sample();
        filter_cpuid(&mut cpuid, 3, 3, false);
        let smt = find(&cpuid, 0xb, 0);
        assert_eq!((smt.eax, smt.ebx, smt.ecx, smt.edx), (0, 1, 0x100, 3));
        let core = find(&cpuid, 0xb, 1);
        assert_eq!((core.eax, core.ebx, core.ecx, core.edx), (2, 3, 0x201, 3));
        let end = find(&cpuid, 0xb, 2);
        assert_eq!((end.eax, end.ebx, end.ecx, end.edx), (0, 0, 2, 3));
    }

    #[test]
    fn pmu_epb_dropped_and_cache_topology() {
        let mut cpuid = sample();
        filter_cpuid(&mut cpuid, 0, 2, false);
        let pmu = find(&cpuid, 0xa, 0);
        assert_eq!((pmu.eax, pmu.edx), (0, 0));
        assert_eq!(find(&cpuid, 6, 0).ecx & ECX_EPB_BIT, 0);
        let l1 = find(&cpuid, 4, 0);
        assert_eq!(l1.eax >> 26, 1);
        assert_eq!((l1.eax >> 14) & 0xfff, 0);
        let l3 = find(&cpuid, 4, 3);
        assert_eq!((l3.eax >> 14) & 0xfff, 1);
        let leaf1 = find(&cpuid, 1, 0);
        assert_eq!(leaf1.ecx & ECX_TSC_DEADLINE_BIT, 0);
    }

    #[test]
    fn single_vcpu_has_no_htt() {
        let mut cpuid = sample();
        filter_cpuid(&mut cpuid, 0, 1, false);
        assert_eq!(find(&cpuid, 1, 0).edx & EDX_HTT_BIT, 0);
        assert_eq!(find(&cpuid, 0xb, 1).eax, 0);
    }
}
