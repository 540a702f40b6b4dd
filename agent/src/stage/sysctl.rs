//! `linux.sysctl`: kernel parameters written to /proc/sys inside the container.
//!
//! Only namespaced parameters are allowed, as runc and the Kata agent check: IPC ones
//! and `kernel.domainname` (the stage always gives a container its own IPC and UTS
//! namespaces, or joins the pod's), and `net.*`. The guest's network namespace belongs to the pod's VM alone,
//! so, as in Kata, `net.*` is accepted without a namespace of the container's own.
//! Anything else would change the whole guest and is rejected with an error naming it.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::StageError;

/// IPC parameters that live in the IPC namespace (besides `fs.mqueue.*`).
const IPC_SYSCTLS: [&str; 8] = [
    "kernel.msgmax",
    "kernel.msgmnb",
    "kernel.msgmni",
    "kernel.sem",
    "kernel.shmall",
    "kernel.shmmax",
    "kernel.shmmni",
    "kernel.shm_rmid_forced",
];

/// Rejects keys that are not namespaced or not plain names; checked at create time.
pub fn validate(sysctls: &BTreeMap<String, String>) -> Result<(), StageError> {
    for key in sysctls.keys() {
        let plain = !key.is_empty()
            && key
                .split(['.', '/'])
                .all(|part| !part.is_empty() && part != "..")
            && !key.contains('\0');
        if !plain {
            return Err(StageError::SysctlName { key: key.clone() });
        }
        let allowed = IPC_SYSCTLS.contains(&key.as_str())
            || key.starts_with("fs.mqueue.")
            || key.starts_with("net.")
            || key == "kernel.domainname";
        if !allowed {
            let why = if key == "kernel.hostname" {
                "set the spec's hostname field instead"
            } else {
                "it is not namespaced and would change the whole VM"
            };
            return Err(StageError::SysctlNotAllowed {
                key: key.clone(),
                why,
            });
        }
    }
    Ok(())
}

/// `/proc/sys/...` for a key; dots become slashes (`kernel.msgmax`), and a key that
/// already uses slashes is taken as is.
fn proc_path(key: &str) -> PathBuf {
    PathBuf::from("/proc/sys").join(key.replace('.', "/"))
}

/// Writes every parameter; runs in the container's namespaces after /proc is mounted
/// and before /proc/sys becomes read-only.
pub fn apply(sysctls: &BTreeMap<String, String>) -> Result<(), StageError> {
    for (key, value) in sysctls {
        let path = proc_path(key);
        std::fs::write(&path, value.as_bytes()).map_err(|source| StageError::Os {
            action: format!("set sysctl {key} = {value:?} ({})", path.display()),
            source,
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(key: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(key.to_string(), "1".to_string())])
    }

    #[test]
    fn only_namespaced_keys_pass() {
        assert!(validate(&one("kernel.msgmax")).is_ok());
        assert!(validate(&one("fs.mqueue.msg_max")).is_ok());
        assert!(validate(&one("net.ipv4.ip_forward")).is_ok());
        assert!(validate(&one("kernel.domainname")).is_ok());
        let err = validate(&one("vm.swappiness"))
            .expect_err("global")
            .to_string();
        assert!(
            err.contains("vm.swappiness") && err.contains("not namespaced"),
            "{err}"
        );
        assert!(validate(&one("kernel.hostname")).is_err());
        assert!(validate(&one("net/../../etc")).is_err());
        assert_eq!(
            proc_path("net.ipv4.ip_forward"),
            PathBuf::from("/proc/sys/net/ipv4/ip_forward")
        );
    }
}
