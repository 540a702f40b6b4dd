//! Rate-limited log lines: a guest that repeats what earns a warning (malformed packets,
//! connects to host ports nobody listens on, protocol violations, floods over the muxer's
//! caps) gets at most one line per [`LOG_INTERVAL`] and kind, with the number of lines left
//! out since the last one, instead of one line each.

use std::time::{Duration, Instant};

/// At most one line per kind in this interval.
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// One kind of repeated line.
#[derive(Debug)]
pub struct LogLimiter {
    interval: Duration,
    last: Option<Instant>,
    suppressed: u64,
    emitted: u64,
}

impl LogLimiter {
    /// A limiter letting one line through per `interval`.
    pub fn new(interval: Duration) -> Self {
        LogLimiter {
            interval,
            last: None,
            suppressed: 0,
            emitted: 0,
        }
    }

    /// Whether a line may be logged at `now`: `Some(n)` with the number of lines suppressed
    /// since the previous one, or `None` (the line is counted as suppressed).
    pub fn check(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < self.interval => {
                self.suppressed = self.suppressed.saturating_add(1);
                None
            }
            _ => {
                self.last = Some(now);
                self.emitted = self.emitted.saturating_add(1);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }

    /// `message`, with how many like it were left out, if the limiter lets it through now.
    pub fn line(&mut self, message: impl FnOnce() -> String) -> Option<String> {
        let suppressed = self.check(Instant::now())?;
        let mut line = message();
        if suppressed > 0 {
            line.push_str(&format!(
                " ({suppressed} similar message(s) suppressed in the last {}s)",
                self.interval.as_secs()
            ));
        }
        Some(line)
    }

    /// Lines let through so far.
    pub fn emitted(&self) -> u64 {
        self.emitted
    }
}

impl Default for LogLimiter {
    fn default() -> Self {
        LogLimiter::new(LOG_INTERVAL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_with_the_count_of_the_rest() {
        let mut l = LogLimiter::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(l.check(t0), Some(0));
        for i in 1..1000 {
            assert_eq!(l.check(t0 + Duration::from_millis(i)), None);
        }
        assert_eq!(l.check(t0 + Duration::from_secs(10)), Some(999));
        assert_eq!(l.check(t0 + Duration::from_secs(11)), None);
        assert_eq!(l.check(t0 + Duration::from_secs(25)), Some(1));
        assert_eq!(l.emitted(), 3);
    }

    #[test]
    fn lines_say_how_many_were_left_out() {
        let mut l = LogLimiter::new(Duration::from_secs(3600));
        assert_eq!(l.line(|| "first".into()).as_deref(), Some("first"));
        assert_eq!(l.line(|| "second".into()), None);
        assert_eq!(l.emitted(), 1);
        l.last = l
            .last
            .and_then(|t| t.checked_sub(Duration::from_secs(3600)));
        let line = l
            .line(|| "third".into())
            .expect("a line after the interval");
        assert_eq!(
            line,
            "third (1 similar message(s) suppressed in the last 3600s)"
        );
    }
}
