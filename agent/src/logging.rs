//! JSON logs (slog) to the guest console as PID 1, else to stderr.
//!
//! The console ends on the host, where every line costs (under TCG each byte is a trap,
//! and the host keeps the console in a bounded log whose older lines a flood would push
//! out). So as PID 1 the agent logs warnings and errors only, at most [`BURST`] lines at
//! once and [`PER_SECOND`] a second after that; lines over the limit are counted, and the
//! next line that goes says how many were dropped (critical lines always go).
//! `agent.log=LEVEL` on the kernel command line (Kata's word) sets the level; at `debug`
//! or `trace` (the host's debug mode adds `agent.log=debug`) nothing is dropped. Outside
//! the guest (`--listen`, for tests) everything goes to stderr.

use std::io::Write;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::Instant;

use slog::{o, Drain, Level, Logger, Never, OwnedKVList, Record};

/// Lines the console log may write at once.
pub const BURST: u32 = 50;
/// Lines a second it may write after a burst.
pub const PER_SECOND: u32 = 5;

/// What goes to the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// The least severe level logged.
    pub level: Level,
    /// Whether lines over the rate are dropped.
    pub limited: bool,
}

impl Settings {
    /// Everything, unthrottled.
    pub const FULL: Settings = Settings {
        level: Level::Trace,
        limited: false,
    };

    /// The console's settings for a kernel command line: the last `agent.log=LEVEL`
    /// that names a level, else warnings; limited unless the level is debug or trace.
    pub fn from_cmdline(cmdline: &str) -> Settings {
        let prefix = format!("{}=", protocols::AGENT_LOG_PARAM);
        let level = cmdline
            .split_whitespace()
            .filter_map(|w| w.strip_prefix(prefix.as_str()))
            .filter_map(|l| Level::from_str(l).ok())
            .next_back()
            .unwrap_or(Level::Warning);
        Settings {
            level,
            limited: !matches!(level, Level::Debug | Level::Trace),
        }
    }
}

pub fn logger(to_console: bool) -> Logger {
    let (out, settings): (Box<dyn Write + Send>, Settings) = match to_console {
        true => {
            let settings = std::fs::read_to_string("/proc/cmdline")
                .map(|c| Settings::from_cmdline(&c))
                .unwrap_or_else(|_| Settings::from_cmdline(""));
            match std::fs::OpenOptions::new().write(true).open("/dev/console") {
                Ok(f) => (Box::new(f), settings),
                Err(_) => (Box::new(std::io::stderr()), settings),
            }
        }
        false => (Box::new(std::io::stderr()), Settings::FULL),
    };
    with_settings(out, settings)
}

/// A logger writing JSON lines to `out` as `settings` say.
pub fn with_settings(out: Box<dyn Write + Send>, settings: Settings) -> Logger {
    let json = slog_json::Json::new(out).add_default_keys().build();
    let drain = Limited {
        inner: Mutex::new(json).fuse(),
        settings,
        bucket: Mutex::new(Bucket {
            tokens: BURST as f64,
            at: Instant::now(),
            dropped: 0,
        }),
    };
    Logger::root(
        drain,
        o!("source" => "kata-agent", "pid" => std::process::id()),
    )
}

/// The level filter and the rate limit (a token bucket).
struct Limited<D> {
    inner: D,
    settings: Settings,
    bucket: Mutex<Bucket>,
}

struct Bucket {
    tokens: f64,
    at: Instant,
    dropped: u64,
}

impl Bucket {
    /// Whether a line may go now; `Some(n)` with the lines dropped before it.
    fn take(&mut self, now: Instant) -> Option<u64> {
        let refill = now.saturating_duration_since(self.at).as_secs_f64() * PER_SECOND as f64;
        self.tokens = (self.tokens + refill).min(BURST as f64);
        self.at = now;
        if self.tokens < 1.0 {
            self.dropped += 1;
            return None;
        }
        self.tokens -= 1.0;
        Some(std::mem::take(&mut self.dropped))
    }
}

impl<D: Drain<Ok = (), Err = Never>> Drain for Limited<D> {
    type Ok = ();
    type Err = Never;

