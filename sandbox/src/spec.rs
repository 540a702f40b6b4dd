//! Rewrites a container's OCI spec from host terms into guest terms: the rootfs and every
//! host bind mount become paths under the virtio-fs share as the guest sees it. The spec
//! stays a JSON value so fields this shim does not know reach the agent unchanged.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::kubelet_volume::KubeletBind;
use crate::mount::{Access, Propagation};

/// A host path the shim must bind into the share for the guest to see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostBind {
    pub source: PathBuf,
    /// Relative to the container's directory in the share.
    pub share_rel: PathBuf,
    /// Enforced on the host, where virtiofsd serves the guest's writes.
    pub access: Access,
    pub propagation: Propagation,
}

/// What the guest's spec relies on besides the spec itself.
#[derive(Debug, Default)]
pub struct GuestMounts {
    /// Host paths the shim binds into the share.
    pub binds: Vec<HostBind>,
    /// kubelet's emptyDirs, which the guest keeps itself (see `kubelet_volume`).
    pub pod_local: Vec<protocols::agent::PodLocalVolume>,
    /// kubelet's ConfigMap, Secret, projected and downward API volumes, which the guest
    /// mirrors from the share.
    pub watched: Vec<protocols::agent::WatchedVolume>,
}

/// Host trees that are the host kernel's state, not files: never served into a guest.
const HOST_KERNEL_TREES: &[&str] = &["/proc", "/sys"];

/// Host trees whose paths mean the same in the guest: a bind source there is the
/// guest's own (its `/dev/fuse`, `/dev/net/tun`, ...), not the host's device nodes.
const GUEST_OWN_TREES: &[&str] = &["/dev"];

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("config.json is not a valid OCI spec: {0}")]
    Invalid(String),
    #[error("container id {0}")]
    BadId(protocols::id::InvalidId),
    #[error("mount {index} ({destination}): bind source {path} does not exist on the host")]
    MissingSource {
        index: usize,
        destination: String,
        path: String,
    },
    #[error(
        "mount {index} ({destination}): bind source {path} is the host kernel's {tree}, which a \
         VM sandbox does not serve to its guest (the guest has a kernel of its own). Use the \
         container's own {tree} (mounted by default), or run this pod with a RuntimeClass that \
         shares the host's kernel (runc)"
    )]
    HostKernelSource {
        index: usize,
        destination: String,
        path: String,
        tree: &'static str,
    },
    #[error("mount {index} ({destination}): cannot read kubelet's emptyDir {path}: {source}")]
    EmptyDir {
        index: usize,
        destination: String,
        path: String,
        source: std::io::Error,
    },
    #[error("mount {index} ({destination}): {detail}")]
    BadOptions {
        index: usize,
        destination: String,
        detail: String,
    },
    #[error("annotation {key} names sandbox {value:?}, which is not a valid id: {source}")]
    BadSandboxId {
        key: &'static str,
        value: String,
        source: protocols::id::InvalidId,
    },
}

/// An id names directories on the host and in the guest: it must pass the one id rule
/// every side applies ([`protocols::id`], containerd's), checked before any host work,
/// whoever calls the Task API.
pub fn check_id(id: &str) -> Result<(), SpecError> {
    protocols::id::validate(id).map_err(SpecError::BadId)
}

/// Where the guest finds container `cid`'s directory of the share.
pub fn guest_container_dir(cid: &str) -> PathBuf {
    Path::new(protocols::GUEST_SHARED_DIR).join(cid)
}

fn is_bind(m: &Value) -> bool {
    let ty = m.get("type").and_then(Value::as_str).unwrap_or("");
    let opts = m.get("options").and_then(Value::as_array);
    ty == "bind"
        || opts.is_some_and(|o| {
            o.iter()
                .any(|v| matches!(v.as_str(), Some("bind") | Some("rbind")))
        })
}

/// The options of a bind, and what they become in the guest.
#[derive(Debug, PartialEq, Eq)]
struct BindOptions {
    access: Access,
    propagation: Propagation,
    /// The options the agent gets.
    guest: Vec<Value>,
}

