//! Per-object retry delays after failed reconciles.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// Per-object exponential backoff: 5 ms doubling up to 5 minutes, forgotten on success.
#[derive(Default)]
pub struct Backoff {
    failures: Mutex<HashMap<String, u32>>,
}

impl Backoff {
    const BASE: Duration = Duration::from_millis(5);
    const MAX: Duration = Duration::from_secs(300);

    /// Records one more failure of `key` and returns how long to wait before retrying.
    pub fn next_delay(&self, key: &str) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let count = failures.entry(key.to_string()).or_insert(0);
        *count = count.saturating_add(1);
        let factor = 2u32.saturating_pow(count.saturating_sub(1).min(20));
        Self::BASE.saturating_mul(factor).min(Self::MAX)
    }

    /// How many objects have failures counted.
    #[cfg(test)]
    pub fn failing(&self) -> usize {
        self.failures.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).len()
    }

    pub fn reset(&self, key: &str) {
        let mut failures = self.failures.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        failures.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_caps_and_resets() {
        let backoff = Backoff::default();
        assert_eq!(backoff.next_delay("a"), Duration::from_millis(5));
        assert_eq!(backoff.next_delay("a"), Duration::from_millis(10));
        assert_eq!(backoff.next_delay("a"), Duration::from_millis(20));
        assert_eq!(backoff.next_delay("b"), Duration::from_millis(5));
        for _ in 0..30 {
            backoff.next_delay("a");
        }
        assert_eq!(backoff.next_delay("a"), Duration::from_secs(300));
        backoff.reset("a");
        assert_eq!(backoff.next_delay("a"), Duration::from_millis(5));
    }
}
