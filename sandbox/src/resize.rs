//! In-place pod resize (issue 43). When kubelet resizes a running pod it sends each
//! container's new limits (Task.Update with OCI `LinuxResources`); the pod's total is the
//! sum of its containers' limits, and the VM that runs it needs the size
//! [`crate::sizing`]'s rule gives that total. It fits when that size is within what the
//! VM can be: its boot size plus the RuntimeClass's resize ceiling (`pod_resize_vcpus`,
//! `pod_resize_memory`). Past it, the resize is refused with a message kubelet shows in
//! the pod's resize condition.
//!
//! A VM booted with a ceiling has the ceiling's vCPUs and memory from the start, kept
//! from its pod: the vCPUs offline (the agent brings them up), the memory in the balloon
//! (the hypervisor lets it out). A resize moves the VM to the size the new total needs,
//! both ways ([`Plan`]): what grows before the container's limits are raised, what
//! shrinks after they are lowered. Without a ceiling the VM keeps its boot size, and a
//! resize within it only changes the guest's cgroups.

use serde_json::Value;
use std::path::Path;

const MIB: u64 = 1 << 20;

/// One container's CPU and memory limits, as its OCI `LinuxResources` give them.
/// `None`: no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// CPU limit in millionths of a CPU (quota / period × 1e6), to sum without rounding.
    pub cpu_micros: Option<u64>,
    pub memory_bytes: Option<u64>,
}

impl Limits {
    /// Reads `cpu.quota`, `cpu.period` and `memory.limit` of an OCI `LinuxResources`
    /// (JSON, as containerd sends it in Task.Update). A quota or limit of 0 or below, or
    /// absent, is no limit.
    pub fn of_resources(res: &Value) -> Self {
        let quota = res.pointer("/cpu/quota").and_then(Value::as_i64);
        let period = res.pointer("/cpu/period").and_then(Value::as_u64);
        let cpu_micros = match (quota, period) {
            (Some(q), Some(p)) if q > 0 && p > 0 => Some((q as u64 * 1_000_000).div_ceil(p)),
            _ => None,
        };
        let memory_bytes = res
            .pointer("/memory/limit")
            .and_then(Value::as_i64)
            .filter(|&m| m > 0)
            .map(|m| m as u64);
        Limits {
            cpu_micros,
            memory_bytes,
        }
    }
}

/// A pod's total: the sum of its containers' limits; `None` when a container has none
/// (the pod then takes what the VM has, and asks for no particular size).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodTotal {
    pub cpus: Option<u32>,
    pub memory_mib: Option<u64>,
}

/// Sums the containers' limits into the pod's total (whole CPUs, rounded up, and MiB).
pub fn pod_total<'a>(containers: impl IntoIterator<Item = &'a Limits>) -> PodTotal {
    let mut cpu = Some(0u64);
    let mut mem = Some(0u64);
    let mut any = false;
    for l in containers {
        any = true;
        cpu = cpu.zip(l.cpu_micros).map(|(a, b)| a + b);
        mem = mem.zip(l.memory_bytes).map(|(a, b)| a + b);
    }
    if !any {
        return PodTotal {
            cpus: None,
            memory_mib: None,
        };
    }
    PodTotal {
        cpus: cpu.map(|c| c.div_ceil(1_000_000) as u32),
        memory_mib: mem.map(|m| m.div_ceil(MIB)),
    }
}

/// What a pod's VM is and may become.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Room {
    /// The VM's boot size.
    pub boot_vcpus: u32,
    pub boot_memory_mib: u32,
    /// How far it may grow past it (`pod_resize_vcpus` / `pod_resize_memory`).
    pub resize_vcpus: u32,
    pub resize_memory_mib: u32,
    /// The sizing rule's overheads (`pod_vcpus_overhead`, `pod_memory_overhead`).
    pub vcpus_overhead: u32,
    pub memory_overhead_mib: u32,
    /// `hypervisor.qemu` or `hypervisor.builtin`, and the configuration file.
    pub section: &'static str,
    pub origin: String,
}

/// The VM size a pod total needs; a figure without a limit keeps the boot size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Needed {
    pub vcpus: u32,
    pub memory_mib: u64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("resize refused: {0}")]
pub struct Refused(String);

