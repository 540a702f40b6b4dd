//! `process.capabilities`, applied the way runc does: the bounding set is reduced while
//! the process is still root, PR_SET_KEEPCAPS keeps the permitted set across the switch
//! to the container user, then the effective, inheritable, permitted and ambient sets are
//! set to exactly what the spec asks for.

use std::os::fd::BorrowedFd;
use std::str::FromStr;

use caps::{CapSet, Capability, CapsHashSet};

use super::{log, StageError};
use crate::spec::Capabilities;

/// The five sets, parsed and checked.
#[derive(Debug, Default, Clone)]
pub struct CapabilitySets {
    pub bounding: CapsHashSet,
    pub effective: CapsHashSet,
    pub inheritable: CapsHashSet,
    pub permitted: CapsHashSet,
    pub ambient: CapsHashSet,
}

impl CapabilitySets {
    /// Parses every name; an unknown one is an error that names it.
    pub fn parse(spec: &Capabilities) -> Result<CapabilitySets, StageError> {
        Ok(CapabilitySets {
            bounding: parse_set("bounding", &spec.bounding)?,
            effective: parse_set("effective", &spec.effective)?,
            inheritable: parse_set("inheritable", &spec.inheritable)?,
            permitted: parse_set("permitted", &spec.permitted)?,
            ambient: parse_set("ambient", &spec.ambient)?,
        })
    }

    /// The sets of `process.capabilities`, or all empty when the spec has none (runc's
    /// behaviour: no capabilities field means no capabilities).
    pub fn from_spec(spec: Option<&Capabilities>) -> Result<CapabilitySets, StageError> {
        spec.map_or_else(|| Ok(CapabilitySets::default()), CapabilitySets::parse)
    }

    /// Drops every supported capability that is not in the bounding set. Needs
    /// CAP_SETPCAP, so it runs before the user changes.
    pub fn apply_bounding(&self, sync: BorrowedFd<'_>) -> Result<(), StageError> {
        let supported = caps::runtime::thread_all_supported();
        for cap in &self.bounding {
            if !supported.contains(cap) {
                log(
                    sync,
                    format!("kernel does not support {cap}; not in bounding set"),
                );
            }
        }
        for cap in supported.difference(&self.bounding) {
            caps::drop(None, CapSet::Bounding, *cap).map_err(|source| {
                StageError::Capabilities {
                    action: format!("drop {cap} from the bounding set"),
                    source,
                }
            })?;
        }
        Ok(())
    }

    /// Sets the effective, inheritable, permitted and ambient sets. Runs after the user
    /// changed (with PR_SET_KEEPCAPS, so the permitted set survived the setuid).
    pub fn apply(&self, sync: BorrowedFd<'_>) -> Result<(), StageError> {
        let supported = caps::runtime::thread_all_supported();
        let only_supported =
            |set: &CapsHashSet| -> CapsHashSet { set.intersection(&supported).copied().collect() };
        // Effective and inheritable may only grow within the current permitted set, and
        // permitted may only shrink to a superset of effective: so permitted comes last.
        let steps = [
            (CapSet::Inheritable, "inheritable", &self.inheritable),
            (CapSet::Effective, "effective", &self.effective),
            (CapSet::Permitted, "permitted", &self.permitted),
        ];
        for (set, name, caps) in steps {
            caps::set(None, set, &only_supported(caps)).map_err(|source| {
                StageError::Capabilities {
                    action: format!("set the {name} capabilities to {}", names(caps)),
                    source,
                }
            })?;
        }
        caps::clear(None, CapSet::Ambient).map_err(|source| StageError::Capabilities {
            action: "clear the ambient capabilities".into(),
            source,
        })?;
        for cap in only_supported(&self.ambient) {
            // As runc: an ambient capability missing from permitted or inheritable
            // cannot be raised; that is worth a log line, not a failed container.
            if let Err(e) = caps::raise(None, CapSet::Ambient, cap) {
                log(sync, format!("cannot raise ambient capability {cap}: {e}"));
            }
        }
        Ok(())
    }
}

fn parse_set(set: &'static str, names: &[String]) -> Result<CapsHashSet, StageError> {
    names
        .iter()
        .map(|name| {
            Capability::from_str(name).map_err(|_| StageError::UnknownCapability {
                set,
                name: name.clone(),
            })
        })
        .collect()
}

fn names(set: &CapsHashSet) -> String {
    let mut v: Vec<String> = set.iter().map(|c| c.to_string()).collect();
    v.sort();
    format!("[{}]", v.join(", "))
}

/// Sets or clears PR_SET_KEEPCAPS, which keeps the permitted set across setuid.
pub fn set_keep_caps(keep: bool) -> Result<(), StageError> {
    // SAFETY: PR_SET_KEEPCAPS takes an integer flag and touches no memory of ours.
    let r = unsafe { libc::prctl(libc::PR_SET_KEEPCAPS, libc::c_ulong::from(keep), 0, 0, 0) };
    if r < 0 {
        return Err(StageError::Os {
            action: format!("prctl(PR_SET_KEEPCAPS, {keep})"),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Sets the no_new_privs bit: execve can no longer grant privileges (setuid bits, file
/// capabilities), and seccomp filters may be loaded without CAP_SYS_ADMIN.
pub fn set_no_new_privileges() -> Result<(), StageError> {
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integer arguments and touches no memory of ours.
    let r = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    if r < 0 {
        return Err(StageError::Os {
            action: "prctl(PR_SET_NO_NEW_PRIVS)".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_and_rejects_unknown_ones() {
        let spec = Capabilities {
            bounding: vec!["CAP_CHOWN".into(), "CAP_KILL".into()],
            effective: vec!["CAP_KILL".into()],
            ..Default::default()
        };
        let sets = CapabilitySets::parse(&spec).expect("parse");
        assert!(sets.bounding.contains(&Capability::CAP_CHOWN));
        assert_eq!(sets.effective.len(), 1);
        assert!(sets.permitted.is_empty());
        let bad = Capabilities {
            ambient: vec!["CAP_FLY".into()],
            ..Default::default()
        };
        let err = CapabilitySets::parse(&bad)
            .expect_err("unknown")
            .to_string();
        assert!(err.contains("CAP_FLY") && err.contains("ambient"), "{err}");
    }
}
