//! The command line: Kata's flags (`--listen-address`, `--runtime-endpoint`,
//! `--log-level`), written `--flag value`, `--flag=value` or with one dash as Go's flag
//! package allows, and two of ours (`--sandboxes-dir`, `--shim-timeout`).

use std::path::PathBuf;
use std::time::Duration;

use crate::log;

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8090";
pub const DEFAULT_ENDPOINT: &str = "/run/containerd/containerd.sock";
/// Where the shims keep their sandboxes (`/run/vc/sbs/<id>/shim-monitor.sock`).
pub use layout::SANDBOX_STATES as DEFAULT_SANDBOXES;
/// How long one shim may take to answer (Kata's monitor waits 3 s too).
pub const DEFAULT_SHIM_TIMEOUT: Duration = Duration::from_secs(3);

pub const USAGE: &str = "Usage: kata-monitor [flags]

Serves the metrics of every sandbox of this node on one HTTP endpoint for Prometheus:
GET /metrics (each shim's families labelled with sandbox_id, cri_uid, cri_name and
cri_namespace, and the monitor's own kata_monitor_*), GET /sandboxes (one sandbox id a line).

Flags:
  --listen-address IP:PORT     where to serve HTTP (default 127.0.0.1:8090)
  --runtime-endpoint PATH      the CRI socket the pods' names come from
                               (default /run/containerd/containerd.sock; unix:// allowed)
  --log-level LEVEL            trace, debug, info, warn, error, fatal or panic (default info)
  --sandboxes-dir DIR          where the shims' sandboxes are (default /run/vc/sbs)
  --shim-timeout SECONDS       how long one shim may take to answer a scrape (default 3)
  --help, --version
";

#[derive(Clone, Debug, PartialEq)]
pub struct Args {
    pub listen_address: String,
    pub runtime_endpoint: PathBuf,
    pub log_level: u8,
    pub sandboxes_dir: PathBuf,
    pub shim_timeout: Duration,
}

/// What the command line asks for.
#[derive(Debug, PartialEq)]
pub enum Command {
    Run(Args),
    Help,
    Version,
}

/// Parses the arguments after the program name; the error says which flag was wrong.
pub fn parse(argv: &[String]) -> Result<Command, String> {
    let mut args = Args {
        listen_address: DEFAULT_LISTEN.into(),
        runtime_endpoint: DEFAULT_ENDPOINT.into(),
        log_level: 2,
        sandboxes_dir: DEFAULT_SANDBOXES.into(),
        shim_timeout: DEFAULT_SHIM_TIMEOUT,
    };
    let mut it = argv.iter();
    while let Some(arg) = it.next() {
        let flag = arg
            .strip_prefix("--")
            .or_else(|| arg.strip_prefix('-'))
            .filter(|f| !f.is_empty())
            .ok_or_else(|| format!("unexpected argument {arg:?}: kata-monitor takes only flags"))?;
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (flag, None),
        };
        match name {
            "help" | "h" => return Ok(Command::Help),
            "version" => return Ok(Command::Version),
            "listen-address" | "runtime-endpoint" | "log-level" | "sandboxes-dir"
            | "shim-timeout" => {}
            _ => return Err(format!("unknown flag --{name}")),
        }
        let value = match inline {
            Some(v) => v,
            None => it
                .next()
                .cloned()
                .ok_or_else(|| format!("--{name} needs a value"))?,
        };
        match name {
            "listen-address" => {
                if value.is_empty() {
                    return Err("--listen-address is empty: give IP:PORT".into());
                }
                args.listen_address = value;
            }
            "runtime-endpoint" => {
                let path = value.strip_prefix("unix://").unwrap_or(&value);
                if path.is_empty() || value.contains("://") && !value.starts_with("unix://") {
                    return Err(format!(
                        "--runtime-endpoint {value:?}: give the path of a unix socket \
                         (or unix:///path)"
                    ));
                }
                args.runtime_endpoint = path.into();
            }
            "log-level" => {
                args.log_level = log::level_of(&value).ok_or_else(|| {
                    format!(
                        "--log-level {value:?}: not a level; use one of {}",
                        log::LEVELS.join(", ")
                    )
                })?;
            }
            "sandboxes-dir" => args.sandboxes_dir = value.into(),
            _ => {
                let secs: f64 = value
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s > 0.0 && *s <= 3600.0)
                    .ok_or_else(|| {
                        format!("--shim-timeout {value:?}: give seconds, more than 0, at most 3600")
                    })?;
                args.shim_timeout = Duration::from_secs_f64(secs);
            }
        }
    }
    Ok(Command::Run(args))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(argv: &[&str]) -> Result<Args, String> {
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        match parse(&argv)? {
            Command::Run(a) => Ok(a),
            other => Err(format!("{other:?}")),
        }
    }

    #[test]
    fn defaults_are_katas() {
        let a = run(&[]).expect("no flags");
        assert_eq!(a.listen_address, "127.0.0.1:8090");
        assert_eq!(
            a.runtime_endpoint,
            PathBuf::from("/run/containerd/containerd.sock")
        );
        assert_eq!(a.log_level, 2);
        assert_eq!(a.sandboxes_dir, PathBuf::from("/run/vc/sbs"));
    }

    #[test]
    fn flags_take_every_spelling() {
        let a = run(&[
            "--listen-address=0.0.0.0:9000",
            "-runtime-endpoint",
            "unix:///tmp/c.sock",
            "--log-level",
            "debug",
            "--shim-timeout=0.5",
        ])
        .expect("valid flags");
        assert_eq!(a.listen_address, "0.0.0.0:9000");
        assert_eq!(a.runtime_endpoint, PathBuf::from("/tmp/c.sock"));
        assert_eq!(a.log_level, 1);
        assert_eq!(a.shim_timeout, Duration::from_millis(500));
    }

    #[test]
    fn bad_flags_say_what_is_wrong() {
        for (argv, says) in [
            (&["--listen"][..], "unknown flag --listen"),
            (&["--log-level", "loud"][..], "not a level"),
            (&["--runtime-endpoint", "tcp://x:1"][..], "unix socket"),
            (&["--listen-address"][..], "needs a value"),
            (&["--shim-timeout", "0"][..], "more than 0"),
            (&["extra"][..], "takes only flags"),
        ] {
            let e = run(argv).expect_err("refused");
            assert!(e.contains(says), "{argv:?}: {e}");
        }
    }
}
