//! A container's statistics as containerd reads them: the guest's cgroup v2 figures (the
//! agent's `StatsContainerResponse`) turned into `io.containerd.cgroups.v2.Metrics`, which
//! `ctr task metrics` and the CRI read.

use containerd_shim_protos::cgroups_v2::metrics::{
    CPUStat, MemoryEvents, MemoryStat, Metrics, PidsStat,
};
use containerd_shim_protos::protobuf::MessageField;
use protocols::agent::StatsContainerResponse;

pub fn metrics_from(s: &StatsContainerResponse) -> Metrics {
    let stat = |key: &str| s.memory_stat.get(key).copied().unwrap_or(0);
    Metrics {
        pids: MessageField::some(PidsStat {
            current: s.pids_current,
            limit: s.pids_limit,
            ..Default::default()
        }),
        cpu: MessageField::some(CPUStat {
            usage_usec: s.cpu_usage_usec,
            user_usec: s.cpu_user_usec,
            system_usec: s.cpu_system_usec,
            nr_periods: s.cpu_nr_periods,
            nr_throttled: s.cpu_nr_throttled,
            throttled_usec: s.cpu_throttled_usec,
            ..Default::default()
        }),
        memory: MessageField::some(MemoryStat {
            anon: stat("anon"),
            file: stat("file"),
            kernel_stack: stat("kernel_stack"),
            slab: stat("slab"),
            sock: stat("sock"),
            shmem: stat("shmem"),
            file_mapped: stat("file_mapped"),
            file_dirty: stat("file_dirty"),
            file_writeback: stat("file_writeback"),
            anon_thp: stat("anon_thp"),
            inactive_anon: stat("inactive_anon"),
            active_anon: stat("active_anon"),
            inactive_file: stat("inactive_file"),
            active_file: stat("active_file"),
            unevictable: stat("unevictable"),
            slab_reclaimable: stat("slab_reclaimable"),
            slab_unreclaimable: stat("slab_unreclaimable"),
            pgfault: stat("pgfault"),
            pgmajfault: stat("pgmajfault"),
            workingset_refault: stat("workingset_refault"),
            workingset_activate: stat("workingset_activate"),
            workingset_nodereclaim: stat("workingset_nodereclaim"),
            pgrefill: stat("pgrefill"),
            pgscan: stat("pgscan"),
            pgsteal: stat("pgsteal"),
            pgactivate: stat("pgactivate"),
            pgdeactivate: stat("pgdeactivate"),
            pglazyfree: stat("pglazyfree"),
            pglazyfreed: stat("pglazyfreed"),
            thp_fault_alloc: stat("thp_fault_alloc"),
            thp_collapse_alloc: stat("thp_collapse_alloc"),
            usage: s.memory_usage,
            usage_limit: s.memory_usage_limit,
            swap_usage: s.memory_swap_usage,
            swap_limit: s.memory_swap_limit,
            ..Default::default()
        }),
        memory_events: MessageField::some(MemoryEvents {
            low: s.memory_events_low,
            high: s.memory_events_high,
            max: s.memory_events_max,
            oom: s.memory_events_oom,
            oom_kill: s.memory_events_oom_kill,
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_figures_land_in_containerd_fields() {
        let mut s = StatsContainerResponse {
            pids_current: 3,
            pids_limit: 20,
            cpu_usage_usec: 1500,
            memory_usage: 4096,
            memory_usage_limit: 33554432,
            memory_events_oom_kill: 1,
            ..Default::default()
        };
        s.memory_stat.insert("anon".into(), 1024);
        s.memory_stat.insert("pgfault".into(), 7);
        let m = metrics_from(&s);
        assert_eq!((m.pids.current, m.pids.limit), (3, 20));
        assert_eq!(m.cpu.usage_usec, 1500);
        assert_eq!((m.memory.usage, m.memory.usage_limit), (4096, 33554432));
        assert_eq!(
            (m.memory.anon, m.memory.pgfault, m.memory.file),
            (1024, 7, 0)
        );
        assert_eq!(m.memory_events.oom_kill, 1);
    }
}
