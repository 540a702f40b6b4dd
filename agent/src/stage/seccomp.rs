//! `linux.seccomp`: the profile compiled with libseccomp (linked statically) and loaded
//! as the container process's last step before execve, as runc does.
//!
//! The filter is compiled early (while the container is created) so that a profile that
//! cannot be loaded fails CreateContainer with a clear message. Semantics follow runc:
//! syscall names unknown to libseccomp are skipped, rules whose action equals the default
//! action are skipped, `errnoRet` defaults to EPERM, several conditions on distinct
//! arguments are ANDed in one rule while conditions repeating an argument index become
//! one rule each (ORed), and the filter does not set no_new_privs by itself.

use std::os::fd::BorrowedFd;
use std::str::FromStr;

use libseccomp::{
    ScmpAction, ScmpArch, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext, ScmpSyscall,
};

use super::{log, StageError};
use crate::spec::{Seccomp, SeccompArg, SeccompSyscalls};

/// Syscalls take at most six arguments.
const MAX_ARGS: u32 = 6;

/// A compiled profile, ready to load.
pub struct Filter {
    ctx: ScmpFilterContext,
}

impl Filter {
    /// Compiles `profile`; errors name the field and value at fault.
    pub fn compile(sync: BorrowedFd<'_>, profile: &Seccomp) -> Result<Filter, StageError> {
        let default = action(
            "linux.seccomp.defaultAction",
            &profile.default_action,
            profile.default_errno_ret,
        )?;
        let mut ctx =
            ScmpFilterContext::new_filter(default).map_err(|e| seccomp("create the filter", e))?;
        // no_new_privs is the spec's decision (process.noNewPrivileges), not the filter's.
        ctx.set_ctl_nnp(false)
            .map_err(|e| seccomp("clear the filter's NNP attribute", e))?;
        for arch in &profile.architectures {
            let a = ScmpArch::from_str(arch).map_err(|_| {
                StageError::bad_field(
                    "linux.seccomp.architectures",
                    format!("unknown seccomp architecture {arch:?}"),
                )
            })?;
            ctx.add_arch(a)
                .map_err(|e| seccomp(&format!("add seccomp architecture {arch}"), e))?;
        }
        for flag in &profile.flags {
            match flag.as_str() {
                // The container process is single-threaded when the filter loads.
                "SECCOMP_FILTER_FLAG_TSYNC" => Ok(()),
                "SECCOMP_FILTER_FLAG_LOG" => ctx.set_ctl_log(true),
                "SECCOMP_FILTER_FLAG_SPEC_ALLOW" => ctx.set_ctl_ssb(true),
                other => {
                    return Err(StageError::bad_field(
                        "linux.seccomp.flags",
                        format!("unsupported seccomp flag {other:?}"),
                    ))
                }
            }
            .map_err(|e| seccomp(&format!("set seccomp flag {flag}"), e))?;
        }
        for (i, rule) in profile.syscalls.iter().enumerate() {
            add_rule(sync, &mut ctx, default, i, rule)?;
        }
        Ok(Filter { ctx })
    }

    /// Loads the filter into this process (it is inherited across execve).
    pub fn load(&self) -> Result<(), StageError> {
        self.ctx
            .load()
            .map_err(|e| seccomp("load the seccomp filter", e))
    }
}

fn seccomp(action: &str, source: libseccomp::error::SeccompError) -> StageError {
    StageError::Seccomp {
        action: action.to_string(),
        source,
    }
}

