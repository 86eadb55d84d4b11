//! Running a controller: readiness once its cache synced, metrics around
//! each reconcile, per-object backoff on failures, and the table entry by
//! which `operator.rs` starts every controller and `manifests` grants its RBAC.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::queue::{self, Action};
use futures::Stream;
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::watch;

use super::context::Context;
use super::health::Readiness;
use super::meta::object_key;
use super::metrics::{ControllerLabels, ErrorLabels, ResultLabels};
use super::permissions::Permission;
use super::pipeline::{self, Reconciler};
use crate::{Error, Result};

/// What a controller's `run` gets: the shared context, the namespace to
/// watch (None: all), how many reconciles at once, a call for when its cache
/// synced, and a flag that turns true on shutdown.
pub struct RunParams {
    pub ctx: Arc<Context>,
    /// Where the controller's watches report their health.
    pub readiness: Readiness,
    pub namespace: Option<String>,
    pub concurrency: u16,
    pub on_synced: Box<dyn FnOnce() + Send>,
    pub shutdown: watch::Receiver<bool>,
}

/// One controller, as the operator runs it and as RBAC is generated for it.
pub struct ControllerDef {
    pub name: &'static str,
    /// Every API right the controller uses, and nothing more.
    pub rbac: &'static [Permission],
    pub run: fn(RunParams) -> Pin<Box<dyn Future<Output = ()> + Send>>,
}

/// Resolves once `shutdown` turns true.
pub async fn stopped(mut shutdown: watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// Calls `on_synced` once `store` has its first full list.
///
/// kube-runtime's ready signal wakes only the last task that polled it, and
/// reconciles poll it too, so poll again on a short timer instead of waiting
/// for a wake-up that may never come.
async fn notify_when_synced<K>(store: Store<K>, on_synced: Box<dyn FnOnce() + Send>)
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    loop {
        match tokio::time::timeout(Duration::from_millis(100), store.wait_until_ready()).await {
            Ok(Ok(())) => return on_synced(),
            Ok(Err(_)) => return,
            Err(_) => continue,
        }
    }
}

/// Runs a controller until it shuts down: the pipeline for every object
/// `triggers` names, at most `concurrency` at once (see [`queue`]).
pub async fn drive<R: Reconciler>(
    store: Store<R::Object>,
    triggers: impl Stream<Item = ObjectRef<R::Object>>,
    reconciler: Arc<R>,
    concurrency: u16,
    on_synced: Box<dyn FnOnce() + Send>,
    shutdown: watch::Receiver<bool>,
) {
    tokio::spawn(notify_when_synced(store.clone(), on_synced));
    let reconciler_metrics = reconciler.context().metrics.clone();
    let forgetting = reconciler.clone();
    let gone = move |object: &ObjectRef<R::Object>| {
        forgetting.context().forget_object(
            R::CONTROLLER,
            &R::Object::kind(&()),
            object.namespace.as_deref(),
            &object.name,
        );
    };
    queue::run(
        store,
        triggers,
        concurrency.into(),
        stopped(shutdown),
        move |object| {
            let reconciler = reconciler.clone();
            // Boxed where it is made: a reconcile's future is large (a MyDatabase's most of all), and
            // moved unboxed into its task it overflowed a test thread's stack in a debug build.
            Box::pin(async move {
                match instrumented(object.clone(), reconciler.clone()).await {
                    Ok(action) => action,
                    Err(error) => error_policy(object, &error, reconciler),
                }
            })
        },
        gone,
        QueueMetrics::of::<R>(&reconciler_metrics),
    )
    .await;
}

/// A controller's queue, as metrics (controller-runtime's `workqueue_depth` and
/// `workqueue_queue_duration_seconds`).
struct QueueMetrics {
    depth: prometheus_client::metrics::gauge::Gauge,
    wait: prometheus_client::metrics::histogram::Histogram,
}

impl QueueMetrics {
    fn of<R: Reconciler>(metrics: &super::Metrics) -> Self {
        let labels = ControllerLabels { controller: R::CONTROLLER };
        Self {
            depth: metrics.queue_depth.get_or_create(&labels).clone(),
            wait: metrics.queue_wait.get_or_create(&labels).clone(),
        }
    }
}

impl queue::Observe for QueueMetrics {
    fn depth(&self, ready: usize) {
        self.depth.set(i64::try_from(ready).unwrap_or(i64::MAX));
    }

    fn waited(&self, waited: Duration) {
        self.wait.observe(waited.as_secs_f64());
    }
}

/// The longest one reconcile may take.
const RECONCILE_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs one reconcile with metrics, and forgets the object's backoff on success.
async fn instrumented<R: Reconciler>(object: Arc<R::Object>, reconciler: Arc<R>) -> Result<Action> {
    let metrics = reconciler.context().metrics.clone();
    let labels = ControllerLabels { controller: R::CONTROLLER };
    metrics.reconciles.get_or_create(&labels).inc();
    let in_flight = metrics.reconciles_in_flight.get_or_create(&labels).clone();
    in_flight.inc();
    let started = Instant::now();
    let key = object_key(object.as_ref());
    // A reconcile that hangs (an API call or a wait that never returns) must
    // not hold its object for ever: it ends as an error and is retried.
    let result = match tokio::time::timeout(RECONCILE_TIMEOUT, pipeline::reconcile(object, reconciler.clone())).await {
        Ok(result) => result,
        Err(_) => {
            tracing::warn!(object = %key, timeout = ?RECONCILE_TIMEOUT, "reconcile timed out");
            Err(Error::TimedOut(RECONCILE_TIMEOUT))
        }
    };
    metrics.reconcile_duration.get_or_create(&labels).observe(started.elapsed().as_secs_f64());
    in_flight.dec();
    let outcome = match &result {
        Ok(action) if action.requeues() => "requeue",
        Ok(_) => "success",
        Err(_) => "error",
    };
    metrics.reconcile_results.get_or_create(&ResultLabels { controller: R::CONTROLLER, result: outcome }).inc();
    match &result {
        Ok(_) => reconciler.context().backoff.reset(&key),
        Err(error) => {
            metrics
                .reconcile_errors
                .get_or_create(&ErrorLabels { controller: R::CONTROLLER, error: error.metric_label() })
                .inc();
        }
    }
    result
}

/// Decides when a failed reconcile runs again: per-object exponential backoff,
/// quietly for conflicts, which only mean our cached copy was stale.
fn error_policy<R: Reconciler>(object: Arc<R::Object>, error: &Error, reconciler: Arc<R>) -> Action {
    let key = object_key(object.as_ref());
    let delay = reconciler.context().backoff.next_delay(&key);
    if error.is_conflict() {
        tracing::debug!(object = %key, %error, ?delay, "conflict, retrying");
    } else {
        tracing::warn!(object = %key, %error, ?delay, "reconcile failed, retrying");
    }
    Action::requeue(delay)
}
