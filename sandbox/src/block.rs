//! Host block devices a container's spec names (raw block volumes, `ctr run --device`).
//!
//! containerd's CRI puts such a device in `linux.devices` as type `b` with the container
//! path and the *host's* major and minor (the host path is not in the spec), plus an
//! allow rule in `linux.resources.devices`. The host's numbers mean nothing in the guest,
//! so the shim finds the host node from them (`/sys/dev/block/MAJ:MIN/uevent`), opens it
//! (QEMU, unprivileged, cannot) and has the hypervisor attach it to the VM; the agent then
//! gives the container a node with the guest's numbers.
//!
//! Character devices (`/dev/null`, `/dev/fuse`, ...) are the guest's own and are left to
//! the agent as they are.

use std::fs::{File, OpenOptions};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde_json::Value;

/// Where the kernel lists block devices by number.
pub const SYS_DEV_BLOCK: &str = "/sys/dev/block";

/// A block device entry of a spec's `linux.devices`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecBlockDevice {
    /// Its path in the container, e.g. `/dev/xvda`.
    pub container_path: String,
    /// The host's numbers.
    pub major: u64,
    pub minor: u64,
    /// The spec's device rules let the container only read it: the VM gets it read-only.
    pub read_only: bool,
}

impl std::fmt::Display for SpecBlockDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "block device {} (host device {}:{})",
            self.container_path, self.major, self.minor
        )
    }
}

/// Why a spec's block device cannot be given to the container.
#[derive(Debug, thiserror::Error)]
pub enum BlockDeviceError {
    #[error("linux.devices entry {path:?}: {why}")]
    BadEntry { path: String, why: String },
    #[error("{device}: the host has no block device {major}:{minor} ({sysfs}: {source})", major = device.major, minor = device.minor)]
    NoHostDevice {
        device: SpecBlockDevice,
        sysfs: PathBuf,
        source: std::io::Error,
    },
    #[error("{device}: {what}")]
    HostNode {
        device: SpecBlockDevice,
        what: String,
    },
}

/// The block devices of `spec`'s `linux.devices`, with whether its device rules allow
/// writing each.
pub fn spec_block_devices(spec: &Value) -> Result<Vec<SpecBlockDevice>, BlockDeviceError> {
    let Some(devices) = spec.pointer("/linux/devices").and_then(Value::as_array) else {
        return Ok(Vec::new());
    };
    let rules = spec
        .pointer("/linux/resources/devices")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut found = Vec::new();
    for d in devices {
        if d.get("type").and_then(Value::as_str) != Some("b") {
            continue;
        }
        let path = d.get("path").and_then(Value::as_str).unwrap_or_default();
        let number = |key: &str| {
            d.get(key)
                .and_then(Value::as_u64)
                .ok_or_else(|| BlockDeviceError::BadEntry {
                    path: path.to_string(),
                    why: format!("its {key} is missing or not a number"),
                })
        };
        if !path.starts_with("/dev/") {
            return Err(BlockDeviceError::BadEntry {
                path: path.to_string(),
                why: "a block device's path must be under /dev/".into(),
            });
        }
        let (major, minor) = (number("major")?, number("minor")?);
        found.push(SpecBlockDevice {
            container_path: path.to_string(),
            major,
            minor,
            read_only: !writable(rules, major, minor),
        });
    }
    Ok(found)
}

/// Whether the last of `rules` that names block device `major:minor` allows writing
/// (OCI device rules apply in order, the last match wins). Without a rule the container
/// could not open it at all; the VM then gets it as the spec has it, writable.
fn writable(rules: &[Value], major: u64, minor: u64) -> bool {
    let matches = |r: &&Value| {
        let typ = r.get("type").and_then(Value::as_str).unwrap_or("a");
        let num = |key: &str, want: u64| match r.get(key) {
            None | Some(Value::Null) => true,
            Some(v) => v.as_i64() == Some(-1) || v.as_u64() == Some(want),
        };
        (typ == "a" || typ == "b") && num("major", major) && num("minor", minor)
    };
    match rules.iter().rev().find(matches) {
        Some(r) => {
            let allow = r.get("allow").and_then(Value::as_bool).unwrap_or(false);
            let access = r.get("access").and_then(Value::as_str).unwrap_or("rwm");
            !allow || access.contains('w')
        }
        None => true,
    }
}

/// The host node of block device `major:minor`, by the name the kernel gives it in
/// `<sys_dev_block>/MAJ:MIN/uevent` (`DEVNAME=loop0` → `/dev/loop0`).
pub fn host_node(sys_dev_block: &Path, major: u64, minor: u64) -> std::io::Result<PathBuf> {
    let uevent = sys_dev_block
        .join(format!("{major}:{minor}"))
        .join("uevent");
    let text = std::fs::read_to_string(&uevent)?;
    let name = text
        .lines()
        .find_map(|l| l.strip_prefix("DEVNAME="))
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{} has no DEVNAME", uevent.display()),
            )
        })?;
    let name = Path::new(name.trim());
    let plain = !name.as_os_str().is_empty()
        && name
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
    if !plain {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{} names {:?}, not a name under /dev",
                uevent.display(),
                name
            ),
        ));
    }
    Ok(Path::new("/dev").join(name))
}

