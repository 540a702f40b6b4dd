//! virtiofsd, the vhost-user daemon behind virtio-fs, shared by both backends: QEMU's
//! `vhost-user-fs-device` and kata-vmm's frontend connect to the socket it listens on.

use std::path::{Path, PathBuf};

use kata_config::VirtioFsCache;
use slog::{info, warn, Logger};

use crate::process::{wait_for_sockets, Daemon, Place, Wait};
use crate::Error;

/// virtiofsd's `--sandbox` mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FsSandbox {
    /// Own mount, pid and net namespaces (virtiofsd's default, preferred).
    Namespace,
    /// No isolation; the fallback where namespaces cannot be set up.
    None,
}

impl FsSandbox {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Namespace => "namespace",
            Self::None => "none",
        }
    }
}

/// One virtiofsd: what it shares, where it listens and logs.
pub(crate) struct Virtiofsd<'a> {
    /// The virtiofsd binary.
    pub program: &'a Path,
    /// `--cache`.
    pub cache: VirtioFsCache,
    /// `--socket-path`.
    pub socket: &'a Path,
    /// `--shared-dir`.
    pub shared_dir: &'a Path,
    /// Its stdout and stderr.
    pub log: PathBuf,
    /// `--log-level debug`.
    pub debug: bool,
    /// Its host cgroup (never the pod's network namespace: it needs no network).
    pub place: &'a Place,
}

impl Virtiofsd<'_> {
    /// virtiofsd's arguments.
    pub fn args(&self, sandbox: FsSandbox) -> Vec<String> {
        let mut args = vec![
            "--socket-path".into(),
            self.socket.display().to_string(),
            "--shared-dir".into(),
            self.shared_dir.display().to_string(),
            "--cache".into(),
            self.cache.to_string(),
            "--sandbox".into(),
            sandbox.as_str().into(),
            // No --announce-submounts: with it, our 6.1 guest crashed binaries run inside
            // a chroot whose root is an announced submount (the container rootfs always is).
        ];
        if self.debug {
            args.extend(["--log-level".into(), "debug".into()]);
        }
        args
    }

    /// Starts virtiofsd with `--sandbox namespace`, or `--sandbox none` if that dies at
    /// once (e.g. no permission to create namespaces), and waits for its socket. Every pid
    /// goes to `started` as soon as it exists, so that a failure can stop it.
    pub async fn start(&self, logger: &Logger, started: &mut Vec<i32>) -> Result<(), Error> {
        let daemon = |sandbox| Daemon {
            step: "virtiofsd",
            program: self.program,
            args: self.args(sandbox),
            env: Vec::new(),
            log: self.log.clone(),
            place: self.place.without_netns(),
        };
        let preferred = daemon(FsSandbox::Namespace);
        log_command(logger, &preferred);
        let pid = preferred.spawn()?;
        started.push(pid);
        match wait_for_sockets(&preferred, pid, &[self.socket]).await {
            Ok(()) => return Ok(()),
            Err(Wait::Timeout(e)) => return Err(e),
            Err(Wait::Died(e)) => warn!(logger,
                "virtiofsd cannot sandbox itself in namespaces; retrying with --sandbox none";
                "error" => e.to_string()),
        }
        let fallback = daemon(FsSandbox::None);
        log_command(logger, &fallback);
        let pid = fallback.spawn()?;
        started.push(pid);
        wait_for_sockets(&fallback, pid, &[self.socket])
            .await
            .map_err(Wait::into_error)
    }
}

/// Logs the command line a daemon is started with.
pub(crate) fn log_command(logger: &Logger, d: &Daemon<'_>) {
    info!(logger, "starting {}", d.step;
        "command" => format!("{} {}", d.program.display(), d.args.join(" ")),
        "log" => d.log.display().to_string());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line() {
        let place = Place::default();
        let v = Virtiofsd {
            program: Path::new("/usr/local/bin/virtiofsd"),
            cache: VirtioFsCache::Never,
            socket: Path::new("/run/vc/sb1/virtiofsd.sock"),
            shared_dir: Path::new("/run/kata-containers/shared/sb1"),
            log: PathBuf::from("/run/vc/sb1/virtiofsd.log"),
            debug: false,
            place: &place,
        };
        assert_eq!(
            v.args(FsSandbox::Namespace).join(" "),
            "--socket-path /run/vc/sb1/virtiofsd.sock \
             --shared-dir /run/kata-containers/shared/sb1 --cache never \
             --sandbox namespace"
        );
        let v = Virtiofsd { debug: true, ..v };
        let s = v.args(FsSandbox::None).join(" ");
        assert!(s.contains("--sandbox none"), "{s}");
        assert!(s.ends_with("--log-level debug"), "{s}");
    }
}
