//! The files a QEMU sandbox keeps in its run directory.

use std::path::{Path, PathBuf};

use crate::virtiofsd::FsFiles;

/// Paths of the sockets and logs in a sandbox's run directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunDirLayout {
    /// virtiofsd of the share.
    pub fs: FsFiles,
    /// virtiofsd of the rootfs share, when the VM has one.
    pub rootfs_fs: FsFiles,
    /// vhost-user socket of the vsock backend (the backend listens, QEMU connects).
    pub vsock_socket: PathBuf,
    /// Hybrid vsock socket the shim dials the agent on.
    pub agent_socket: PathBuf,
    /// QMP control socket (QEMU listens); its greeting tells that QEMU is up.
    pub qmp_socket: PathBuf,
    /// The guest's serial console, as the shim keeps it (bounded: see `crate::console`).
    pub console_log: PathBuf,
    /// stdout and stderr of each process.
    pub qemu_log: PathBuf,
    pub vsock_log: PathBuf,
}

impl RunDirLayout {
    pub fn new(run_dir: &Path) -> Self {
        Self {
            fs: FsFiles::new(run_dir, "virtiofsd"),
            rootfs_fs: FsFiles::new(run_dir, "virtiofsd-rootfs"),
            vsock_socket: run_dir.join("vhost-vsock.sock"),
            agent_socket: run_dir.join("kata.hvsock"),
            qmp_socket: run_dir.join("qmp.sock"),
            console_log: run_dir.join("console.log"),
            qemu_log: run_dir.join("qemu.log"),
            vsock_log: run_dir.join("vhost-vsock.log"),
        }
    }

    /// Sockets (and virtiofsd's pid files) that a previous run may have left behind and
    /// that a new run must not find.
    pub fn stale_files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = self.fs.stale_files().into();
        files.extend(self.rootfs_fs.stale_files());
        files.extend([
            self.vsock_socket.clone(),
            self.agent_socket.clone(),
            self.qmp_socket.clone(),
        ]);
        files
    }
}
