//! The lines `kata-runtime check` prints: one per requirement, each a verdict, and when it
//! is not met, what to do. Also the exit status they add up to.

use std::fmt::Write;

/// A requirement's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Met.
    Ok,
    /// Sandboxes run, but worse than they could (e.g. TCG instead of KVM).
    Warn,
    /// Sandboxes cannot run until this is fixed.
    Fail,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Warn => "warn",
            Self::Fail => "FAIL",
        }
    }
}

/// One requirement's line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// What is required, short: `kvm`, `qemu`, `containerd runtime`, ...
    pub requirement: &'static str,
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What to do, when not [`Status::Ok`]; may span lines (a snippet to paste).
    pub fix: Option<String>,
}

impl Line {
    pub fn ok(requirement: &'static str, detail: impl Into<String>) -> Self {
        Self {
            requirement,
            status: Status::Ok,
            detail: detail.into(),
            fix: None,
        }
    }

    pub fn warn(
        requirement: &'static str,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            requirement,
            status: Status::Warn,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }

    pub fn fail(
        requirement: &'static str,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            requirement,
            status: Status::Fail,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
}

/// Every line of one check.
#[derive(Debug, Default)]
pub struct Report {
    pub lines: Vec<Line>,
}

impl Report {
    /// Sandboxes can run: nothing failed (warnings allowed).
    pub fn runnable(&self) -> bool {
        self.lines.iter().all(|l| l.status != Status::Fail)
    }

    /// 0 when runnable, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        if self.runnable() {
            0
        } else {
            1
        }
    }

    /// The text printed: a line per requirement, its fix indented below it, a summary.
    pub fn render(&self) -> String {
        let width = self
            .lines
            .iter()
            .map(|l| l.requirement.len())
            .max()
            .unwrap_or(0);
        let mut out = String::new();
        for line in &self.lines {
            let _ = writeln!(
                out,
                "{:<4}  {:<width$}  {}",
                line.status.label(),
                line.requirement,
                line.detail
            );
            if let Some(fix) = &line.fix {
                let mut fix_lines = fix.lines();
                if let Some(first) = fix_lines.next() {
                    let _ = writeln!(out, "      -> {first}");
                }
                for more in fix_lines {
                    let _ = writeln!(out, "         {more}");
                }
            }
        }
        let count = |s| self.lines.iter().filter(|l| l.status == s).count();
        let (warnings, failures) = (count(Status::Warn), count(Status::Fail));
        if failures == 0 {
            let _ = writeln!(
                out,
                "kata-runtime check: this host can run sandboxes ({warnings} warning{})",
                plural(warnings)
            );
        } else {
            let _ = writeln!(
                out,
                "kata-runtime check: this host cannot run sandboxes: {failures} requirement{} failed, {warnings} warning{}",
                plural(failures),
                plural(warnings)
            );
        }
        out
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(lines: Vec<Line>) -> Report {
        Report { lines }
    }

    #[test]
    fn warnings_keep_the_host_runnable() {
        let r = report(vec![
            Line::ok("tun", "/dev/net/tun opens"),
            Line::warn("kvm", "slow", "use real KVM"),
        ]);
        assert!(r.runnable());
        assert_eq!(r.exit_code(), 0);
        assert!(
            r.render().ends_with("can run sandboxes (1 warning)\n"),
            "{}",
            r.render()
        );
    }

    #[test]
    fn one_failure_makes_the_exit_status_non_zero() {
        let r = report(vec![
            Line::ok("tun", "fine"),
            Line::fail("qemu", "missing", "apt install qemu-system-x86"),
            Line::warn("kvm", "slow", "x"),
        ]);
        assert!(!r.runnable());
        assert_eq!(r.exit_code(), 1);
        assert!(
            r.render().contains("1 requirement failed, 1 warning\n"),
            "{}",
            r.render()
        );
    }

    #[test]
    fn an_empty_report_is_runnable() {
        assert_eq!(report(Vec::new()).exit_code(), 0);
    }

    #[test]
    fn render_aligns_and_indents_multi_line_fixes() {
        let r = report(vec![
            Line::ok("tun", "fine"),
            Line::fail("containerd runtime", "none", "add this:\n[a]\n  b = 1"),
        ]);
        let text = r.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "ok    tun                 fine");
        assert_eq!(lines[1], "FAIL  containerd runtime  none");
        assert_eq!(lines[2], "      -> add this:");
        assert_eq!(lines[3], "         [a]");
        assert_eq!(lines[4], "           b = 1");
    }
}
