//! Log lines on stderr (journald or the container's log takes them), as JSON through
//! slog like the runtime's other programs, at and above `--log-level`.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

use slog::Drain;

/// The levels of Kata's `--log-level`, least severe first.
pub const LEVELS: [&str; 7] = ["trace", "debug", "info", "warn", "error", "fatal", "panic"];

static THRESHOLD: AtomicU8 = AtomicU8::new(2);

/// The index of `name` in [`LEVELS`].
pub fn level_of(name: &str) -> Option<u8> {
    let name = name.to_ascii_lowercase();
    let name = if name == "warning" {
        "warn"
    } else {
        name.as_str()
    };
    LEVELS.iter().position(|l| *l == name).map(|i| i as u8)
}

pub fn set_threshold(level: u8) {
    THRESHOLD.store(level, Ordering::Relaxed);
}

pub fn enabled(level: u8) -> bool {
    level >= THRESHOLD.load(Ordering::Relaxed)
}

/// JSON lines on stderr, as the runtime's other programs log (slog-json, with its time
/// stamp and level), each naming `source=kata-monitor`.
fn logger() -> &'static slog::Logger {
    static LOGGER: OnceLock<slog::Logger> = OnceLock::new();
    LOGGER.get_or_init(|| {
        // A record goes out in one write(2), not token by token, so that the lines of
        // the monitor's threads and of whatever shares its stderr stay whole.
        let out = std::io::LineWriter::with_capacity(16 * 1024, std::io::stderr());
        let json = slog_json::Json::new(out).add_default_keys().build();
        slog::Logger::root(
            std::sync::Mutex::new(json).fuse(),
            slog::o!("source" => "kata-monitor"),
        )
    })
}

pub fn write(level: u8, msg: &str) {
    if !enabled(level) {
        return;
    }
    let log = logger();
    match level {
        0 => slog::trace!(log, "{}", msg),
        1 => slog::debug!(log, "{}", msg),
        2 => slog::info!(log, "{}", msg),
        3 => slog::warn!(log, "{}", msg),
        4 => slog::error!(log, "{}", msg),
        _ => slog::crit!(log, "{}", msg),
    }
}

macro_rules! debug {
    ($($arg:tt)*) => { if $crate::log::enabled(1) { $crate::log::write(1, &format!($($arg)*)) } };
}
macro_rules! info {
    ($($arg:tt)*) => { $crate::log::write(2, &format!($($arg)*)) };
}
macro_rules! warning {
    ($($arg:tt)*) => { $crate::log::write(3, &format!($($arg)*)) };
}
macro_rules! error {
    ($($arg:tt)*) => { $crate::log::write(4, &format!($($arg)*)) };
}
pub(crate) use {debug, error, info, warning};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kata_level_names_are_accepted() {
        assert_eq!(level_of("info"), Some(2));
        assert_eq!(level_of("WARNING"), Some(3));
        assert_eq!(level_of("panic"), Some(6));
        assert_eq!(level_of("loud"), None);
    }
}