/// Opens the host's block device `device` names, read-only when it is to be, and checks
/// that the node opened is that device.
pub fn open_host_device(device: &SpecBlockDevice) -> Result<OwnedFd, BlockDeviceError> {
    let sysfs = Path::new(SYS_DEV_BLOCK);
    let node = host_node(sysfs, device.major, device.minor).map_err(|source| {
        BlockDeviceError::NoHostDevice {
            device: device.clone(),
            sysfs: sysfs.join(format!("{}:{}", device.major, device.minor)),
            source,
        }
    })?;
    let host_node = |what: String| BlockDeviceError::HostNode {
        device: device.clone(),
        what,
    };
    let file: File = OpenOptions::new()
        .read(true)
        .write(!device.read_only)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(&node)
        .map_err(|e| host_node(format!("opening {}: {e}", node.display())))?;
    let meta = file
        .metadata()
        .map_err(|e| host_node(format!("reading {}: {e}", node.display())))?;
    let rdev = meta.rdev();
    let (major, minor) = (libc::major(rdev) as u64, libc::minor(rdev) as u64);
    if !meta.file_type().is_block_device() || (major, minor) != (device.major, device.minor) {
        return Err(host_node(format!(
            "{} is not that device but {}{major}:{minor}",
            node.display(),
            if meta.file_type().is_block_device() {
                "block device "
            } else {
                "a non-block file "
            }
        )));
    }
    Ok(file.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(devices: Value, rules: Value) -> Value {
        json!({ "linux": { "devices": devices, "resources": { "devices": rules } } })
    }

    #[test]
    fn block_devices_are_taken_and_character_devices_left() {
        let s = spec(
            json!([
                { "path": "/dev/fuse", "type": "c", "major": 10, "minor": 229 },
                { "path": "/dev/xvda", "type": "b", "major": 7, "minor": 3, "fileMode": 432 }
            ]),
            json!([
                { "allow": false, "access": "rwm" },
                { "allow": true, "type": "b", "major": 7, "minor": 3, "access": "rwm" }
            ]),
        );
        assert_eq!(
            spec_block_devices(&s).unwrap(),
            vec![SpecBlockDevice {
                container_path: "/dev/xvda".into(),
                major: 7,
                minor: 3,
                read_only: false,
            }]
        );
        assert!(spec_block_devices(&json!({})).unwrap().is_empty());
        assert!(spec_block_devices(&json!({ "linux": {} }))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn a_device_the_rules_let_only_be_read_is_read_only() {
        let dev = json!([{ "path": "/dev/xvda", "type": "b", "major": 8, "minor": 16 }]);
        let ro = spec(
            dev.clone(),
            json!([
                { "allow": false, "access": "rwm" },
                { "allow": true, "type": "b", "major": 8, "minor": 16, "access": "rm" }
            ]),
        );
        assert!(spec_block_devices(&ro).unwrap()[0].read_only);
        // The last matching rule wins: a later write allow makes it writable.
        let rw = spec(
            dev.clone(),
            json!([
                { "allow": true, "type": "b", "major": 8, "minor": 16, "access": "r" },
                { "allow": true, "type": "a", "access": "rwm" }
            ]),
        );
        assert!(!spec_block_devices(&rw).unwrap()[0].read_only);
        // A rule for another device says nothing about this one.
        let other = spec(
            dev,
            json!([{ "allow": true, "type": "b", "major": 8, "minor": 0, "access": "r" }]),
        );
        assert!(!spec_block_devices(&other).unwrap()[0].read_only);
    }

    #[test]
    fn bad_entries_are_refused_with_their_path() {
        let no_minor = spec(
            json!([{ "path": "/dev/xvda", "type": "b", "major": 8 }]),
            json!([]),
        );
        let e = spec_block_devices(&no_minor).unwrap_err().to_string();
        assert!(e.contains("/dev/xvda") && e.contains("minor"), "{e}");
        let outside = spec(
            json!([{ "path": "/data/disk", "type": "b", "major": 8, "minor": 0 }]),
            json!([]),
        );
        let e = spec_block_devices(&outside).unwrap_err().to_string();
        assert!(e.contains("/data/disk") && e.contains("/dev/"), "{e}");
    }

    #[test]
    fn the_host_node_is_named_by_the_kernels_uevent() {
        let sys = tempfile::tempdir().unwrap();
        let dev = sys.path().join("7:3");
        std::fs::create_dir(&dev).unwrap();
        std::fs::write(
            dev.join("uevent"),
            "MAJOR=7\nMINOR=3\nDEVNAME=loop3\nDEVTYPE=disk\n",
        )
        .unwrap();
        assert_eq!(
            host_node(sys.path(), 7, 3).unwrap(),
            Path::new("/dev/loop3")
        );
        let nested = sys.path().join("253:1");
        std::fs::create_dir(&nested).unwrap();
        std::fs::write(nested.join("uevent"), "DEVNAME=mapper/../../etc/shadow\n").unwrap();
        assert!(host_node(sys.path(), 253, 1).is_err(), "no way out of /dev");
        let unnamed = sys.path().join("8:0");
        std::fs::create_dir(&unnamed).unwrap();
        std::fs::write(unnamed.join("uevent"), "MAJOR=8\n").unwrap();
        assert!(host_node(sys.path(), 8, 0).is_err());
        assert_eq!(
            host_node(sys.path(), 9, 9).unwrap_err().kind(),
            std::io::ErrorKind::NotFound
        );
    }

    #[test]
    fn a_node_of_another_device_is_refused() {
        // /dev/null is 1:3 and a character device: asked for as block device 1:3 it is
        // refused, whatever /sys says.
        let d = SpecBlockDevice {
            container_path: "/dev/xvda".into(),
            major: 1,
            minor: 3,
            read_only: true,
        };
        assert!(open_host_device(&d).is_err());
    }
}
