//! `process.rlimits`: setrlimit for each entry, while the process is still privileged
//! (raising a hard limit needs CAP_SYS_RESOURCE, which the container may not keep).

use nix::sys::resource::{setrlimit, Resource};

use super::StageError;
use crate::spec::Rlimit;

/// Maps an OCI rlimit name (`RLIMIT_NOFILE`) to the resource.
fn resource(name: &str) -> Option<Resource> {
    Some(match name {
        "RLIMIT_AS" => Resource::RLIMIT_AS,
        "RLIMIT_CORE" => Resource::RLIMIT_CORE,
        "RLIMIT_CPU" => Resource::RLIMIT_CPU,
        "RLIMIT_DATA" => Resource::RLIMIT_DATA,
        "RLIMIT_FSIZE" => Resource::RLIMIT_FSIZE,
        "RLIMIT_LOCKS" => Resource::RLIMIT_LOCKS,
        "RLIMIT_MEMLOCK" => Resource::RLIMIT_MEMLOCK,
        "RLIMIT_MSGQUEUE" => Resource::RLIMIT_MSGQUEUE,
        "RLIMIT_NICE" => Resource::RLIMIT_NICE,
        "RLIMIT_NOFILE" => Resource::RLIMIT_NOFILE,
        "RLIMIT_NPROC" => Resource::RLIMIT_NPROC,
        "RLIMIT_RSS" => Resource::RLIMIT_RSS,
        "RLIMIT_RTPRIO" => Resource::RLIMIT_RTPRIO,
        "RLIMIT_RTTIME" => Resource::RLIMIT_RTTIME,
        "RLIMIT_SIGPENDING" => Resource::RLIMIT_SIGPENDING,
        "RLIMIT_STACK" => Resource::RLIMIT_STACK,
        _ => return None,
    })
}

/// Checks every entry; an unknown name or soft > hard is an error that names it.
pub fn parse(rlimits: &[Rlimit]) -> Result<Vec<(Resource, &Rlimit)>, StageError> {
    rlimits
        .iter()
        .map(|r| {
            let res =
                resource(&r.typ).ok_or_else(|| StageError::UnknownRlimit { typ: r.typ.clone() })?;
            if r.soft > r.hard {
                return Err(StageError::RlimitSoftAboveHard {
                    typ: r.typ.clone(),
                    soft: r.soft,
                    hard: r.hard,
                });
            }
            Ok((res, r))
        })
        .collect()
}

/// Applies every entry to this process; the limits survive execve.
pub fn apply(rlimits: &[Rlimit]) -> Result<(), StageError> {
    for (res, r) in parse(rlimits)? {
        setrlimit(res, r.soft, r.hard).map_err(|e| {
            StageError::sys(
                format!("set rlimit {} to soft {} / hard {}", r.typ, r.soft, r.hard),
                e,
            )
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rlimit(typ: &str, soft: u64, hard: u64) -> Rlimit {
        Rlimit {
            typ: typ.into(),
            soft,
            hard,
        }
    }

    #[test]
    fn names_map_and_bad_entries_are_named() {
        let ok = [rlimit("RLIMIT_NOFILE", 10, 20)];
        assert_eq!(parse(&ok).expect("valid").len(), 1);
        let err = parse(&[rlimit("RLIMIT_BOGUS", 1, 1)])
            .expect_err("unknown")
            .to_string();
        assert!(err.contains("RLIMIT_BOGUS"), "{err}");
        let err = parse(&[rlimit("RLIMIT_CORE", 2, 1)])
            .expect_err("soft > hard")
            .to_string();
        assert!(err.contains("RLIMIT_CORE"), "{err}");
    }
}