fn add_rule(
    sync: BorrowedFd<'_>,
    ctx: &mut ScmpFilterContext,
    default: ScmpAction,
    index: usize,
    rule: &SeccompSyscalls,
) -> Result<(), StageError> {
    let field = format!("linux.seccomp.syscalls[{index}]");
    let act = action(&format!("{field}.action"), &rule.action, rule.errno_ret)?;
    if act == default {
        // libseccomp refuses such rules; they change nothing.
        return Ok(());
    }
    let conditions = rule
        .args
        .iter()
        .map(|a| condition(&field, a))
        .collect::<Result<Vec<_>, _>>()?;
    let mut indexes: Vec<u32> = rule.args.iter().map(|a| a.index).collect();
    indexes.sort_unstable();
    let repeated = indexes.windows(2).any(|w| w[0] == w[1]);
    for name in &rule.names {
        let Ok(syscall) = ScmpSyscall::from_name(name) else {
            log(sync, format!("seccomp: skipping unknown syscall {name:?}"));
            continue;
        };
        let added = if repeated {
            conditions
                .iter()
                .try_for_each(|c| ctx.add_rule_conditional(act, syscall, &[*c]))
        } else {
            ctx.add_rule_conditional(act, syscall, &conditions)
        };
        added.map_err(|e| seccomp(&format!("add seccomp rule {field} for {name}"), e))?;
    }
    Ok(())
}

/// An OCI action name with its errno (EPERM unless given).
fn action(field: &str, name: &str, errno: Option<u32>) -> Result<ScmpAction, StageError> {
    let ret = errno.unwrap_or(libc::EPERM as u32);
    let ret = i32::try_from(ret)
        .ok()
        .filter(|r| *r <= i32::from(u16::MAX))
        .ok_or_else(|| {
            StageError::bad_field(field, format!("errno {ret} is out of range (0-65535)"))
        })?;
    if name == "SCMP_ACT_NOTIFY" {
        return Err(StageError::bad_field(
            field,
            "SCMP_ACT_NOTIFY needs a seccomp agent, which this runtime does not support",
        ));
    }
    let value = matches!(name, "SCMP_ACT_ERRNO" | "SCMP_ACT_TRACE").then_some(ret);
    ScmpAction::from_str(name, value)
        .map_err(|_| StageError::bad_field(field, format!("unknown seccomp action {name:?}")))
}

fn condition(field: &str, arg: &SeccompArg) -> Result<ScmpArgCompare, StageError> {
    if arg.index >= MAX_ARGS {
        return Err(StageError::bad_field(
            field,
            format!("argument index {} is out of range (0-5)", arg.index),
        ));
    }
    let op = match arg.op.as_str() {
        // For a masked compare, `value` is the mask and `valueTwo` the expected value.
        "SCMP_CMP_MASKED_EQ" => {
            return Ok(ScmpArgCompare::new(
                arg.index,
                ScmpCompareOp::MaskedEqual(arg.value),
                arg.value_two,
            ))
        }
        other => ScmpCompareOp::from_str(other).map_err(|_| {
            StageError::bad_field(field, format!("unknown seccomp operator {other:?}"))
        })?,
    };
    Ok(ScmpArgCompare::new(arg.index, op, arg.value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_and_conditions_parse() {
        let act = |name, errno| action("f", name, errno).expect("valid action");
        assert_eq!(act("SCMP_ACT_ERRNO", None), ScmpAction::Errno(libc::EPERM));
        assert_eq!(act("SCMP_ACT_ERRNO", Some(38)), ScmpAction::Errno(38));
        assert_eq!(act("SCMP_ACT_ALLOW", None), ScmpAction::Allow);
        let err = action("f", "SCMP_ACT_DANCE", None)
            .expect_err("unknown")
            .to_string();
        assert!(err.contains("SCMP_ACT_DANCE"), "{err}");
        assert!(action("f", "SCMP_ACT_NOTIFY", None).is_err());
        let arg = SeccompArg {
            index: 7,
            value: 0,
            value_two: 0,
            op: "SCMP_CMP_EQ".into(),
        };
        let err = condition("f", &arg).expect_err("index").to_string();
        assert!(err.contains("index 7"), "{err}");
        let arg = SeccompArg {
            index: 0,
            op: "SCMP_CMP_WHAT".into(),
            ..arg
        };
        assert!(condition("f", &arg).is_err());
    }
}
