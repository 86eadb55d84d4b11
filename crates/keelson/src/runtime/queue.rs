//! The reconcile queue both controllers run on: which object reconciles
//! next, never two reconciles of one object at once, at most `concurrency`
//! at a time, and each object's requeue.
//!
//! kube-runtime's `Controller` sends every trigger, even one due at once,
//! through a `DelayQueue`, which rounds it up to the next tick of tokio's
//! millisecond timer: about 2 ms from a watch event to its reconcile, most of
//! a drift revert's time inside the operator. Here a trigger goes straight to
//! the ready list; only requeues wait on a timer.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt, future, stream};
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::Event;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::cache;

/// What a reconcile asks for next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Action {
    requeue_after: Option<Duration>,
}

impl Action {
    /// Again after `duration`, unless a change comes first.
    pub const fn requeue(duration: Duration) -> Self {
        Self { requeue_after: Some(duration) }
    }

    /// It asked to be looked at again later.
    pub const fn requeues(&self) -> bool {
        self.requeue_after.is_some()
    }

    /// Only when a change comes.
    pub const fn await_change() -> Self {
        Self { requeue_after: None }
    }
}

/// How long a reconcile that panicked waits before it runs again.
const AFTER_A_PANIC: Duration = Duration::from_secs(10);

/// How often a store that has not had its first full list is looked at again
/// (its ready signal wakes only the last task that polled it: see
/// `controller::notify_when_synced`).
const SYNC_RECHECK: Duration = Duration::from_millis(100);

/// Which objects are due, running, or waiting for a timer. Bookkeeping only:
/// the clock is passed in, so it is tested without a runtime.
pub struct Queue<T> {
    ready: VecDeque<T>,
    queued: HashSet<T>,
    running: HashSet<T>,
    /// Triggered while running: due again as soon as it ends.
    again: HashSet<T>,
    timers: BTreeMap<(Instant, u64), T>,
    timer_of: HashMap<T, (Instant, u64)>,
    timers_set: u64,
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Self {
            ready: VecDeque::new(),
            queued: HashSet::new(),
            running: HashSet::new(),
            again: HashSet::new(),
            timers: BTreeMap::new(),
            timer_of: HashMap::new(),
            timers_set: 0,
        }
    }
}

impl<T: Clone + Eq + Hash> Queue<T> {
    /// `item` is due now: ready (once), or again after its running reconcile.
    pub fn trigger(&mut self, item: T) {
        if self.running.contains(&item) {
            self.again.insert(item);
            return;
        }
        if let Some(timer) = self.timer_of.remove(&item) {
            self.timers.remove(&timer);
        }
        if self.queued.insert(item.clone()) {
            self.ready.push_back(item);
        }
    }

    /// How many items are ready and not running yet.
    pub fn depth(&self) -> usize {
        self.ready.len()
    }

    /// The next ready item, now counted as running.
    pub fn start_next(&mut self) -> Option<T> {
        let item = self.ready.pop_front()?;
        self.queued.remove(&item);
        self.running.insert(item.clone());
        Some(item)
    }

    /// `item`'s reconcile ended: due again at once if triggered meanwhile,
    /// else at `requeue_at`. (It has no timer: a trigger, which started it, removes it.)
    pub fn finished(&mut self, item: &T, requeue_at: Option<Instant>) {
        self.running.remove(item);
        if self.again.remove(item) {
            self.trigger(item.clone());
        } else if let Some(at) = requeue_at {
            self.timers_set += 1;
            let timer = (at, self.timers_set);
            self.timers.insert(timer, item.clone());
            self.timer_of.insert(item.clone(), timer);
        }
    }

    /// Triggers every timer due at `now`; returns when the next one is due.
    pub fn fire_timers(&mut self, now: Instant) -> Option<Instant> {
        while let Some(entry) = self.timers.first_entry() {
            if entry.key().0 > now {
                return Some(entry.key().0);
            }
            let item = entry.remove();
            self.timer_of.remove(&item);
            self.trigger(item);
        }
        None
    }
}