/// The VM size `total` needs under `room`'s rule.
fn needed(total: PodTotal, room: &Room) -> Needed {
    Needed {
        vcpus: total
            .cpus
            .map_or(room.boot_vcpus, |c| c + room.vcpus_overhead),
        // As crate::sizing: the limit plus the guest's own need, plus 1/64 for the guest
        // kernel's page descriptors.
        memory_mib: total
            .memory_mib
            .map_or(u64::from(room.boot_memory_mib), |m| {
                ((m + u64::from(room.memory_overhead_mib)) * 64).div_ceil(63)
            }),
    }
}

/// Whether a resize from `before` to `total` may go ahead: a figure that grows must fit in
/// the boot size plus the ceiling (one that stays or shrinks always may: containers
/// created with limits past the boot size, in a pod without limits, keep them); else
/// why not, naming the key to raise.
pub fn fit(before: PodTotal, total: PodTotal, room: &Room) -> Result<Needed, Refused> {
    let was = needed(before, room);
    let Needed { vcpus, memory_mib } = needed(total, room);
    let most_vcpus = room.boot_vcpus + room.resize_vcpus;
    let most_memory = u64::from(room.boot_memory_mib) + u64::from(room.resize_memory_mib);
    let cpu_over = vcpus > most_vcpus && vcpus > was.vcpus;
    let mem_over = memory_mib > most_memory && memory_mib > was.memory_mib;
    if !cpu_over && !mem_over {
        return Ok(Needed { vcpus, memory_mib });
    }
    let show = |c: Option<u32>, m: Option<u64>| {
        format!(
            "{} CPU / {} MiB",
            c.map_or("no limit".into(), |c| c.to_string()),
            m.map_or("no limit".into(), |m| m.to_string())
        )
    };
    let asks = format!(
        "the pod asks for {}, its VM needs {vcpus} vCPUs / {memory_mib} MiB",
        show(total.cpus, total.memory_mib)
    );
    if room.resize_vcpus == 0 && room.resize_memory_mib == 0 {
        // No ceiling: no key to raise for this pod (a RuntimeClass with one is another VM).
        return Err(Refused(format!(
            "{asks} but was booted with {} vCPUs / {} MiB and cannot grow past its boot size; \
             recreate the pod with the new limits",
            room.boot_vcpus, room.boot_memory_mib
        )));
    }
    let mut keys = Vec::new();
    if cpu_over {
        keys.push(format!("{}.pod_resize_vcpus", room.section));
    }
    if mem_over {
        keys.push(format!("{}.pod_resize_memory", room.section));
    }
    Err(Refused(format!(
        "{asks} and can grow to at most {most_vcpus} vCPUs / {most_memory} MiB (booted with {} vCPUs \
         / {} MiB + ceiling {} vCPUs / {} MiB); raise {} in {} (the RuntimeClass's configuration) \
         for new pods, or recreate this pod with the new limits",
        room.boot_vcpus,
        room.boot_memory_mib,
        room.resize_vcpus,
        room.resize_memory_mib,
        keys.join(" and "),
        room.origin
    )))
}

/// What a resize does to the VM: its size now and after. A figure changes only where the
/// VM has a ceiling for it; it may then go below the boot size, never past the ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub from: Needed,
    pub to: Needed,
    /// The pod's total after the resize.
    pub pod: PodTotal,
}

/// A VM size change: the vCPUs to have online, the memory (MiB) to give the pod.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Change {
    pub vcpus: Option<u32>,
    pub memory_mib: Option<u32>,
}

impl Change {
    pub fn is_empty(&self) -> bool {
        self.vcpus.is_none() && self.memory_mib.is_none()
    }
}

impl Plan {
    /// The VM's move for a pod that now needs `fits`, from `now`.
    pub fn new(now: Needed, fits: Needed, pod: PodTotal, room: &Room) -> Self {
        let vcpus = if room.resize_vcpus > 0 {
            fits.vcpus.clamp(1, room.boot_vcpus + room.resize_vcpus)
        } else {
            now.vcpus
        };
        let memory_mib = if room.resize_memory_mib > 0 {
            fits.memory_mib.clamp(
                1,
                u64::from(room.boot_memory_mib) + u64::from(room.resize_memory_mib),
            )
        } else {
            now.memory_mib
        };
        Plan {
            from: now,
            to: Needed { vcpus, memory_mib },
            pod,
        }
    }

