//! virtiofsd, the vhost-user daemon behind virtio-fs, shared by both backends: QEMU's
//! `vhost-user-fs-device` and kata-vmm's frontend connect to the socket it listens on.
//!
//! A sandbox has one or two: the share (tag [`SHARED_FS_TAG`](crate::SHARED_FS_TAG))
//! under `virtio_fs_cache`, and, when `virtio_fs_rootfs_cache` differs, the rootfs share
//! (tag [`ROOTFS_FS_TAG`](protocols::ROOTFS_FS_TAG)): the same host directory under
//! the rootfs policy, which the guest reads container root filesystems from. Volumes
//! the host may change stay coherent through the first; root filesystems, which only
//! the guest writes, keep their cache through the second.

use std::path::{Path, PathBuf};

use kata_config::VirtioFsCache;
use slog::{info, Logger};

use crate::process::{wait_for_sockets, Daemon, Place, Wait};
use crate::Error;

/// What the guest reaches through virtiofsd is decided by the guest: names, handles,
/// the order of requests. virtiofsd therefore always runs confined, and a virtiofsd that
/// cannot confine itself is a failed start, never a reason to run it unconfined (serving
/// guest-chosen names against the host's root is how Kata's GHSA-2gv2-cffp-j227 happened):
/// - `--sandbox namespace`: its own mount, pid and network namespaces, the shared
///   directory as its root;
/// - `--seccomp kill`: a system call outside its list kills it;
/// - `--inode-file-handles=never`: inodes held as `O_PATH` descriptors under the shared
///   directory, so it needs no CAP_DAC_READ_SEARCH, with which a handle could open any
///   file of the host filesystem.
const CONFINEMENT: [&str; 5] = [
    "--sandbox",
    "namespace",
    "--seccomp",
    "kill",
    "--inode-file-handles=never",
];

/// What to do when virtiofsd dies before it listens, for the error.
const CONFINEMENT_HINT: &str = "virtiofsd always runs in namespaces of its own with a \
seccomp filter and is never started without them; if its log says a namespace, mount or \
seccomp call was not permitted, run the shim as root on a host that allows mount, pid and \
network namespaces (inside a container: privileged, or CAP_SYS_ADMIN with unconfined \
seccomp and AppArmor profiles)";

/// One virtiofsd: what it shares, where it listens and logs.
pub(crate) struct Virtiofsd<'a> {
    /// Names it in logs and errors.
    pub step: &'static str,
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
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![
            "--socket-path".into(),
            self.socket.display().to_string(),
            "--shared-dir".into(),
            self.shared_dir.display().to_string(),
            "--cache".into(),
            self.cache.to_string(),
            // No --announce-submounts: with it, our 6.1 guest crashed binaries run inside
            // a chroot whose root is an announced submount (the container rootfs always is;
            // not retried since the guest moved to 6.12).
        ];
        args.extend(CONFINEMENT.iter().map(|a| a.to_string()));
        if self.debug {
            args.extend(["--log-level".into(), "debug".into()]);
        }
        args
    }

    /// Starts virtiofsd, confined (see [`CONFINEMENT`]), and waits until it listens. Its pid
    /// goes to `started` as soon as it exists, so that a failure can stop it.
    pub async fn start(&self, logger: &Logger, started: &mut Vec<i32>) -> Result<(), Error> {
        let daemon = Daemon {
            step: self.step,
            program: self.program,
            args: self.args(),
            env: Vec::new(),
            log: self.log.clone(),
            place: self.place.without_netns(),
        };
        log_command(logger, &daemon);
        let pid = daemon.spawn(logger)?;
        started.push(pid);
        match wait_for_sockets(&daemon, pid, &[self.socket]).await {
            Ok(()) => Ok(()),
            Err(Wait::Timeout(e)) => Err(e),
            Err(Wait::Died(Error::Step {
                step,
                reason,
                log,
                tail,
            })) => Err(Error::Step {
                step,
                reason: format!("{reason}; {CONFINEMENT_HINT}"),
                log,
                tail,
            }),
            Err(Wait::Died(e)) => Err(e),
        }
    }
}

/// Where one share's virtiofsd listens and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsFiles {
    /// Its vhost-user socket (virtiofsd listens, the VMM connects).
    pub socket: PathBuf,
    /// Its stdout and stderr.
    pub log: PathBuf,
}

impl FsFiles {
    /// `<run_dir>/<name>.sock` and `<run_dir>/<name>.log`.
    pub fn new(run_dir: &Path, name: &str) -> Self {
        Self {
            socket: run_dir.join(format!("{name}.sock")),
            log: run_dir.join(format!("{name}.log")),
        }
    }

    /// The socket and the pid file virtiofsd keeps next to it, which a previous run may
    /// have left behind and a new one must not find.
    pub fn stale_files(&self) -> [PathBuf; 2] {
        let mut pid_file = self.socket.clone().into_os_string();
        pid_file.push(".pid");
        [self.socket.clone(), pid_file.into()]
    }
}

/// A sandbox's virtiofsds (see the module's introduction).
pub(crate) struct Shares<'a> {
    /// The virtiofsd binary.
    pub program: &'a Path,
    /// The host directory both export.
    pub shared_dir: &'a Path,
    /// The share's policy and files.
    pub share: (VirtioFsCache, &'a FsFiles),
    /// The rootfs share's, when the VM has one.
    pub rootfs: Option<(VirtioFsCache, &'a FsFiles)>,
    pub debug: bool,
    pub place: &'a Place,
}

impl<'a> Shares<'a> {
    fn daemon(
        &self,
        step: &'static str,
        (cache, files): (VirtioFsCache, &'a FsFiles),
    ) -> Virtiofsd<'a> {
        Virtiofsd {
            step,
            program: self.program,
            cache,
            socket: &files.socket,
            shared_dir: self.shared_dir,
            log: files.log.clone(),
            debug: self.debug,
            place: self.place,
        }
    }

    /// Starts the virtiofsds side by side and waits until both listen. Each pid goes to
    /// `share_pids` or `rootfs_pids` (the caller's) as soon as it exists, so that the
    /// caller can stop it after an error, or after dropping this future midway (a
    /// helper started beside these failed first).
    pub async fn start(
        &self,
        logger: &Logger,
        share_pids: &mut Vec<i32>,
        rootfs_pids: &mut Vec<i32>,
    ) -> Result<(), Error> {
        let share = self.daemon("virtiofsd", self.share);
        let Some(rootfs) = self.rootfs else {
            return share.start(logger, share_pids).await;
        };
        let rootfs = self.daemon("virtiofsd of the rootfs share", rootfs);
        tokio::try_join!(
            share.start(logger, share_pids),
            rootfs.start(logger, rootfs_pids),
        )
        .map(|_| ())
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
            step: "virtiofsd",
            program: Path::new("/usr/local/bin/virtiofsd"),
            cache: VirtioFsCache::Never,
            socket: Path::new("/run/vc/sb1/virtiofsd.sock"),
            shared_dir: Path::new("/run/kata-containers/shared/sb1"),
            log: PathBuf::from("/run/vc/sb1/virtiofsd.log"),
            debug: false,
            place: &place,
        };
        assert_eq!(
            v.args().join(" "),
            "--socket-path /run/vc/sb1/virtiofsd.sock \
             --shared-dir /run/kata-containers/shared/sb1 --cache never \
             --sandbox namespace --seccomp kill --inode-file-handles=never"
        );
        let v = Virtiofsd { debug: true, ..v };
        let s = v.args().join(" ");
        assert!(s.contains("--sandbox namespace"), "{s}");
        assert!(s.ends_with("--log-level debug"), "{s}");
    }
}