/// What the queue tells about itself, for metrics (`()` for none).
pub trait Observe {
    /// Objects ready to reconcile and waiting for a free slot.
    fn depth(&self, ready: usize);
    /// How long a triggered object waited before its reconcile started.
    fn waited(&self, waited: Duration);
}

impl Observe for () {
    fn depth(&self, _ready: usize) {}
    fn waited(&self, _waited: Duration) {}
}

/// Reconciles every object `triggers` names (looked up in `store`; one gone
/// meanwhile is skipped and handed to `gone`), as the queue orders them, until `shutdown`; then
/// lets the running reconciles end. Nothing starts before the store has its
/// first full list: the objects of that list are triggered while it is being
/// read, before the store holds them.
pub async fn run<K, F, Fut>(
    store: Store<K>,
    triggers: impl Stream<Item = ObjectRef<K>>,
    concurrency: usize,
    shutdown: impl Future<Output = ()>,
    reconcile: F,
    gone: impl Fn(&ObjectRef<K>),
    observe: impl Observe,
) where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    F: Fn(Arc<K>) -> Fut,
    Fut: Future<Output = Action> + Send + 'static,
{
    let mut queue = Queue::default();
    let mut running = JoinSet::new();
    let mut triggers = std::pin::pin!(triggers);
    let mut shutdown = std::pin::pin!(shutdown);
    let mut synced = false;
    // When each waiting object was triggered, for the wait it observes.
    let mut triggered_at: HashMap<ObjectRef<K>, Instant> = HashMap::new();
    loop {
        synced = synced || cache::is_synced(&store);
        let now = Instant::now();
        let mut next_timer = queue.fire_timers(now);
        if !synced {
            next_timer = Some(next_timer.map_or(now + SYNC_RECHECK, |at| at.min(now + SYNC_RECHECK)));
        }
        while synced && running.len() < concurrency.max(1) {
            let Some(item) = queue.start_next() else { break };
            if let Some(at) = triggered_at.remove(&item) {
                observe.waited(now.saturating_duration_since(at));
            }
            match store.get(&item) {
                Some(object) => {
                    let reconciling = AssertUnwindSafe(reconcile(object)).catch_unwind();
                    running.spawn(async move { (item, reconciling.await) });
                }
                None => {
                    gone(&item);
                    queue.finished(&item, None);
                }
            }
        }
        observe.depth(queue.depth());
        let timer = async {
            match next_timer {
                Some(at) => tokio::time::sleep_until(at).await,
                None => future::pending().await,
            }
        };
        tokio::select! {
            () = &mut shutdown => break,
            item = triggers.next() => match item {
                Some(item) => {
                    triggered_at.entry(item.clone()).or_insert_with(Instant::now);
                    queue.trigger(item);
                }
                None => break,
            },
            Some(ended) = running.join_next() => match ended {
                Ok((item, Ok(action))) => {
                    queue.finished(&item, action.requeue_after.map(|after| Instant::now() + after));
                }
                Ok((item, Err(_))) => {
                    tracing::error!(object = %item, "reconcile panicked");
                    queue.finished(&item, Some(Instant::now() + AFTER_A_PANIC));
                }
                // Only a cancelled task ends so, and none is cancelled before shutdown.
                Err(error) => tracing::error!(%error, "reconcile task lost"),
            },
            () = timer => {}
        }
    }
    while running.join_next().await.is_some() {}
}

/// A watched object's own key.
pub fn trigger_self<K>(events: impl Stream<Item = Event<K>>) -> impl Stream<Item = ObjectRef<K>>
where
    K: Resource<DynamicType = ()>,
{
    trigger_with(events, |object: &K| Some(ObjectRef::from_obj(object)))
}

