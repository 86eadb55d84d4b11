//! State shared by every reconcile of both controllers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use super::metrics::Metrics;

/// The field manager every server-side apply of Keelson uses.
pub const FIELD_MANAGER: &str = "keelson";

pub struct Context {
    pub client: Client,
    pub metrics: Arc<Metrics>,
    pub recorder: Recorder,
    pub backoff: Backoff,
    pub settings: Settings,
    /// The resourceVersion each child had after our last write to it.
    pub own_writes: OwnWrites,
    /// When this process last wrote each object's status.
    pub status_writes: StatusWrites,
}

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

/// What our last write to each child left (`kind/namespace/name` → its
/// resourceVersion), to tell whether a cached copy already shows that write.
/// Where it does, a difference between the cache and the desired object is
/// someone else's change, written back at once; where it may not (or this
/// process never wrote the child), the applier reads the object first.
/// Versions are compared as the numbers the API server (etcd) gives; one
/// that is not a number counts as not caught up.
#[derive(Default)]
pub struct OwnWrites {
    /// Owner key (`Kind/namespace/name`) → child key → version: an owner's
    /// children are forgotten with it.
    versions: Mutex<HashMap<String, HashMap<String, String>>>,
}

impl OwnWrites {
    fn versions(&self) -> std::sync::MutexGuard<'_, HashMap<String, HashMap<String, String>>> {
        self.versions.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn record(&self, owner: &str, key: String, version: Option<String>) {
        let mut versions = self.versions();
        match version {
            Some(version) => {
                versions.entry(owner.to_owned()).or_default().insert(key, version);
            }
            None => Self::remove(&mut versions, owner, &key),
        }
    }

    /// Whether a cached copy at `cached` shows our last write (false when we never wrote).
    pub fn caught_up(&self, owner: &str, key: &str, cached: Option<&str>) -> bool {
        self.versions()
            .get(owner)
            .and_then(|children| children.get(key))
            .is_some_and(|ours| version_at_least(cached, ours))
    }

    /// Whether this process has written the child (and not deleted it since).
    pub fn wrote(&self, owner: &str, key: &str) -> bool {
        self.versions().get(owner).is_some_and(|children| children.contains_key(key))
    }

    /// Forgets a child that was deleted.
    pub fn forget(&self, owner: &str, key: &str) {
        Self::remove(&mut self.versions(), owner, key);
    }

    /// Forgets every child of an owner that is gone.
    pub fn forget_owner(&self, owner: &str) {
        self.versions().remove(owner);
    }

    fn remove(versions: &mut HashMap<String, HashMap<String, String>>, owner: &str, key: &str) {
        if let Some(children) = versions.get_mut(owner) {
            children.remove(key);
            if children.is_empty() {
                versions.remove(owner);
            }
        }
    }

    /// How many owners have children recorded.
    #[cfg(test)]
    pub fn owners(&self) -> usize {
        self.versions().len()
    }
}

/// Whether a copy at version `cached` is at `ours` or later (versions compared
/// as the numbers etcd gives; one that is not a number counts as older).
fn version_at_least(cached: Option<&str>, ours: &str) -> bool {
    let number = |v: &str| v.parse::<u64>().ok();
    cached == Some(ours) || cached.and_then(number).zip(number(ours)).is_some_and(|(cached, ours)| cached >= ours)
}

/// What the operator's flags say about the objects it builds.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The image MyDatabase pods copy the instance manager from: the operator's own.
    pub instance_image: String,
    /// Watches receive their initial lists as streams (the API server supports it).
    pub streaming_lists: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self { instance_image: concat!("keelson:", env!("CARGO_PKG_VERSION")).into(), streaming_lists: false }
    }
}

impl Context {
    pub fn new(client: Client, metrics: Arc<Metrics>, settings: Settings) -> Arc<Self> {
        let reporter = Reporter { controller: "keelson".into(), instance: std::env::var("POD_NAME").ok() };
        Arc::new(Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
            backoff: Backoff::default(),
            settings,
            own_writes: OwnWrites::default(),
            status_writes: StatusWrites::default(),
        })
    }

    /// Forgets what this process kept about an object that is gone (deleted,
    /// or never seen): its status writes, its children's versions, its backoff.
    /// Forgetting a live object is safe: its next status is written again, its
    /// children are read before they are written, its next failure starts anew.
    pub fn forget_object(&self, controller: &str, kind: &str, namespace: Option<&str>, name: &str) {
        use super::meta::key;
        let object = key(kind, namespace, name);
        self.status_writes.forget(&key(controller, namespace, name));
        self.own_writes.forget_owner(&object);
        self.backoff.reset(&object);
    }

    /// Publishes an Event on `regarding` in the background, off the reconcile's
    /// critical path; a failure to publish is logged, never fatal.
    pub async fn event(&self, regarding: &ObjectReference, type_: EventType, reason: &str, action: &str, note: String) {
        let event = Event { type_, reason: reason.into(), note: Some(note), action: action.into(), secondary: None };
        let (recorder, regarding) = (self.recorder.clone(), regarding.clone());
        tokio::spawn(async move {
            if let Err(error) = recorder.publish(&event, &regarding).await {
                tracing::warn!(%error, reason = %event.reason, "could not publish event");
            }
        });
    }
}

#[cfg(test)]
mod status_writes_tests {
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

#[cfg(test)]
mod own_writes_tests {
    use super::OwnWrites;

    #[test]
    fn a_cache_has_caught_up_once_it_shows_our_last_write_or_later() {
        let writes = OwnWrites::default();
        let (owner, key) = ("WebApp/ns/app", "Deployment/ns/app");
        assert!(!writes.caught_up(owner, key, None), "never written by us: read it to be sure");
        writes.record(owner, key.into(), Some("10".into()));
        assert!(!writes.caught_up(owner, key, None), "our create is not in the cache yet");
        assert!(!writes.caught_up(owner, key, Some("9")), "the cache is older than our write");
        assert!(writes.caught_up(owner, key, Some("10")));
        assert!(writes.caught_up(owner, key, Some("11")), "someone changed it after us");
        writes.record(owner, key.into(), Some("opaque".into()));
        assert!(!writes.caught_up(owner, key, Some("12")), "not a number: read it to be sure");
        writes.forget(owner, key);
        assert!(!writes.caught_up(owner, key, Some("12")), "forgotten");
        assert_eq!(writes.owners(), 0, "an owner without children is not kept");
    }

    #[test]
    fn an_owner_that_is_gone_takes_its_children_with_it() {
        let writes = OwnWrites::default();
        writes.record("WebApp/ns/a", "Deployment/ns/a".into(), Some("1".into()));
        writes.record("WebApp/ns/a", "Service/ns/a-service".into(), Some("2".into()));
        writes.record("WebApp/ns/b", "Deployment/ns/b".into(), Some("3".into()));
        writes.forget_owner("WebApp/ns/a");
        assert!(!writes.wrote("WebApp/ns/a", "Deployment/ns/a"));
        assert!(!writes.wrote("WebApp/ns/a", "Service/ns/a-service"));
        assert!(writes.wrote("WebApp/ns/b", "Deployment/ns/b"), "another owner's children stay");
        assert_eq!(writes.owners(), 1);
    }
}

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
