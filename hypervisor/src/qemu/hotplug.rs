//! Host block devices attached to a running VM as SCSI disks (raw block volumes).
//!
//! `-M microvm` has no PCI and so no PCI hotplug; a virtio-scsi controller on the
//! virtio-mmio bus, present from boot ([`SCSI_CONTROLLER`]), takes disks at any time.
//! A disk is attached over QMP in three steps, each undone if a later one fails:
//! 1. `add-fd`: the descriptor the shim (root) opened rides on the command (SCM_RIGHTS)
//!    into an fd set of its own: QEMU runs as an unprivileged uid that cannot open the
//!    host's device node itself, and needs no access to /dev;
//! 2. `blockdev-add`: a `raw` node over a `host_device` on `/dev/fdset/N`, read-only
//!    when the file is (QEMU picks the set's descriptor of the same access mode);
//! 3. `device_add`: a `scsi-hd` on the controller's bus at SCSI target `T`, LUN 0; the
//!    guest driver hears of it (virtio-scsi hotplug event) and probes the target.
//!
//! The guest finds the disk by its address (`0:0:T:0`). Detaching undoes all three;
//! the shim holds no descriptor once the fd set has its copy.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::qmp::{QmpError, QmpSession};
use crate::vm::AttachedBlock;
use crate::Error;

/// The controller's `-device` argument.
pub const SCSI_CONTROLLER: &str = "virtio-scsi-device,id=scsi0";
/// The bus of [`SCSI_CONTROLLER`] that disks are added to.
const SCSI_BUS: &str = "scsi0.0";
/// virtio-scsi's targets are 0..=255 (QEMU's `max_target`); every disk gets one, LUN 0.
const MAX_TARGETS: u16 = 256;
/// How long one QMP read or write may take (the commands are quick; a loaded TCG host
/// is slow).
const QMP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a detached disk's node may stay busy after `device_del`.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// The disks attached to one VM, by SCSI target.
#[derive(Debug)]
pub struct ScsiDisks {
    qmp_socket: PathBuf,
    /// Target → the fd set holding its descriptor.
    attached: BTreeMap<u16, u64>,
}

impl ScsiDisks {
    /// The disks of the VM whose QMP socket is `qmp_socket` (none yet).
    pub fn new(qmp_socket: PathBuf) -> Self {
        ScsiDisks {
            qmp_socket,
            attached: BTreeMap::new(),
        }
    }

    /// Attaches the host block device open as `file` (read-only when `read_only`; the
    /// descriptor must be opened likewise) at the lowest free SCSI target.
    pub async fn add(&mut self, file: OwnedFd, read_only: bool) -> Result<AttachedBlock, Error> {
        let target = (0..MAX_TARGETS)
            .find(|t| !self.attached.contains_key(t))
            .ok_or_else(|| {
                Error::Unsupported(format!(
                    "cannot attach another block device: all {MAX_TARGETS} SCSI targets of \
                     the VM are in use"
                ))
            })?;
        let socket = self.qmp_socket.clone();
        let fdset = tokio::task::spawn_blocking(move || attach(&socket, &file, target, read_only))
            .await
            .map_err(|e| device_error("attach", target, format!("the QMP task failed: {e}")))?
            .map_err(|e| device_error("attach", target, e.to_string()))?;
        self.attached.insert(target, fdset);
        Ok(AttachedBlock {
            id: device_id(target),
            scsi_target: target,
            scsi_lun: 0,
        })
    }

    /// Detaches the disk `id` names ([`AttachedBlock::id`]); an unknown id is no error.
    pub async fn remove(&mut self, id: &str) -> Result<(), Error> {
        let Some(target) = target_of(id) else {
            return Ok(());
        };
        let Some(&fdset) = self.attached.get(&target) else {
            return Ok(());
        };
        let socket = self.qmp_socket.clone();
        tokio::task::spawn_blocking(move || detach(&socket, target, fdset))
            .await
            .map_err(|e| device_error("detach", target, format!("the QMP task failed: {e}")))?
            .map_err(|e| device_error("detach", target, e.to_string()))?;
        self.attached.remove(&target);
        Ok(())
    }
}

fn device_error(action: &str, target: u16, reason: String) -> Error {
    Error::Device {
        action: format!(
            "{action}ing block device {} (SCSI target {target})",
            device_id(target)
        ),
        reason,
    }
}

/// The three steps of an attach, undone on failure; returns the fd set's id.
fn attach(
    socket: &std::path::Path,
    file: &OwnedFd,
    target: u16,
    read_only: bool,
) -> Result<u64, QmpError> {
    let id = device_id(target);
    let mut qmp = QmpSession::connect(socket, QMP_TIMEOUT)?;
    let added = qmp.execute_with_fd(&add_fd(&id), file.as_fd())?;
    let fdset = added
        .get("fdset-id")
        .and_then(Value::as_u64)
        .ok_or_else(|| {
            QmpError::Protocol(format!("add-fd answered without an fdset-id: {added}"))
        })?;
    if let Err(e) = qmp.execute(&blockdev_add(&id, fdset, read_only)) {
        let _ = qmp.execute(&remove_fd(fdset));
        return Err(e);
    }
    if let Err(e) = qmp.execute(&scsi_disk_add(&id, target)) {
        let _ = qmp.execute(&blockdev_del(&id));
        let _ = qmp.execute(&remove_fd(fdset));
        return Err(e);
    }
    Ok(fdset)
}