    /// What grows: done before the container's limits are raised.
    pub fn grow(&self) -> Change {
        Change {
            vcpus: (self.to.vcpus > self.from.vcpus).then_some(self.to.vcpus),
            memory_mib: (self.to.memory_mib > self.from.memory_mib)
                .then_some(self.to.memory_mib as u32),
        }
    }

    /// What shrinks: done after the container's limits are lowered.
    pub fn shrink(&self) -> Change {
        Change {
            vcpus: (self.to.vcpus < self.from.vcpus).then_some(self.to.vcpus),
            memory_mib: (self.to.memory_mib < self.from.memory_mib)
                .then_some(self.to.memory_mib as u32),
        }
    }
}

impl Room {
    /// The room of a VM booted with `cfg` (after [`crate::sizing::apply`], which also
    /// bounds the ceiling by the caps).
    pub fn of_config(cfg: &kata_config::Config) -> Self {
        let (vcpus, memory, sizing, section) =
            if cfg.runtime.hypervisor_name == kata_config::HypervisorName::Builtin {
                let b = &cfg.hypervisor.builtin;
                (
                    b.default_vcpus,
                    b.default_memory,
                    b.sizing,
                    "hypervisor.builtin",
                )
            } else {
                let q = &cfg.hypervisor.qemu;
                (
                    q.default_vcpus,
                    q.default_memory,
                    q.sizing,
                    "hypervisor.qemu",
                )
            };
        Room {
            boot_vcpus: vcpus,
            boot_memory_mib: memory,
            resize_vcpus: sizing.resize_vcpus,
            resize_memory_mib: sizing.resize_memory,
            vcpus_overhead: sizing.vcpus_overhead,
            memory_overhead_mib: sizing.memory_overhead,
            section,
            origin: cfg.origin.display().to_string(),
        }
    }
}

impl Room {
    /// The VM's size at boot.
    pub fn boot_size(&self) -> Needed {
        Needed {
            vcpus: self.boot_vcpus,
            memory_mib: u64::from(self.boot_memory_mib),
        }
    }
}

/// A container's limits as created, from its bundle's `config.json`; `None` for the
/// sandbox (pause) container, whose limits are the pod's own and not one more share.
fn created_limits(bundle: &Path) -> Option<Limits> {
    let text = std::fs::read(bundle.join("config.json")).ok()?;
    let spec: Value = serde_json::from_slice(&text).ok()?;
    let kind = spec
        .pointer("/annotations/io.kubernetes.cri.container-type")
        .and_then(Value::as_str);
    if kind == Some("sandbox") {
        return None;
    }
    Some(
        spec.pointer("/linux/resources")
            .map(Limits::of_resources)
            .unwrap_or_default(),
    )
}

/// One container of the pod as a resize sees it: its id, its bundle (whose `config.json`
/// has the limits it was created with) and the limits Task.Update has given it since.
pub struct Member<'a> {
    pub id: &'a str,
    pub bundle: &'a Path,
    pub given: Option<Limits>,
}

/// The limits an OCI LinuxResources JSON object (Task.Update's) gives.
pub fn limits_of(resources: &[u8]) -> Limits {
    serde_json::from_slice::<Value>(resources)
        .map(|v| Limits::of_resources(&v))
        .unwrap_or_default()
}

