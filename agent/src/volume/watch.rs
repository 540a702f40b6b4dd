//! The sync loop of a watched volume: the guest copy of a ConfigMap, Secret, projected or
//! downward API volume, kept in step with the share every [`POLL`].
//!
//! kubelet writes these volumes with its atomic writer: a new `..<timestamp>` directory,
//! then the `..data` symlink swapped by rename, then the user-visible `key -> ..data/key`
//! symlinks. A poll that finds `..data` and the top-level names as they were is one
//! readlink and one listing; anything else is a full read and compare (see `mirror`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use slog::{info, warn, Logger};

use super::mirror::{self, MirrorError, Tree};

/// How often the share is looked at: a change reaches the container within about this
/// long, plus virtio-fs's attribute timeout (1 s with the volumes share's "auto" cache).
pub const POLL: Duration = Duration::from_secs(1);

/// The largest volume the guest copies: a ConfigMap or Secret is at most 1 MiB (etcd's
/// object limit); projected volumes add a few of them. A larger volume is served over
/// virtio-fs as it is, without change events.
pub const SIZE_LIMIT: u64 = 16 << 20;

/// What tells the share's tree has not changed without reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Signature {
    data_link: OsString,
    names: Vec<OsString>,
}

impl Signature {
    /// `None` when the share has no `..data` link (not kubelet's atomic writer's layout):
    /// then every poll compares the whole tree.
    fn of(src: &Path) -> Option<Signature> {
        let data_link = std::fs::read_link(src.join("..data"))
            .ok()?
            .into_os_string();
        let mut names: Vec<OsString> = std::fs::read_dir(src)
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .collect();
        names.sort();
        Some(Signature { data_link, names })
    }
}

/// A copy and what it was last brought up to.
struct State {
    src: PathBuf,
    dest: PathBuf,
    last: Tree,
    signature: Option<Signature>,
}

/// A watched volume being kept in sync; [`WatchedVolume::stop`] ends it and removes the
/// copy.
pub struct WatchedVolume {
    /// `None` once stopped: a poll in flight finds it so and does nothing more.
    state: Arc<Mutex<Option<State>>>,
    task: tokio::task::JoinHandle<()>,
    dest: PathBuf,
}

/// Copies the volume at `src` (the share) into `dest` (made here, under a tmpfs) and
/// starts keeping it in sync. A volume over [`SIZE_LIMIT`] is refused.
pub fn start(log: &Logger, src: &Path, dest: &Path) -> Result<WatchedVolume, MirrorError> {
    let signature = Signature::of(src);
    let tree = Tree::read(src, SIZE_LIMIT)?;
    std::fs::create_dir_all(dest).map_err(|source| MirrorError::Io {
        what: "create",
        path: dest.to_path_buf(),
        source,
    })?;
    if let Err(e) = mirror::apply(dest, &mirror::diff(&Tree::default(), &tree)) {
        let _ = std::fs::remove_dir_all(dest);
        return Err(e);
    }
    let state = Arc::new(Mutex::new(Some(State {
        src: src.to_path_buf(),
        dest: dest.to_path_buf(),
        last: tree,
        signature,
    })));
    let task = tokio::spawn(poll(log.clone(), state.clone()));
    Ok(WatchedVolume {
        state,
        task,
        dest: dest.to_path_buf(),
    })
}

async fn poll(log: Logger, state: Arc<Mutex<Option<State>>>) {
    let mut failing = false;
    loop {
        tokio::time::sleep(POLL).await;
        let s = state.clone();
        let r = tokio::task::spawn_blocking(move || step(&s)).await;
        match r {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => return,
            Ok(Err(e @ (MirrorError::TooBig { .. } | MirrorError::TooDeep))) => {
                warn!(log, "a watched volume outgrew its guest copy, which keeps its last contents and is no longer synced"; "error" => %e);
                return;
            }
            Ok(Err(e)) => {
                // Said once per run of failures: a volume the host removed fails every poll.
                if !failing {
                    warn!(log, "cannot bring a watched volume's guest copy up to date"; "error" => %e);
                }
                failing = true;
                continue;
            }
            Err(_) => return,
        }
        failing = false;
    }
}

/// One poll: `Ok(false)` once the volume is stopped.
fn step(state: &Mutex<Option<State>>) -> Result<bool, MirrorError> {
    let Ok(mut guard) = state.lock() else {
        return Ok(false);
    };
    let Some(st) = guard.as_mut() else {
        return Ok(false);
    };
    let signature = Signature::of(&st.src);
    if signature.is_some() && signature == st.signature {
        return Ok(true);
    }
    let now = Tree::read(&st.src, SIZE_LIMIT)?;
    let ops = mirror::diff(&st.last, &now);
    if !ops.is_empty() {
        mirror::apply(&st.dest, &ops)?;
    }
    st.last = now;
    st.signature = signature;
    Ok(true)
}

impl WatchedVolume {
    /// Ends the sync and removes the guest copy.
    pub fn stop(&self, log: &Logger) {
        self.task.abort();
        if let Ok(mut guard) = self.state.lock() {
            guard.take();
        }
        if let Err(e) = std::fs::remove_dir_all(&self.dest) {
            if e.kind() != std::io::ErrorKind::NotFound {
                warn!(log, "cannot remove a watched volume's guest copy"; "path" => %self.dest.display(), "error" => %e);
            }
        } else {
            info!(log, "watched volume stopped"; "path" => %self.dest.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_after_a_swap_of_data_copies_the_new_version() {
        let src = tempfile::tempdir().unwrap();
        let dest = tempfile::tempdir().unwrap();
        let v1 = src.path().join("..v1");
        std::fs::create_dir(&v1).unwrap();
        std::fs::write(v1.join("k"), "1").unwrap();
        std::os::unix::fs::symlink("..v1", src.path().join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/k", src.path().join("k")).unwrap();
        let tree = Tree::read(src.path(), SIZE_LIMIT).unwrap();
        mirror::apply(dest.path(), &mirror::diff(&Tree::default(), &tree)).unwrap();
        let state = Mutex::new(Some(State {
            src: src.path().to_path_buf(),
            dest: dest.path().to_path_buf(),
            last: tree,
            signature: Signature::of(src.path()),
        }));
        assert!(step(&state).unwrap());
        let v2 = src.path().join("..v2");
        std::fs::create_dir(&v2).unwrap();
        std::fs::write(v2.join("k"), "2").unwrap();
        std::os::unix::fs::symlink("..v2", src.path().join("..tmp")).unwrap();
        std::fs::rename(src.path().join("..tmp"), src.path().join("..data")).unwrap();
        std::fs::remove_dir_all(&v1).unwrap();
        assert!(step(&state).unwrap());
        assert_eq!(std::fs::read_to_string(dest.path().join("k")).unwrap(), "2");
        assert!(!dest.path().join("..v1").exists());
        state.lock().unwrap().take();
        assert!(!step(&state).unwrap(), "a stopped volume stops its loop");
    }
}
