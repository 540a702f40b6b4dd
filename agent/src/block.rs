//! Host block devices the shim attached to the VM for a container (raw block volumes).
//!
//! Each arrives as a SCSI disk on the VM's virtio-scsi controller at an address the
//! shim chose (`BlockDevice.scsi_address`, `<target>:<lun>`). The agent asks the guest
//! kernel to scan that target (`/sys/class/scsi_host/host*/scan`: the guest boots with
//! `scsi_mod.scan=manual`, so the controller's hotplug event alone probes nothing) and
//! waits for the disk (`/sys/bus/scsi/devices/<host>:0:<target>:<lun>/block/<sdX>`),
//! then gives the spec's
//! `linux.devices` entry, which carries the host's major and minor, the guest disk's, so
//! the stage makes the container's node with numbers that mean something here. Device
//! rules naming the host's numbers follow.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::error::{AgentError, Result};
use crate::spec::Spec;

/// How long a disk may take to appear after the shim attached it: the probe is quick,
/// but a loaded host under TCG runs the guest slowly.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(20);
/// Between scans of a target that has no disk yet: the first may come before QEMU has
/// added it.
const RESCAN_EVERY: Duration = Duration::from_millis(500);
/// Between checks of sysfs.
const POLL: Duration = Duration::from_millis(20);

/// A disk the guest found for a container path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestDisk {
    pub container_path: String,
    /// The guest's node name, e.g. `sda`.
    pub name: String,
    pub major: i64,
    pub minor: i64,
}

/// `<target>:<lun>`.
pub fn parse_scsi_address(address: &str) -> Result<(u32, u32)> {
    let bad = || {
        AgentError::InvalidArgument(format!(
            "block device SCSI address {address:?} is not <target>:<lun>"
        ))
    };
    let (t, l) = address.split_once(':').ok_or_else(bad)?;
    Ok((t.parse().map_err(|_| bad())?, l.parse().map_err(|_| bad())?))
}

/// The disk at `<any host>:0:<target>:<lun>` under `sys` (the sysfs root), if the
/// kernel has probed it: its name and `major:minor`.
pub fn find_scsi_disk(sys: &Path, target: u32, lun: u32) -> Option<(String, i64, i64)> {
    let suffix = format!(":0:{target}:{lun}");
    let devices = std::fs::read_dir(sys.join("bus/scsi/devices")).ok()?;
    for entry in devices.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let Some(host) = name.strip_suffix(&suffix) else {
            continue;
        };
        if host.is_empty() || !host.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(mut disks) = std::fs::read_dir(entry.path().join("block")) else {
            continue;
        };
        let Some(Ok(disk)) = disks.next() else {
            continue;
        };
        let disk = disk.file_name().to_string_lossy().into_owned();
        let dev = std::fs::read_to_string(sys.join("class/block").join(&disk).join("dev")).ok()?;
        let (major, minor) = dev.trim().split_once(':')?;
        return Some((disk, major.parse().ok()?, minor.parse().ok()?));
    }
    None
}

/// Asks every SCSI host to scan `target`, `lun` on channel 0 (a disk found already
/// stays as it is).
fn scan(sys: &Path, target: u32, lun: u32) {
    let Ok(hosts) = std::fs::read_dir(sys.join("class/scsi_host")) else {
        return;
    };
    for host in hosts.flatten() {
        let _ = std::fs::write(host.path().join("scan"), format!("0 {target} {lun}"));
    }
}

/// Waits until the disk at `address` is probed, at most `timeout` (blocking).
pub fn wait_for_disk(
    sys: &Path,
    container_path: &str,
    address: &str,
    timeout: Duration,
) -> Result<GuestDisk> {
    let (target, lun) = parse_scsi_address(address)?;
    let start = Instant::now();
    let mut scanned: Option<Instant> = None;
    loop {
        if let Some((name, major, minor)) = find_scsi_disk(sys, target, lun) {
            return Ok(GuestDisk {
                container_path: container_path.to_string(),
                name,
                major,
                minor,
            });
        }
        let waited = start.elapsed();
        if waited >= timeout {
            return Err(AgentError::FailedPrecondition(format!(
                "block device {container_path}: no disk appeared at SCSI address \
                 {target}:{lun} in the guest within {} s (the guest kernel has no disk at \
                 {}/bus/scsi/devices/*:0:{target}:{lun})",
                timeout.as_secs(),
                sys.display()
            )));
        }
        if scanned.is_none_or(|at| at.elapsed() >= RESCAN_EVERY) {
            scan(sys, target, lun);
            scanned = Some(Instant::now());
        }
        std::thread::sleep(POLL);
    }
}