/// The `Owner` of each child, by its owner references.
pub fn trigger_owners<Owner, C>(events: impl Stream<Item = Event<C>>) -> impl Stream<Item = ObjectRef<Owner>>
where
    Owner: Resource<DynamicType = ()>,
    C: Resource,
{
    trigger_with(events, |child: &C| {
        let namespace = child.meta().namespace.clone();
        child
            .meta()
            .owner_references
            .iter()
            .flatten()
            .filter(|owner| owner.kind == Owner::kind(&()) && owner.api_version == Owner::api_version(&()))
            .map(|owner| {
                let key = ObjectRef::<Owner>::new(&owner.name);
                match &namespace {
                    Some(namespace) => key.within(namespace),
                    None => key,
                }
            })
            .collect::<Vec<_>>()
    })
}

/// Whatever `map` says each object of a watch's events concerns, once its
/// cache holds it. The objects of a (re)list arrive one by one, but the cache
/// takes them all at once at its end: their keys are held until then, or a
/// reconcile started at once would read the cache from before the list (after
/// an API-server restart, an outsider's change seen in the list was missed).
pub fn trigger_with<K, C, I>(
    events: impl Stream<Item = Event<C>>,
    map: impl Fn(&C) -> I,
) -> impl Stream<Item = ObjectRef<K>>
where
    K: Resource<DynamicType = ()>,
    I: IntoIterator<Item = ObjectRef<K>>,
{
    events
        .scan(Vec::new(), move |listed, event| {
            let due: Vec<ObjectRef<K>> = match event {
                Event::Apply(object) | Event::Delete(object) => map(&object).into_iter().collect(),
                Event::Init => {
                    listed.clear();
                    Vec::new()
                }
                Event::InitApply(object) => {
                    listed.extend(map(&object));
                    Vec::new()
                }
                Event::InitDone => std::mem::take(listed),
            };
            future::ready(Some(due))
        })
        .flat_map(stream::iter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trigger_is_ready_at_once_and_only_once() {
        let mut queue = Queue::default();
        queue.trigger("a");
        queue.trigger("b");
        queue.trigger("a");
        assert_eq!(queue.start_next(), Some("a"));
        assert_eq!(queue.start_next(), Some("b"));
        assert_eq!(queue.start_next(), None);
    }

    #[test]
    fn a_trigger_while_running_runs_again_after_it_not_beside_it() {
        let mut queue = Queue::default();
        queue.trigger("a");
        assert_eq!(queue.start_next(), Some("a"));
        queue.trigger("a");
        queue.trigger("a");
        assert_eq!(queue.start_next(), None, "never two reconciles of one object");
        queue.finished(&"a", Some(Instant::now() + Duration::from_secs(3600)));
        assert_eq!(queue.start_next(), Some("a"), "due at once, not at the requeue");
        queue.finished(&"a", None);
        assert_eq!(queue.start_next(), None);
    }

    #[test]
    fn a_requeue_waits_for_its_time_and_a_trigger_comes_first() {
        let now = Instant::now();
        let mut queue = Queue::default();
        queue.trigger("a");
        queue.trigger("b");
        queue.start_next();
        queue.start_next();
        queue.finished(&"a", Some(now + Duration::from_secs(5)));
        queue.finished(&"b", Some(now + Duration::from_secs(10)));
        assert_eq!(queue.fire_timers(now), Some(now + Duration::from_secs(5)));
        assert_eq!(queue.start_next(), None);
        // A change before the timer: due now, and the timer is gone.
        queue.trigger("b");
        assert_eq!(queue.start_next(), Some("b"));
        queue.finished(&"b", None);
        assert_eq!(queue.fire_timers(now + Duration::from_secs(5)), None, "b's timer went with its trigger");
        assert_eq!(queue.start_next(), Some("a"));
        assert_eq!(queue.start_next(), None);
    }

    #[test]
    fn timers_fire_in_their_order() {
        let now = Instant::now();
        let mut queue = Queue::default();
        for (item, after) in [("late", 60), ("soon", 2), ("mid", 5)] {
            queue.trigger(item);
            queue.start_next();
            queue.finished(&item, Some(now + Duration::from_secs(after)));
        }
        assert_eq!(queue.fire_timers(now + Duration::from_secs(5)), Some(now + Duration::from_secs(60)));
        assert_eq!((queue.start_next(), queue.start_next(), queue.start_next()), (Some("soon"), Some("mid"), None));
    }

    #[tokio::test]
    async fn run_waits_for_the_first_list_reconciles_each_trigger_skips_the_deleted_and_ends_on_shutdown() {
        use k8s_openapi::api::core::v1::ConfigMap;
        use kube::runtime::reflector::store;
        use kube::runtime::watcher::Event;
        use std::sync::Mutex;

        let (reader, mut writer) = store::<ConfigMap>();
        let object = |name: &str| ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("n".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        // The first list is being read: its objects are triggered before the store holds them.
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitApply(object("here")));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let recorder = seen.clone();
        let forgotten = Arc::new(Mutex::new(Vec::new()));
        let forgetting = forgotten.clone();
        let running = tokio::spawn(run(
            reader,
            rx,
            2,
            async {
                let _ = stopped.await;
            },
            move |object: Arc<ConfigMap>| {
                let recorder = recorder.clone();
                async move {
                    recorder.lock().unwrap_or_else(|p| p.into_inner()).push(object.metadata.name.clone());
                    Action::await_change()
                }
            },
            move |gone: &ObjectRef<ConfigMap>| {
                forgetting.lock().unwrap_or_else(|p| p.into_inner()).push(gone.name.clone())
            },
            (),
        ));
        for name in ["gone", "here"] {
            tx.unbounded_send(ObjectRef::new(name).within("n")).expect("sent");
        }
        tokio::time::sleep(2 * SYNC_RECHECK).await;
        assert!(seen.lock().unwrap_or_else(|p| p.into_inner()).is_empty(), "nothing starts before the first list");
        writer.apply_watcher_event(&Event::InitDone);
        let reconciled = async {
            while seen.lock().unwrap_or_else(|p| p.into_inner()).is_empty() {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), reconciled).await.expect("reconciled");
        let _ = stop.send(());
        tokio::time::timeout(Duration::from_secs(10), running).await.expect("ended").expect("no panic");
        assert_eq!(*seen.lock().unwrap_or_else(|p| p.into_inner()), [Some("here".to_string())]);
        assert_eq!(*forgotten.lock().unwrap_or_else(|p| p.into_inner()), ["gone"], "the deleted one is handed on");
    }

    #[tokio::test]
    async fn the_objects_of_a_list_trigger_once_the_list_is_complete() {
        use k8s_openapi::api::apps::v1::Deployment;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

        let owned = |name: &str| Deployment {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("n".into()),
                owner_references: Some(vec![
                    OwnerReference {
                        api_version: "apps.keelson.dev/v1".into(),
                        kind: "WebApp".into(),
                        name: format!("{name}-owner"),
                        ..Default::default()
                    },
                    OwnerReference {
                        api_version: "v1".into(),
                        kind: "Other".into(),
                        name: "x".into(),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            },
            ..Default::default()
        };
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let mut triggers = std::pin::pin!(trigger_owners::<crate::api::WebApp, _>(rx));
        for event in [Event::Init, Event::InitApply(owned("a")), Event::InitApply(owned("b"))] {
            tx.unbounded_send(event).expect("sent");
        }
        assert!(triggers.next().now_or_never().is_none(), "held while the list is read");
        tx.unbounded_send(Event::InitDone).expect("sent");
        tx.unbounded_send(Event::Apply(owned("c"))).expect("sent");
        let mut keys = Vec::new();
        for _ in 0..3 {
            let key = triggers.next().await.expect("a trigger");
            keys.push((key.name.clone(), key.namespace.clone()));
        }
        let n = Some("n".to_string());
        assert_eq!(
            keys,
            [("a-owner".to_string(), n.clone()), ("b-owner".to_string(), n.clone()), ("c-owner".to_string(), n)]
        );
    }
}
