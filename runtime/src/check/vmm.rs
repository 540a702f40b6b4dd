//! The VMM lines: QEMU (version and the microvm machine) or kata-vmm, and virtiofsd,
//! each taken from the configured backend's section.

use std::path::Path;

use kata_config::{Config, HypervisorName};

use super::Backend;
use crate::command::is_executable;
use crate::components;
use crate::report::Line;

/// The oldest QEMU with everything we use (microvm, vhost-user-fs/vsock devices, memfd).
pub const MIN_QEMU: (u32, u32) = (6, 0);

pub fn lines(config: &Config, backend: &Backend) -> Vec<Line> {
    let mut lines = match backend.name {
        HypervisorName::Qemu => qemu_lines(&config.hypervisor.qemu.path, &backend.file),
        HypervisorName::Builtin => vec![kata_vmm_line(
            &config.hypervisor.builtin.path,
            &backend.file,
        )],
    };
    lines.push(virtiofsd_line(backend));
    lines
}

fn qemu_lines(qemu: &Path, file: &str) -> Vec<Line> {
    let install = format!(
        "install QEMU {}.{} or later (on Debian bookworm: qemu-system-x86 from bookworm-backports), or set hypervisor.qemu.path in {file}",
        MIN_QEMU.0, MIN_QEMU.1
    );
    let version = if is_executable(qemu) {
        components::qemu_version(qemu)
    } else {
        Err(format!("{} is not an executable file", qemu.display()))
    };
    let version_line = match &version {
        Ok(v) => match components::parse_qemu_version(v) {
            Some(found) if found >= MIN_QEMU => {
                Line::ok("qemu", format!("{v} at {}", qemu.display()))
            }
            Some((major, minor)) => Line::fail(
                "qemu",
                format!(
                    "QEMU {major}.{minor} at {} is older than {}.{}",
                    qemu.display(),
                    MIN_QEMU.0,
                    MIN_QEMU.1
                ),
                install.clone(),
            ),
            None => Line::fail(
                "qemu",
                format!("cannot read a version in {v:?}"),
                install.clone(),
            ),
        },
        Err(why) => Line::fail("qemu", why.clone(), install.clone()),
    };
    let microvm = match version.and_then(|_| components::qemu_has_microvm(qemu)) {
        Ok(true) => Line::ok("qemu microvm", "`-machine help` lists microvm"),
        Ok(false) => Line::fail(
            "qemu microvm",
            format!("{} -machine help does not list microvm", qemu.display()),
            "install a QEMU built with the microvm machine (Debian's qemu-system-x86 has it)",
        ),
        Err(why) => Line::fail("qemu microvm", format!("cannot ask QEMU: {why}"), install),
    };
    vec![version_line, microvm]
}

fn kata_vmm_line(path: &Path, file: &str) -> Line {
    if is_executable(path) {
        Line::ok("kata-vmm", format!("{} is executable", path.display()))
    } else {
        Line::fail(
            "kata-vmm",
            format!("{} is not an executable file", path.display()),
            format!("run `make install` (it installs kata-vmm in $(PREFIX)/bin), or set hypervisor.builtin.path in {file}"),
        )
    }
}

fn virtiofsd_line(backend: &Backend) -> Line {
    let (key, path) = backend.virtiofsd;
    let install = format!(
        "install virtiofsd (`cargo install virtiofsd`, which needs libseccomp-dev and libcap-ng-dev; scripts/setup-host.sh puts it under /opt/kata-tools) and set {key} in {}",
        backend.file
    );
    if !is_executable(path) {
        return Line::fail(
            "virtiofsd",
            format!("{} is not an executable file", path.display()),
            install,
        );
    }
    match components::virtiofsd_version(path) {
        Ok(version) => Line::ok(
            "virtiofsd",
            format!("virtiofsd {version} at {}", path.display()),
        ),
        Err(why) => Line::fail("virtiofsd", why, install),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Status;

    #[test]
    fn missing_binaries_fail_naming_path_and_key() {
        let config = Config::from_str(
            "[hypervisor.qemu]\npath = \"/nonexistent/qemu\"\nvirtio_fs_daemon = \"/nonexistent/virtiofsd\"",
            "/tmp/c.toml",
        )
        .unwrap();
        let backend = Backend::of(&config, "/tmp/c.toml".into());
        let lines = lines(&config, &backend);
        let names: Vec<&str> = lines.iter().map(|l| l.requirement).collect();
        assert_eq!(names, ["qemu", "qemu microvm", "virtiofsd"]);
        assert!(lines.iter().all(|l| l.status == Status::Fail), "{lines:?}");
        assert!(lines[0].detail.contains("/nonexistent/qemu"));
        assert!(lines[2]
            .fix
            .as_deref()
            .unwrap()
            .contains("hypervisor.qemu.virtio_fs_daemon in /tmp/c.toml"));
    }

    #[test]
    fn a_binary_that_is_not_qemu_fails() {
        // /bin/true answers --version with nothing.
        let lines = qemu_lines(Path::new("/bin/true"), "/tmp/c.toml");
        assert_eq!(lines[0].status, Status::Fail, "{lines:?}");
        assert_eq!(lines[1].status, Status::Fail, "{lines:?}");
    }

    #[test]
    fn the_builtin_backend_checks_kata_vmm_instead_of_qemu() {
        let config = Config::from_str(
            "[runtime]\nhypervisor_name = \"builtin\"\n[hypervisor.builtin]\npath = \"/bin/true\"",
            "/tmp/c.toml",
        )
        .unwrap();
        let backend = Backend::of(&config, "/tmp/c.toml".into());
        let lines = lines(&config, &backend);
        assert_eq!(lines[0].requirement, "kata-vmm");
        assert_eq!(lines[0].status, Status::Ok);
        assert_eq!(lines[1].requirement, "virtiofsd");
    }
}
