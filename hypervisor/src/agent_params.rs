//! Guest kernel command line words that come from `[agent.kata]` rather than from a
//! hypervisor section: the agent (PID 1) reads them from `/proc/cmdline`. Every backend
//! gets them the same way, ahead of the user's `kernel_params` (so a user's own
//! `agent.debug_console_vport=N`, read last, wins), through [`with_agent_params`] in
//! [`new_hypervisor`](crate::new_hypervisor).

use kata_config::AgentConfig;
use protocols::{DEBUG_CONSOLE_PARAM, DEBUG_CONSOLE_VPORT_PARAM, DEBUG_CONSOLE_VSOCK_PORT};

/// The words `agent` asks of the guest kernel command line, space-separated; empty when
/// it asks for none (the default).
pub fn agent_kernel_params(agent: &AgentConfig) -> String {
    if agent.kata.debug_console_enabled {
        format!("{DEBUG_CONSOLE_PARAM} {DEBUG_CONSOLE_VPORT_PARAM}={DEBUG_CONSOLE_VSOCK_PORT}")
    } else {
        String::new()
    }
}

/// A backend's `kernel_params` with the agent's words in front.
pub fn with_agent_params(agent: &AgentConfig, kernel_params: &str) -> String {
    let words = agent_kernel_params(agent);
    match (words.is_empty(), kernel_params.trim().is_empty()) {
        (true, _) => kernel_params.to_string(),
        (false, true) => words,
        (false, false) => format!("{words} {}", kernel_params.trim()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(toml: &str) -> AgentConfig {
        kata_config::Config::from_str(toml, "test.toml")
            .expect("a valid configuration")
            .agent
    }

    #[test]
    fn the_debug_console_adds_kata_words_only_when_enabled() {
        let off = agent("");
        assert_eq!(agent_kernel_params(&off), "");
        assert_eq!(with_agent_params(&off, "a=b"), "a=b");
        assert_eq!(with_agent_params(&off, ""), "");

        let on = agent("[agent.kata]\ndebug_console_enabled = true\n");
        assert_eq!(
            agent_kernel_params(&on),
            "agent.debug_console agent.debug_console_vport=1026"
        );
        assert_eq!(
            with_agent_params(&on, " agent.debug_console_vport=2000 "),
            "agent.debug_console agent.debug_console_vport=1026 agent.debug_console_vport=2000"
        );
        assert_eq!(
            with_agent_params(&on, ""),
            "agent.debug_console agent.debug_console_vport=1026"
        );
    }

    /// Both backends put the words on the guest's command line.
    #[test]
    fn both_backends_get_the_words() {
        let on = kata_config::Config::from_str(
            "[agent.kata]\ndebug_console_enabled = true\n",
            "test.toml",
        )
        .expect("a valid configuration");
        let (qemu, builtin) = crate::backend_configs(&on);
        let qemu_line =
            crate::qemu::cmdline::kernel_cmdline(&qemu, crate::accel::Accel::Kvm, false, None);
        assert!(
            qemu_line.ends_with(
                " quiet agent.rootfs_share scsi_mod.scan=manual agent.debug_console \
                 agent.debug_console_vport=1026"
            ),
            "{qemu_line}"
        );
        let builtin_line = crate::builtin::kernel_cmdline(&builtin, false);
        assert!(
            builtin_line.ends_with(
                " quiet agent.rootfs_share agent.debug_console agent.debug_console_vport=1026"
            ),
            "{builtin_line}"
        );
    }
}
