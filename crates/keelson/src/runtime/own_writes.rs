//! Which version each child had after this process's last write to it.

use std::collections::HashMap;
use std::sync::Mutex;

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
pub(super) fn version_at_least(cached: Option<&str>, ours: &str) -> bool {
    let number = |v: &str| v.parse::<u64>().ok();
    cached == Some(ours) || cached.and_then(number).zip(number(ours)).is_some_and(|(cached, ours)| cached >= ours)
}

#[cfg(test)]
mod tests {
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
