//! `vmm.json`: the contract between the builtin backend, which writes it, and
//! `kata-vmm --config FILE`, which boots what it describes. One typed model for both sides
//! (kata-vmm re-exports this module as `vmm::config`); every struct rejects unknown fields,
//! so a key one side adds and the other does not know fails at once with the key named.
//!
//! This module only reads the file it is given; it touches nothing else.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Errors while reading the configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("Cannot read the VMM configuration {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid JSON for [`VmConfig`].
    #[error("The VMM configuration {path} is invalid: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// A value is out of range.
    #[error("The VMM configuration is invalid: {0}")]
    Invalid(String),
}

/// The hybrid vsock device: guest CID and the host unix socket.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct VsockConfig {
    /// The guest's context id (3 or more).
    pub guest_cid: u64,
    /// The unix socket that host programs connect to (`CONNECT <port>\n`).
    pub uds_path: PathBuf,
}

/// A virtio-blk disk backed by a host file (or block device).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BlockConfig {
    /// The backing file.
    pub path: PathBuf,
    /// Refuse guest writes (the device offers VIRTIO_BLK_F_RO).
    #[serde(default)]
    pub read_only: bool,
    /// The serial the guest reads with VIRTIO_BLK_T_GET_ID (at most 20 bytes); default: none.
    #[serde(default)]
    pub serial: Option<String>,
}

/// A virtio-net interface on an existing host tap device.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NetConfig {
    /// The tap interface name (at most 15 bytes), created beforehand or by us if missing.
    pub tap: String,
    /// The guest MAC address, `aa:bb:cc:dd:ee:ff`; default: one derived from the tap name.
    #[serde(default)]
    pub mac: Option<String>,
}

/// A virtio-fs share served by a vhost-user daemon (virtiofsd).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FsConfig {
    /// virtiofsd's vhost-user socket (`--socket-path`).
    pub socket: PathBuf,
    /// The mount tag the guest uses (`mount -t virtiofs <tag> <dir>`), at most 36 bytes.
    pub tag: String,
    /// Size of each virtqueue.
    #[serde(default = "default_fs_queue_size")]
    pub queue_size: u16,
}

/// The virtio-fs queue size when `vmm.json` gives none.
pub const DEFAULT_FS_QUEUE_SIZE: u16 = 1024;

fn default_fs_queue_size() -> u16 {
    DEFAULT_FS_QUEUE_SIZE
}

/// The VM to boot.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct VmConfig {
    /// An ELF vmlinux (64-bit Linux boot, or PVH if it has the PVH note).
    pub kernel: PathBuf,
    /// An initrd, loaded at the top of low memory.
    #[serde(default)]
    pub initrd: Option<PathBuf>,
    /// The kernel command line; virtio-mmio devices are appended to it.
    #[serde(default)]
    pub cmdline: String,
    /// Number of vCPUs.
    #[serde(default = "default_vcpus")]
    pub vcpus: u8,
    /// Guest RAM in MiB.
    #[serde(default = "default_memory_mib")]
    pub memory_mib: u64,
    /// Where the serial console's output goes; none = discarded.
    #[serde(default)]
    pub serial_log: Option<PathBuf>,
    /// An inherited descriptor (a pipe's write end) the serial console's output goes to,
    /// instead of `serial_log`; the builtin backend's shim reads it into a bounded log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial_fd: Option<i32>,
    /// The hybrid vsock device.
    #[serde(default)]
    pub vsock: Option<VsockConfig>,
    /// virtio-fs shares, after rng and vsock in device order.
    #[serde(default)]
    pub fs: Vec<FsConfig>,
    /// virtio-blk disks, after the shares.
    #[serde(default)]
    pub block: Vec<BlockConfig>,
    /// virtio-net interfaces, after the disks.
    #[serde(default)]
    pub net: Vec<NetConfig>,
    /// Whether to add a virtio-rng device.
    #[serde(default = "default_true")]
    pub rng: bool,
    /// Whether to confine vCPU and device threads with seccomp filters.
    #[serde(default = "default_true")]
    pub seccomp: bool,
    /// A file written (with our pid) once the vCPUs run: the readiness signal for a parent.
    #[serde(default)]
    pub ready_file: Option<PathBuf>,
}

fn default_vcpus() -> u8 {
    1
}

fn default_memory_mib() -> u64 {
    128
}

fn default_true() -> bool {
    true
}

