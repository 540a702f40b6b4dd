//! A pod's VM sized by the pod's resources, once, before boot (neither QEMU's microvm nor
//! kata-vmm can add CPUs or memory later).
//!
//! containerd's CRI puts the pod's summed limits on the sandbox container's spec as
//! annotations (`io.kubernetes.cri.sandbox-cpu-quota`, `-cpu-period`, `-cpu-shares`,
//! `-memory`, from kubelet's PodSandboxConfig). The rule, with the hypervisor section's
//! [`PodSizing`]:
//! - vCPUs = ceil(quota / period) + `pod_vcpus_overhead` when the pod has a CPU limit
//!   (quota and period above 0), else `default_vcpus`;
//! - memory = (the limit in MiB + `pod_memory_overhead`) × 64/63 when the pod has a memory
//!   limit (above 0), else `default_memory`: the overhead is the guest's own need, and the
//!   64/63 the guest kernel's page descriptors (64 bytes per 4 KiB page), which it takes
//!   before any of the memory counts as its own;
//! - a size above `default_maxvcpus` / `default_maxmemory` (0: the host's CPUs / memory)
//!   fails the pod, naming its limit and the cap.
//!
//! The guest's containers then get their own limits in the guest's cgroups, so one past its
//! limit is OOM-killed in the guest, not the VM on the host.

use kata_config::PodSizing;
use serde_json::Value;

/// containerd's annotations of the pod's resources on the sandbox container.
pub mod keys {
    pub const CPU_QUOTA: &str = "io.kubernetes.cri.sandbox-cpu-quota";
    pub const CPU_PERIOD: &str = "io.kubernetes.cri.sandbox-cpu-period";
    pub const CPU_SHARES: &str = "io.kubernetes.cri.sandbox-cpu-shares";
    pub const MEMORY: &str = "io.kubernetes.cri.sandbox-memory";
}

const MIB: u64 = 1 << 20;

/// The pod's resource annotations as the spec has them (absent ones are `None`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodResources {
    pub cpu_quota: Option<String>,
    pub cpu_period: Option<String>,
    pub cpu_shares: Option<String>,
    pub memory: Option<String>,
}

