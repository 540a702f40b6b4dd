//! kubelet's volumes that the guest keeps itself, as the shim marks them in
//! CreateContainerRequest (see `sandbox/src/kubelet_volume.rs`):
//!
//! - `pod_local`: emptyDirs, a guest directory (or tmpfs) per pod volume, which never
//!   crosses virtio-fs, so that unix sockets and FIFOs on it work between containers;
//! - `sub_path`: kubelet's subPath of such a volume, bound safely;
//! - `mirror` and `watch`: ConfigMap, Secret, projected and downward API volumes copied
//!   from the share into the guest and kept in sync, so that inotify in the container
//!   sees kubelet's updates.
//!
//! [`prepare`] points the container's spec mounts at them before its stage runs; the
//! container owns the [`ContainerVolumes`] that result and stops them when it goes.

pub mod mirror;
pub mod pod_local;
pub mod sub_path;
pub mod watch;

use std::path::{Path, PathBuf};

use protocols::agent::{PodLocalVolume, WatchedVolume};
use slog::{info, warn, Logger};

use crate::error::{AgentError, Result};
use crate::spec::{Mount, Spec};
use pod_local::PodVolumes;

/// The volumes of a container's create request.
#[derive(Debug, Default, Clone)]
pub struct Requested {
    pub pod_local: Vec<PodLocalVolume>,
    pub watched: Vec<WatchedVolume>,
}

/// What a container holds of its volumes: the syncs of its watched volumes and the
/// binds of its subPaths.
#[derive(Default)]
pub struct ContainerVolumes {
    watched: Vec<watch::WatchedVolume>,
    sub_paths: Vec<PathBuf>,
    /// The container's directory of copies, removed with the last of them.
    dir: Option<PathBuf>,
}

impl ContainerVolumes {
    /// Stops every sync and removes the copies.
    pub fn stop(&mut self, log: &Logger) {
        for w in self.watched.drain(..) {
            w.stop(log);
        }
        for at in self.sub_paths.drain(..) {
            sub_path::unbind(&at);
        }
        if let Some(dir) = self.dir.take() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

fn mount_at<'a>(spec: &'a mut Spec, index: u32, what: &str) -> Result<&'a mut Mount> {
    let len = spec.mounts.len();
    let m = spec.mounts.get_mut(index as usize).ok_or_else(|| {
        AgentError::InvalidArgument(format!(
            "{what} names mount {index}, but the spec has {len} mounts"
        ))
    })?;
    let bind =
        m.typ.as_deref() == Some("bind") || m.options.iter().any(|o| o == "bind" || o == "rbind");
    if !bind {
        return Err(AgentError::InvalidArgument(format!(
            "{what} names mount {index} ({}), which is not a bind mount",
            m.destination
        )));
    }
    Ok(m)
}

/// Points the spec's marked mounts at the guest's volumes: pod volumes made (or found)
/// in `pod` (a subPath bound under `container_root/<id>/`), watched volumes copied under
/// `container_root/<id>/` and synced from then on.
/// A watched volume the guest cannot copy (over the size cap, unreadable) stays a bind of
/// the share, as every volume was before, and the log says why.
pub fn prepare(
    log: &Logger,
    id: &str,
    spec: &mut Spec,
    req: &Requested,
    pod: &PodVolumes,
    container_root: &Path,
) -> Result<ContainerVolumes> {
    let dir = container_root.join(id);
    let mut volumes = ContainerVolumes {
        dir: Some(dir.clone()),
        ..Default::default()
    };
    if let Err(e) = pod_volumes(log, id, spec, req, pod, &dir, &mut volumes) {
        volumes.stop(log);
        return Err(e);
    }
    for v in &req.watched {
        let m = match mount_at(spec, v.mount_index, "a watched volume") {
            Ok(m) => m,
            Err(e) => {
                volumes.stop(log);
                return Err(e);
            }
        };
        let Some(src) = m.source.clone() else {
            continue;
        };
        let dest = dir.join(v.mount_index.to_string());
        match watch::start(log, Path::new(&src), &dest) {
            Ok(w) => {
                volumes.watched.push(w);
                m.source = Some(dest.display().to_string());
                // The copy is the agent's: the container reads it only.
                m.options.retain(|o| o != "rw");
                m.options.push("ro".into());
                info!(log, "watched volume copied into the guest"; "container_id" => id,
                    "destination" => &m.destination);
            }
            Err(e) => {
                warn!(log, "watched volume served over virtio-fs as it is: kubelet's updates raise no inotify events in it";
                    "container_id" => id, "destination" => &m.destination, "reason" => %e);
            }
        }
    }
    Ok(volumes)
}

