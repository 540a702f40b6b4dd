//! `kata-vsock`: a vhost-user vsock backend for QEMU's `vhost-user-vsock-device`, with
//! hybrid vsock (unix sockets) on the host side.
//!
//! Command line, the same as vhost-device-vsock's for one VM:
//!
//! ```text
//! kata-vsock --vm guest-cid=3,socket=/run/x/vhost-vsock.sock,uds-path=/run/x/kata.hvsock
//! kata-vsock --guest-cid 3 --socket /run/x/vhost-vsock.sock --uds-path /run/x/kata.hvsock
//! ```
//!
//! In `--vm`, values are split on ','; a literal ',' is written ",," (as QEMU does). Both
//! sockets exist when the process is ready; it serves one frontend and exits when it goes.
//! `KATA_VSOCK_LOG=debug` (or `trace`, `warn`, ...) sets the stderr log level.

use std::path::PathBuf;
use std::process::ExitCode;

use log::{error, info, LevelFilter, Log, Metadata, Record};
use vmm::seccomp::{self, Filter};
use vmm::vsock::{vhost_user, VsockDevice};

const USAGE: &str = "usage: kata-vsock --vm guest-cid=<cid>,socket=<vhost-user socket>,uds-path=<hybrid vsock socket>\n       kata-vsock --guest-cid <cid> --socket <path> --uds-path <path>";

#[derive(Debug, Default, PartialEq, Eq)]
struct Args {
    guest_cid: Option<u64>,
    socket: Option<String>,
    uds_path: Option<PathBuf>,
}

/// Splits a `--vm` value on ',' with ",," standing for a literal ','.
fn split_vm_option(s: &str) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c != ',' {
            if let Some(last) = parts.last_mut() {
                last.push(c);
            }
        } else if chars.peek() == Some(&',') {
            chars.next();
            if let Some(last) = parts.last_mut() {
                last.push(',');
            }
        } else {
            parts.push(String::new());
        }
    }
    parts
}

impl Args {
    fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        match key {
            "guest-cid" | "guest_cid" => {
                let cid = value
                    .parse::<u64>()
                    .map_err(|_| format!("guest-cid must be a number, not {value:?}"))?;
                if cid <= 2 || cid >= u64::from(u32::MAX) {
                    return Err(format!("guest-cid {cid} is reserved; use 3 or more"));
                }
                self.guest_cid = Some(cid);
            }
            "socket" => self.socket = Some(value.to_string()),
            "uds-path" | "uds_path" => self.uds_path = Some(PathBuf::from(value)),
            // vhost-device-vsock options that have no meaning for a single hybrid VM.
            "tx-buffer-size" | "groups" | "forward-cid" | "forward-listen" => {}
            _ => return Err(format!("unknown option {key:?}")),
        }
        Ok(())
    }

    fn parse(argv: &[String]) -> Result<Args, String> {
        let mut args = Args::default();
        let mut it = argv.iter();
        while let Some(arg) = it.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
                _ => (arg.as_str(), None),
            };
            let mut value = || {
                inline
                    .clone()
                    .or_else(|| it.next().cloned())
                    .ok_or_else(|| format!("{flag} needs a value"))
            };
            match flag {
                "--vm" => {
                    if args.socket.is_some() {
                        return Err("only one --vm is supported".into());
                    }
                    for kv in split_vm_option(&value()?) {
                        let (k, v) = kv
                            .split_once('=')
                            .ok_or_else(|| format!("--vm expects key=value pairs, got {kv:?}"))?;
                        args.set(k, v)?;
                    }
                }
                "--guest-cid" => args.set("guest-cid", &value()?)?,
                "--socket" => args.set("socket", &value()?)?,
                "--uds-path" => args.set("uds-path", &value()?)?,
                _ => return Err(format!("unknown argument {arg:?}")),
            }
        }
        Ok(args)
    }
}

struct StderrLogger;

impl Log for StderrLogger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record) {
        if self.enabled(record.metadata()) {
            eprintln!(
                "kata-vsock[{}]: {}: {}",
                std::process::id(),
                record.level(),
                record.args()
            );
        }
    }

    fn flush(&self) {}
}

static LOGGER: StderrLogger = StderrLogger;

fn init_logging() {
    let level = std::env::var("KATA_VSOCK_LOG")
        .ok()
        .and_then(|l| l.parse::<LevelFilter>().ok())
        .unwrap_or(LevelFilter::Info);
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(level);
    }
}

fn run(args: Args) -> Result<(), String> {
    let (Some(cid), Some(socket), Some(uds)) = (args.guest_cid, args.socket, args.uds_path) else {
        return Err(format!(
            "guest-cid, socket and uds-path are all required\n{USAGE}"
        ));
    };
    let device = VsockDevice::new(cid, &uds).map_err(|e| e.to_string())?;
    let listener = vhost_user::listen(&socket).map_err(|e| e.to_string())?;
    // Both sockets are bound: from here on nothing is opened, no thread is started
    // unfiltered (the vhost-user threads start in `serve` and inherit the filter).
    seccomp::apply(Filter::Vsock).map_err(|e| e.to_string())?;
    info!(
        "guest cid {cid}: hybrid vsock on {}, vhost-user on {socket}",
        uds.display()
    );
    vhost_user::serve(device, listener).map_err(|e| e.to_string())?;
    info!("the vhost-user frontend disconnected; exiting");
    Ok(())
}

fn main() -> ExitCode {
    // Before anything else: no exec'd program of ours can gain privileges, and the seccomp
    // filter can be installed without CAP_SYS_ADMIN.
    if let Err(e) = seccomp::set_no_new_privs() {
        eprintln!("kata-vsock: {e}");
        return ExitCode::FAILURE;
    }
    init_logging();
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    if argv.iter().any(|a| a == "--version" || a == "-V") {
        println!("kata-vsock {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    let args = match Args::parse(&argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("kata-vsock: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_vhost_device_vsock_syntax() {
        let a = Args::parse(&argv(&[
            "--vm",
            "guest-cid=3,socket=/run/a,,b/vhost-vsock.sock,uds-path=/run/vc/kata.hvsock",
        ]))
        .expect("parse");
        assert_eq!(a.guest_cid, Some(3));
        assert_eq!(a.socket.as_deref(), Some("/run/a,b/vhost-vsock.sock"));
        assert_eq!(a.uds_path, Some(PathBuf::from("/run/vc/kata.hvsock")));
    }

    #[test]
    fn parses_separate_flags_and_rejects_bad_ones() {
        let a = Args::parse(&argv(&[
            "--guest-cid=4",
            "--socket",
            "/s",
            "--uds-path",
            "/u",
        ]))
        .expect("parse");
        assert_eq!(a.guest_cid, Some(4));
        assert!(Args::parse(&argv(&["--vm", "guest-cid=2,socket=/s,uds-path=/u"])).is_err());
        assert!(Args::parse(&argv(&["--vm", "cid=3"])).is_err());
        assert!(Args::parse(&argv(&["--bogus"])).is_err());
        assert!(Args::parse(&argv(&["--socket"])).is_err());
    }
}
