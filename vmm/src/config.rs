//! `vmm.json`: what `kata-vmm --config FILE` boots.

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
pub struct VsockConfig {
    /// The guest's context id (3 or more).
    pub guest_cid: u64,
    /// The unix socket that host programs connect to (`CONNECT <port>\n`).
    pub uds_path: PathBuf,
}

/// The VM to boot.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
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
    /// The hybrid vsock device.
    #[serde(default)]
    pub vsock: Option<VsockConfig>,
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
        if let Some(vsock) = &self.vsock {
            if vsock.guest_cid < 3 {
                return Err(ConfigError::Invalid(format!(
                    "vsock.guest_cid is {}, expected 3 or more",
                    vsock.guest_cid
                )));
            }
        }
        Ok(())
    }
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
}