impl VmConfig {
    /// Reads and validates `path`.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let config: VmConfig =
            serde_json::from_str(&text).map_err(|source| ConfigError::Parse {
                path: path.to_path_buf(),
                source,
            })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks ranges that the builder relies on.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.vcpus == 0 || self.vcpus > 32 {
            return Err(ConfigError::Invalid(format!(
                "vcpus is {}, expected 1 to 32",
                self.vcpus
            )));
        }
        if self.memory_mib < 2 || self.memory_mib > 1 << 20 {
            return Err(ConfigError::Invalid(format!(
                "memory_mib is {}, expected 2 to 1048576",
                self.memory_mib
            )));
        }
        if let Some(fd) = self.serial_fd {
            if fd < 3 {
                return Err(ConfigError::Invalid(format!(
                    "serial_fd is {fd}, expected an inherited descriptor, 3 or more"
                )));
            }
        }
        if let Some(vsock) = &self.vsock {
            if vsock.guest_cid < 3 {
                return Err(ConfigError::Invalid(format!(
                    "vsock.guest_cid is {}, expected 3 or more",
                    vsock.guest_cid
                )));
            }
        }
        for fs in &self.fs {
            if fs.tag.is_empty() || fs.tag.len() > 36 {
                return Err(ConfigError::Invalid(format!(
                    "fs tag \"{}\" must be 1 to 36 bytes long",
                    fs.tag
                )));
            }
            if !fs.queue_size.is_power_of_two() || fs.queue_size > 32768 {
                return Err(ConfigError::Invalid(format!(
                    "fs queue_size is {}, expected a power of two up to 32768",
                    fs.queue_size
                )));
            }
        }
        for block in &self.block {
            if block.serial.as_ref().is_some_and(|s| s.len() > 20) {
                return Err(ConfigError::Invalid(format!(
                    "block serial of {} is longer than 20 bytes",
                    block.path.display()
                )));
            }
        }
        for net in &self.net {
            if net.tap.is_empty() || net.tap.len() > 15 {
                return Err(ConfigError::Invalid(format!(
                    "net tap name \"{}\" must be 1 to 15 bytes long",
                    net.tap
                )));
            }
            if let Some(mac) = &net.mac {
                parse_mac(mac)?;
            }
        }
        Ok(())
    }
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(text: &str) -> Result<[u8; 6], ConfigError> {
    let bad = || {
        ConfigError::Invalid(format!(
            "MAC address \"{text}\" is not six hex bytes like 02:00:00:00:00:01"
        ))
    };
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        let part = parts.next().ok_or_else(bad)?;
        if part.len() != 2 {
            return Err(bad());
        }
        *byte = u8::from_str_radix(part, 16).map_err(|_| bad())?;
    }
    if parts.next().is_some() {
        return Err(bad());
    }
    Ok(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_config_gets_defaults() {
        let c: VmConfig = serde_json::from_str(r#"{"kernel": "/k"}"#).unwrap();
        assert_eq!(
            (c.vcpus, c.memory_mib, c.rng, c.seccomp),
            (1, 128, true, true)
        );
        c.validate().unwrap();
    }

    #[test]
    fn full_config_and_validation() {
        let c: VmConfig = serde_json::from_str(
            r#"{"kernel": "/k", "initrd": "/i", "cmdline": "console=ttyS0", "vcpus": 2,
                "memory_mib": 256, "serial_log": "/tmp/s", "rng": false,
                "vsock": {"guest_cid": 3, "uds_path": "/run/v.sock"}}"#,
        )
        .unwrap();
        assert_eq!(c.vsock.as_ref().unwrap().guest_cid, 3);
        c.validate().unwrap();
        let bad = VmConfig {
            vcpus: 0,
            ..c.clone()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("vcpus"));
        let bad = VmConfig {
            vsock: Some(VsockConfig {
                guest_cid: 2,
                uds_path: "/x".into(),
            }),
            ..c
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn unknown_fields_are_refused_by_name() {
        for (text, field) in [
            (r#"{"kernel": "/k", "memory": 128}"#, "memory"),
            (
                r#"{"kernel": "/k", "vsock": {"guest_cid": 3, "uds_path": "/v", "port": 1}}"#,
                "port",
            ),
            (
                r#"{"kernel": "/k", "fs": [{"socket": "/s", "tag": "t", "cache": "auto"}]}"#,
                "cache",
            ),
        ] {
            let e = serde_json::from_str::<VmConfig>(text)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("unknown field `{field}`")),
                "{text}: {e}"
            );
        }
    }

    #[test]
    fn a_file_that_does_not_parse_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vmm.json");
        std::fs::write(&path, r#"{"kernel": "/k", "vcpu": 2}"#).unwrap();
        let e = VmConfig::from_file(&path).unwrap_err().to_string();
        assert!(e.contains(&path.display().to_string()), "{e}");
        assert!(e.contains("vcpu"), "{e}");
    }

    #[test]
    fn devices_parse_and_validate() {
        let c: VmConfig = serde_json::from_str(
            r#"{"kernel": "/k",
                "fs": [{"socket": "/run/fs.sock", "tag": "kataShared"}],
                "block": [{"path": "/img", "read_only": true, "serial": "disk0"}],
                "net": [{"tap": "tap0", "mac": "02:00:00:00:00:01"}]}"#,
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.fs[0].queue_size, 1024);
        assert!(c.block[0].read_only);
        assert_eq!(parse_mac("02:00:00:00:00:01").unwrap(), [2, 0, 0, 0, 0, 1]);
        for bad in [
            "02:00:00:00:00",
            "02:00:00:00:00:01:03",
            "zz:00:00:00:00:01",
            "2:0:0:0:0:1",
        ] {
            assert!(parse_mac(bad).is_err(), "{bad}");
        }
        let mut bad = c.clone();
        bad.net[0].tap = "a-very-long-tap-name".into();
        assert!(bad.validate().unwrap_err().to_string().contains("tap"));
        let mut bad = c.clone();
        bad.fs[0].tag = "x".repeat(37);
        assert!(bad.validate().unwrap_err().to_string().contains("tag"));
        let mut bad = c;
        bad.block[0].serial = Some("s".repeat(21));
        assert!(bad.validate().unwrap_err().to_string().contains("serial"));
        assert!(serde_json::from_str::<VmConfig>(
            r#"{"kernel": "/k", "net": [{"tap": "t", "macc": "x"}]}"#
        )
        .is_err());
    }
}