/// Gives each of `disks`' `linux.devices` entries the guest disk's numbers, and the
/// device rules that named the host's numbers of one of them the guest's.
pub fn use_guest_numbers(spec: &mut Spec, disks: &[GuestDisk]) -> Result<()> {
    if disks.is_empty() {
        return Ok(());
    }
    let linux = spec.linux.as_mut().ok_or_else(|| {
        AgentError::InvalidArgument("block devices were sent for a spec without linux".into())
    })?;
    // host (major, minor) → guest, all read before any is changed: numbers may swap.
    let mut renumber = HashMap::new();
    for disk in disks {
        let entry = linux
            .devices
            .iter_mut()
            .find(|d| d.path == disk.container_path && d.typ == "b")
            .ok_or_else(|| {
                AgentError::InvalidArgument(format!(
                    "block device {} was sent, but linux.devices has no block device at that \
                     path",
                    disk.container_path
                ))
            })?;
        renumber.insert((entry.major, entry.minor), (disk.major, disk.minor));
        entry.major = disk.major;
        entry.minor = disk.minor;
    }
    let rules = linux
        .resources
        .as_mut()
        .and_then(|r| r.extra.get_mut("devices"))
        .and_then(Value::as_array_mut);
    for rule in rules.into_iter().flatten() {
        if rule.get("type").and_then(Value::as_str) != Some("b") {
            continue;
        }
        let (Some(major), Some(minor)) = (
            rule.get("major").and_then(Value::as_i64),
            rule.get("minor").and_then(Value::as_i64),
        ) else {
            continue;
        };
        if let Some(&(gmajor, gminor)) = renumber.get(&(major, minor)) {
            rule["major"] = gmajor.into();
            rule["minor"] = gminor.into();
        }
    }
    Ok(())
}

/// The sysfs root the agent reads.
pub fn sysfs() -> PathBuf {
    PathBuf::from("/sys")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: &str) -> Spec {
        serde_json::from_str(json).unwrap()
    }

    fn disk(path: &str, major: i64, minor: i64) -> GuestDisk {
        GuestDisk {
            container_path: path.into(),
            name: "sda".into(),
            major,
            minor,
        }
    }

    #[test]
    fn addresses_are_target_and_lun() {
        assert_eq!(parse_scsi_address("3:0").unwrap(), (3, 0));
        for bad in ["3", "a:0", "3:", ":0", "3:0:1", "-1:0"] {
            assert!(parse_scsi_address(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_entry_and_its_rules_get_the_guests_numbers() {
        let mut s = spec(
            r#"{"linux":{
                "devices":[
                    {"path":"/dev/fuse","type":"c","major":10,"minor":229},
                    {"path":"/dev/xvda","type":"b","major":7,"minor":3,"fileMode":432,"uid":0,"gid":6},
                    {"path":"/dev/xvdb","type":"b","major":8,"minor":0}
                ],
                "resources":{"devices":[
                    {"allow":false,"access":"rwm"},
                    {"allow":true,"type":"c","major":7,"minor":3,"access":"rwm"},
                    {"allow":true,"type":"b","major":7,"minor":3,"access":"rwm"},
                    {"allow":true,"type":"b","major":8,"minor":0,"access":"r"}
                ]}}}"#,
        );
        // The host's 7:3 becomes the guest's 8:0 and the host's 8:0 the guest's 8:16:
        // the rule of the first must not be taken for the second.
        use_guest_numbers(&mut s, &[disk("/dev/xvda", 8, 0), disk("/dev/xvdb", 8, 16)]).unwrap();
        let linux = s.linux.as_ref().unwrap();
        let xvda = &linux.devices[1];
        assert_eq!((xvda.major, xvda.minor), (8, 0));
        assert_eq!(
            (xvda.file_mode, xvda.uid, xvda.gid),
            (Some(432), Some(0), Some(6))
        );
        assert_eq!((linux.devices[2].major, linux.devices[2].minor), (8, 16));
        assert_eq!((linux.devices[0].major, linux.devices[0].minor), (10, 229));
        let rules = linux.resources.as_ref().unwrap().extra["devices"].clone();
        assert_eq!(rules[1]["major"], 7, "a character rule keeps its numbers");
        assert_eq!(
            (rules[2]["major"].clone(), rules[2]["minor"].clone()),
            (8.into(), 0.into())
        );
        assert_eq!(
            (rules[3]["major"].clone(), rules[3]["minor"].clone()),
            (8.into(), 16.into())
        );
        assert_eq!(rules[3]["access"], "r");
    }

    #[test]
    fn a_device_the_spec_does_not_have_is_refused() {
        let mut s = spec(r#"{"linux":{"devices":[]}}"#);
        let e = use_guest_numbers(&mut s, &[disk("/dev/xvda", 8, 0)]).unwrap_err();
        assert!(e.to_string().contains("/dev/xvda"), "{e}");
    }

    #[test]
    fn a_probed_disk_is_found_by_its_address() {
        let sys = tempfile::tempdir().unwrap();
        let dev = sys.path().join("bus/scsi/devices/0:0:3:0/block/sdb");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::create_dir_all(sys.path().join("bus/scsi/devices/0:0:1:0/block/sda")).unwrap();
        std::fs::create_dir_all(sys.path().join("bus/scsi/devices/host0")).unwrap();
        let class = sys.path().join("class/block/sdb");
        std::fs::create_dir_all(&class).unwrap();
        std::fs::write(class.join("dev"), "8:16\n").unwrap();
        assert_eq!(
            find_scsi_disk(sys.path(), 3, 0),
            Some(("sdb".to_string(), 8, 16))
        );
        assert_eq!(find_scsi_disk(sys.path(), 2, 0), None);
        let found = wait_for_disk(sys.path(), "/dev/xvda", "3:0", Duration::ZERO).unwrap();
        assert_eq!(
            (found.name.as_str(), found.major, found.minor),
            ("sdb", 8, 16)
        );
    }

    #[test]
    fn a_disk_that_never_comes_fails_naming_the_device() {
        let sys = tempfile::tempdir().unwrap();
        let e = wait_for_disk(sys.path(), "/dev/xvda", "4:0", Duration::from_millis(50))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/dev/xvda") && e.contains("4:0"), "{e}");
    }
}
