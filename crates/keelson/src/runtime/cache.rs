//! Watch caches of children: one watch per kind feeds both a store that
//! reconciles read from (no GET per reconcile) and the controller's triggers.

use futures::{FutureExt, Stream};
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;

use super::meta;

/// A watch of `api` filtered by `labels`, cached; managedFields are dropped to
/// save memory. Returns the cache and the stream of touched objects.
pub fn watch<K>(api: Api<K>, labels: &str) -> (Store<K>, impl Stream<Item = Result<K, watcher::Error>> + Send + 'static)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let stream = watcher(api, watcher::Config::default().labels(labels))
        .default_backoff()
        .modify(|object| object.managed_fields_mut().clear())
        .reflect(writer)
        .touched_objects();
    (store, stream)
}

/// True once the cache holds its first full list.
pub fn is_synced<K>(store: &Store<K>) -> bool
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    matches!(store.wait_until_ready().now_or_never(), Some(Ok(())))
}

/// The cached `namespace/name`, if any.
pub fn get<K>(store: &Store<K>, namespace: &str, name: &str) -> Option<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store.get(&ObjectRef::new(name).within(namespace)).map(|object| K::clone(&object))
}

/// Cached objects in `namespace` carrying every label of `labels`, by name.
pub fn list<K>(store: &Store<K>, namespace: &str, labels: &BTreeMap<String, String>) -> Vec<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let mut found: Vec<K> = store
        .state()
        .into_iter()
        .filter(|o| o.namespace().as_deref() == Some(namespace) && meta::matches(o.labels(), labels))
        .map(|o| K::clone(&o))
        .collect();
    found.sort_by_key(|o| o.name_any());
    found
}
