//! `kata-runtime`: the operator's host tool.
//!
//! `kata-runtime check` says, one line per requirement, whether this host can run
//! sandboxes and what to do where it cannot (exit status 0 when it can); `kata-runtime
//! env` prints what sandboxes will use and where each setting came from; `kata-runtime
//! exec SANDBOX-ID` opens a shell in a sandbox's guest when its debug console is on.
//! Modules: [`check`], [`env`] and [`exec`] are the commands; [`effective`] finds the configuration and the
//! source of each value; [`containerd`] reads containerd's runtime entries;
//! [`components`] asks binaries and files their versions; [`command`] runs tools with a
//! deadline; [`report`] prints check lines and decides the exit status.

mod check;
mod command;
mod components;
mod containerd;
mod effective;
mod env;
mod exec;
mod factory;
mod report;

use std::path::PathBuf;

use effective::Effective;

const USAGE: &str = "\
usage: kata-runtime [--config FILE] check [--containerd-config FILE]
       kata-runtime [--config FILE] env [--json] [--containerd-config FILE]
       kata-runtime exec SANDBOX-ID
       kata-runtime [--config FILE] factory init|status|destroy
       kata-runtime --version

  check   one line per requirement: ok, warn (runs, but worse) or FAIL with what to do;
          exit status 0 when this host can run sandboxes, 1 when it cannot
  env     the effective configuration (each key's value and source), component versions
          and paths, as TOML (--json: as JSON)
  exec    an interactive root shell in the guest of sandbox SANDBOX-ID, through its debug
          console (only when [agent.kata] debug_console_enabled = true; leave with `exit`)
  factory the VM pool ([factory] vm_cache_number): `init` keeps that many booted VMs
          ready (foreground, until SIGTERM), `status` lists them, `destroy` stops the
          factory and every ready VM

  --config FILE             the configuration file (default: $KATA_CONF_FILE, then
                            /etc/kata-containers/configuration.toml, then
                            /usr/share/defaults/kata-containers/configuration.toml)
  --containerd-config FILE  containerd's configuration (default /etc/containerd/config.toml)";

/// Exit status for a usage error (BSD's EX_USAGE).
const EX_USAGE: i32 = 64;

#[derive(Debug, Default, PartialEq)]
struct Args {
    command: Option<String>,
    config: Option<PathBuf>,
    containerd_config: Option<PathBuf>,
    json: bool,
    /// `exec`'s operand.
    sandbox_id: Option<String>,
}

fn parse_args(argv: impl IntoIterator<Item = String>) -> Result<Args, String> {
    let mut args = Args::default();
    let mut argv = argv.into_iter();
    while let Some(arg) = argv.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| argv.next())
                .map(PathBuf::from)
                .ok_or_else(|| format!("{flag} needs a file"))
        };
        match flag.as_str() {
            "--config" | "-c" => args.config = Some(value()?),
            "--containerd-config" => args.containerd_config = Some(value()?),
            "--json" => args.json = true,
            "check" | "env" | "exec" | "--version" | "--help" | "-h" if args.command.is_none() => {
                args.command = Some(flag)
            }
            _ if args.command.as_deref() == Some("exec")
                && args.sandbox_id.is_none()
                && !arg.starts_with('-') =>
            {
                args.sandbox_id = Some(arg)
            }
            _ => return Err(format!("unexpected argument {arg:?}")),
        }
    }
    Ok(args)
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    // `factory ...`: everything after the word is the shim's factory command's.
    if let Some(at) = argv.iter().position(|a| a == "factory") {
        let (before, after) = argv.split_at(at);
        let args = match parse_args(before.iter().cloned()) {
            Ok(args) if args.command.is_none() => args,
            Ok(_) => {
                eprintln!("kata-runtime: factory cannot follow another command\n{USAGE}");
                std::process::exit(EX_USAGE);
            }
            Err(why) => {
                eprintln!("kata-runtime: {why}\n{USAGE}");
                std::process::exit(EX_USAGE);
            }
        };
        eprintln!(
            "kata-runtime factory: {}",
            factory::exec(&after[1..], args.config.as_ref())
        );
        std::process::exit(1);
    }
    let args = match parse_args(argv) {
        Ok(args) => args,
        Err(why) => {
            eprintln!("kata-runtime: {why}\n{USAGE}");
            std::process::exit(EX_USAGE);
        }
    };
    let containerd_config = args
        .containerd_config
        .clone()
        .unwrap_or_else(|| PathBuf::from(containerd::DEFAULT_CONFIG));
    let code = match args.command.as_deref() {
        Some("check") => {
            let report = check::run(&Effective::load(args.config.as_deref()), &containerd_config);
            print!("{}", report.render());
            report.exit_code()
        }
        Some("env") => {
            let env = env::gather(&Effective::load(args.config.as_deref()), &containerd_config);
            let rendered = if args.json {
                env.to_json()
            } else {
                env.to_toml()
            };
            match rendered {
                Ok(text) => {
                    println!("{}", text.trim_end());
                    0
                }
                Err(why) => {
                    eprintln!("kata-runtime env: {why}");
                    1
                }
            }
        }
        Some("exec") => match args.sandbox_id.as_deref() {
            Some(id) => match exec::run(id) {
                Ok(()) => 0,
                Err(why) => {
                    eprintln!("kata-runtime exec: {why}");
                    1
                }
            },
            None => {
                eprintln!("kata-runtime: exec needs a SANDBOX-ID\n{USAGE}");
                EX_USAGE
            }
        },
        Some("--version") => {
            println!("kata-runtime {}", env!("CARGO_PKG_VERSION"));
            0
        }
        Some(_) => {
            println!("{USAGE}");
            0
        }
        None => {
            eprintln!("{USAGE}");
            EX_USAGE
        }
    };
    std::process::exit(code);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, String> {
        parse_args(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn options_go_before_or_after_the_command() {
        let a = parse(&[
            "--config",
            "/a.toml",
            "check",
            "--containerd-config=/c.toml",
        ])
        .unwrap();
        assert_eq!(a.command.as_deref(), Some("check"));
        assert_eq!(a.config, Some(PathBuf::from("/a.toml")));
        assert_eq!(a.containerd_config, Some(PathBuf::from("/c.toml")));
        let b = parse(&["env", "--json", "--config=/b.toml"]).unwrap();
        assert!(b.json);
        assert_eq!(b.config, Some(PathBuf::from("/b.toml")));
    }

    #[test]
    fn exec_takes_one_sandbox_id() {
        let a = parse(&["exec", "sb1"]).unwrap();
        assert_eq!(a.command.as_deref(), Some("exec"));
        assert_eq!(a.sandbox_id.as_deref(), Some("sb1"));
        let b = parse(&["--config", "/a.toml", "exec"]).unwrap();
        assert_eq!(b.sandbox_id, None);
    }

    #[test]
    fn bad_arguments_are_errors() {
        assert!(parse(&["check", "env"]).unwrap_err().contains("\"env\""));
        assert!(parse(&["check", "--config"])
            .unwrap_err()
            .contains("needs a file"));
        assert!(parse(&["frobnicate"]).is_err());
        assert!(parse(&["exec", "a", "b"]).unwrap_err().contains("\"b\""));
        assert!(parse(&["check", "sb1"]).is_err());
        assert_eq!(parse(&[]).unwrap().command, None);
    }
}
