//! JSON logs (slog) to the guest console as PID 1, else to stderr.

use std::io::Write;
use std::sync::Mutex;

use slog::{o, Drain, Logger};

pub fn logger(to_console: bool) -> Logger {
    let out: Box<dyn Write + Send> = match to_console {
        true => match std::fs::OpenOptions::new().write(true).open("/dev/console") {
            Ok(f) => Box::new(f),
            Err(_) => Box::new(std::io::stderr()),
        },
        false => Box::new(std::io::stderr()),
    };
    let drain = slog_json::Json::new(out).add_default_keys().build();
    let drain = Mutex::new(drain).fuse();
    Logger::root(
        drain,
        o!("source" => "kata-agent", "pid" => std::process::id()),
    )
}