/// Reads a bind's `ro`/`rro`/`rw` and propagation options. The host bind carries the
/// access; the guest's bind is read-only only when the whole tree is (`rro`): a host
/// submount of an `ro` volume is a plain directory of the virtio-fs share in the guest,
/// and must stay as writable as the host leaves it (the host refuses writes to the
/// volume's top with EROFS).
fn bind_options(m: &Value) -> Result<BindOptions, String> {
    let opts: Vec<&str> = m
        .get("options")
        .and_then(Value::as_array)
        .map(|o| o.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut access = Access::ReadWrite;
    let mut propagation = None;
    let mut guest = Vec::new();
    for opt in &opts {
        match *opt {
            "ro" => {
                if access != Access::RecursiveReadOnly {
                    access = Access::ReadOnly;
                }
                continue;
            }
            "rro" => access = Access::RecursiveReadOnly,
            // The last of `ro` and `rw` counts, as with mount(8).
            "rw" if access == Access::ReadOnly => access = Access::ReadWrite,
            "private" | "rprivate" => propagation = Some(Propagation::Private),
            "slave" | "rslave" => propagation = Some(Propagation::Slave),
            "shared" | "rshared" => propagation = Some(Propagation::Shared),
            _ => {}
        }
        guest.push(Value::String(opt.to_string()));
    }
    if access == Access::RecursiveReadOnly {
        if opts.contains(&"rw") {
            return Err(format!("options {opts:?} ask for both rw and read-only"));
        }
        if propagation.is_some_and(|p| p != Propagation::Private) {
            return Err(format!(
                "options {opts:?}: a recursively read-only (rro) bind must be private \
                 (rprivate), as the CRI asks"
            ));
        }
        // The guest's bind is one virtio-fs directory: read-only is all of it.
        guest.retain(|v| v.as_str() != Some("rro"));
        guest.push(Value::String("ro".into()));
    }
    Ok(BindOptions {
        access,
        // runc's default: the rootfs and what is under it are rslave.
        propagation: propagation.unwrap_or(Propagation::Slave),
        guest,
    })
}

/// The tree of `trees` that `path` is in, if any.
fn tree_of(path: &Path, trees: &[&'static str]) -> Option<&'static str> {
    trees.iter().copied().find(|t| path.starts_with(t))
}

/// What the sandbox container's spec says about the whole sandbox, read before the spec
/// is rewritten for the guest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxSpec {
    /// The network namespace CNI set up (a path), if the spec names one.
    pub netns: Option<PathBuf>,
    /// The pod's hostname (`hostname`).
    pub hostname: String,
    /// The pod's host cgroup (`linux.cgroupsPath`).
    pub cgroups_path: Option<String>,
    /// A Kubernetes pod sandbox (annotated `container-type: sandbox`), not a lone
    /// container.
    pub pod: bool,
    /// The spec joins the host's network namespace (no `network` namespace entry).
    pub host_network: bool,
    /// The pod's resources, as containerd's CRI annotates them (see `sizing`).
    pub resources: crate::sizing::PodResources,
}

/// Reads the sandbox-wide parts of the sandbox container's spec.
pub fn sandbox_spec(spec: &Value) -> SandboxSpec {
    let namespaces = spec
        .pointer("/linux/namespaces")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let network = namespaces
        .iter()
        .find(|ns| ns.get("type").and_then(Value::as_str) == Some("network"));
    let netns = network
        .and_then(|ns| ns.get("path"))
        .and_then(Value::as_str)
        .filter(|p| !p.is_empty())
        .map(PathBuf::from);
    let ann = spec.get("annotations");
    let pod = annotations::CONTAINER_TYPE
        .iter()
        .any(|k| ann.and_then(|a| a.get(*k)).and_then(Value::as_str) == Some("sandbox"));
    SandboxSpec {
        netns,
        hostname: spec
            .get("hostname")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        cgroups_path: spec
            .pointer("/linux/cgroupsPath")
            .and_then(Value::as_str)
            .filter(|p| !p.is_empty())
            .map(str::to_string),
        pod,
        host_network: network.is_none(),
        resources: crate::sizing::PodResources::of_spec(spec),
    }
}

/// Points `spec`'s root at container `cid`'s rootfs as the guest sees it, under
/// `rootfs_root` (the mount of the share that carries root filesystems). `spec` has been
/// through [`rewrite_for_guest`], so its root is an object.
pub fn set_guest_rootfs(spec: &mut Value, rootfs_root: &str, cid: &str) {
    let path = Path::new(rootfs_root).join(cid).join("rootfs");
    if let Some(root) = spec.get_mut("root").and_then(Value::as_object_mut) {
        root.insert("path".into(), Value::String(path.display().to_string()));
    }
}

/// One mount of a container's rootfs as its caller describes it (containerd's snapshot
/// mounts: `overlay` with its layers in `options`, or a bind), made at `<bundle>/rootfs`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RootfsMount {
    /// The filesystem type (`overlay`, `bind`, ...).
    pub kind: String,
    pub source: String,
    /// Mount flags (`ro`, `rbind`, ...) and filesystem data (`lowerdir=...`), as `mount -o`.
    pub options: Vec<String>,
}

/// containerd's rootfs mounts without the `uidmap=`/`gidmap=` options its overlay
/// snapshotter adds for a user namespace (ID-mapped layers, which the host's mount code
/// here does not make), and whether there were any: then the guest ID-maps the rootfs
/// through the container's user namespace instead (see [`mark_rootfs_idmap`]), so its
/// files owned by root on the host are the container's root's, as with runc.
pub fn rootfs_without_idmap(rootfs: &[RootfsMount]) -> (Vec<RootfsMount>, bool) {
    let mut idmapped = false;
    let mounts = rootfs
        .iter()
        .map(|m| {
            let mut m = m.clone();
            let before = m.options.len();
            m.options
                .retain(|o| !o.starts_with("uidmap=") && !o.starts_with("gidmap="));
            idmapped |= m.options.len() != before;
            m
        })
        .collect();
    (mounts, idmapped)
}

/// Sets [`protocols::ROOTFS_IDMAP_ANNOTATION`] on `spec` when `idmapped`, and removes
/// it otherwise: only the shim decides it.
pub fn mark_rootfs_idmap(spec: &mut Value, idmapped: bool) {
    let Some(obj) = spec.as_object_mut() else {
        return;
    };
    let annotations = obj
        .entry("annotations")
        .or_insert_with(|| Value::Object(Default::default()));
    if let Some(a) = annotations.as_object_mut() {
        if idmapped {
            a.insert(
                protocols::ROOTFS_IDMAP_ANNOTATION.into(),
                Value::String("true".into()),
            );
        } else {
            a.remove(protocols::ROOTFS_IDMAP_ANNOTATION);
        }
    }
}

/// Rewrites `spec` for the guest and returns the host binds and guest volumes it now
/// relies on.
/// `pod_member`: the container belongs to another container's pod sandbox, and shares
/// the namespaces its spec names by path with the pod (see [`protocols::GUEST_SANDBOX_NS_DIR`]).
pub fn rewrite_for_guest(
    spec: &mut Value,
    cid: &str,
    pod_member: bool,
) -> Result<GuestMounts, SpecError> {
    let guest_dir = guest_container_dir(cid);
    let obj = spec
        .as_object_mut()
        .ok_or_else(|| SpecError::Invalid("the top level is not an object".into()))?;
    // Its path is set per sandbox (see [`set_guest_rootfs`]).
    let root = obj
        .entry("root")
        .or_insert_with(|| Value::Object(Default::default()));
    if !root.is_object() {
        return Err(SpecError::Invalid("root is not an object".into()));
    }

    let mut out = GuestMounts::default();
    if let Some(mounts) = obj.get_mut("mounts").and_then(Value::as_array_mut) {
        for (index, m) in mounts.iter_mut().enumerate() {
            if !is_bind(m) {
                continue;
            }
            let source = m
                .get("source")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let destination = m
                .get("destination")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            // Where the source really is (containerd resolves symlinks; other callers
            // may not).
            let Ok(real) = std::fs::canonicalize(&source) else {
                return Err(SpecError::MissingSource {
                    index,
                    destination,
                    path: source,
                });
            };
            if let Some(tree) = tree_of(&real, HOST_KERNEL_TREES) {
                return Err(SpecError::HostKernelSource {
                    index,
                    destination,
                    path: source,
                    tree,
                });
            }
            if tree_of(&real, GUEST_OWN_TREES).is_some() {
                // The agent binds the guest's own path of that name.
                m["source"] = Value::String(real.display().to_string());
                continue;
            }
            let opts = bind_options(m).map_err(|detail| SpecError::BadOptions {
                index,
                destination: destination.clone(),
                detail,
            })?;
            match crate::kubelet_volume::of_bind(&real) {
                Some(KubeletBind::EmptyDir {
                    pod_uid,
                    name,
                    volume_dir,
                    sub_path,
                }) => {
                    let setup =
                        crate::kubelet_volume::empty_dir_setup(&volume_dir).map_err(|source| {
                            SpecError::EmptyDir {
                                index,
                                destination: destination.clone(),
                                path: volume_dir.display().to_string(),
                                source,
                            }
                        })?;
                    let mut guest = opts.guest;
                    if opts.access != Access::ReadWrite {
                        guest.push(Value::String("ro".into()));
                    }
                    let mut dir = Path::new(protocols::GUEST_POD_VOLUMES_DIR)
                        .join(&pod_uid)
                        .join(&name);
                    if !sub_path.as_os_str().is_empty() {
                        dir.push(&sub_path);
                    }
                    m["source"] = Value::String(dir.display().to_string());
                    m["options"] = Value::Array(guest);
                    out.pod_local.push(protocols::agent::PodLocalVolume {
                        mount_index: index as u32,
                        pod_uid,
                        name,
                        memory: setup.tmpfs_size.is_some(),
                        size_bytes: setup.tmpfs_size.unwrap_or(0),
                        uid: setup.uid,
                        gid: setup.gid,
                        mode: setup.mode,
                        sub_path: sub_path.display().to_string(),
                        ..Default::default()
                    });
                    continue;
                }
                Some(KubeletBind::Watched) => {
                    out.watched.push(protocols::agent::WatchedVolume {
                        mount_index: index as u32,
                        ..Default::default()
                    });
                }
                None => {}
            }
            let name = Path::new(&destination)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "root".into());
            let share_rel = PathBuf::from("mounts").join(format!("{index}-{name}"));
            out.binds.push(HostBind {
                source: PathBuf::from(&source),
                share_rel: share_rel.clone(),
                access: opts.access,
                propagation: opts.propagation,
            });
            m["source"] = Value::String(guest_dir.join(&share_rel).display().to_string());
            m["options"] = Value::Array(opts.guest);
        }
    }

    // Namespace paths name host namespaces, which mean nothing inside the VM. A pod
    // member's path to its sandbox's IPC, UTS or PID namespace becomes the guest's path
    // to the pod's; the network is the guest's own, shared by every container.
    if let Some(nss) = obj
        .get_mut("linux")
        .and_then(|l| l.get_mut("namespaces"))
        .and_then(Value::as_array_mut)
    {
        for ns in nss.iter_mut() {
            let Some(o) = ns.as_object_mut() else {
                continue;
            };
            let typ = o
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let has_path = o
                .get("path")
                .and_then(Value::as_str)
                .is_some_and(|p| !p.is_empty());
            let peer = o
                .get("path")
                .and_then(Value::as_str)
                .is_some_and(|p| p.starts_with(protocols::GUEST_CONTAINER_NS_DIR));
            if pod_member && peer {
                // Named by `name_peer_namespaces`: already the guest's.
            } else if pod_member
                && has_path
                && protocols::POD_SHARED_NAMESPACES.contains(&typ.as_str())
            {
                let guest = Path::new(protocols::GUEST_SANDBOX_NS_DIR).join(&typ);
                o.insert("path".into(), Value::String(guest.display().to_string()));
            } else {
                o.remove("path");
            }
        }
    }
    Ok(out)
}