/// Whether container `id` may take `new`: the pod's total with it, against the pod's
/// total now, and what the VM then does. `room`: what the VM may become and its size now;
/// without one (a VM the shim did not size) everything may, and the VM stays as it is.
pub fn check(
    id: &str,
    new: Limits,
    members: &[Member<'_>],
    room: Option<(Room, Needed)>,
) -> Result<Option<Plan>, Refused> {
    let Some((room, now)) = room else {
        return Ok(None);
    };
    let mut before = Vec::new();
    let mut after = Vec::new();
    for m in members {
        let Some(created) = created_limits(m.bundle) else {
            continue;
        };
        let limits = m.given.unwrap_or(created);
        before.push(limits);
        after.push(if m.id == id { new } else { limits });
    }
    let total = pod_total(&after);
    let fits = fit(pod_total(&before), total, &room)?;
    Ok(Some(Plan::new(now, fits, total, &room)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn room(resize_vcpus: u32, resize_memory_mib: u32) -> Room {
        Room {
            boot_vcpus: 1,
            boot_memory_mib: 358,
            resize_vcpus,
            resize_memory_mib,
            vcpus_overhead: 0,
            memory_overhead_mib: 96,
            section: "hypervisor.qemu",
            origin: "/etc/kata-containers/configuration.toml".into(),
        }
    }

    fn limits(cpu: &str, mem: &str) -> Limits {
        let (q, p) = match cpu {
            "" => (0, 0),
            c => (c.parse::<i64>().unwrap_or(0), 100_000),
        };
        let m: i64 = mem.parse().unwrap_or(0);
        Limits::of_resources(&json!({"cpu": {"quota": q, "period": p}, "memory": {"limit": m}}))
    }

    #[test]
    fn limits_read_from_oci_resources() {
        let l = Limits::of_resources(
            &json!({"cpu": {"quota": 150000, "period": 100000, "shares": 1536},
                     "memory": {"limit": 268435456}}),
        );
        assert_eq!(l.cpu_micros, Some(1_500_000));
        assert_eq!(l.memory_bytes, Some(256 * MIB));
        // A quota of -1 (unlimited), or no memory limit, is no limit.
        let l = Limits::of_resources(&json!({"cpu": {"quota": -1, "period": 100000}}));
        assert_eq!(l, Limits::default());
        assert_eq!(Limits::of_resources(&json!({})), Limits::default());
    }

    #[test]
    fn the_pod_total_sums_before_rounding() {
        // 2 × 0.5 CPU is 1 CPU, not 2.
        let t = pod_total(&[limits("50000", "134217728"), limits("50000", "134217728")]);
        assert_eq!(
            t,
            PodTotal {
                cpus: Some(1),
                memory_mib: Some(256)
            }
        );
        // One container without a limit: the pod has none for that figure.
        let t = pod_total(&[limits("100000", "134217728"), limits("", "134217728")]);
        assert_eq!(
            t,
            PodTotal {
                cpus: None,
                memory_mib: Some(256)
            }
        );
        assert_eq!(
            pod_total(&[]),
            PodTotal {
                cpus: None,
                memory_mib: None
            }
        );
    }

    const BOOT: PodTotal = PodTotal {
        cpus: Some(1),
        memory_mib: Some(256),
    };

    #[test]
    fn what_does_not_grow_is_never_refused() {
        // A pod without limits whose container was created with 4 GiB on a smaller VM:
        // lowering the CPU limit is not refused for the memory it already had.
        let before = PodTotal {
            cpus: Some(2),
            memory_mib: Some(4096),
        };
        let after = PodTotal {
            cpus: Some(1),
            memory_mib: Some(4096),
        };
        assert!(fit(before, after, &room(1, 1000)).is_ok());
        // Growing it further is refused.
        let more = PodTotal {
            cpus: Some(1),
            memory_mib: Some(5000),
        };
        let err = fit(before, more, &room(1, 1000))
            .expect_err("grows past")
            .to_string();
        assert!(err.contains("pod_resize_memory"), "{err}");
        assert!(!err.contains("pod_resize_vcpus"), "{err}");
    }

    #[test]
    fn a_resize_within_the_ceiling_fits() {
        // Boot: 1 CPU / 256 MiB pod -> 1 vCPU / 358 MiB. Grow to 2 CPU / 512 MiB.
        let t = PodTotal {
            cpus: Some(2),
            memory_mib: Some(512),
        };
        assert_eq!(
            fit(BOOT, t, &room(1, 300)),
            Ok(Needed {
                vcpus: 2,
                memory_mib: 618
            })
        );
        // Shrinking always fits; no limit keeps the boot size.
        let t = PodTotal {
            cpus: None,
            memory_mib: Some(128),
        };
        assert_eq!(
            fit(BOOT, t, &room(0, 0)),
            Ok(Needed {
                vcpus: 1,
                memory_mib: 228
            })
        );
    }

    const POD: PodTotal = PodTotal {
        cpus: None,
        memory_mib: None,
    };

    #[test]
    fn the_vm_moves_only_where_it_has_a_ceiling_growing_first_shrinking_last() {
        let boot = Needed {
            vcpus: 1,
            memory_mib: 358,
        };
        let big = Needed {
            vcpus: 2,
            memory_mib: 1659,
        };
        // 1 CPU / 256 MiB to 2 CPU / 1536 MiB with room for both: both grow, first.
        let p = Plan::new(boot, big, POD, &room(1, 1400));
        assert_eq!(p.to, big);
        assert_eq!(
            p.grow(),
            Change {
                vcpus: Some(2),
                memory_mib: Some(1659)
            }
        );
        assert!(p.shrink().is_empty());
        // And back: both shrink, last.
        let back = Plan::new(big, boot, POD, &room(1, 1400));
        assert!(back.grow().is_empty());
        assert_eq!(
            back.shrink(),
            Change {
                vcpus: Some(1),
                memory_mib: Some(358)
            }
        );
        // A ceiling for memory only: the vCPUs stay as they are.
        let p = Plan::new(boot, big, POD, &room(0, 1400));
        assert_eq!(p.to.vcpus, 1);
        assert_eq!(p.grow().vcpus, None);
        // No ceiling: the VM never moves (the resize lands in the guest's cgroups only).
        assert!(Plan::new(boot, big, POD, &room(0, 0)).grow().is_empty());
        // Never past the ceiling, even for a pod created past it.
        let p = Plan::new(boot, big, POD, &room(1, 100));
        assert_eq!(p.to.memory_mib, 458);
    }

    /// The pod's total is its containers' (created limits from the bundle, or what an
    /// update gave since), the pause container's left out.
    #[test]
    fn a_check_sums_the_pods_containers_as_given_and_plans_the_vm() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = |name: &str, spec: serde_json::Value| {
            let b = dir.path().join(name);
            std::fs::create_dir(&b).unwrap();
            std::fs::write(b.join("config.json"), spec.to_string()).unwrap();
            b
        };
        let res = |q: i64, mib: i64| {
            json!({"linux": {"resources": {"cpu": {"quota": q, "period": 100000},
                                           "memory": {"limit": mib << 20}}}})
        };
        let pause = bundle(
            "pause",
            json!({"annotations": {"io.kubernetes.cri.container-type": "sandbox"},
                   "linux": {"resources": {"cpu": {"quota": 900000, "period": 100000}}}}),
        );
        let a = bundle("a", res(50000, 128));
        let b = bundle("b", res(50000, 128));
        let members = [
            Member {
                id: "pause",
                bundle: &pause,
                given: None,
            },
            Member {
                id: "a",
                bundle: &a,
                given: None,
            },
            // b was resized to 1 CPU / 256 MiB before.
            Member {
                id: "b",
                bundle: &b,
                given: Some(limits("100000", "268435456")),
            },
        ];
        let boot = room(1, 1000);
        let now = boot.boot_size();
        // a to 1 CPU / 512 MiB: the pod is 2 CPU / 768 MiB, the VM 2 vCPUs / 878 MiB.
        let plan = check(
            "a",
            limits("100000", "536870912"),
            &members,
            Some((boot.clone(), now)),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            plan.to,
            Needed {
                vcpus: 2,
                memory_mib: 878
            }
        );
        assert_eq!(
            plan.grow(),
            Change {
                vcpus: Some(2),
                memory_mib: Some(878)
            }
        );
        // No room (a VM this shim did not size): anything goes, the VM stays.
        assert_eq!(check("a", limits("", ""), &members, None), Ok(None));
    }

    #[test]
    fn past_the_ceiling_is_refused_naming_ask_room_and_key() {
        let t = PodTotal {
            cpus: Some(4),
            memory_mib: Some(512),
        };
        let err = fit(BOOT, t, &room(1, 300))
            .expect_err("past the ceiling")
            .to_string();
        assert!(err.contains("asks for 4 CPU / 512 MiB"), "{err}");
        assert!(err.contains("at most 2 vCPUs / 658 MiB"), "{err}");
        assert!(err.contains("booted with 1 vCPUs / 358 MiB + ceiling 1 vCPUs / 300 MiB"));
        assert!(
            err.contains(
                "raise hypervisor.qemu.pod_resize_vcpus in /etc/kata-containers/configuration.toml"
            ),
            "{err}"
        );
        assert!(!err.contains("pod_resize_memory"), "{err}");
        // Without a ceiling, any growth past the boot size is refused, with no key to raise.
        let err = fit(BOOT, t, &room(0, 0))
            .expect_err("no ceiling")
            .to_string();
        assert!(
            err.contains("asks for 4 CPU / 512 MiB, its VM needs 4 vCPUs / 618 MiB but was booted with 1 vCPUs / 358 MiB and cannot grow"),
            "{err}"
        );
        assert!(!err.contains("pod_resize"), "{err}");
    }
}
