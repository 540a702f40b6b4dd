//! Keys whose value is one of a fixed set of words (`accelerator`, `shared_fs`,
//! `virtio_fs_cache`), parsed with an error that lists the allowed words.

use std::fmt;
use std::path::Path;

use crate::Error;

/// A value chosen from a fixed list of words.
pub trait Choice: Copy + Sized + 'static {
    /// Every allowed value, in the order shown in error messages.
    const ALL: &'static [Self];

    /// The word that stands for this value in `configuration.toml`.
    fn as_str(self) -> &'static str;

    /// Parses `value` of `key`, or says which words are allowed.
    fn parse(origin: &Path, key: &'static str, value: &str) -> Result<Self, Error> {
        Self::ALL
            .iter()
            .copied()
            .find(|c| c.as_str() == value)
            .ok_or_else(|| Error::Invalid {
                origin: origin.to_path_buf(),
                key,
                value: format!("{value:?}"),
                expected: format!(
                    "expected one of {}",
                    Self::ALL
                        .iter()
                        .map(|c| c.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })
    }
}

/// Which VMM backend runs sandboxes (`[runtime] hypervisor_name`, as in Kata's runtime-rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HypervisorName {
    /// `qemu-system-x86_64 -M microvm`, configured by `[hypervisor.qemu]`.
    Qemu,
    /// The builtin KVM VMM `kata-vmm`, configured by `[hypervisor.builtin]`.
    Builtin,
}

impl Choice for HypervisorName {
    const ALL: &'static [Self] = &[Self::Qemu, Self::Builtin];

    fn as_str(self) -> &'static str {
        match self {
            Self::Qemu => "qemu",
            Self::Builtin => "builtin",
        }
    }
}

/// Which accelerator QEMU uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accelerator {
    /// KVM where it runs a guest at full speed, else TCG; decided at run time.
    Auto,
    /// Hardware virtualization through `/dev/kvm`.
    Kvm,
    /// QEMU's binary translator; works everywhere, slower.
    Tcg,
}

impl Choice for Accelerator {
    const ALL: &'static [Self] = &[Self::Auto, Self::Kvm, Self::Tcg];

    fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Kvm => "kvm",
            Self::Tcg => "tcg",
        }
    }
}

/// How container root filesystems and volumes reach the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedFs {
    /// virtio-fs served by `virtiofsd` over vhost-user.
    VirtioFs,
}

impl Choice for SharedFs {
    const ALL: &'static [Self] = &[Self::VirtioFs];

    fn as_str(self) -> &'static str {
        match self {
            Self::VirtioFs => "virtio-fs",
        }
    }
}

/// virtiofsd's `--cache` policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VirtioFsCache {
    /// No caching in the guest: every access goes to the host.
    Never,
    /// Cache with timeouts (virtiofsd's default).
    Auto,
    /// Cache everything; only right when the host does not change shared files.
    Always,
}

impl Choice for VirtioFsCache {
    const ALL: &'static [Self] = &[Self::Never, Self::Auto, Self::Always];

    fn as_str(self) -> &'static str {
        match self {
            Self::Never => "never",
            Self::Auto => "auto",
            Self::Always => "always",
        }
    }
}

macro_rules! display_as_str {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    )*};
}
display_as_str!(Accelerator, SharedFs, VirtioFsCache);
