//! Watch caches of children: one watch per kind feeds both a store that
//! reconciles read from (no GET per reconcile) and the controller's triggers.

use futures::{FutureExt, Stream, StreamExt, future};
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::utils::ResetTimerBackoff;
use kube::runtime::watcher::ExponentialBackoff;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::client::RETRY_MAX_DELAY;
use super::health::WatchHealth;
use super::meta;
pub use super::packed::{LabelsRead, Packed};

/// How one watch runs: where it reports its health, and whether its initial
/// list comes as a stream of events (see [`streaming_lists_supported`]).
pub struct Watching {
    pub health: WatchHealth,
    pub streaming_lists: bool,
}

/// A watch of `api` filtered by `labels`, cached without managedFields. It
/// retries with backoff for ever and reports its failures to its health.
/// Returns the cache and the stream of its events (after the cache took
/// them), which never carries an error: see `queue::trigger_*`. Children are
/// watched as [`Packed`] objects, to keep the caches small.
pub fn watch<K>(
    api: Api<K>,
    labels: &str,
    watching: Watching,
) -> (Store<K>, impl Stream<Item = watcher::Event<K>> + Send + 'static)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let Watching { health, streaming_lists } = watching;
    let (store, writer) = reflector::store::<K>();
    let mut config = watcher::Config::default().labels(labels);
    if streaming_lists {
        config = config.streaming_lists();
    }
    let stream = watcher(api, config)
        .backoff(retry_backoff())
        .inspect(move |event| match event {
            Ok(_) => health.working(),
            Err(error) => health.failed(error),
        })
        .modify(|object| object.managed_fields_mut().clear())
        .reflect(writer)
        // Each watch retries on its own, above. Its errors are not passed on:
        // kube's controller used to pause *all* its watches behind one shared
        // backoff that grows to 30 s and re-arms on any watch's next error (with
        // ten watches failing in turn after an API-server restart, it stayed
        // blind for minutes).
        .filter_map(|event| future::ready(event.ok()));
    (store, stream)
}

/// Whether the API server sends a watch's initial list as events, one object
/// at a time (WatchList), instead of in pages the client must hold whole:
/// asked once at startup with a watch of `api` that the server ends after a
/// second. An older server, or one with the feature off, refuses it.
pub async fn streaming_lists_supported<K>(api: &Api<K>) -> bool
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let params = kube::api::WatchParams::streaming_lists().timeout(1);
    let Ok(stream) = api.watch(&params, "0").await else { return false };
    let mut stream = std::pin::pin!(stream);
    matches!(
        tokio::time::timeout(Duration::from_secs(5), stream.next()).await,
        Ok(Some(Ok(kube::api::WatchEvent::Added(_) | kube::api::WatchEvent::Bookmark(_))))
    )
}

/// How a failed watch retries: 200 ms doubling to at most 2 s, jittered, for
/// ever; forgotten after a minute of health. kube's default grows to 30 s, which
/// left the operator blind for up to a minute after an API-server restart; a
/// watch retry is one cheap request, so a short cap costs the API server little.
pub(crate) fn retry_backoff() -> ResetTimerBackoff<ExponentialBackoff> {
    let exponential = backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(RETRY_MAX_DELAY)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times();
    ResetTimerBackoff::new(ExponentialBackoff::from(exponential), Duration::from_secs(60))
}

/// True once the cache holds its first full list.
pub fn is_synced<K>(store: &Store<K>) -> bool
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    matches!(store.wait_until_ready().now_or_never(), Some(Ok(())))
}

/// The cached `namespace/name`, if any.
pub fn get<K>(store: &Store<Packed<K>>, namespace: &str, name: &str) -> Option<K>
where
    K: Resource<DynamicType = ()> + LabelsRead + Serialize + DeserializeOwned + 'static,
{
    get_arrived(store, namespace, name).map(|(object, _)| object)
}

/// The cached `namespace/name`, if any, with when its watch delivered it.
pub fn get_arrived<K>(store: &Store<Packed<K>>, namespace: &str, name: &str) -> Option<(K, Instant)>
where
    K: Resource<DynamicType = ()> + LabelsRead + Serialize + DeserializeOwned + 'static,
{
    let packed = store.get(&ObjectRef::new(name).within(namespace))?;
    Some((unpack(&packed)?, packed.arrived()))
}

/// Cached objects in `namespace` carrying every label of `labels`, by name.
pub fn list<K>(store: &Store<Packed<K>>, namespace: &str, labels: &BTreeMap<String, String>) -> Vec<K>
where
    K: Resource<DynamicType = ()> + LabelsRead + Serialize + DeserializeOwned + 'static,
{
    const { assert!(K::LABELS_READ, "a kind listed by label keeps its labels in the cache: see LabelsRead") };
    let mut packed = store.state();
    packed.retain(|o| o.namespace().as_deref() == Some(namespace) && meta::matches(o.labels(), labels));
    packed.sort_by_key(|o| o.name_any());
    packed.iter().filter_map(|o| unpack(o)).collect()
}

/// A cached object whole again. It was packed from what the API server sent,
/// so this cannot fail short of a bug; if it does, the object counts as not
/// cached (the applier then asks the API server) and the error is logged.
fn unpack<K>(packed: &Packed<K>) -> Option<K>
where
    K: Resource<DynamicType = ()> + LabelsRead + Serialize + DeserializeOwned,
{
    packed
        .unpack()
        .inspect_err(|error| tracing::error!(object = ?packed, %error, "a cached object does not decode"))
        .ok()
}

/// Until `store` has its first full list (at once afterwards): a reconcile
/// must not take an unsynced cache's emptiness for the cluster's. Bounded: a
/// watch that cannot list is an error naming it, not a hang.
pub async fn synced<K>(store: &Store<K>, what: &'static str) -> crate::Result<()>
where
    K: Resource + Clone,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    match tokio::time::timeout(std::time::Duration::from_secs(10), store.wait_until_ready()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(crate::Error::CacheStopped(what)),
        Err(_) => Err(crate::Error::CacheNotSynced(what)),
    }
}
