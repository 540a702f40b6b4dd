//! The containment line: whether the configured backend's host processes run confined
//! (`sandbox_host_processes`), and whether this host lets them: the VMM (and for QEMU,
//! kata-vsock) started as a sandbox would start it, as an unprivileged uid of the
//! configured range without capabilities, in a private `/dev` and (kata-vsock) an empty
//! network namespace, must run; and QEMU must take its seccomp sandbox.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use kata_config::{Config, HostProcesses, HypervisorName};

use super::Backend;
use crate::report::Line;

const NAME: &str = "containment";

/// What QEMU reads on its QMP stdio: negotiate, then quit.
const QMP_QUIT: &[u8] = b"{\"execute\":\"qmp_capabilities\"}\n{\"execute\":\"quit\"}\n";

pub fn line(config: &Config, backend: &Backend) -> Line {
    let (section, hp) = match backend.name {
        HypervisorName::Qemu => ("hypervisor.qemu", config.hypervisor.qemu.host_processes),
        HypervisorName::Builtin => (
            "hypervisor.builtin",
            config.hypervisor.builtin.host_processes,
        ),
    };
    if !hp.sandboxed {
        return Line::warn(
            NAME,
            format!(
                "{section}.sandbox_host_processes = false: the VMM runs as root with every \
                 capability, so a guest that escapes its VM is root on this host"
            ),
            format!(
                "set sandbox_host_processes = true under [{section}] in {}",
                backend.file
            ),
        );
    }
    if !nix::unistd::geteuid().is_root() {
        return Line::warn(
            NAME,
            "not checked: only root can start processes as another uid",
            "run kata-runtime check as root",
        );
    }
    let fix = format!(
        "make the programs executable by every user (each runs in a minimal root of its \
         own, as an unprivileged uid), on a kernel with mount and network namespaces; or, \
         to run the VMM as root instead, set sandbox_host_processes = false under \
         [{section}] in {}",
        backend.file
    );
    let probed = match backend.name {
        HypervisorName::Qemu => {
            let q = &config.hypervisor.qemu;
            probe(&hp, &q.path, &["-version"], false)
                .and_then(|()| probe(&hp, &q.vsock_backend, &["--version"], true))
                .and_then(|()| qemu_seccomp(&q.path))
        }
        HypervisorName::Builtin => probe(&hp, &config.hypervisor.builtin.path, &["--help"], false),
    };
    match probed {
        Ok(()) => Line::ok(
            NAME,
            format!(
                "supported: each sandbox's VMM{} as a uid of the sandbox's own from {} .. {}, \
                 without capabilities, with no new privileges, in a minimal root with a \
                 private /dev{}",
                if backend.name == HypervisorName::Qemu {
                    " and kata-vsock run"
                } else {
                    " runs"
                },
                hp.uid_start,
                u64::from(hp.uid_start) + u64::from(hp.uid_count) - 1,
                if backend.name == HypervisorName::Qemu {
                    ", QEMU's seccomp sandbox, and kata-vsock without a network"
                } else {
                    ""
                }
            ),
        ),
        Err(why) => Line::fail(NAME, why, fix),
    }
}

fn probe(hp: &HostProcesses, program: &Path, args: &[&str], new_netns: bool) -> Result<(), String> {
    hypervisor::probe::probe(hp, program, args, new_netns)
}

/// QEMU starts with the seccomp sandbox the shim gives it (built with libseccomp).
fn qemu_seccomp(qemu: &Path) -> Result<(), String> {
    let mut child = Command::new(qemu)
        .args([
            "-sandbox",
            hypervisor::qemu::cmdline::QEMU_SANDBOX,
            "-M",
            "none",
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-qmp",
            "stdio",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", qemu.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(QMP_QUIT);
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{}: {e}", qemu.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} does not start with -sandbox {} ({}): {}",
            qemu.display(),
            hypervisor::qemu::cmdline::QEMU_SANDBOX,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::report::Status;

    fn config(text: &str) -> Config {
        Config::from_str(text, "test.toml").unwrap()
    }

    fn backend(config: &Config) -> Backend<'_> {
        Backend::of(config, "test.toml".into())
    }

    #[test]
    fn turned_off_is_a_warning_naming_the_key() {
        let c = config("[hypervisor.qemu]\nsandbox_host_processes = false\n");
        let l = line(&c, &backend(&c));
        assert_eq!(l.status, Status::Warn);
        assert!(l.detail.contains("runs as root"), "{}", l.detail);
        assert!(l
            .fix
            .unwrap()
            .contains("sandbox_host_processes = true under [hypervisor.qemu]"));
    }

    #[test]
    fn a_program_the_sandboxes_uid_cannot_run_fails_the_line() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "the containment check's tests need root (as the check does)"
        );
        // A QEMU only root may run.
        let dir = tempfile::tempdir().unwrap();
        let qemu = dir.path().join("qemu");
        std::fs::copy("/bin/true", &qemu).unwrap();
        std::fs::set_permissions(&qemu, std::fs::Permissions::from_mode(0o700)).unwrap();
        let c = config(&format!(
            "[hypervisor.qemu]\npath = {qemu:?}\nvsock_backend = \"/bin/true\"\n"
        ));
        let l = line(&c, &backend(&c));
        assert_eq!(l.status, Status::Fail, "{l:?}");
        assert!(
            l.detail.contains(&qemu.display().to_string()),
            "{}",
            l.detail
        );
        assert!(l.fix.unwrap().contains("executable by every user"));
    }
}
