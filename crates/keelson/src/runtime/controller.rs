//! The pieces of a controller loop both controllers share: metrics around
//! each reconcile, per-object backoff on errors, and reporting of child changes.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::apply::ChildChange;
use super::context::Context;
use super::metrics::{ChildWriteLabels, ControllerLabels, DriftLabels, ErrorLabels};
use crate::{Error, Result};

pub fn object_key<K: Resource<DynamicType = ()>>(object: &K) -> String {
    format!("{}/{}/{}", K::kind(&()), object.namespace().unwrap_or_default(), object.name_any())
}

/// Calls `on_synced` once `store` has its first full list.
///
/// kube-runtime's ready signal wakes only the last task that polled it, and the
/// controller polls it too, so poll again on a short timer instead of waiting
/// for a wake-up that may never come.
pub async fn notify_when_synced<K>(store: Store<K>, on_synced: impl FnOnce())
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    loop {
        match tokio::time::timeout(std::time::Duration::from_millis(100), store.wait_until_ready()).await {
            Ok(Ok(())) => return on_synced(),
            Ok(Err(_)) => return,
            Err(_) => continue,
        }
    }
}

/// Runs a built controller to its end: readiness once its cache has synced,
/// metrics around each reconcile, per-object backoff on errors.
pub async fn drive<K, C, F, Fut>(
    controller: Controller<K>,
    name: &'static str,
    reconcile: F,
    ctx: Arc<C>,
    on_synced: impl FnOnce() + Send + 'static,
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    C: AsRef<Context> + Send + Sync + 'static,
    F: Fn(Arc<K>, Arc<C>) -> Fut + Copy + Send + Sync + 'static,
    Fut: Future<Output = Result<Action>> + Send + 'static,
{
    tokio::spawn(notify_when_synced(controller.store(), on_synced));
    controller
        .run(move |object, ctx| instrumented(name, object, ctx, reconcile), error_policy, ctx)
        .for_each(|_| futures::future::ready(()))
        .await;
}

/// Runs one reconcile with metrics, and forgets the object's backoff on success.
pub async fn instrumented<K, C, F, Fut>(
    controller: &'static str,
    object: Arc<K>,
    ctx: Arc<C>,
    reconcile: F,
) -> Result<Action>
where
    K: Resource<DynamicType = ()>,
    C: AsRef<Context>,
    F: FnOnce(Arc<K>, Arc<C>) -> Fut,
    Fut: Future<Output = Result<Action>>,
{
    let shared: &Context = C::as_ref(&ctx);
    let labels = ControllerLabels { controller };
    shared.metrics.reconciles.get_or_create(&labels).inc();
    let in_flight = shared.metrics.reconciles_in_flight.get_or_create(&labels).clone();
    in_flight.inc();
    let started = Instant::now();
    let key = object_key(object.as_ref());
    let result = reconcile(object, ctx.clone()).await;
    shared.metrics.reconcile_duration.get_or_create(&labels).observe(started.elapsed().as_secs_f64());
    in_flight.dec();
    match &result {
        Ok(_) => shared.backoff.reset(&key),
        Err(error) => {
            shared
                .metrics
                .reconcile_errors
                .get_or_create(&ErrorLabels { controller, error: error.metric_label() })
                .inc();
        }
    }
    result
}

/// Decides when a failed reconcile runs again: per-object exponential backoff,
/// quietly for conflicts, which only mean our cached copy was stale.
pub fn error_policy<K: Resource<DynamicType = ()>, C: AsRef<Context>>(
    object: Arc<K>,
    error: &Error,
    ctx: Arc<C>,
) -> Action {
    let shared: &Context = C::as_ref(&ctx);
    let key = object_key(object.as_ref());
    if let Some(delay) = error.fixed_retry() {
        tracing::debug!(object = %key, %error, "waiting");
        return Action::requeue(delay);
    }
    let delay = shared.backoff.next_delay(&key);
    if error.is_conflict() {
        tracing::debug!(object = %key, %error, ?delay, "conflict, retrying");
    } else {
        tracing::warn!(object = %key, %error, ?delay, "reconcile failed, retrying");
    }
    Action::requeue(delay)
}

/// Logs, counts and publishes Events for what applying one child did.
pub async fn report_child_change<C: Resource<DynamicType = ()>>(
    ctx: &Context,
    owner: &ObjectReference,
    child_name: &str,
    change: &ChildChange,
    owner_was_reconciled_before: bool,
) {
    let kind = C::kind(&()).to_string();
    // Secret values never reach logs or Events.
    let secret = kind == "Secret";
    let shown = |value: &serde_json::Value| if secret { "<redacted>".to_string() } else { value.to_string() };
    let namespace = owner.namespace.as_deref().unwrap_or_default();
    let owner_name = owner.name.as_deref().unwrap_or_default();
    let action = match change {
        ChildChange::Unchanged => return,
        ChildChange::Created if owner_was_reconciled_before => {
            tracing::info!(
                namespace,
                name = owner_name,
                child = child_name,
                "Drift detected! Updating {kind}: it was deleted, recreating it"
            );
            ctx.metrics
                .drift_corrections
                .get_or_create(&DriftLabels { kind: kind.clone(), field: "(deleted)".into() })
                .inc();
            let note = format!("{kind} {child_name} was deleted by someone else; recreated it");
            ctx.event(owner, EventType::Warning, "DriftCorrected", "Recreate", note).await;
            "create"
        }
        ChildChange::Created => {
            tracing::info!(namespace, name = owner_name, child = child_name, "creating {kind}");
            ctx.event(owner, EventType::Normal, "Created", "Create", format!("Created {kind} {child_name}")).await;
            "create"
        }
        ChildChange::Updated(fields) => {
            let paths: Vec<&str> = fields.iter().map(|f| f.path.as_str()).collect();
            tracing::info!(namespace, name = owner_name, child = child_name, fields = ?paths, "updating {kind} to the new spec");
            let note = format!("Updated {kind} {child_name}: {}", paths.join(", "));
            ctx.event(owner, EventType::Normal, "Updated", "Update", note).await;
            "update"
        }
        ChildChange::DriftCorrected(fields) => {
            let mut notes = Vec::new();
            for field in fields {
                tracing::info!(
                    namespace,
                    name = owner_name,
                    child = child_name,
                    field = %field.path,
                    desired = %shown(&field.desired),
                    actual = %shown(&field.actual),
                    "Drift detected! Updating {kind}"
                );
                ctx.metrics
                    .drift_corrections
                    .get_or_create(&DriftLabels { kind: kind.clone(), field: field.field() })
                    .inc();
                notes.push(format!(
                    "{} was {}, set back to {}",
                    field.path,
                    shown(&field.actual),
                    shown(&field.desired)
                ));
            }
            let note = format!("{kind} {child_name} was changed by someone else: {}", notes.join("; "));
            ctx.event(owner, EventType::Warning, "DriftCorrected", "Update", truncate(note, 1000)).await;
            "drift_correct"
        }
    };
    ctx.metrics.child_writes.get_or_create(&ChildWriteLabels { kind, action }).inc();
}

fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut cut = max;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    text
}
