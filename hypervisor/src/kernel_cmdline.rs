//! The guest kernel command line, built the one way for both backends: the backend's
//! base parameters, then the agent's log level (`AGENT_DEBUG_LOG`, or `quiet`), then the
//! backend's conditional parameters in order, and the user's `kernel_params` last (so
//! that theirs win where the kernel takes the last of a repeated parameter).

use protocols::AGENT_DEBUG_LOG;

/// A kernel command line being built.
pub struct KernelCmdline(String);

impl KernelCmdline {
    /// `base`, then the agent's log level: everything unthrottled with `debug` (by
    /// default warnings, rate-limited), else a quiet kernel.
    pub fn new(base: &str, debug: bool) -> Self {
        let mut line = Self(base.to_string());
        line.push(if debug { AGENT_DEBUG_LOG } else { "quiet" });
        line
    }

    /// Appends `params` (nothing when it is blank).
    pub fn push(&mut self, params: &str) -> &mut Self {
        let params = params.trim();
        if !params.is_empty() {
            if !self.0.is_empty() {
                self.0.push(' ');
            }
            self.0.push_str(params);
        }
        self
    }

    /// Appends `params` when `cond` holds.
    pub fn push_if(&mut self, cond: bool, params: &str) -> &mut Self {
        if cond {
            self.push(params);
        }
        self
    }

    /// The line, with the user's `kernel_params` last.
    pub fn finish(mut self, user: &str) -> String {
        self.push(user);
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_users_parameters_come_last_and_blanks_add_nothing() {
        let mut line = KernelCmdline::new("console=ttyS0", false);
        line.push_if(true, "a=1").push_if(false, "b=2").push("  ");
        assert_eq!(line.finish(" x=y "), "console=ttyS0 quiet a=1 x=y");
        let line = KernelCmdline::new("console=ttyS0", true);
        assert_eq!(line.finish(""), format!("console=ttyS0 {AGENT_DEBUG_LOG}"));
    }
}
