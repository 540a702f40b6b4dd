//! The OCI runtime spec (config.json) as the agent holds it: parsed once, at
//! CreateContainer (or ExecProcess, for a process), then handed on typed: the cgroup
//! code gets `linux.resources`, the container stage gets the whole spec.
//!
//! Plain serde structs rather than `oci-spec`: the stage receives the spec re-serialised,
//! and `oci-spec`'s structs drop every field they do not know (and reject some values
//! runc accepts), while the shim passes fields through on purpose. Here the fields the
//! agent acts on are typed, and the rest of each object the shim sends is kept in
//! `extra` (`#[serde(flatten)]`), so nothing is lost on the way to the stage.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::cgroup::resources::LinuxResources;

/// Why a spec (or an ExecProcess process) was refused; always the caller's to fix.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("invalid OCI spec JSON: {0}")]
    SpecJson(#[source] serde_json::Error),
    #[error("invalid OCI process JSON: {0}")]
    ProcessJson(#[source] serde_json::Error),
    #[error("OCI spec has no {0}: the shim must send one")]
    Missing(&'static str),
    #[error("process.args must not be empty: give the command to run")]
    NoArgs,
    #[error("{field} {value:?} must be an absolute path")]
    NotAbsolute { field: &'static str, value: String },
    #[error(
        "linux.namespaces[{index}].type {typ:?} is not a namespace type this agent supports: \
         use one of {}",
        NAMESPACE_TYPES.join(", ")
    )]
    UnknownNamespace { index: usize, typ: String },
}

/// Gives the container a cgroup namespace of its own when its spec names none, so that the
/// guest's cgroup v2 file system shows the container its own cgroup at `/sys/fs/cgroup`
/// (its `memory.max`, `cpu.max`: what the JVM, Go and nginx size themselves by). containerd
/// adds one only on a cgroup v2 host; on a v1 host runc binds the container's own cgroup
/// directories there instead. Either way the container sees its own cgroup, and so here.
pub fn own_cgroup_namespace(spec: &mut Spec) {
    let linux = spec.linux.get_or_insert_with(Default::default);
    if !linux.namespaces.iter().any(|n| n.typ == "cgroup") {
        linux.namespaces.push(Namespace {
            typ: "cgroup".into(),
            path: None,
        });
    }
}

/// The namespace types `linux.namespaces` may name (the stage creates or joins each).
pub const NAMESPACE_TYPES: &[&str] = &["pid", "network", "mount", "ipc", "uts", "user", "cgroup"];

/// The PATH used to resolve `args[0]` when `process.env` has none (runc's default).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Spec {
    pub process: Option<Process>,
    pub root: Option<Root>,
    pub hostname: Option<String>,
    pub mounts: Vec<Mount>,
    pub linux: Option<Linux>,
    /// Not interpreted by the agent; kept for the stage and whoever reads it next.
    pub annotations: BTreeMap<String, String>,
    /// Every other field (`ociVersion`, `hooks`, ...), passed through unchanged.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Process {
    pub terminal: bool,
    pub user: User,
    pub args: Vec<String>,
    pub env: Vec<String>,
    pub cwd: String,
    /// `None` means no capabilities at all, as with runc.
    pub capabilities: Option<Capabilities>,
    pub rlimits: Vec<Rlimit>,
    pub no_new_privileges: bool,
    /// The guest has no AppArmor; logged and ignored.
    pub apparmor_profile: Option<String>,
    /// The guest has no SELinux; logged and ignored.
    pub selinux_label: Option<String>,
    /// Fields the agent does not interpret (`consoleSize`, `oomScoreAdj`, ...).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Process {
    /// The value of `PATH` in the process environment, or the default.
    pub fn path_env(&self) -> &str {
        self.env
            .iter()
            .find_map(|e| e.strip_prefix("PATH="))
            .unwrap_or(DEFAULT_PATH)
    }

    /// Parses and checks an OCI process sent by ExecProcess.
    pub fn from_json(bytes: &[u8]) -> Result<Process, SpecError> {
        let process: Process = serde_json::from_slice(bytes).map_err(SpecError::ProcessJson)?;
        process.validate()?;
        Ok(process)
    }

    /// Checks what the stage cannot do without. What it would refuse field by field
    /// (capability names, rlimits) is for `stage::preflight_process`.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.args.is_empty() {
            return Err(SpecError::NoArgs);
        }
        if !self.cwd.starts_with('/') {
            return Err(SpecError::NotAbsolute {
                field: "process.cwd",
                value: self.cwd.clone(),
            });
        }
        Ok(())
    }
}

