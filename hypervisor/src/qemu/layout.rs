//! The files a QEMU sandbox keeps in its run directory.

use std::path::{Path, PathBuf};

/// Paths of the sockets and logs in a sandbox's run directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunDirLayout {
    /// vhost-user socket of virtiofsd (virtiofsd listens, QEMU connects).
    pub virtiofsd_socket: PathBuf,
    /// vhost-user socket of the vsock backend (the backend listens, QEMU connects).
    pub vsock_socket: PathBuf,
    /// Hybrid vsock socket the shim dials the agent on.
    pub agent_socket: PathBuf,
    /// QMP control socket (QEMU listens); its greeting tells that QEMU is up.
    pub qmp_socket: PathBuf,
    /// The guest's serial console.
    pub console_log: PathBuf,
    /// stdout and stderr of each process.
    pub qemu_log: PathBuf,
    pub virtiofsd_log: PathBuf,
    pub vsock_log: PathBuf,
}

impl RunDirLayout {
    pub fn new(run_dir: &Path) -> Self {
        Self {
            virtiofsd_socket: run_dir.join("virtiofsd.sock"),
            vsock_socket: run_dir.join("vhost-vsock.sock"),
            agent_socket: run_dir.join("kata.hvsock"),
            qmp_socket: run_dir.join("qmp.sock"),
            console_log: run_dir.join("console.log"),
            qemu_log: run_dir.join("qemu.log"),
            virtiofsd_log: run_dir.join("virtiofsd.log"),
            vsock_log: run_dir.join("vhost-vsock.log"),
        }
    }

    /// Sockets (and virtiofsd's pid file) that a previous run may have left behind and
    /// that a new run must not find.
    pub fn stale_files(&self) -> Vec<PathBuf> {
        let mut pid_file = self.virtiofsd_socket.clone().into_os_string();
        pid_file.push(".pid");
        vec![
            self.virtiofsd_socket.clone(),
            pid_file.into(),
            self.vsock_socket.clone(),
            self.agent_socket.clone(),
            self.qmp_socket.clone(),
        ]
    }
}
