//! The host side of a container: containerd's rootfs mounts made at `<bundle>/rootfs`,
//! then the rootfs and the spec's host binds bound into the virtio-fs share; undone in
//! reverse at delete. [`HostMounts`] is the seam: the host's mount table in production,
//! plain directories in the Task service's unit tests.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::mount;
use crate::spec::{HostBind, RootfsMount};

#[derive(Debug, thiserror::Error)]
pub enum HostSetupError {
    #[error("mounting the container rootfs at {target}: {detail}")]
    Rootfs { target: PathBuf, detail: String },
    #[error(transparent)]
    Mount(#[from] mount::MountError),
}

/// Mounts containerd's rootfs mounts at `<bundle>/rootfs` (if any; otherwise the bundle
/// already holds the rootfs), then binds it and the spec's host binds into the share:
/// the volumes into virtiofsd's mount namespaces (`serving`, see
/// [`mount::serving_namespaces`]) when there are any, else into the host's. Returns every
/// host mount point made, in order; on error, undoes its own work.
pub async fn setup_host_mounts(
    bundle: &Path,
    rootfs: &[RootfsMount],
    share_dir: &Path,
    binds: &[HostBind],
    serving: &[std::fs::File],
) -> Result<Vec<PathBuf>, HostSetupError> {
    let mut made = Vec::new();
    let result = async {
        let host_rootfs = bundle.join("rootfs");
        for m in rootfs {
            std::fs::create_dir_all(&host_rootfs).map_err(|e| HostSetupError::Rootfs {
                target: host_rootfs.clone(),
                detail: e.to_string(),
            })?;
            mount_rootfs(m, &host_rootfs)
                .await
                .map_err(|e| HostSetupError::Rootfs {
                    target: host_rootfs.clone(),
                    detail: format!("{} mount from {}: {e}", m.kind, m.source),
                })?;
            made.push(host_rootfs.clone());
        }
        let target = share_dir.join("rootfs");
        mount::bind(
            &host_rootfs,
            &target,
            mount::Access::ReadWrite,
            mount::Propagation::Private,
        )?;
        made.push(target);
        // `<share>/mounts/<id>`: the share's `mounts` and this container's part of it.
        let (share_mounts, own) = match (share_dir.parent(), share_dir.file_name()) {
            (Some(parent), Some(own)) => (parent, PathBuf::from(own)),
            _ => (share_dir, PathBuf::new()),
        };
        for b in binds {
            let rel = own.join(&b.share_rel);
            let host = mount::bind_volume(
                &b.source,
                share_mounts,
                &rel,
                b.access,
                b.propagation,
                serving,
            )?;
            made.extend(host);
        }
        Ok(())
    }
    .await;
    match result {
        Ok(()) => Ok(made),
        Err(e) => {
            mount::unmount_all(&made);
            let _ = mount::remove_dir_if_unmounted(share_dir);
            Err(e)
        }
    }
}

/// A container's host mounts, behind a seam: [`RealHostMounts`] in production; the task
/// service's unit tests give their sandboxes one that mounts nothing, so they run without
/// root.
#[async_trait::async_trait]
pub trait HostMounts: Send + Sync {
    /// As [`setup_host_mounts`].
    async fn setup(
        &self,
        bundle: &Path,
        rootfs: &[RootfsMount],
        share_dir: &Path,
        binds: &[HostBind],
        serving: &[std::fs::File],
    ) -> Result<Vec<PathBuf>, HostSetupError>;

    /// As [`teardown_host_mounts`].
    fn teardown(&self, mounts: &[PathBuf], share_dir: &Path);
}

/// The host's mount table: [`setup_host_mounts`] and [`teardown_host_mounts`].
pub struct RealHostMounts;

#[async_trait::async_trait]
impl HostMounts for RealHostMounts {
    async fn setup(
        &self,
        bundle: &Path,
        rootfs: &[RootfsMount],
        share_dir: &Path,
        binds: &[HostBind],
        serving: &[std::fs::File],
    ) -> Result<Vec<PathBuf>, HostSetupError> {
        setup_host_mounts(bundle, rootfs, share_dir, binds, serving).await
    }

    fn teardown(&self, mounts: &[PathBuf], share_dir: &Path) {
        teardown_host_mounts(mounts, share_dir)
    }
}

/// For the Task service's unit tests: a container's place on the share is a directory
/// holding an empty `rootfs` directory, and nothing is mounted.
#[cfg(any(test, feature = "test-utils"))]
pub struct DirsOnly;

#[cfg(any(test, feature = "test-utils"))]
#[async_trait::async_trait]
impl HostMounts for DirsOnly {
    async fn setup(
        &self,
        _bundle: &Path,
        _rootfs: &[RootfsMount],
        share_dir: &Path,
        _binds: &[HostBind],
        _serving: &[std::fs::File],
    ) -> Result<Vec<PathBuf>, HostSetupError> {
        let rootfs = share_dir.join("rootfs");
        std::fs::create_dir_all(&rootfs).map_err(|e| HostSetupError::Rootfs {
            target: rootfs.clone(),
            detail: e.to_string(),
        })?;
        Ok(vec![rootfs])
    }

    fn teardown(&self, _mounts: &[PathBuf], share_dir: &Path) {
        let _ = std::fs::remove_dir_all(share_dir);
    }
}

/// Undoes `setup_host_mounts`.
pub fn teardown_host_mounts(mounts: &[PathBuf], share_dir: &Path) {
    mount::unmount_all(mounts);
    for m in mount::mounts_under(share_dir) {
        mount::unmount(&m);
    }
    let _ = mount::remove_dir_if_unmounted(share_dir);
}

/// How the host process makes one of a container's rootfs mounts at a target directory
/// (blocking). The shim gives containerd-shim's, which knows the forms of containerd's
/// mount options (an overlay whose layers do not fit in one page, a loop device).
pub type MountRootfs = fn(&RootfsMount, &Path) -> Result<(), String>;

static MOUNT_ROOTFS: OnceLock<MountRootfs> = OnceLock::new();

/// Says how this process makes rootfs mounts; once, before the first container.
pub fn set_rootfs_mounter(mount: MountRootfs) {
    let _ = MOUNT_ROOTFS.set(mount);
}

/// Makes `m` at `target` with the process's [`MountRootfs`], on a blocking thread.
async fn mount_rootfs(m: &RootfsMount, target: &Path) -> Result<(), String> {
    let Some(mount) = MOUNT_ROOTFS.get().copied() else {
        return Err("this process cannot mount a container's rootfs: it set no \
                    rootfs mounter (kata_sandbox::host_mounts::set_rootfs_mounter)"
            .into());
    };
    let (m, target) = (m.clone(), target.to_path_buf());
    tokio::task::spawn_blocking(move || mount(&m, &target))
        .await
        .map_err(|e| format!("the mount's thread failed: {e}"))?
}