/// Rewrites a pod member's namespace paths that name another container of the pod by the
/// host pid it reports (`/proc/<pid>/ns/<type>`, `peers`: pid → container id) to that
/// container's namespace in the guest, `<GUEST_CONTAINER_NS_DIR>/<id>/<type>`: how
/// containerd names the target of `kubectl debug --target` (its PID namespace). Other
/// paths stay for [`rewrite_for_guest`].
pub fn name_peer_namespaces(spec: &mut Value, peers: &HashMap<u32, String>) {
    let Some(nss) = spec
        .pointer_mut("/linux/namespaces")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for ns in nss.iter_mut() {
        let Some(o) = ns.as_object_mut() else {
            continue;
        };
        let Some(typ) = o.get("type").and_then(Value::as_str).map(str::to_string) else {
            continue;
        };
        let Some(id) = o
            .get("path")
            .and_then(Value::as_str)
            .and_then(proc_pid_of)
            .and_then(|pid| peers.get(&pid))
        else {
            continue;
        };
        let guest = Path::new(protocols::GUEST_CONTAINER_NS_DIR)
            .join(id)
            .join(&typ);
        o.insert("path".into(), Value::String(guest.display().to_string()));
    }
}

/// The pid of a `/proc/<pid>/ns/<type>` path.
fn proc_pid_of(path: &str) -> Option<u32> {
    let rest = path.strip_prefix("/proc/")?;
    let (pid, ns) = rest.split_once('/')?;
    ns.strip_prefix("ns/")?;
    pid.parse().ok()
}