impl PodResources {
    /// Reads the annotations of a sandbox container's spec.
    pub fn of_spec(spec: &Value) -> Self {
        let get = |key: &str| {
            spec.pointer("/annotations")
                .and_then(|a| a.get(key))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        PodResources {
            cpu_quota: get(keys::CPU_QUOTA),
            cpu_period: get(keys::CPU_PERIOD),
            cpu_shares: get(keys::CPU_SHARES),
            memory: get(keys::MEMORY),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SizingError {
    #[error("annotation {key} = {value:?} is not {expected}; containerd's CRI sets it from the pod's resources (PodSandboxConfig.linux.resources)")]
    Parse {
        key: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("the pod's {what} ({limit}) needs {needed} {unit}, more than the cap {key} = {cap} ({origin}); lower the pod's limit or raise the cap")]
    OverCap {
        what: &'static str,
        limit: String,
        needed: u64,
        unit: &'static str,
        key: String,
        cap: u64,
        origin: String,
    },
}

/// The size a sandbox VM gets, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmSize {
    pub vcpus: u32,
    pub memory_mib: u32,
    /// How each figure came about, for the shim's log.
    pub why: String,
}

/// The defaults and the rule of the hypervisor section in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    pub default_vcpus: u32,
    pub default_memory: u32,
    pub sizing: PodSizing,
    /// `hypervisor.qemu` or `hypervisor.builtin`, for the caps' names.
    pub section: &'static str,
    /// The configuration file, for the caps' errors.
    pub origin: String,
    /// What a cap of 0 means: the host's CPUs and memory (MiB).
    pub host_cpus: u32,
    pub host_memory: u64,
}

fn number(key: &'static str, value: &Option<String>) -> Result<i64, SizingError> {
    match value.as_deref().map(str::trim) {
        None | Some("") => Ok(0),
        Some(v) => v.parse::<i64>().map_err(|_| SizingError::Parse {
            key,
            value: v.to_string(),
            expected: "a whole number",
        }),
    }
}

/// The VM size for a pod with `res` under `shape`.
pub fn size(res: &PodResources, shape: &Shape) -> Result<VmSize, SizingError> {
    let quota = number(keys::CPU_QUOTA, &res.cpu_quota)?;
    let period = number(keys::CPU_PERIOD, &res.cpu_period)?;
    // Shares weigh CPU time against other pods; they size nothing, but a garbled value
    // is as wrong as any other.
    number(keys::CPU_SHARES, &res.cpu_shares)?;
    let memory = number(keys::MEMORY, &res.memory)?;
    if quota > 0 && period < 0 {
        return Err(SizingError::Parse {
            key: keys::CPU_PERIOD,
            value: period.to_string(),
            expected: "a period of at least 1 (µs) for the quota",
        });
    }

    let (vcpus, cpu_why) = if quota > 0 && period > 0 {
        let limit = (quota as u64).div_ceil(period as u64);
        let vcpus = limit + u64::from(shape.sizing.vcpus_overhead);
        let cap = match shape.sizing.max_vcpus {
            0 => u64::from(shape.host_cpus).max(u64::from(shape.default_vcpus)),
            n => u64::from(n),
        };
        if vcpus > cap {
            return Err(SizingError::OverCap {
                what: "CPU limit",
                limit: format!("{}={quota}, {}={period}", keys::CPU_QUOTA, keys::CPU_PERIOD),
                needed: vcpus,
                unit: "vCPUs",
                key: format!("{}.default_maxvcpus", shape.section),
                cap,
                origin: shape.origin.clone(),
            });
        }
        (
            vcpus as u32,
            format!(
                "{vcpus} vCPUs: CPU limit {quota}/{period} -> {limit} + overhead {}",
                shape.sizing.vcpus_overhead
            ),
        )
    } else {
        (
            shape.default_vcpus,
            format!("{} vCPUs: no CPU limit, default_vcpus", shape.default_vcpus),
        )
    };

    let (memory_mib, mem_why) = if memory > 0 {
        let limit_mib = (memory as u64).div_ceil(MIB);
        let with_overhead = limit_mib + u64::from(shape.sizing.memory_overhead);
        let mib = (with_overhead * 64).div_ceil(63);
        let cap = match shape.sizing.max_memory {
            0 => shape.host_memory.max(u64::from(shape.default_memory)),
            n => u64::from(n),
        };
        if mib > cap {
            return Err(SizingError::OverCap {
                what: "memory limit",
                limit: format!("{}={memory}, {limit_mib} MiB", keys::MEMORY),
                needed: mib,
                unit: "MiB",
                key: format!("{}.default_maxmemory", shape.section),
                cap,
                origin: shape.origin.clone(),
            });
        }
        (
            mib as u32,
            format!(
                "{mib} MiB: memory limit {limit_mib} MiB + overhead {} MiB, + 1/64 for page descriptors",
                shape.sizing.memory_overhead
            ),
        )
    } else {
        (
            shape.default_memory,
            format!(
                "{} MiB: no memory limit, default_memory",
                shape.default_memory
            ),
        )
    };
    Ok(VmSize {
        vcpus,
        memory_mib,
        why: format!("{cpu_why}; {mem_why}"),
    })
}

/// The host's online CPUs and memory (MiB), what caps of 0 stand for.
pub fn host_capacity() -> (u32, u64) {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1);
    let mem_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .unwrap_or(0);
    (cpus, mem_kib / 1024)
}

/// Sizes the VM of the configuration's hypervisor for `res`: the configuration with that
/// section's `default_vcpus` and `default_memory` set to the pod's size.
pub fn apply(
    mut cfg: kata_config::Config,
    res: &PodResources,
) -> Result<(kata_config::Config, VmSize), SizingError> {
    let (host_cpus, host_memory) = host_capacity();
    let origin = cfg.origin.display().to_string();
    let builtin = cfg.runtime.hypervisor_name == kata_config::HypervisorName::Builtin;
    let most = if builtin {
        kata_config::MAX_BUILTIN_VCPUS
    } else {
        kata_config::MAX_VCPUS
    };
    let (vcpus, memory, sizing, section) = if builtin {
        let b = &mut cfg.hypervisor.builtin;
        (
            &mut b.default_vcpus,
            &mut b.default_memory,
            b.sizing,
            "hypervisor.builtin",
        )
    } else {
        let q = &mut cfg.hypervisor.qemu;
        (
            &mut q.default_vcpus,
            &mut q.default_memory,
            q.sizing,
            "hypervisor.qemu",
        )
    };
    let shape = Shape {
        default_vcpus: *vcpus,
        default_memory: *memory,
        sizing,
        section,
        origin,
        // A cap of 0 is the host's CPUs, as many as the VMM takes.
        host_cpus: host_cpus.min(most),
        host_memory,
    };
    let got = size(res, &shape)?;
    *vcpus = got.vcpus;
    *memory = got.memory_mib;
    if !builtin {
        // The resize ceiling stops at the caps: the VM boots with what it may grow to.
        let s = &mut cfg.hypervisor.qemu.sizing;
        let vcpu_cap = match s.max_vcpus {
            0 => host_cpus.min(most),
            n => n,
        };
        let memory_cap = match s.max_memory {
            0 => u32::try_from(host_memory).unwrap_or(u32::MAX),
            n => n,
        };
        s.resize_vcpus = s.resize_vcpus.min(vcpu_cap.saturating_sub(got.vcpus));
        s.resize_memory = s
            .resize_memory
            .min(memory_cap.saturating_sub(got.memory_mib));
    }
    Ok((cfg, got))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape {
            default_vcpus: 1,
            default_memory: 512,
            sizing: PodSizing {
                max_vcpus: 0,
                max_memory: 0,
                vcpus_overhead: 0,
                memory_overhead: 96,
                resize_vcpus: 0,
                resize_memory: 0,
            },
            section: "hypervisor.qemu",
            origin: "/etc/kata-containers/configuration.toml".into(),
            host_cpus: 8,
            host_memory: 16384,
        }
    }

