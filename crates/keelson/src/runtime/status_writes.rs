//! When this process last wrote each object's status, and which objects are
//! on their way to another status.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use super::own_writes::version_at_least;

/// When this process last wrote each object's status (`controller/namespace/name`),
/// and which objects are on their way to another status.
#[derive(Default)]
pub struct StatusWrites {
    written: Mutex<HashMap<String, Written>>,
    converging: Mutex<Converging>,
}

/// Our last status write to one object: when, what (a hash: the status
/// itself would cost a copy per object), and the version it left.
struct Written {
    at: std::time::Instant,
    status: u64,
    version: Option<String>,
}

/// A status's hash without its conditions' transition times. A reconcile that
/// reads a cached object not yet showing our last write builds its conditions
/// anew, stamped with a later time: that is not news.
pub fn status_digest(status: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    fn drop_transition_times(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                map.remove("lastTransitionTime");
                map.values_mut().for_each(drop_transition_times);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(drop_transition_times),
            _ => {}
        }
    }
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    match serde_json::from_str::<serde_json::Value>(status) {
        Ok(mut value) => {
            drop_transition_times(&mut value);
            value.to_string().hash(&mut hasher);
        }
        Err(_) => status.hash(&mut hasher),
    }
    hasher.finish()
}

/// Progress reports (a status on its way to another) are news no one waits
/// for: one is written only after the object has been on its way for a
/// settle time in this process's eyes, and none while more than `CROWD`
/// objects are on their way at once (the API server's capacity then goes to
/// their children and final statuses, and a phase would be stale before anyone
/// read it); an object still on its way a settle time after the crowd thinned
/// is reported then.
pub const CROWD: usize = 10;

/// An object not seen on its way for this long is no longer counted (it was
/// deleted, or waits for nothing this process will see).
const CONVERGING_FORGOTTEN_AFTER: Duration = Duration::from_secs(30);

/// The objects on their way (first and last seen so), and when there were
/// last more than [`CROWD`] of them.
#[derive(Default)]
struct Converging {
    seen: HashMap<String, Sighting>,
    crowded_at: Option<std::time::Instant>,
    /// When `seen` was last rid of forgotten objects: once a second at most,
    /// not on every reconcile of a crowd.
    pruned_at: Option<std::time::Instant>,
}

#[derive(Clone, Copy)]
struct Sighting {
    first: std::time::Instant,
    last: std::time::Instant,
}

/// What this process knows of one object on its way to another status.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Convergence {
    /// Since the first reconcile that found it on its way.
    pub seen_for: Duration,
    /// Since there were last more than [`CROWD`] objects on their way, if ever.
    pub since_crowded: Option<Duration>,
}

impl StatusWrites {
    pub fn record(&self, key: String, status: u64, version: Option<String>) {
        let written = Written { at: std::time::Instant::now(), status, version };
        self.written.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(key, written);
    }

    /// Whether `status` is what we wrote last (but for conditions' transition
    /// times) and the cached object, at version `cached`, does not show that
    /// write yet: writing it again would repeat ourselves. A different status
    /// is written even then: it may carry what was seen only once (a
    /// failover's end), which a later reconcile cannot see again.
    pub fn not_yet_seen(&self, key: &str, status: u64, cached: Option<&str>) -> bool {
        let written = self.written.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        written.get(key).is_some_and(|w| {
            w.status == status && w.version.as_deref().is_some_and(|ours| !version_at_least(cached, ours))
        })
    }

    /// Notes whether the object `key` is on its way to another status, and
    /// if it is, what this process knows of that.
    pub fn note_converging(&self, key: &str, converging: bool) -> Option<Convergence> {
        self.note_converging_at(key, converging, std::time::Instant::now())
    }

    pub(crate) fn note_converging_at(
        &self,
        key: &str,
        converging: bool,
        now: std::time::Instant,
    ) -> Option<Convergence> {
        let mut state = self.converging.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if !converging {
            state.seen.remove(key);
            return None;
        }
        let first = match state.seen.get_mut(key) {
            Some(sighting) => {
                sighting.last = now;
                sighting.first
            }
            None => {
                state.seen.insert(key.to_owned(), Sighting { first: now, last: now });
                now
            }
        };
        let prune_due = state.pruned_at.is_none_or(|at| now.saturating_duration_since(at) >= Duration::from_secs(1));
        if state.seen.len() > CROWD && prune_due {
            state.seen.retain(|_, s| now.saturating_duration_since(s.last) < CONVERGING_FORGOTTEN_AFTER);
            state.pruned_at = Some(now);
        }
        if state.seen.len() > CROWD {
            state.crowded_at = Some(now);
        }
        Some(Convergence {
            seen_for: now.saturating_duration_since(first),
            since_crowded: state.crowded_at.map(|at| now.saturating_duration_since(at)),
        })
    }

