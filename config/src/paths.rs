//! Checks that the files the configuration names exist on this host. Kept apart from
//! parsing so that unit tests (and `kata-runtime check`) can parse without them.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::{Config, Error, HypervisorName};

/// The host's memory in MiB (MemTotal), if it can be read.
fn host_memory_mib() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib / 1024)
}

/// What a configured path must be.
#[derive(Clone, Copy)]
enum Kind {
    /// A regular file that can be read.
    File,
    /// A regular file with an execute bit.
    Executable,
}

impl Config {
    /// Checks that the selected backend's binaries, kernel and initrd (and, for QEMU, its
    /// helper daemons) exist and are files (binaries executable), and that the VM's
    /// memory fits this host. Returns the first problem found.
    pub fn validate_paths(&self) -> Result<(), Error> {
        let q = &self.hypervisor.qemu;
        let b = &self.hypervisor.builtin;
        let checks: Vec<(&'static str, &Path, Kind)> = match self.runtime.hypervisor_name {
            HypervisorName::Qemu => vec![
                ("hypervisor.qemu.path", &q.path, Kind::Executable),
                ("hypervisor.qemu.kernel", &q.kernel, Kind::File),
                ("hypervisor.qemu.initrd", &q.initrd, Kind::File),
                (
                    "hypervisor.qemu.virtio_fs_daemon",
                    &q.virtio_fs_daemon,
                    Kind::Executable,
                ),
                (
                    "hypervisor.qemu.vsock_backend",
                    &q.vsock_backend,
                    Kind::Executable,
                ),
            ],
            HypervisorName::Builtin => vec![
                ("hypervisor.builtin.path", &b.path, Kind::Executable),
                ("hypervisor.builtin.kernel", &b.kernel, Kind::File),
                ("hypervisor.builtin.initrd", &b.initrd, Kind::File),
                (
                    "hypervisor.builtin.virtio_fs_daemon",
                    &b.virtio_fs_daemon,
                    Kind::Executable,
                ),
            ],
        };
        for (key, path, kind) in checks {
            check(path, kind).map_err(|problem| Error::Path {
                origin: self.origin.clone(),
                key,
                path: path.to_path_buf(),
                problem,
            })?;
        }
        self.check_memory_fits(host_memory_mib())
    }

    /// A VM cannot have more memory than the host: QEMU would fail to map it, with an
    /// error that names no key. (Overcommit below that is the user's choice.)
    fn check_memory_fits(&self, host_mib: Option<u64>) -> Result<(), Error> {
        let (key, memory) = match self.runtime.hypervisor_name {
            HypervisorName::Qemu => (
                "hypervisor.qemu.default_memory",
                self.hypervisor.qemu.default_memory,
            ),
            HypervisorName::Builtin => (
                "hypervisor.builtin.default_memory",
                self.hypervisor.builtin.default_memory,
            ),
        };
        match host_mib {
            Some(host) if u64::from(memory) > host => Err(Error::Invalid {
                origin: self.origin.clone(),
                key,
                value: memory.to_string(),
                expected: format!("expected at most this host's memory, {host} (MiB)"),
            }),
            _ => Ok(()),
        }
    }
}

fn check(path: &Path, kind: Kind) -> Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => "the file does not exist".to_string(),
        _ => format!("cannot inspect the file: {e}"),
    })?;
    if !meta.is_file() {
        return Err("expected a regular file".into());
    }
    if matches!(kind, Kind::Executable) && meta.permissions().mode() & 0o111 == 0 {
        return Err("the file is not executable".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::Config;

    #[test]
    fn memory_beyond_the_host_names_the_key_and_the_limit() {
        let cfg = Config::from_str(
            "[hypervisor.qemu]\ndefault_memory = 999999999\n",
            "/etc/k.toml",
        )
        .unwrap();
        let err = cfg.check_memory_fits(Some(24_000)).unwrap_err().to_string();
        assert!(err.contains("/etc/k.toml"), "{err}");
        assert!(
            err.contains("hypervisor.qemu.default_memory = 999999999"),
            "{err}"
        );
        assert!(err.contains("24000"), "{err}");
        assert!(
            cfg.check_memory_fits(None).is_ok(),
            "an unknown host size is no error"
        );
        let small = Config::from_str("", "/etc/k.toml").unwrap();
        assert!(small.check_memory_fits(Some(24_000)).is_ok());
    }
}
