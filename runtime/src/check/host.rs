//! The host device lines: the vsock path the configured backend uses, `/dev/net/tun`
//! (a tap per pod network interface), and the netfilter tool port-forward needs.

use std::path::Path;

use kata_config::{Config, HypervisorName};

use super::Backend;
use crate::command::{find_in_path, is_executable};
use crate::report::Line;

const TUN: &str = "/dev/net/tun";
const VHOST_VSOCK: &str = "/dev/vhost-vsock";

pub fn lines(config: &Config, backend: &Backend) -> Vec<Line> {
    vec![
        vsock_line(config, backend),
        tun_line(Path::new(TUN)),
        port_forward_line(find_in_path("nft").or_else(|| find_in_path("iptables"))),
    ]
}

/// Port-forward into a pod redirects the pod namespace's localhost to the shim with
/// `nft` (or `iptables`); without either, pods run but port-forward fails.
fn port_forward_line(tool: Option<std::path::PathBuf>) -> Line {
    match tool {
        Some(t) => Line::ok(
            "port-forward",
            format!("{} redirects a pod's localhost into its VM", t.display()),
        ),
        None => Line::warn(
            "port-forward",
            "neither nft nor iptables is in PATH: pods run, but port-forward into them fails",
            "install nftables (apt-get install nftables) or iptables",
        ),
    }
}

/// QEMU reaches the guest's vsock through a vhost-user backend (hybrid vsock), so the
/// backend binary is what matters; kata-vmm serves vsock itself.
fn vsock_line(config: &Config, backend: &Backend) -> Line {
    let kernel_vsock = if Path::new(VHOST_VSOCK).exists() {
        "present"
    } else {
        "absent"
    };
    match backend.name {
        HypervisorName::Builtin => Line::ok(
            "vsock",
            format!("served by kata-vmm itself (hybrid vsock on a unix socket); {VHOST_VSOCK} {kernel_vsock}, not needed"),
        ),
        HypervisorName::Qemu => {
            let path = &config.hypervisor.qemu.vsock_backend;
            if is_executable(path) {
                Line::ok(
                    "vsock",
                    format!("vhost-user backend {} (hybrid vsock on a unix socket); {VHOST_VSOCK} {kernel_vsock}, not needed", path.display()),
                )
            } else {
                Line::fail(
                    "vsock",
                    format!("the vhost-user vsock backend {} is not an executable file", path.display()),
                    format!(
                        "run `make install-vsock` (it installs kata-vsock in $(PREFIX)/bin), or set hypervisor.qemu.vsock_backend in {} (vhost-device-vsock takes the same arguments)",
                        backend.file
                    ),
                )
            }
        }
    }
}

fn tun_line(tun: &Path) -> Line {
    match std::fs::OpenOptions::new().read(true).write(true).open(tun) {
        Ok(_) => Line::ok(
            "tun",
            format!("{} opens (a tap per pod network interface)", tun.display()),
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Line::fail(
            "tun",
            format!(
                "{} does not exist: pods cannot get a network",
                tun.display()
            ),
            "load the tun module (modprobe tun)",
        ),
        Err(e) => Line::fail(
            "tun",
            format!("cannot open {}: {e}", tun.display()),
            "run as root (the shim does), or load the tun module (modprobe tun)",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Status;

    #[test]
    fn a_missing_tun_device_fails_with_modprobe() {
        let line = tun_line(Path::new("/nonexistent/tun"));
        assert_eq!(line.status, Status::Fail);
        assert!(line.fix.unwrap().contains("modprobe tun"));
    }

    #[test]
    fn port_forward_needs_nft_or_iptables() {
        let line = port_forward_line(None);
        assert_eq!(line.status, Status::Warn);
        assert!(line.fix.unwrap().contains("nftables"));
        let line = port_forward_line(Some("/usr/sbin/nft".into()));
        assert_eq!(line.status, Status::Ok);
        assert!(line.detail.contains("/usr/sbin/nft"));
    }

    #[test]
    fn vsock_follows_the_backend() {
        let qemu = Config::from_str(
            "[hypervisor.qemu]\nvsock_backend = \"/nonexistent/kata-vsock\"",
            "/tmp/c.toml",
        )
        .unwrap();
        let line = vsock_line(&qemu, &Backend::of(&qemu, "/tmp/c.toml".into()));
        assert_eq!(line.status, Status::Fail);
        assert!(line.detail.contains("/nonexistent/kata-vsock"));
        let builtin = Config::from_str(
            "[runtime]\nhypervisor_name = \"builtin\"\n[hypervisor.qemu]\nvsock_backend = \"/nonexistent/kata-vsock\"",
            "/tmp/c.toml",
        )
        .unwrap();
        let line = vsock_line(&builtin, &Backend::of(&builtin, "/tmp/c.toml".into()));
        assert_eq!(line.status, Status::Ok, "kata-vmm does not use the backend");
    }
}