    fn pod(quota: &str, period: &str, memory: &str) -> PodResources {
        PodResources {
            cpu_quota: Some(quota.into()),
            cpu_period: Some(period.into()),
            cpu_shares: Some("2048".into()),
            memory: Some(memory.into()),
        }
    }

    #[test]
    fn a_pod_without_limits_gets_the_defaults() {
        for res in [
            PodResources::default(),
            pod("0", "0", "0"),
            pod("-1", "100000", "0"),
        ] {
            let s = size(&res, &shape()).unwrap();
            assert_eq!((s.vcpus, s.memory_mib), (1, 512), "{res:?}");
            assert!(s.why.contains("no CPU limit") && s.why.contains("no memory limit"));
        }
    }

    #[test]
    fn limits_give_the_size() {
        // 2 CPUs, 1536 MiB: (1536 + 96) * 64/63 = 1657.9 -> 1658.
        let s = size(&pod("200000", "100000", "1610612736"), &shape()).unwrap();
        assert_eq!((s.vcpus, s.memory_mib), (2, 1658), "{}", s.why);
        // Half a CPU is one vCPU; a limit that is not whole MiB rounds up.
        let s = size(&pod("50000", "100000", "1000000"), &shape()).unwrap();
        assert_eq!((s.vcpus, s.memory_mib), (1, 99), "{}", s.why);
        // The overheads add.
        let mut sh = shape();
        sh.sizing.vcpus_overhead = 1;
        sh.sizing.memory_overhead = 0;
        let s = size(&pod("150000", "100000", "134217728"), &sh).unwrap();
        assert_eq!((s.vcpus, s.memory_mib), (3, 131), "{}", s.why);
    }

    #[test]
    fn bad_annotations_name_the_key_and_the_value() {
        let e = size(&pod("200000", "100000", "2Gi"), &shape()).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains(keys::MEMORY) && msg.contains("\"2Gi\""),
            "{msg}"
        );
        let e = size(&pod("lots", "100000", "0"), &shape())
            .unwrap_err()
            .to_string();
        assert!(e.contains(keys::CPU_QUOTA) && e.contains("lots"), "{e}");
        let mut res = pod("0", "0", "0");
        res.cpu_shares = Some("x".into());
        assert!(size(&res, &shape())
            .unwrap_err()
            .to_string()
            .contains(keys::CPU_SHARES));
        let e = size(&pod("100000", "-5", "0"), &shape())
            .unwrap_err()
            .to_string();
        assert!(e.contains(keys::CPU_PERIOD), "{e}");
    }

    #[test]
    fn sizes_past_the_caps_fail_naming_limit_and_cap() {
        let e = size(&pod("1600000", "100000", "0"), &shape())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("1600000") && e.contains("default_maxvcpus = 8") && e.contains("16 vCPUs"),
            "{e}"
        );
        let mut sh = shape();
        sh.sizing.max_memory = 1024;
        let e = size(&pod("0", "0", "2147483648"), &sh)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("2147483648")
                && e.contains("hypervisor.qemu.default_maxmemory = 1024")
                && e.contains("/etc/kata-containers/configuration.toml"),
            "{e}"
        );
        sh.sizing.max_vcpus = 4;
        assert!(size(&pod("400000", "100000", "0"), &sh).is_ok());
    }
}
