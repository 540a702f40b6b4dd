//! Rate limits for what a guest can make the shim do over and over (publish an event,
//! log a line): at most one per key and period, the rest counted and reported with the
//! next one that goes through.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Keys remembered at most; past it, keys idle for a whole period are forgotten.
const MAX_KEYS: usize = 1024;

/// At most one per key per `period`.
pub struct PerKey {
    period: Duration,
    slots: HashMap<String, Slot>,
}

struct Slot {
    last: Instant,
    dropped: u64,
}

impl PerKey {
    pub fn new(period: Duration) -> Self {
        Self {
            period,
            slots: HashMap::new(),
        }
    }

    /// Whether one for `key` may go at `now`: `Some(n)`, with `n` the number dropped for
    /// it since the last that went; `None` when this one is dropped (and counted).
    pub fn admit(&mut self, key: &str, now: Instant) -> Option<u64> {
        if let Some(slot) = self.slots.get_mut(key) {
            if now.saturating_duration_since(slot.last) < self.period {
                slot.dropped += 1;
                return None;
            }
            let dropped = slot.dropped;
            *slot = Slot {
                last: now,
                dropped: 0,
            };
            return Some(dropped);
        }
        if self.slots.len() >= MAX_KEYS {
            let period = self.period;
            self.slots
                .retain(|_, s| now.saturating_duration_since(s.last) < period);
        }
        if self.slots.len() >= MAX_KEYS {
            // Every key is busy: the new one waits for room, counted nowhere.
            return None;
        }
        self.slots.insert(
            key.to_string(),
            Slot {
                last: now,
                dropped: 0,
            },
        );
        Some(0)
    }

    /// The keys with drops not yet reported, and their counts (reported by this call).
    pub fn take_dropped(&mut self) -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> = self
            .slots
            .iter_mut()
            .filter(|(_, s)| s.dropped > 0)
            .map(|(k, s)| (k.clone(), std::mem::take(&mut s.dropped)))
            .collect();
        out.sort();
        out
    }
}

/// `s` cut to at most `max` bytes (on a character boundary), for logging what a guest
/// sent.
pub fn clip(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_per_key_and_period_goes_through_and_the_rest_are_counted() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut limit = PerKey::new(Duration::from_secs(1));
        assert_eq!(limit.admit("a", ms(0)), Some(0));
        assert_eq!(limit.admit("a", ms(10)), None);
        assert_eq!(limit.admit("a", ms(999)), None);
        // Another key has its own budget.
        assert_eq!(limit.admit("b", ms(500)), Some(0));
        assert_eq!(limit.admit("a", ms(1000)), Some(2));
        assert_eq!(limit.admit("a", ms(1500)), None);
        assert_eq!(limit.admit("b", ms(1200)), None);
        assert_eq!(
            limit.take_dropped(),
            vec![("a".to_string(), 1), ("b".to_string(), 1)]
        );
        assert_eq!(limit.take_dropped(), vec![]);
        assert_eq!(limit.admit("a", ms(2000)), Some(0));
    }

    #[test]
    fn the_keys_remembered_are_bounded() {
        let t0 = Instant::now();
        let mut limit = PerKey::new(Duration::from_secs(1));
        for i in 0..MAX_KEYS {
            assert_eq!(limit.admit(&i.to_string(), t0), Some(0));
        }
        assert_eq!(limit.admit("new", t0), None);
        assert_eq!(limit.slots.len(), MAX_KEYS);
        // Once the others are idle for a period, they make room.
        assert_eq!(limit.admit("new", t0 + Duration::from_secs(1)), Some(0));
        assert_eq!(limit.slots.len(), 1);
    }

    #[test]
    fn clip_cuts_on_a_character_boundary() {
        assert_eq!(clip("abc", 5), "abc");
        assert_eq!(clip("abcdef", 3), "abc");
        assert_eq!(clip("aé", 2), "a");
    }
}