/// Undoes [`attach`]: the device, then its node once the device let go of it, then the
/// fd set.
fn detach(socket: &std::path::Path, target: u16, fdset: u64) -> Result<(), QmpError> {
    let id = device_id(target);
    let mut qmp = QmpSession::connect(socket, QMP_TIMEOUT)?;
    match qmp.execute(&device_del(&id)) {
        Ok(_) => {}
        // Gone already (a retry after a half-done detach).
        Err(QmpError::Refused { class, .. }) if class == "DeviceNotFound" => {}
        Err(e) => return Err(e),
    }
    let deadline = Instant::now() + RELEASE_TIMEOUT;
    loop {
        match qmp.execute(&blockdev_del(&id)) {
            Ok(_) => break,
            Err(QmpError::Refused { desc, .. }) if desc.contains("not found") => break,
            Err(e @ QmpError::Refused { .. }) if Instant::now() >= deadline => return Err(e),
            Err(QmpError::Refused { .. }) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(e),
        }
    }
    match qmp.execute(&remove_fd(fdset)) {
        Ok(_) => Ok(()),
        // QEMU closed the set itself once nothing used it.
        Err(QmpError::Refused { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The QEMU id of the disk at `target` (device and block node alike).
fn device_id(target: u16) -> String {
    format!("blk{target}")
}

/// The target a [`device_id`] names.
fn target_of(id: &str) -> Option<u16> {
    id.strip_prefix("blk")?
        .parse()
        .ok()
        .filter(|t| *t < MAX_TARGETS)
}

fn add_fd(opaque: &str) -> Value {
    json!({ "execute": "add-fd", "arguments": { "opaque": opaque } })
}

fn remove_fd(fdset: u64) -> Value {
    json!({ "execute": "remove-fd", "arguments": { "fdset-id": fdset } })
}

/// A raw node over the host device in `fdset`. Locking is off: two containers of a pod
/// may name the same volume, as they may under runc, and each gets a disk of its own.
fn blockdev_add(node: &str, fdset: u64, read_only: bool) -> Value {
    json!({ "execute": "blockdev-add", "arguments": {
        "driver": "raw",
        "node-name": node,
        "read-only": read_only,
        "file": {
            "driver": "host_device",
            "filename": format!("/dev/fdset/{fdset}"),
            "read-only": read_only,
            "locking": "off",
        },
    }})
}

fn blockdev_del(node: &str) -> Value {
    json!({ "execute": "blockdev-del", "arguments": { "node-name": node } })
}

/// A SCSI disk on node `id` at `target`, LUN 0; its serial is its id.
fn scsi_disk_add(id: &str, target: u16) -> Value {
    json!({ "execute": "device_add", "arguments": {
        "driver": "scsi-hd",
        "id": id,
        "drive": id,
        "bus": SCSI_BUS,
        "channel": 0,
        "scsi-id": target,
        "lun": 0,
        "serial": id,
    }})
}

fn device_del(id: &str) -> Value {
    json!({ "execute": "device_del", "arguments": { "id": id } })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_name_their_target_and_nothing_else() {
        assert_eq!(device_id(7), "blk7");
        assert_eq!(target_of("blk7"), Some(7));
        assert_eq!(target_of("blk255"), Some(255));
        assert_eq!(target_of("blk256"), None);
        assert_eq!(target_of("scsi0"), None);
        assert_eq!(target_of("blk"), None);
    }

    #[test]
    fn a_read_only_disk_is_read_only_at_both_layers() {
        let c = blockdev_add("blk3", 5, true);
        assert_eq!(c["execute"], "blockdev-add");
        let a = &c["arguments"];
        assert_eq!(a["driver"], "raw");
        assert_eq!(a["node-name"], "blk3");
        assert_eq!(a["read-only"], true);
        assert_eq!(a["file"]["driver"], "host_device");
        assert_eq!(a["file"]["filename"], "/dev/fdset/5");
        assert_eq!(a["file"]["read-only"], true);
        assert_eq!(
            blockdev_add("blk3", 5, false)["arguments"]["file"]["read-only"],
            false
        );
    }

    #[test]
    fn the_disk_sits_on_the_controller_at_its_target() {
        let c = scsi_disk_add("blk3", 3);
        assert_eq!(c["execute"], "device_add");
        let a = &c["arguments"];
        assert_eq!(a["driver"], "scsi-hd");
        assert_eq!(a["bus"], "scsi0.0");
        assert_eq!(a["drive"], "blk3");
        assert_eq!(a["scsi-id"], 3);
        assert_eq!(a["lun"], 0);
        assert!(SCSI_CONTROLLER.contains("id=scsi0"));
        assert!(SCSI_BUS.starts_with("scsi0."));
    }

    #[test]
    fn removal_commands_name_what_was_added() {
        assert_eq!(device_del("blk3")["arguments"]["id"], "blk3");
        assert_eq!(blockdev_del("blk3")["arguments"]["node-name"], "blk3");
        assert_eq!(remove_fd(5)["arguments"]["fdset-id"], 5);
        assert_eq!(add_fd("blk3")["arguments"]["opaque"], "blk3");
    }
}