    fn log(&self, record: &Record<'_>, values: &OwnedKVList) -> Result<(), Never> {
        if !record.level().is_at_least(self.settings.level) {
            return Ok(());
        }
        // Critical lines (a panic, the fatal error before a reset) always go.
        if self.settings.limited && record.level() != Level::Critical {
            let dropped = match self.bucket.lock() {
                Ok(mut b) => b.take(Instant::now()),
                Err(_) => return Ok(()),
            };
            match dropped {
                None => return Ok(()),
                Some(0) => {}
                Some(n) => self.inner.log(
                    &slog::record!(
                        Level::Warning,
                        "",
                        &format_args!(
                            "{n} log lines dropped (at most {BURST} at once and \
                             {PER_SECOND} a second; agent.log=debug logs everything)"
                        ),
                        slog::b!("dropped" => n)
                    ),
                    values,
                )?,
            }
        }
        self.inner.log(record, values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Lines {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    #[test]
    fn the_console_logs_warnings_by_default_and_everything_in_debug_mode() {
        let s = Settings::from_cmdline("console=ttyS0 quiet agent.rootfs_share\n");
        assert_eq!(s.level, Level::Warning);
        assert!(s.limited);
        let s = Settings::from_cmdline("console=ttyS0 agent.log=debug agent.rootfs_share");
        assert_eq!(
            s,
            Settings {
                level: Level::Debug,
                limited: false
            }
        );
        // The user's kernel_params come last and win; a word naming no level is ignored.
        let s = Settings::from_cmdline("agent.log=debug agent.log=info agent.log=loud");
        assert_eq!(
            s,
            Settings {
                level: Level::Info,
                limited: true
            }
        );
        assert!(!Settings::from_cmdline("agent.log=trace").limited);
        assert_eq!(
            Settings::from_cmdline("agent.log=error").level,
            Level::Error
        );
    }

    #[test]
    fn a_flood_is_cut_to_the_burst_and_the_drop_is_counted() {
        let out = Lines::default();
        let log = with_settings(
            Box::new(out.clone()),
            Settings {
                level: Level::Warning,
                limited: true,
            },
        );
        let started = Instant::now();
        for i in 0..1000 {
            slog::info!(log, "below the level"; "i" => i);
            slog::warn!(log, "refused"; "i" => i);
        }
        // The burst, plus what refilled while the loop ran (each refilled line may
        // bring a note of the drops before it).
        let refilled = (started.elapsed().as_secs_f64() * PER_SECOND as f64).ceil() as u32;
        let text = out.text();
        assert!(!text.contains("below the level"), "{text}");
        let lines = text.lines().count() as u32;
        assert!(lines >= BURST, "{lines} lines");
        assert!(
            lines <= BURST + 2 * refilled,
            "{lines} lines, {refilled} refilled"
        );
    }

    #[test]
    fn the_bucket_refills_and_reports_the_drops() {
        let t0 = Instant::now();
        let mut b = Bucket {
            tokens: BURST as f64,
            at: t0,
            dropped: 0,
        };
        for _ in 0..BURST {
            assert_eq!(b.take(t0), Some(0));
        }
        assert_eq!(b.take(t0), None);
        assert_eq!(b.take(t0), None);
        // One line's worth later, the next goes and says two were dropped.
        let later = t0 + Duration::from_millis(1000 / PER_SECOND as u64);
        assert_eq!(b.take(later), Some(2));
        assert_eq!(b.take(later), None);
    }

    #[test]
    fn critical_lines_are_never_dropped() {
        let out = Lines::default();
        let log = with_settings(Box::new(out.clone()), Settings::from_cmdline(""));
        for i in 0..(BURST * 4) {
            slog::error!(log, "refused"; "i" => i);
        }
        slog::crit!(log, "fatal error, resetting the VM");
        assert!(out.text().contains("fatal error, resetting the VM"));
    }

    #[test]
    fn debug_mode_drops_nothing() {
        let out = Lines::default();
        let log = with_settings(
            Box::new(out.clone()),
            Settings::from_cmdline("agent.log=debug"),
        );
        for i in 0..1000 {
            slog::debug!(log, "op"; "i" => i);
        }
        assert_eq!(out.text().lines().count(), 1000);
    }
}
