//! OCI `linux.resources` → cgroup v2 file writes, with runc's conversions.
//!
//! [`plan`] is pure: it turns the resources into a list of `(file, value)` writes, each
//! tagged with the spec field it comes from. [`apply`] performs them on a cgroup
//! directory; a file the guest kernel lacks is an error naming the file and the field.
//! `devices` is not a cgroup v2 file (it would be an eBPF program) and is ignored, as
//! are the v1-only memory knobs (`kernel`, `kernelTCP`, `swappiness`,
//! `disableOOMKiller`).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{write_file, CgroupError};

/// The OCI LinuxResources object (only what cgroup v2 can express).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LinuxResources {
    pub memory: Option<Memory>,
    pub cpu: Option<Cpu>,
    pub pids: Option<Pids>,
    #[serde(rename = "blockIO")]
    pub block_io: Option<BlockIo>,
    pub hugepage_limits: Option<Vec<HugepageLimit>>,
    pub unified: Option<BTreeMap<String, String>>,
    /// v1 only (net_cls/net_prio): rejected when set.
    pub network: Option<serde_json::Value>,
    /// Not supported by this agent: rejected when set.
    pub rdma: Option<serde_json::Value>,
    /// What cgroup v2 cannot express (`devices`, ...): ignored, but kept so the spec
    /// reaches the stage whole.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Memory {
    pub limit: Option<i64>,
    pub reservation: Option<i64>,
    /// memory + swap, as in cgroup v1.
    pub swap: Option<i64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Cpu {
    pub shares: Option<u64>,
    pub quota: Option<i64>,
    pub period: Option<u64>,
    pub realtime_runtime: Option<i64>,
    pub realtime_period: Option<u64>,
    pub cpus: Option<String>,
    pub mems: Option<String>,
    pub idle: Option<i64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Pids {
    pub limit: i64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct BlockIo {
    pub weight: Option<u16>,
    pub throttle_read_bps_device: Option<Vec<ThrottleDevice>>,
    pub throttle_write_bps_device: Option<Vec<ThrottleDevice>>,
    #[serde(rename = "throttleReadIOPSDevice")]
    pub throttle_read_iops_device: Option<Vec<ThrottleDevice>>,
    #[serde(rename = "throttleWriteIOPSDevice")]
    pub throttle_write_iops_device: Option<Vec<ThrottleDevice>>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ThrottleDevice {
    pub major: i64,
    pub minor: i64,
    pub rate: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HugepageLimit {
    pub page_size: String,
    pub limit: u64,
}

/// One write into a cgroup directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileWrite {
    pub file: String,
    pub value: String,
    /// The spec field this write implements, for error messages.
    pub field: String,
}

impl LinuxResources {
    /// Parses an OCI LinuxResources JSON object (UpdateContainer's payload).
    pub fn from_json(bytes: &[u8]) -> Result<LinuxResources, CgroupError> {
        serde_json::from_slice(bytes)
            .map_err(|e| CgroupError::InvalidResources(format!("not a LinuxResources JSON: {e}")))
    }
}

/// Writes `resources` into the cgroup directory `dir`, in [`plan`]'s order.
pub fn apply(dir: &Path, resources: &LinuxResources) -> Result<(), CgroupError> {
    for w in plan(resources)? {
        match write_file(dir, &w.file, &w.value, &w.field) {
            // A kernel without swap support has no swap to limit: "no swap" and "no
            // limit" are what it does anyway. Any other swap limit is an error.
            Err(CgroupError::MissingFile { .. })
                if w.file == "memory.swap.max" && (w.value == "0" || w.value == "max") => {}
            r => r?,
        }
    }
    Ok(())
}

/// The cgroup v2 writes that implement `resources`. Fields that are absent, or zero
/// where OCI means "unset" (Go's zero value), produce no write.
pub fn plan(r: &LinuxResources) -> Result<Vec<FileWrite>, CgroupError> {
    let mut writes = Vec::new();
    let mut add = |file: &str, value: String, field: &str| {
        writes.push(FileWrite {
            file: file.to_string(),
            value,
            field: format!("linux.resources.{field}"),
        })
    };

    if let Some(m) = &r.memory {
        let limit = m.limit.unwrap_or(0);
        let swap = swap_max(m.swap.unwrap_or(0), limit)?;
        if swap != 0 {
            add("memory.swap.max", limit_str(swap), "memory.swap");
        }
        if limit != 0 {
            add("memory.max", limit_str(limit), "memory.limit");
        }
        if let Some(res) = m.reservation.filter(|v| *v != 0) {
            add("memory.low", limit_str(res), "memory.reservation");
        }
    }

    if let Some(c) = &r.cpu {
        if c.realtime_runtime.unwrap_or(0) != 0 || c.realtime_period.unwrap_or(0) != 0 {
            return Err(CgroupError::InvalidResources(
                "cpu.realtimeRuntime/realtimePeriod are not supported with cgroup v2".into(),
            ));
        }
        if let Some(shares) = c.shares.filter(|s| *s != 0) {
            add(
                "cpu.weight",
                shares_to_weight(shares).to_string(),
                "cpu.shares",
            );
        }
        if let Some(idle) = c.idle {
            add("cpu.idle", idle.to_string(), "cpu.idle");
        }
        if let Some(max) = cpu_max(c.quota.unwrap_or(0), c.period.unwrap_or(0)) {
            add("cpu.max", max, "cpu.quota/period");
        }
        if let Some(cpus) = c.cpus.as_deref().filter(|s| !s.is_empty()) {
            add("cpuset.cpus", cpus.to_string(), "cpu.cpus");
        }
        if let Some(mems) = c.mems.as_deref().filter(|s| !s.is_empty()) {
            add("cpuset.mems", mems.to_string(), "cpu.mems");
        }
    }

    if let Some(p) = &r.pids {
        let value = if p.limit <= 0 {
            "max".to_string()
        } else {
            p.limit.to_string()
        };
        add("pids.max", value, "pids.limit");
    }

    if let Some(b) = &r.block_io {
        if let Some(weight) = b.weight.filter(|w| *w != 0) {
            add(
                "io.weight",
                blkio_weight_to_io_weight(weight).to_string(),
                "blockIO.weight",
            );
        }
        let throttles = [
            ("rbps", &b.throttle_read_bps_device, "throttleReadBpsDevice"),
            (
                "wbps",
                &b.throttle_write_bps_device,
                "throttleWriteBpsDevice",
            ),
            (
                "riops",
                &b.throttle_read_iops_device,
                "throttleReadIOPSDevice",
            ),
            (
                "wiops",
                &b.throttle_write_iops_device,
                "throttleWriteIOPSDevice",
            ),
        ];
        for (key, devices, field) in throttles {
            for d in devices.iter().flatten() {
                let rate = if d.rate == 0 {
                    "max".to_string()
                } else {
                    d.rate.to_string()
                };
                let value = format!("{}:{} {key}={rate}", d.major, d.minor);
                add("io.max", value, &format!("blockIO.{field}"));
            }
        }
    }

    for h in r.hugepage_limits.iter().flatten() {
        if h.page_size.is_empty() || h.page_size.contains('/') {
            return Err(CgroupError::InvalidResources(format!(
                "hugepageLimits.pageSize {:?} is not a page size",
                h.page_size
            )));
        }
        add(
            &format!("hugetlb.{}.max", h.page_size),
            h.limit.to_string(),
            "hugepageLimits",
        );
    }

    if r.network.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(CgroupError::InvalidResources(
            "network (net_cls/net_prio) exists only in cgroup v1".into(),
        ));
    }
    if r.rdma.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(CgroupError::InvalidResources(
            "rdma limits are not supported by this agent".into(),
        ));
    }

    // Last, so that they win over the fields above (as in runc).
    for (key, value) in r.unified.iter().flatten() {
        if key.is_empty() || key.contains('/') || key.starts_with('.') || !key.contains('.') {
            return Err(CgroupError::InvalidResources(format!(
                "unified key {key:?} is not a cgroup file name"
            )));
        }
        add(key, value.clone(), &format!("unified.{key}"));
    }
    Ok(writes)
}

/// A memory figure as cgroup v2 writes it: negative = "max".
fn limit_str(v: i64) -> String {
    if v < 0 {
        "max".into()
    } else {
        v.to_string()
    }
}

/// OCI's `memory.swap` is memory+swap (cgroup v1); cgroup v2's `memory.swap.max` is
/// swap alone. runc's `ConvertMemorySwapToCgroupV2Value`: 0 = unset, -1 = max.
pub fn swap_max(swap: i64, limit: i64) -> Result<i64, CgroupError> {
    if limit == -1 && swap == 0 {
        // Unlimited memory without a swap setting means unlimited swap too.
        return Ok(-1);
    }
    if swap == -1 || swap == 0 {
        return Ok(swap);
    }
    if limit == 0 || limit == -1 {
        return Err(CgroupError::InvalidResources(
            "memory.swap needs a memory.limit".into(),
        ));
    }
    if limit < 0 || swap < 0 {
        return Err(CgroupError::InvalidResources(format!(
            "memory.limit {limit} / memory.swap {swap} must be positive or -1"
        )));
    }
    if swap < limit {
        return Err(CgroupError::InvalidResources(format!(
            "memory.swap {swap} (memory+swap) must be >= memory.limit {limit}"
        )));
    }
    Ok(swap - limit)
}

/// runc's `ConvertCPUSharesToCgroupV2Value`: shares [2, 262144] → weight [1, 10000].
pub fn shares_to_weight(shares: u64) -> u64 {
    let shares = shares.clamp(2, 262_144);
    1 + ((shares - 2) * 9999) / 262_142
}

/// `cpu.max` as runc writes it: "max" or the quota, then the period if one is given.
pub fn cpu_max(quota: i64, period: u64) -> Option<String> {
    if quota == 0 && period == 0 {
        return None;
    }
    let mut value = if quota > 0 {
        quota.to_string()
    } else {
        "max".to_string()
    };
    if period != 0 {
        value.push_str(&format!(" {period}"));
    }
    Some(value)
}

/// runc's `convertBlkIOToIOWeightValue`: blkio weight [10, 1000] → io.weight [1, 10000].
pub fn blkio_weight_to_io_weight(weight: u16) -> u64 {
    let weight = u64::from(weight.clamp(10, 1000));
    1 + (weight - 10) * 9999 / 990
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writes(json: &str) -> Vec<(String, String)> {
        let r = LinuxResources::from_json(json.as_bytes()).expect("parse");
        plan(&r)
            .expect("plan")
            .into_iter()
            .map(|w| (w.file, w.value))
            .collect()
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(f, v)| (f.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn shares_convert_like_runc() {
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(1024), 39);
        assert_eq!(shares_to_weight(262_144), 10_000);
        assert_eq!(shares_to_weight(1), 1);
        assert_eq!(shares_to_weight(u64::MAX), 10_000);
    }

    #[test]
    fn swap_is_memory_plus_swap_in_oci() {
        assert_eq!(swap_max(0, 100).expect("unset"), 0);
        assert_eq!(swap_max(-1, 100).expect("max"), -1);
        assert_eq!(swap_max(0, -1).expect("unlimited"), -1);
        assert_eq!(swap_max(300, 100).expect("diff"), 200);
        assert_eq!(swap_max(100, 100).expect("no swap"), 0);
        assert!(swap_max(50, 100).is_err());
        assert!(swap_max(50, 0).is_err());
    }

    #[test]
    fn cpu_max_forms() {
        assert_eq!(cpu_max(0, 0), None);
        assert_eq!(cpu_max(50_000, 100_000).as_deref(), Some("50000 100000"));
        assert_eq!(cpu_max(-1, 100_000).as_deref(), Some("max 100000"));
        assert_eq!(cpu_max(20_000, 0).as_deref(), Some("20000"));
    }

    #[test]
    fn full_resources_map_to_files() {
        let json = r#"{
            "devices": [{"allow": false, "access": "rwm"}],
            "memory": {"limit": 33554432, "reservation": 16777216, "swap": 67108864},
            "cpu": {"shares": 1024, "quota": 50000, "period": 100000, "cpus": "0-1", "mems": "0"},
            "pids": {"limit": 0},
            "hugepageLimits": null,
            "unified": {"memory.high": "30000000"}
        }"#;
        assert_eq!(
            writes(json),
            pairs(&[
                ("memory.swap.max", "33554432"),
                ("memory.max", "33554432"),
                ("memory.low", "16777216"),
                ("cpu.weight", "39"),
                ("cpu.max", "50000 100000"),
                ("cpuset.cpus", "0-1"),
                ("cpuset.mems", "0"),
                ("pids.max", "max"),
                ("memory.high", "30000000"),
            ])
        );
    }

    #[test]
    fn unset_fields_write_nothing_and_minus_one_is_max() {
        assert!(writes(r#"{"memory": {}, "cpu": {"shares": 0}}"#).is_empty());
        assert_eq!(
            writes(r#"{"memory": {"limit": -1}, "pids": {"limit": 7}}"#),
            pairs(&[
                ("memory.swap.max", "max"),
                ("memory.max", "max"),
                ("pids.max", "7")
            ])
        );
    }

    #[test]
    fn spec_resources_and_bad_input() {
        let spec = br#"{"process":{"args":["sh"],"cwd":"/"},"root":{"path":"/r"},
            "linux":{"resources":{"pids":{"limit":3}}}}"#;
        let spec = crate::spec::Spec::from_json(spec).expect("parse");
        let r = spec.linux.and_then(|l| l.resources).expect("resources");
        assert_eq!(r.pids.map(|p| p.limit), Some(3));
        let bad_key = LinuxResources::from_json(br#"{"unified":{"../x":"1"}}"#).expect("parse");
        assert!(plan(&bad_key).is_err());
        let rt = LinuxResources::from_json(br#"{"cpu":{"realtimeRuntime":5}}"#).expect("parse");
        assert!(plan(&rt).unwrap_err().to_string().contains("realtime"));
    }

    #[test]
    fn apply_writes_files_and_names_missing_ones() {
        let dir = std::env::temp_dir().join(format!("cg-apply-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        for f in ["memory.max", "cpu.max", "cpu.weight", "pids.max"] {
            std::fs::write(dir.join(f), "").expect("seed");
        }
        // No memory.swap.max here (a kernel without swap): swap == limit means no swap.
        let ok = LinuxResources::from_json(
            br#"{"memory":{"limit":1048576,"swap":1048576},"cpu":{"shares":2,"quota":1000,"period":10000},"pids":{"limit":-1}}"#,
        )
        .expect("parse");
        apply(&dir, &ok).expect("apply");
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).expect("read");
        assert_eq!(read("memory.max"), "1048576");
        assert_eq!(read("cpu.max"), "1000 10000");
        assert_eq!(read("cpu.weight"), "1");
        assert_eq!(read("pids.max"), "max");

        let swap = LinuxResources::from_json(br#"{"memory":{"limit":1048576,"swap":2097152}}"#)
            .expect("parse");
        let err = apply(&dir, &swap).expect_err("no swap file").to_string();
        assert!(
            err.contains("memory.swap.max") && err.contains("linux.resources.memory.swap"),
            "{err}"
        );
        let cpuset = LinuxResources::from_json(br#"{"cpu":{"cpus":"0"}}"#).expect("parse");
        let err = apply(&dir, &cpuset).expect_err("no cpuset").to_string();
        assert!(
            err.contains("cpuset.cpus") && err.contains("linux.resources.cpu.cpus"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
