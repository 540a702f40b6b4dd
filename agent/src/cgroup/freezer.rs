//! Pause and resume through the cgroup v2 freezer: `cgroup.freeze`, confirmed by the
//! `frozen` key of `cgroup.events` (the kernel freezes tasks asynchronously).

use std::path::Path;
use std::time::{Duration, Instant};

use super::{keyed_value, read_optional, write_file, CgroupError, POLL_INTERVAL};

/// How long the kernel may take to freeze or thaw every task.
pub const FREEZE_TIMEOUT: Duration = Duration::from_secs(5);

/// Freezes (`frozen = true`) or thaws the cgroup at `dir` and waits until the kernel
/// reports that state.
pub async fn set_frozen(dir: &Path, frozen: bool) -> Result<(), CgroupError> {
    set_frozen_within(dir, frozen, FREEZE_TIMEOUT).await
}

async fn set_frozen_within(dir: &Path, frozen: bool, timeout: Duration) -> Result<(), CgroupError> {
    let (value, what) = if frozen {
        ("1", "report frozen 1 in cgroup.events")
    } else {
        ("0", "report frozen 0 in cgroup.events")
    };
    write_file(dir, "cgroup.freeze", value, "freezer")?;
    let want = u64::from(frozen);
    let deadline = Instant::now() + timeout;
    loop {
        if is_frozen_value(dir)? == Some(want) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(CgroupError::Timeout {
                path: dir.join("cgroup.events"),
                what,
                timeout,
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Whether the kernel reports the cgroup at `dir` as frozen.
pub fn is_frozen(dir: &Path) -> Result<bool, CgroupError> {
    Ok(is_frozen_value(dir)? == Some(1))
}

fn is_frozen_value(dir: &Path) -> Result<Option<u64>, CgroupError> {
    let events = read_optional(dir, "cgroup.events")?.ok_or_else(|| CgroupError::MissingFile {
        file: "cgroup.events".into(),
        field: "freezer".into(),
    })?;
    Ok(keyed_value(&events, "frozen"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waits_for_the_kernel_to_confirm() {
        let dir = std::env::temp_dir().join(format!("cg-freeze-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("cgroup.freeze"), "0").expect("seed");
        std::fs::write(dir.join("cgroup.events"), "populated 1\nfrozen 1\n").expect("seed");
        set_frozen(&dir, true).await.expect("freeze");
        assert_eq!(
            std::fs::read_to_string(dir.join("cgroup.freeze")).expect("read"),
            "1"
        );
        assert!(is_frozen(&dir).expect("events"));
        // A fake cgroup never thaws: the deadline must end the wait with a clear error.
        let started = Instant::now();
        let timeout = Duration::from_millis(100);
        let err = set_frozen_within(&dir, false, timeout)
            .await
            .expect_err("timeout");
        assert!(started.elapsed() >= timeout);
        assert!(err.to_string().contains("frozen 0"), "{err}");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
