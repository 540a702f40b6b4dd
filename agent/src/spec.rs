//! The parts of the OCI runtime spec (config.json) that the agent acts on.
//!
//! Plain serde structs rather than `oci-spec`: the agent reads a handful of fields and
//! passes the same structs to the container stage, so they must also serialize.
//! Unknown fields are ignored.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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
}

impl Process {
    /// The value of `PATH` in the process environment, or the default.
    pub fn path_env(&self) -> &str {
        self.env
            .iter()
            .find_map(|e| e.strip_prefix("PATH="))
            .unwrap_or(DEFAULT_PATH)
    }

    /// Checks what the stage cannot do without.
    pub fn validate(&self) -> Result<(), String> {
        if self.args.is_empty() {
            return Err("process.args must not be empty".into());
        }
        if !self.cwd.starts_with('/') {
            return Err(format!(
                "process.cwd {:?} must be an absolute path",
                self.cwd
            ));
        }
        if let Some(caps) = &self.capabilities {
            crate::stage::caps::CapabilitySets::parse(caps)?;
        }
        crate::stage::rlimits::parse(&self.rlimits)?;
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
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Mount {
    pub destination: String,
    #[serde(rename = "type")]
    pub typ: Option<String>,
    pub source: Option<String>,
    pub options: Vec<String>,
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
    pub fn from_json(bytes: &[u8]) -> Result<Spec, String> {
        let spec: Spec =
            serde_json::from_slice(bytes).map_err(|e| format!("invalid OCI spec JSON: {e}"))?;
        let process = spec.process.as_ref().ok_or("OCI spec has no process")?;
        process.validate()?;
        let root = spec.root.as_ref().ok_or("OCI spec has no root")?;
        if !root.path.starts_with('/') {
            return Err(format!(
                "root.path {:?} must be an absolute path",
                root.path
            ));
        }
        if let Some(linux) = &spec.linux {
            crate::stage::sysctl::validate(&linux.sysctl)?;
            validate_namespaces(&linux.namespaces)?;
        }
        Ok(spec)
    }
}

/// Refuses namespace types the stage cannot create or join: ignoring one would run the
/// container with less isolation than its spec asked for.
fn validate_namespaces(namespaces: &[Namespace]) -> Result<(), String> {
    use crate::stage::NAMESPACE_TYPES;
    for (i, ns) in namespaces.iter().enumerate() {
        if !NAMESPACE_TYPES.contains(&ns.typ.as_str()) {
            return Err(format!(
                "linux.namespaces[{i}].type {:?} is not a namespace type this agent supports: \
                 use one of {}",
                ns.typ,
                NAMESPACE_TYPES.join(", ")
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn rejects_missing_args_and_relative_root() {
        let no_args = br#"{"process":{"args":[],"cwd":"/"},"root":{"path":"/r"}}"#;
        assert!(Spec::from_json(no_args).is_err());
        let rel = br#"{"process":{"args":["sh"],"cwd":"/"},"root":{"path":"r"}}"#;
        assert!(Spec::from_json(rel).unwrap_err().contains("root.path"));
        let bad_ns = br#"{"process":{"args":["sh"],"cwd":"/"},"root":{"path":"/r"},
            "linux":{"namespaces":[{"type":"pid"},{"type":"wormhole"}]}}"#;
        let err = Spec::from_json(bad_ns).expect_err("unknown namespace type");
        assert!(
            err.contains(r#"linux.namespaces[1].type "wormhole""#),
            "{err}"
        );
        assert!(err.contains("use one of pid, network"), "{err}");
    }
}