/// `process.capabilities`: capability names such as `CAP_CHOWN`, per set.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Capabilities {
    pub bounding: Vec<String>,
    pub effective: Vec<String>,
    pub inheritable: Vec<String>,
    pub permitted: Vec<String>,
    pub ambient: Vec<String>,
}

/// One `process.rlimits` entry, e.g. `{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Rlimit {
    #[serde(rename = "type")]
    pub typ: String,
    pub hard: u64,
    pub soft: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
    /// A name to look up in the container's /etc/passwd (see `stage::passwd`); it sets
    /// uid and gid.
    pub username: Option<String>,
    pub umask: Option<u32>,
    pub additional_gids: Vec<u32>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Root {
    pub path: String,
    pub readonly: bool,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Mount {
    pub destination: String,
    #[serde(rename = "type")]
    pub typ: Option<String>,
    pub source: Option<String>,
    pub options: Vec<String>,
    /// Fields the agent does not interpret (`uidMappings`, ...).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Linux {
    pub namespaces: Vec<Namespace>,
    pub masked_paths: Vec<String>,
    pub readonly_paths: Vec<String>,
    pub sysctl: BTreeMap<String, String>,
    pub devices: Vec<Device>,
    pub seccomp: Option<Seccomp>,
    /// Applied by the agent to the container's cgroup (see `cgroup::resources`).
    pub resources: Option<LinuxResources>,
    /// Fields the agent does not interpret (`cgroupsPath`, `uidMappings`, ...).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One `linux.devices` entry: a node created in the container's rootfs.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Device {
    /// `c`, `u` (both character), `b` (block) or `p` (fifo).
    #[serde(rename = "type")]
    pub typ: String,
    pub path: String,
    pub major: i64,
    pub minor: i64,
    pub file_mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

/// `linux.seccomp`: a libseccomp-style profile (what `ctr run --seccomp` sends).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Seccomp {
    pub default_action: String,
    pub default_errno_ret: Option<u32>,
    pub architectures: Vec<String>,
    pub flags: Vec<String>,
    pub listener_path: Option<String>,
    pub syscalls: Vec<SeccompSyscalls>,
}

/// A rule of a seccomp profile: `action` for every syscall in `names` whose arguments
/// match `args`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SeccompSyscalls {
    pub names: Vec<String>,
    pub action: String,
    pub errno_ret: Option<u32>,
    pub args: Vec<SeccompArg>,
}

/// A condition on one syscall argument (`op` is e.g. `SCMP_CMP_MASKED_EQ`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SeccompArg {
    pub index: u32,
    pub value: u64,
    pub value_two: u64,
    pub op: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Namespace {
    #[serde(rename = "type")]
    pub typ: String,
    pub path: Option<String>,
}

impl Spec {
    /// Parses and checks a spec sent by the shim.
    pub fn from_json(bytes: &[u8]) -> Result<Spec, SpecError> {
        let spec: Spec = serde_json::from_slice(bytes).map_err(SpecError::SpecJson)?;
        let process = spec.process.as_ref().ok_or(SpecError::Missing("process"))?;
        process.validate()?;
        let root = spec.root.as_ref().ok_or(SpecError::Missing("root"))?;
        if !root.path.starts_with('/') {
            return Err(SpecError::NotAbsolute {
                field: "root.path",
                value: root.path.clone(),
            });
        }
        if let Some(linux) = &spec.linux {
            validate_namespaces(&linux.namespaces)?;
        }
        Ok(spec)
    }
}

