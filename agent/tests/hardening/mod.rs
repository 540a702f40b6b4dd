//! Helpers shared by the hardening tests (security.rs, seccomp.rs): a busybox rootfs
//! with a few more applets, the harness's runc-shaped spec edited as JSON, and runs
//! that report text.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use crate::common::{code, message, TestAgent};
use serde_json::Value;

/// Applets these tests need on top of the common rootfs.
pub const EXTRA_APPLETS: &[&str] = &["grep", "touch", "chown", "mkdir", "stat", "readlink"];

/// A busybox rootfs with the extra applets.
pub fn rootfs(agent: &TestAgent, id: &str) -> PathBuf {
    let rootfs = agent.rootfs(id);
    for applet in EXTRA_APPLETS {
        let link = rootfs.join("bin").join(applet);
        if link.symlink_metadata().is_err() {
            std::os::unix::fs::symlink("busybox", link).expect("symlink applet");
        }
    }
    rootfs
}

/// The harness's runc-shaped spec for `sh -c script`, changed by `edit`.
pub fn spec(
    agent: &TestAgent,
    rootfs: &Path,
    script: &str,
    edit: impl FnOnce(&mut Value),
) -> Vec<u8> {
    let bytes = agent.spec(rootfs, &["sh", "-c", script], &[], "/");
    let mut spec: Value = serde_json::from_slice(&bytes).expect("spec JSON");
    edit(&mut spec);
    serde_json::to_vec(&spec).expect("encode spec")
}

/// Creates, starts and waits; returns (status, stdout, stderr) as text. A terminal has
/// no stderr of its own (it is merged into stdout): empty.
pub async fn run(agent: &TestAgent, id: &str, spec: Vec<u8>) -> (i32, String, String) {
    let terminal = serde_json::from_slice::<Value>(&spec)
        .map(|s| s["process"]["terminal"] == true)
        .unwrap_or(false);
    agent
        .create(id, spec, false)
        .await
        .expect("create container");
    let out = agent.read_all(id, "", false);
    let err = (!terminal).then(|| agent.read_all(id, "", true));
    agent.start_container(id).await.expect("start container");
    let status = agent.wait(id, "").await;
    let out = String::from_utf8_lossy(&out.await.expect("stdout")).into_owned();
    let err = match err {
        Some(err) => String::from_utf8_lossy(&err.await.expect("stderr")).into_owned(),
        None => String::new(),
    };
    agent.remove(id).await.expect("remove container");
    (status, out, err)
}

/// Runs `script` with `edit` applied and expects exit 0; returns stdout.
pub async fn run_ok(
    agent: &TestAgent,
    id: &str,
    script: &str,
    edit: impl FnOnce(&mut Value),
) -> String {
    let root = rootfs(agent, id);
    let (status, out, err) = run(agent, id, spec(agent, &root, script, edit)).await;
    assert_eq!(status, 0, "{id}: stdout {out:?} stderr {err:?}");
    out
}

/// The value of a `Key:\tvalue` line of /proc/<pid>/status output.
pub fn status_field<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(':')))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no {key} in {out:?}"))
}

/// Expects CreateContainer to fail with `code` and a message containing `needle`.
pub async fn expect_create_error(agent: &TestAgent, id: &str, spec: Vec<u8>, needle: &str) {
    let err = agent
        .create(id, spec, false)
        .await
        .expect_err("create must fail");
    assert!(message(&err).contains(needle), "{id}: {}", message(&err));
    assert!(
        matches!(
            code(&err),
            Some(ttrpc::Code::INVALID_ARGUMENT | ttrpc::Code::FAILED_PRECONDITION)
        ),
        "{id}: {err:?}"
    );
}

/// Expects CreateContainer to fail with INVALID_ARGUMENT (the spec's fault) and a
/// message containing every one of `needles`.
pub async fn expect_create_invalid(agent: &TestAgent, id: &str, spec: Vec<u8>, needles: &[&str]) {
    let err = agent
        .create(id, spec, false)
        .await
        .expect_err("create must fail");
    for needle in needles {
        assert!(message(&err).contains(needle), "{id}: {}", message(&err));
    }
    assert_eq!(
        code(&err),
        Some(ttrpc::Code::INVALID_ARGUMENT),
        "{id}: {err:?}"
    );
}
