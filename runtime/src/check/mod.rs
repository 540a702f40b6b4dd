//! `kata-runtime check`: can this host run sandboxes, and if not, what to do.
//!
//! One line per requirement of the configured backend: the configuration itself, KVM
//! ([`kvm`]), the VMM and its helpers ([`vmm`]), vsock and tun ([`host`]), the guest
//! kernel and initrd ([`guest`]), and containerd (`crate::containerd`). The groups run on
//! their own threads: the slowest parts are the KVM probe (at most about 250 ms) and
//! `containerd config dump`.
//!
//! It only reads, runs the tools' `--version`/`help`, and (through the KVM probe)
//! refreshes the probe's cache under `/run/kata-containers/`.

mod containment;
mod guest;
mod host;
mod kvm;
mod pool;
mod vmm;

use std::path::{Path, PathBuf};

use kata_config::{Config, Error, HypervisorName};

use crate::command::find_in_path;
use crate::containerd::{Containerd, SHIM_BINARY};
use crate::effective::Effective;
use crate::report::{Line, Report};

/// The files of the configured backend, with the keys that name them.
pub(crate) struct Backend<'a> {
    pub name: HypervisorName,
    pub kernel: (&'static str, &'a Path),
    pub initrd: (&'static str, &'a Path),
    pub virtiofsd: (&'static str, &'a Path),
    /// The configuration file, as fixes name it.
    pub file: String,
}

impl<'a> Backend<'a> {
    fn of(config: &'a Config, file: String) -> Self {
        let (q, b) = (&config.hypervisor.qemu, &config.hypervisor.builtin);
        match config.runtime.hypervisor_name {
            HypervisorName::Qemu => Self {
                name: HypervisorName::Qemu,
                kernel: ("hypervisor.qemu.kernel", &q.kernel),
                initrd: ("hypervisor.qemu.initrd", &q.initrd),
                virtiofsd: ("hypervisor.qemu.virtio_fs_daemon", &q.virtio_fs_daemon),
                file,
            },
            HypervisorName::Builtin => Self {
                name: HypervisorName::Builtin,
                kernel: ("hypervisor.builtin.kernel", &b.kernel),
                initrd: ("hypervisor.builtin.initrd", &b.initrd),
                virtiofsd: ("hypervisor.builtin.virtio_fs_daemon", &b.virtio_fs_daemon),
                file,
            },
        }
    }
}

/// Runs every check for the configuration `eff` and containerd's `containerd_config`.
pub fn run(eff: &Effective, containerd_config: &Path) -> Report {
    let config = &eff.config;
    let file = eff
        .path
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "the configuration file".into());
    let backend = Backend::of(config, file);
    let lines = std::thread::scope(|s| {
        let kvm = s.spawn(|| {
            let verdict = hypervisor::accel::probe_kvm(&hypervisor::discard_logger());
            vec![kvm::line(&verdict, config, &backend.file)]
        });
        let vmm = s.spawn(|| vmm::lines(config, &backend));
        let guest = s.spawn(|| guest::lines(&backend));
        let containerd = s.spawn(|| {
            let shim: Option<PathBuf> = find_in_path(SHIM_BINARY);
            Containerd::inspect(containerd_config).lines(shim.as_deref())
        });
        let mut lines = vec![config_line(eff)];
        for group in [kvm, vmm] {
            lines.extend(joined(group));
        }
        lines.extend(host::lines(config, &backend));
        lines.push(containment::line(config, &backend));
        lines.push(pool::line(config, &backend.file));
        for group in [guest, containerd] {
            lines.extend(joined(group));
        }
        lines
    });
    Report { lines }
}

fn joined(handle: std::thread::ScopedJoinHandle<'_, Vec<Line>>) -> Vec<Line> {
    handle.join().unwrap_or_else(|_| {
        vec![Line::fail(
            "internal",
            "a check panicked",
            "report this as a bug in kata-runtime",
        )]
    })
}

/// The configuration: found, valid, and naming files that exist.
fn config_line(eff: &Effective) -> Line {
    const NAME: &str = "configuration";
    let defaults_note = "; the lines below use the built-in defaults";
    match (&eff.error, &eff.path) {
        (Some(e @ (Error::NotFound { .. } | Error::Read { .. })), _) => Line::fail(
            NAME,
            format!("{e}{defaults_note}"),
            format!(
                "run `make install` (it installs {}), or pass an existing file to --config",
                kata_config::DEFAULT_CONF_FILE
            ),
        ),
        (Some(e), _) => Line::fail(
            NAME,
            format!("{e}{defaults_note}"),
            "correct that key (config/configuration.toml documents every key and its values)",
        ),
        (None, path) => {
            let file = path
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            let backend = kata_config::Choice::as_str(eff.config.runtime.hypervisor_name);
            match eff.config.validate_paths() {
                Ok(()) => Line::ok(
                    NAME,
                    format!(
                        "{file} (chosen by {}) is valid; backend {backend}",
                        eff.chosen_by
                    ),
                ),
                Err(e) => Line::fail(
                    NAME,
                    e.to_string(),
                    format!(
                        "install what that key names (`make install`), or change the key in {file}"
                    ),
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Status;

    #[test]
    fn a_missing_configuration_fails_and_says_how_to_install_one() {
        let eff = Effective::load(Some(Path::new("/nonexistent/configuration.toml")));
        let line = config_line(&eff);
        assert_eq!(line.status, Status::Fail);
        assert!(
            line.detail.contains("/nonexistent/configuration.toml"),
            "{}",
            line.detail
        );
        assert!(line.detail.contains("built-in defaults"), "{}", line.detail);
    }

    #[test]
    fn a_valid_file_naming_missing_binaries_fails_naming_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "[hypervisor.qemu]\npath = \"/nonexistent/qemu\"\n").unwrap();
        let line = config_line(&Effective::load(Some(&file)));
        assert_eq!(line.status, Status::Fail);
        assert!(
            line.detail.contains("hypervisor.qemu.path"),
            "{}",
            line.detail
        );
        assert!(line.fix.unwrap().contains(&file.display().to_string()));
    }
}