/// Refuses namespace types the stage cannot create or join: ignoring one would run the
/// container with less isolation than its spec asked for.
fn validate_namespaces(namespaces: &[Namespace]) -> Result<(), SpecError> {
    for (index, ns) in namespaces.iter().enumerate() {
        if !NAMESPACE_TYPES.contains(&ns.typ.as_str()) {
            return Err(SpecError::UnknownNamespace {
                index,
                typ: ns.typ.clone(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_gets_a_cgroup_namespace_of_its_own_unless_its_spec_names_one() {
        let mut bare =
            Spec::from_json(br#"{"process":{"args":["sh"],"cwd":"/"},"root":{"path":"/r"}}"#)
                .expect("spec");
        own_cgroup_namespace(&mut bare);
        let ns = &bare.linux.as_ref().expect("linux").namespaces;
        assert_eq!(ns.len(), 1);
        assert_eq!(
            (ns[0].typ.as_str(), ns[0].path.as_deref()),
            ("cgroup", None)
        );

        let json = br#"{"process":{"args":["sh"],"cwd":"/"},"root":{"path":"/r"},
            "linux":{"namespaces":[{"type":"pid"},{"type":"cgroup","path":"/p"}]}}"#;
        let mut named = Spec::from_json(json).expect("spec");
        own_cgroup_namespace(&mut named);
        let ns = &named.linux.as_ref().expect("linux").namespaces;
        assert_eq!(ns.len(), 2, "the spec's own cgroup namespace stays: {ns:?}");
        assert_eq!(ns[1].path.as_deref(), Some("/p"));
    }

    #[test]
    fn parses_runc_shape_and_finds_path() {
        let json = br#"{"ociVersion":"1.0.2","process":{"terminal":false,"user":{"uid":0,"gid":0},
            "args":["sh"],"env":["A=1","PATH=/bin"],"cwd":"/"},"root":{"path":"/r","readonly":true},
            "mounts":[{"destination":"/proc","type":"proc","source":"proc"}],
            "linux":{"namespaces":[{"type":"pid"},{"type":"network","path":"/x"}],"maskedPaths":["/a"]}}"#;
        let spec = Spec::from_json(json).expect("valid spec");
        let process = spec.process.as_ref().expect("process");
        assert_eq!(process.path_env(), "/bin");
        assert!(spec.root.as_ref().expect("root").readonly);
        let linux = spec.linux.expect("linux");
        assert_eq!(linux.namespaces[1].path.as_deref(), Some("/x"));
        assert_eq!(linux.masked_paths, vec!["/a".to_string()]);
    }

    #[test]
    fn keeps_what_it_does_not_interpret_on_the_way_to_the_stage() {
        let json = br#"{"ociVersion":"1.1.0","annotations":{"io.kata.x":"1"},
            "hooks":{"prestart":[]},
            "process":{"args":["sh"],"cwd":"/","oomScoreAdj":5},"root":{"path":"/r"},
            "mounts":[{"destination":"/m","uidMappings":[]}],
            "linux":{"cgroupsPath":"/k/c","resources":{"pids":{"limit":3},"devices":[]}}}"#;
        let spec = Spec::from_json(json).expect("valid spec");
        assert_eq!(
            spec.annotations.get("io.kata.x").map(String::as_str),
            Some("1")
        );
        let linux = spec.linux.as_ref().expect("linux");
        assert_eq!(
            linux
                .resources
                .as_ref()
                .and_then(|r| r.pids.as_ref())
                .map(|p| p.limit),
            Some(3)
        );
        let again = serde_json::to_value(&spec).expect("serialise");
        assert_eq!(again["ociVersion"], "1.1.0");
        assert!(again["hooks"]["prestart"].is_array());
        assert_eq!(again["process"]["oomScoreAdj"], 5);
        assert!(again["mounts"][0]["uidMappings"].is_array());
        assert_eq!(again["linux"]["cgroupsPath"], "/k/c");
        assert!(again["linux"]["resources"]["devices"].is_array());
        let back: Spec = serde_json::from_value(again).expect("round trip");
        assert_eq!(back.annotations.len(), 1);
    }

    #[test]
    fn exec_process_is_parsed_and_checked_once() {
        let process = Process::from_json(br#"{"args":["ls"],"cwd":"/"}"#).expect("valid");
        assert_eq!(process.args, vec!["ls".to_string()]);
        let err = Process::from_json(br#"{"args":["ls"],"cwd":"tmp"}"#)
            .expect_err("relative cwd")
            .to_string();
        assert!(err.contains(r#"process.cwd "tmp""#), "{err}");
        let err = Process::from_json(b"[").expect_err("not JSON").to_string();
        assert!(err.starts_with("invalid OCI process JSON"), "{err}");
    }

    #[test]
    fn rejects_missing_args_and_relative_root() {
        let no_args = br#"{"process":{"args":[],"cwd":"/"},"root":{"path":"/r"}}"#;
        assert!(Spec::from_json(no_args).is_err());
        let rel = br#"{"process":{"args":["sh"],"cwd":"/"},"root":{"path":"r"}}"#;
        let err = Spec::from_json(rel).expect_err("relative root").to_string();
        assert!(err.contains("root.path"), "{err}");
        let bad_ns = br#"{"process":{"args":["sh"],"cwd":"/"},"root":{"path":"/r"},
            "linux":{"namespaces":[{"type":"pid"},{"type":"wormhole"}]}}"#;
        let err = Spec::from_json(bad_ns)
            .expect_err("unknown namespace type")
            .to_string();
        assert!(
            err.contains(r#"linux.namespaces[1].type "wormhole""#),
            "{err}"
        );
        assert!(err.contains("use one of pid, network"), "{err}");
    }
}