    /// Forgets an object that is gone.
    pub fn forget(&self, key: &str) {
        self.written.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(key);
        self.converging.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).seen.remove(key);
    }

    /// How many objects have a status write recorded.
    #[cfg(test)]
    pub fn recorded(&self) -> usize {
        self.written.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).len()
    }

    /// How long ago the last write was, if there was one.
    pub fn since(&self, key: &str) -> Option<Duration> {
        self.written.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(key).map(|w| w.at.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::{CONVERGING_FORGOTTEN_AFTER, CROWD, Convergence, StatusWrites, status_digest};
    use std::time::{Duration, Instant};

    #[test]
    fn a_status_we_wrote_is_not_written_again_until_the_cache_shows_it() {
        let writes = StatusWrites::default();
        let key = "webapp/ns/app";
        assert!(!writes.not_yet_seen(key, status_digest("Running"), Some("5")), "never written");
        writes.record(key.into(), status_digest("Running"), Some("10".into()));
        assert!(writes.not_yet_seen(key, status_digest("Running"), Some("9")), "the cache lags our write");
        assert!(
            !writes.not_yet_seen(key, status_digest("Running"), Some("10")),
            "the cache shows it: compare with the cache"
        );
        assert!(!writes.not_yet_seen(key, status_digest("Scaling"), Some("9")), "another status is news");
    }

    #[test]
    fn conditions_built_anew_from_a_lagging_cache_are_not_news() {
        let writes = StatusWrites::default();
        let key = "webapp/ns/app";
        let status = |phase: &str, at: &str| {
            serde_json::json!({"phase": phase, "conditions": [{"type": "Available", "lastTransitionTime": at}]})
                .to_string()
        };
        writes.record(key.into(), status_digest(&status("Running", "2026-12-03T21:00:00Z")), Some("10".into()));
        assert!(
            writes.not_yet_seen(key, status_digest(&status("Running", "2026-12-03T21:00:01Z")), Some("9")),
            "only a later time"
        );
        assert!(
            !writes.not_yet_seen(key, status_digest(&status("Scaling", "2026-12-03T21:00:01Z")), Some("9")),
            "a new phase"
        );
        let failover = |serving_at: &str| serde_json::json!({"lastFailover": {"servingAt": serving_at}}).to_string();
        writes.record(key.into(), status_digest(&failover("2026-12-03T21:00:00Z")), Some("11".into()));
        assert!(
            !writes.not_yet_seen(key, status_digest(&failover("2026-12-03T21:00:05Z")), Some("10")),
            "other times are news"
        );
    }

    #[test]
    fn an_object_on_its_way_is_timed_from_its_first_sighting() {
        let writes = StatusWrites::default();
        let start = Instant::now();
        let seen = |at| writes.note_converging_at("webapp/ns/app", true, at);
        assert_eq!(seen(start), Some(Convergence { seen_for: Duration::ZERO, since_crowded: None }));
        let later = start + Duration::from_secs(3);
        assert_eq!(seen(later).map(|c| c.seen_for), Some(Duration::from_secs(3)));
        assert_eq!(writes.note_converging_at("webapp/ns/app", false, later), None, "settled");
        assert_eq!(seen(later).map(|c| c.seen_for), Some(Duration::ZERO), "on its way again: a new clock");
    }

    #[test]
    fn a_crowd_is_counted_until_its_objects_settle_or_are_forgotten() {
        let writes = StatusWrites::default();
        let start = Instant::now();
        let crowd = |key: &str, at| writes.note_converging_at(key, true, at).and_then(|c| c.since_crowded);
        for i in 0..CROWD {
            assert_eq!(crowd(&format!("webapp/ns/{i}"), start), None, "not a crowd yet");
        }
        assert_eq!(crowd("webapp/ns/one-more", start), Some(Duration::ZERO));
        // One settles: back to CROWD; the crowd was a second ago.
        let later = start + Duration::from_secs(1);
        writes.note_converging_at("webapp/ns/0", false, later);
        assert_eq!(crowd("webapp/ns/1", later), Some(Duration::from_secs(1)));
        // Later, new ones: the old ones are forgotten on the way.
        let much_later = start + CONVERGING_FORGOTTEN_AFTER + Duration::from_secs(2);
        for i in 1..CROWD {
            crowd(&format!("webapp/ns/x{i}"), much_later);
        }
        assert_eq!(
            crowd("webapp/ns/x0", much_later),
            Some(much_later - start),
            "ten new ones: the old ones are forgotten, no crowd"
        );
    }
}