/// The annotations that tell a pod's sandbox container from its other containers.
pub mod annotations {
    pub const CONTAINER_TYPE: &[&str] = &[
        "io.kubernetes.cri.container-type",
        "io.kubernetes.cri-o.ContainerType",
    ];
    pub const SANDBOX_ID: &[&str] = &[
        "io.kubernetes.cri.sandbox-id",
        "io.kubernetes.cri-o.SandboxID",
    ];
}

/// The sandbox a container belongs to: itself, unless its annotations name another,
/// whose id passes the same rule as a container's ([`check_id`]): it names directories
/// and sockets on the host.
pub fn sandbox_of(spec: &Value, cid: &str) -> Result<String, SpecError> {
    let ann = spec.get("annotations");
    let get = |keys: &[&'static str]| {
        keys.iter().find_map(|k| {
            ann.and_then(|a| a.get(*k))
                .and_then(Value::as_str)
                .map(|v| (*k, v.to_string()))
        })
    };
    match get(annotations::CONTAINER_TYPE) {
        Some((_, t)) if t == "container" => match get(annotations::SANDBOX_ID) {
            Some((key, value)) => match protocols::id::validate(&value) {
                Ok(()) => Ok(value),
                Err(source) => Err(SpecError::BadSandboxId { key, value, source }),
            },
            None => Ok(cid.to_string()),
        },
        _ => Ok(cid.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_id_mapped_snapshot_is_mounted_plainly_and_mapped_in_the_guest() {
        let overlay = RootfsMount {
            kind: "overlay".into(),
            source: "overlay".into(),
            options: vec![
                "index=off".into(),
                "lowerdir=/l".into(),
                "uidmap=0:1000:100000".into(),
                "gidmap=0:1000:100000".into(),
            ],
        };
        let (mounts, idmapped) = rootfs_without_idmap(std::slice::from_ref(&overlay));
        assert!(idmapped);
        assert_eq!(mounts[0].options, vec!["index=off", "lowerdir=/l"]);
        let mut spec = json!({"annotations": {"a": "b"}});
        mark_rootfs_idmap(&mut spec, true);
        assert_eq!(
            spec["annotations"][protocols::ROOTFS_IDMAP_ANNOTATION],
            "true"
        );
        assert_eq!(spec["annotations"]["a"], "b");

        // A plain snapshot: nothing stripped, and a forged annotation is removed.
        let (mounts, idmapped) = rootfs_without_idmap(&mounts);
        assert!(!idmapped);
        assert_eq!(mounts[0].options.len(), 2);
        mark_rootfs_idmap(&mut spec, false);
        assert!(spec["annotations"]
            .get(protocols::ROOTFS_IDMAP_ANNOTATION)
            .is_none());
    }

    #[test]
    fn rootfs_and_binds_point_into_the_share() {
        let mut spec = json!({
            "root": {"path": "rootfs"},
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/data", "type": "bind", "source": "/tmp", "options": ["rbind", "ro"]},
                {"destination": "/etc/hosts", "source": "/etc/hosts", "options": ["bind"]}
            ],
            "linux": {"namespaces": [{"type": "network", "path": "/proc/1/ns/net"}, {"type": "pid"}]},
            "unknownField": 1
        });
        let binds = rewrite_for_guest(&mut spec, "c1", false).unwrap().binds;
        set_guest_rootfs(&mut spec, protocols::GUEST_SHARED_DIR, "c1");
        assert_eq!(
            spec["root"]["path"],
            "/run/kata-containers/shared/containers/c1/rootfs"
        );
        set_guest_rootfs(&mut spec, protocols::GUEST_ROOTFS_DIR, "c1");
        assert_eq!(
            spec["root"]["path"],
            "/run/kata-containers/shared/rootfs/c1/rootfs"
        );
        assert_eq!(spec["mounts"][0]["source"], "proc");
        assert_eq!(
            spec["mounts"][1]["source"],
            "/run/kata-containers/shared/containers/c1/mounts/1-data"
        );
        assert_eq!(
            spec["mounts"][2]["source"],
            "/run/kata-containers/shared/containers/c1/mounts/2-hosts"
        );
        assert_eq!(spec["unknownField"], 1);
        assert!(spec["linux"]["namespaces"][0].get("path").is_none());
        assert_eq!(binds.len(), 2);
        assert_eq!(binds[0].access, Access::ReadOnly);
        assert_eq!(binds[1].access, Access::ReadWrite);
        assert_eq!(binds[0].source, PathBuf::from("/tmp"));
    }

    #[test]
    fn kubelet_empty_dirs_stay_in_the_guest_and_api_volumes_are_watched() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        let vols = root.join("pods/u-1/volumes");
        let cache = vols.join("kubernetes.io~empty-dir/cache");
        let cfg = vols.join("kubernetes.io~configmap/cfg");
        std::fs::create_dir_all(&cache).unwrap();
        std::fs::create_dir_all(&cfg).unwrap();
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o2775)).unwrap();
        let mut spec = json!({"mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/cache", "type": "bind", "source": cache, "options": ["rbind", "rprivate", "rw"]},
            {"destination": "/ro-cache", "type": "bind", "source": cache, "options": ["rbind", "rprivate", "ro"]},
            {"destination": "/etc/cfg", "type": "bind", "source": cfg, "options": ["rbind", "rprivate", "ro"]}
        ]});
        let out = rewrite_for_guest(&mut spec, "c1", true).unwrap();
        assert_eq!(out.binds.len(), 1, "only the ConfigMap crosses the share");
        assert_eq!(out.binds[0].source, cfg);
        assert_eq!(out.pod_local.len(), 2);
        let v = &out.pod_local[0];
        assert_eq!(
            (v.mount_index, v.pod_uid.as_str(), v.name.as_str()),
            (1, "u-1", "cache")
        );
        assert!(!v.memory, "no tmpfs at the path: a disk emptyDir");
        assert_eq!(v.mode, 0o2775);
        assert_eq!(v.uid, nix::unistd::getuid().as_raw());
        assert_eq!(
            spec["mounts"][1]["source"],
            "/run/kata-containers/sandbox/volumes/u-1/cache"
        );
        assert_eq!(
            spec["mounts"][1]["options"],
            json!(["rbind", "rprivate", "rw"])
        );
        // Nothing on the host enforces read-only for a guest-only volume: the guest does.
        assert_eq!(
            spec["mounts"][2]["options"],
            json!(["rbind", "rprivate", "ro"])
        );
        assert_eq!(out.watched.len(), 1);
        assert_eq!(out.watched[0].mount_index, 3);
        assert_eq!(
            spec["mounts"][3]["source"],
            "/run/kata-containers/shared/containers/c1/mounts/3-cfg"
        );
    }

    #[test]
    fn missing_bind_source_is_named() {
        let mut spec =
            json!({"mounts": [{"destination": "/d", "type": "bind", "source": "/no/such/dir"}]});
        let err = rewrite_for_guest(&mut spec, "c1", false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("/no/such/dir") && err.contains("/d"), "{err}");
    }

    #[test]
    fn pod_containers_join_their_sandbox() {
        let pod = json!({"annotations": {"io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.sandbox-id": "sb"}});
        assert_eq!(sandbox_of(&pod, "c2").unwrap(), "sb");
        let sb = json!({"annotations": {"io.kubernetes.cri.container-type": "sandbox"}});
        assert_eq!(sandbox_of(&sb, "sb").unwrap(), "sb");
        assert_eq!(sandbox_of(&json!({}), "solo").unwrap(), "solo");
    }

    #[test]
    fn a_sandbox_id_annotation_passes_the_id_rule() {
        for bad in ["../x", "", "..", "a/b"] {
            let spec = json!({"annotations": {"io.kubernetes.cri.container-type": "container",
                                              "io.kubernetes.cri.sandbox-id": bad}});
            let err = sandbox_of(&spec, "c2").unwrap_err().to_string();
            assert!(
                err.contains("io.kubernetes.cri.sandbox-id") && err.contains(&format!("{bad:?}")),
                "{err}"
            );
        }
        let crio = json!({"annotations": {"io.kubernetes.cri-o.ContainerType": "container",
                                          "io.kubernetes.cri-o.SandboxID": "../../etc"}});
        assert!(sandbox_of(&crio, "c2").is_err());
    }

    fn bind_of(options: serde_json::Value) -> (Vec<HostBind>, serde_json::Value) {
        let mut spec = json!({"mounts": [
            {"destination": "/data", "type": "bind", "source": "/tmp", "options": options}
        ]});
        let binds = rewrite_for_guest(&mut spec, "c1", false).unwrap().binds;
        (binds, spec["mounts"][0]["options"].clone())
    }

    #[test]
    fn read_only_is_the_volumes_top_on_the_host_and_writable_submounts_in_the_guest() {
        // What containerd's CRI writes for `readOnly: true`.
        let (binds, guest) = bind_of(json!(["rbind", "rprivate", "ro"]));
        assert_eq!(binds[0].access, Access::ReadOnly);
        assert_eq!(binds[0].propagation, Propagation::Private);
        // The host refuses writes to the top; the guest's bind leaves the host's
        // submounts (plain directories of the share there) as the host has them.
        assert_eq!(guest, json!(["rbind", "rprivate"]));
    }

    #[test]
    fn recursive_read_only_is_read_only_on_both_sides() {
        let (binds, guest) = bind_of(json!(["rbind", "rprivate", "rro"]));
        assert_eq!(binds[0].access, Access::RecursiveReadOnly);
        assert_eq!(guest, json!(["rbind", "rprivate", "ro"]));
        let (binds, _) = bind_of(json!(["rbind", "ro", "rro"]));
        assert_eq!(binds[0].access, Access::RecursiveReadOnly);
        for bad in [
            json!(["rbind", "rslave", "rro"]),
            json!(["rbind", "rro", "rw"]),
        ] {
            let mut spec = json!({"mounts": [
                {"destination": "/data", "type": "bind", "source": "/tmp", "options": bad}
            ]});
            let err = rewrite_for_guest(&mut spec, "c1", false)
                .unwrap_err()
                .to_string();
            assert!(err.contains("/data") && err.contains("rro"), "{err}");
        }
    }

    #[test]
    fn propagation_is_what_the_options_ask_and_rslave_without_any() {
        let cases = [
            (json!(["rbind", "rw"]), Propagation::Slave),
            (json!(["rbind", "rprivate"]), Propagation::Private),
            (json!(["rbind", "rslave"]), Propagation::Slave),
            (json!(["rbind", "rshared"]), Propagation::Shared),
        ];
        for (options, want) in cases {
            let (binds, _) = bind_of(options.clone());
            assert_eq!(binds[0].propagation, want, "{options}");
            assert_eq!(binds[0].access, Access::ReadWrite, "{options}");
        }
        let (binds, guest) = bind_of(json!(["rbind", "ro", "rw"]));
        assert_eq!(
            binds[0].access,
            Access::ReadWrite,
            "the last of ro and rw counts"
        );
        assert_eq!(guest, json!(["rbind", "rw"]));
    }

    #[test]
    fn host_proc_and_sys_are_refused_and_dev_is_the_guests_own() {
        for (source, tree) in [
            ("/proc", "/proc"),
            ("/proc/self", "/proc"),
            ("/sys/kernel", "/sys"),
        ] {
            let mut spec = json!({"mounts": [
                {"destination": "/host", "type": "bind", "source": source, "options": ["rbind", "ro"]}
            ]});
            let err = rewrite_for_guest(&mut spec, "c1", false)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("/host")
                    && err.contains(source)
                    && err.contains(&format!("host kernel's {tree}")),
                "{err}"
            );
        }
        let mut spec = json!({"mounts": [
            {"destination": "/dev/fuse", "type": "bind", "source": "/dev/fuse", "options": ["bind"]}
        ]});
        let binds = rewrite_for_guest(&mut spec, "c1", false).unwrap().binds;
        assert!(
            binds.is_empty(),
            "nothing of the host's /dev goes into the share"
        );
        assert_eq!(spec["mounts"][0]["source"], "/dev/fuse");
    }

    #[test]
    fn a_pod_member_joins_the_pods_namespaces_in_the_guest() {
        let mut spec = json!({"linux": {"namespaces": [
            {"type": "network", "path": "/proc/7/ns/net"},
            {"type": "ipc", "path": "/proc/7/ns/ipc"},
            {"type": "uts", "path": "/proc/7/ns/uts"},
            {"type": "pid", "path": "/proc/7/ns/pid"},
            {"type": "mount"}
        ]}});
        rewrite_for_guest(&mut spec, "c2", true).unwrap();
        let nss = &spec["linux"]["namespaces"];
        assert!(
            nss[0].get("path").is_none(),
            "the guest's network is shared as it is"
        );
        assert_eq!(nss[1]["path"], "/run/kata-containers/sandbox/ns/ipc");
        assert_eq!(nss[2]["path"], "/run/kata-containers/sandbox/ns/uts");
        assert_eq!(nss[3]["path"], "/run/kata-containers/sandbox/ns/pid");
        assert!(nss[4].get("path").is_none());

        // Not a pod member (ctr run --with-ns): host paths are dropped.
        let mut spec =
            json!({"linux": {"namespaces": [{"type": "ipc", "path": "/proc/7/ns/ipc"}]}});
        rewrite_for_guest(&mut spec, "solo", false).unwrap();
        assert!(spec["linux"]["namespaces"][0].get("path").is_none());
    }

    #[test]
    fn a_debug_target_names_its_targets_pid_namespace_in_the_guest() {
        // kubectl debug --target=main: containerd names the target's PID namespace by the
        // pid it reported, the pod's others by the sandbox container's (the VMM's).
        let mut spec = json!({"linux": {"namespaces": [
            {"type": "ipc", "path": "/proc/7/ns/ipc"},
            {"type": "pid", "path": "/proc/4321/ns/pid"},
            {"type": "mount"}
        ]}});
        let peers = HashMap::from([(4321, "main".to_string()), (99, "other".to_string())]);
        name_peer_namespaces(&mut spec, &peers);
        rewrite_for_guest(&mut spec, "debugger", true).unwrap();
        let nss = &spec["linux"]["namespaces"];
        assert_eq!(nss[0]["path"], "/run/kata-containers/sandbox/ns/ipc");
        assert_eq!(
            nss[1]["path"],
            format!("{}/main/pid", protocols::GUEST_CONTAINER_NS_DIR)
        );
        assert!(nss[2].get("path").is_none());

        // A pid that is no container's: the pod's, as before.
        let mut spec =
            json!({"linux": {"namespaces": [{"type": "pid", "path": "/proc/7/ns/pid"}]}});
        name_peer_namespaces(&mut spec, &peers);
        rewrite_for_guest(&mut spec, "c2", true).unwrap();
        assert_eq!(
            spec["linux"]["namespaces"][0]["path"],
            "/run/kata-containers/sandbox/ns/pid"
        );
        assert_eq!(proc_pid_of("/proc/12/ns/pid"), Some(12));
        assert_eq!(proc_pid_of("/proc/12/root"), None);
        assert_eq!(proc_pid_of("/var/run/netns/x"), None);
    }

    #[test]
    fn the_sandbox_spec_names_netns_hostname_and_cgroup() {
        let spec = json!({
            "hostname": "web-1",
            "annotations": {"io.kubernetes.cri.container-type": "sandbox",
                            "io.kubernetes.cri.sandbox-memory": "1610612736"},
            "linux": {
                "cgroupsPath": "/kubepods/pod1/sb",
                "namespaces": [{"type": "pid"}, {"type": "network", "path": "/var/run/netns/cni-1"}]
            }
        });
        assert_eq!(
            sandbox_spec(&spec),
            SandboxSpec {
                netns: Some(PathBuf::from("/var/run/netns/cni-1")),
                hostname: "web-1".into(),
                cgroups_path: Some("/kubepods/pod1/sb".into()),
                pod: true,
                host_network: false,
                resources: crate::sizing::PodResources {
                    memory: Some("1610612736".into()),
                    ..Default::default()
                },
            }
        );
        // ctr run: a new network namespace without a path; ctr run --net-host: none.
        let ctr = json!({"linux": {"namespaces": [{"type": "network"}]}});
        let s = sandbox_spec(&ctr);
        assert!(s.netns.is_none() && !s.host_network && !s.pod);
        let host = json!({"annotations": {"io.kubernetes.cri.container-type": "sandbox"},
                          "linux": {"namespaces": [{"type": "pid"}]}});
        assert!(sandbox_spec(&host).host_network);
    }
}
