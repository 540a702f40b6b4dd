//! Checks that the files the configuration names exist on this host. Kept apart from
//! parsing so that unit tests (and `kata-runtime check`) can parse without them.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::{Config, Error, HypervisorName};

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
    /// helper daemons) exist and are files (binaries executable). Returns the first
    /// problem found.
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
        Ok(())
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