/// The pod volumes of [`prepare`]; subPath binds are recorded in `volumes` as made.
fn pod_volumes(
    log: &Logger,
    id: &str,
    spec: &mut Spec,
    req: &Requested,
    pod: &PodVolumes,
    dir: &Path,
    volumes: &mut ContainerVolumes,
) -> Result<()> {
    for v in &req.pod_local {
        let m = mount_at(spec, v.mount_index, "a pod volume")?;
        let mut source = pod.ensure(v)?;
        if !v.sub_path.is_empty() {
            let at = dir.join(format!("sub-{}", v.mount_index));
            sub_path::bind(&source, &v.sub_path, &at)?;
            volumes.sub_paths.push(at.clone());
            source = at;
        }
        m.source = Some(source.display().to_string());
        info!(log, "pod volume in the guest"; "container_id" => id, "volume" => &v.name,
            "sub_path" => &v.sub_path, "destination" => &m.destination, "memory" => v.memory,
            "size_bytes" => v.size_bytes);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec_with(mounts: serde_json::Value) -> Spec {
        let json = serde_json::json!({"process": {"args": ["sh"], "cwd": "/"}, "root": {"path": "/r"}, "mounts": mounts});
        Spec::from_json(&serde_json::to_vec(&json).unwrap()).unwrap()
    }

    fn log() -> Logger {
        Logger::root(slog::Discard, slog::o!())
    }

    #[tokio::test]
    async fn marked_mounts_point_at_the_guests_volumes() {
        let tmp = tempfile::tempdir().unwrap();
        let share = tmp.path().join("share-cfg");
        std::fs::create_dir(&share).unwrap();
        std::fs::write(share.join("key"), "v").unwrap();
        let mut spec = spec_with(serde_json::json!([
            {"destination": "/cache", "type": "bind", "source": "/x", "options": ["rbind", "rw"]},
            {"destination": "/cfg", "type": "bind", "source": share, "options": ["rbind", "rw"]}
        ]));
        let req = Requested {
            pod_local: vec![PodLocalVolume {
                mount_index: 0,
                pod_uid: "u1".into(),
                name: "cache".into(),
                uid: nix::unistd::getuid().as_raw(),
                gid: nix::unistd::getgid().as_raw(),
                mode: 0o777,
                ..Default::default()
            }],
            watched: vec![WatchedVolume {
                mount_index: 1,
                ..Default::default()
            }],
        };
        let pod = PodVolumes::at(&tmp.path().join("pod"));
        let watched = tmp.path().join("watched");
        let mut vols = prepare(&log(), "c1", &mut spec, &req, &pod, &watched).unwrap();
        let cache = tmp.path().join("pod/u1/cache");
        assert_eq!(spec.mounts[0].source.as_deref(), cache.to_str());
        let copy = watched.join("c1/1");
        assert_eq!(spec.mounts[1].source.as_deref(), copy.to_str());
        assert_eq!(spec.mounts[1].options, ["rbind", "ro"]);
        assert_eq!(std::fs::read_to_string(copy.join("key")).unwrap(), "v");
        vols.stop(&log());
        assert!(
            !watched.join("c1").exists(),
            "the copies go with the container"
        );
        assert!(
            cache.exists(),
            "the pod's volume stays for its next container"
        );
    }

    #[tokio::test]
    async fn a_mark_on_a_mount_that_is_no_bind_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let mut spec = spec_with(serde_json::json!([
            {"destination": "/proc", "type": "proc", "source": "proc"}
        ]));
        let req = Requested {
            watched: vec![WatchedVolume {
                mount_index: 0,
                ..Default::default()
            }],
            ..Default::default()
        };
        let pod = PodVolumes::at(tmp.path());
        let err = prepare(&log(), "c1", &mut spec, &req, &pod, tmp.path())
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("not a bind mount"), "{err}");
        let req = Requested {
            watched: vec![WatchedVolume {
                mount_index: 7,
                ..Default::default()
            }],
            ..Default::default()
        };
        let err = prepare(&log(), "c1", &mut spec, &req, &pod, tmp.path())
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("has 1 mounts"), "{err}");
    }
}
