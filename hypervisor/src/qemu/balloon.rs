//! The pod's memory in a VM booted with room to grow (issue 43). The VM has its boot size
//! plus the resize ceiling (`pod_resize_memory`); the balloon holds what the pod is not
//! given, so the guest can use only that: set over QMP (`balloon`, the guest's size in
//! bytes) as soon as QEMU answers, and again when the pod is resized. The guest takes
//! pages into the balloon (its `MemTotal` falls by them) and QEMU discards them: the
//! host memory they held goes back at once. Letting them go is the guest's to do; a guest
//! that does not simply keeps less.
//!
//! The guest's page descriptors cover all of its memory, the ceiling too: 1/64 of it,
//! taken from what it has. The balloon leaves that much more to the guest, so a pod
//! keeps what the shim's sizing rule promised it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;

use super::qmp::{QmpError, QmpSession};
use crate::Error;

const MIB: u64 = 1 << 20;
/// How long one QMP read or write may take.
const QMP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a growing pod waits for the guest to let go of the balloon's pages: the
/// resize returns once the memory is there (TCG deflates 1 GiB in about a second).
const DEFLATE_WAIT: Duration = Duration::from_secs(20);
/// Close enough: the guest deflates in steps of 256 pages.
const SLACK: u64 = 4 * MIB;

/// The guest's size, in bytes, for a pod given `memory_mib` in a VM with a ceiling of
/// `ceiling_mib`: the pod's size plus the page descriptors of the ceiling.
pub fn guest_bytes(memory_mib: u32, ceiling_mib: u32) -> u64 {
    (u64::from(memory_mib) + u64::from(ceiling_mib).div_ceil(64)) * MIB
}

/// Sets the guest's size to `bytes`; with `wait`, returns once the guest has grown to it
/// (or after [`DEFLATE_WAIT`], saying so in the error).
pub(super) async fn set(socket: PathBuf, bytes: u64, wait: bool) -> Result<(), Error> {
    tokio::task::spawn_blocking(move || set_blocking(&socket, bytes, wait))
        .await
        .map_err(|e| failed(bytes, e.to_string()))?
}

fn failed(bytes: u64, reason: String) -> Error {
    Error::Device {
        action: format!("setting the guest's memory to {} MiB", bytes / MIB),
        reason,
    }
}

fn set_blocking(socket: &Path, bytes: u64, wait: bool) -> Result<(), Error> {
    let qmp = |e: QmpError| failed(bytes, e.to_string());
    let mut session = QmpSession::connect(socket, QMP_TIMEOUT).map_err(qmp)?;
    session
        .execute(&json!({ "execute": "balloon", "arguments": { "value": bytes } }))
        .map_err(qmp)?;
    if !wait {
        return Ok(());
    }
    let deadline = Instant::now() + DEFLATE_WAIT;
    loop {
        let actual = session
            .execute(&json!({ "execute": "query-balloon" }))
            .map_err(qmp)?
            .get("actual")
            .and_then(|v| v.as_u64())
            .unwrap_or(0);
        if actual + SLACK >= bytes {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(failed(
                bytes,
                format!(
                    "the guest has {} MiB after {} s: it did not let go of the balloon's pages",
                    actual / MIB,
                    DEFLATE_WAIT.as_secs()
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guest_keeps_the_ceilings_page_descriptors() {
        assert_eq!(guest_bytes(512, 0), 512 * MIB);
        assert_eq!(guest_bytes(512, 1024), (512 + 16) * MIB);
        assert_eq!(guest_bytes(512, 100), (512 + 2) * MIB);
    }
}
