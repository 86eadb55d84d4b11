//! The reconcile pipeline both controllers run, stage by stage:
//!
//! 1. read      what the caches hold for the object ([`Reconciler::read`])
//! 2. validate  pure; an invalid spec becomes a condition, nothing is applied
//! 3. build     pure builders turn spec and what was read into desired children
//! 4. apply     through the shared [`Applier`], in the controller's order
//! 5. status    pure, from what was read and applied and the [`Outcome`]
//! 6. write     status once, only if it changed
//!
//! A deleted object with a finalizer runs one more stage of the same shape:
//! read → clean up through the applier → status → release the finalizer
//! once the clean-up is complete.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

use super::queue::Action;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::apply::{Applier, Child};
use super::context::Context;
use super::outcome::{Invalid, Outcome};
use super::status;
use super::status_writes::Convergence;
use crate::{Error, Result};

/// One controller's answers to the pipeline's questions.
pub trait Reconciler: Send + Sync + 'static {
    /// The custom resource.
    type Object: Child;
    /// What the cluster holds for one object: read from caches, updated by apply.
    type Observed: Send + Sync;
    /// The children the spec asks for.
    type Desired: Send;
    type Status: Serialize + PartialEq + Debug + Send + Sync;

    /// Name in metrics and logs.
    const CONTROLLER: &'static str;
    /// A finalizer that holds deletion until [`Reconciler::clean_up`] completes.
    const FINALIZER: Option<&'static str> = None;

    fn context(&self) -> &Context;

    /// Stage 1: what the caches hold for `object`, confirmed with the API
    /// server where a stale answer would do harm.
    fn read(&self, object: &Self::Object) -> impl Future<Output = Result<Self::Observed>> + Send;

    /// Stage 2: what only the reconciler can reject.
    fn validate(object: &Self::Object, observed: &Self::Observed) -> Result<(), Invalid>;

    /// Stage 3: the desired children.
    fn build(&self, object: &Self::Object, observed: &Self::Observed) -> Result<Self::Desired>;

    /// Stage 4: applies the desired children; returns what the cluster has now.
    fn apply(
        &self,
        object: &Self::Object,
        observed: Self::Observed,
        desired: Self::Desired,
        applier: &Applier<'_>,
    ) -> impl Future<Output = Self::Observed> + Send;

    /// Stage 5: the status `object` should have.
    fn status(object: &Self::Object, observed: &Self::Observed, outcome: &Outcome) -> Self::Status;

    fn current_status(object: &Self::Object) -> Option<&Self::Status>;

    /// A status on its way to another (pods coming up): such a status is
    /// written only once the object has been on its way for [`STATUS_SETTLE`]
    /// as this process saw it, at most once per [`STATUS_SETTLE`], and not
    /// while more than [`CROWD`](super::status_writes::CROWD) objects are on their
    /// way, so that a quick convergence, or many at once, cost one status write
    /// per object, not one per step. Default: none is.
    fn progressing(_status: &Self::Status) -> bool {
        false
    }

    /// When to look again although nothing changes (a condition that only
    /// time can tell); the default is the hourly resync.
    fn recheck(_object: &Self::Object, _observed: &Self::Observed) -> Option<std::time::Duration> {
        None
    }

    /// Tells people about a status change (logs, Events); the default logs nothing.
    fn announce(
        &self,
        _object: &Self::Object,
        _new: &Self::Status,
        _outcome: &Outcome,
    ) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// The deletion stage, under [`Reconciler::FINALIZER`]: complete when the
    /// applier recorded neither a failure nor a wait.
    fn clean_up(
        &self,
        _object: &Self::Object,
        _observed: &Self::Observed,
        _applier: &Applier<'_>,
    ) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// Runs the pipeline for one object.
pub async fn reconcile<R: Reconciler>(object: Arc<R::Object>, reconciler: Arc<R>) -> Result<Action> {
    let ctx = reconciler.context();
    let namespace = object.namespace().ok_or_else(|| {
        Error::MissingMetadata(format!("{} {} has no namespace", R::Object::kind(&()), object.name_any()))
    })?;
    let api: Api<R::Object> = Api::namespaced(ctx.client.clone(), &namespace);
    if object.meta().deletion_timestamp.is_some() {
        return delete(&*reconciler, &object, &api).await;
    }
    if let Some(finalizer) = R::FINALIZER
        && !object.finalizers().iter().any(|f| f == finalizer)
    {
        add_finalizer(&api, &object, finalizer).await?;
    }
    // A child missing from an object that has a status was deleted: drift, not a creation.
    let applier = Applier::new(ctx, &*object, R::current_status(&object).is_some());

    let observed = reconciler.read(&object).await?; // 1. read
    let observed = match R::validate(&object, &observed) {
        // Paused: read and report, change nothing.
        _ if crate::api::conditions::is_paused(&*object) => {
            applier.pause();
            observed
        }
        // 2. validate
        Err(invalid) => {
            applier.invalid(invalid);
            observed
        }
        Ok(()) => {
            let desired = reconciler.build(&object, &observed)?; // 3. build
            reconciler.apply(&object, observed, desired, &applier).await // 4. apply
        }
    };
    let mut outcome = applier.finish();
    outcome.recheck = R::recheck(&object, &observed);
    let new_status = R::status(&object, &observed, &outcome); // 5. status
    let key = status_key::<R>(&object);
    let convergence = ctx.status_writes.note_converging(&key, R::progressing(&new_status));
    match status_hold::<R>(ctx, &key, &object, &new_status, &outcome, convergence) {
        // Looked at again when the hold ends, if nothing else comes first.
        Some(wait) => outcome.recheck = Some(outcome.recheck.map_or(wait, |r| r.min(wait))),
        None => write_status::<R>(reconciler.as_ref(), &object, &new_status, &outcome).await?, // 6. write
    }
    outcome.into_action()
}

/// How long a progressing status waits (see `status_hold` and
/// [`Reconciler::progressing`]).
pub const STATUS_SETTLE: std::time::Duration = std::time::Duration::from_secs(5);

/// How long to hold `new` back, if it is a progressing status that came too
/// soon: within [`STATUS_SETTLE`] of this process first finding the object on
/// its way, of our last status write to it, or of the last time this process
/// had a crowd of objects on their way. News (a failure, an invalid spec, a
/// settled status) is never held.
fn status_hold<R: Reconciler>(
    ctx: &Context,
    key: &str,
    object: &R::Object,
    new: &R::Status,
    outcome: &Outcome,
    convergence: Option<Convergence>,
) -> Option<std::time::Duration> {
    // Not on its way: news, written at once.
    let convergence = convergence?;
    if R::current_status(object) == Some(new) || !outcome.failures.is_empty() || outcome.invalid.is_some() {
        return None;
    }
    let since_write = ctx.status_writes.since(key);
    let elapsed = [Some(convergence.seen_for), since_write, convergence.since_crowded].into_iter().flatten().min()?;
    STATUS_SETTLE.checked_sub(elapsed).filter(|wait| !wait.is_zero())
}

fn status_key<R: Reconciler>(object: &R::Object) -> String {
    status::key(R::CONTROLLER, object)
}

/// The deletion stage: clean up, write status, release the finalizer when done.
async fn delete<R: Reconciler>(reconciler: &R, object: &R::Object, api: &Api<R::Object>) -> Result<Action> {
    let Some(finalizer) = R::FINALIZER else {
        // Owner references hand the children to the garbage collector.
        return Ok(Action::await_change());
    };
    let Some(position) = object.finalizers().iter().position(|f| f == finalizer) else {
        return Ok(Action::await_change());
    };
    let applier = Applier::new(reconciler.context(), object, true);
    let observed = reconciler.read(object).await?;
    reconciler.clean_up(object, &observed, &applier).await;
    let outcome = applier.finish();
    let new_status = R::status(object, &observed, &outcome);
    if let Err(error) = write_status::<R>(reconciler, object, &new_status, &outcome).await {
        // Status is news, not a condition of the clean-up.
        tracing::debug!(%error, "could not write status of a deleted object");
    }
    if !outcome.is_complete() {
        return outcome.into_action();
    }
    // `test` makes the removal fail if the list changed since we read it.
    let patch = json!([
        { "op": "test", "path": format!("/metadata/finalizers/{position}"), "value": finalizer },
        { "op": "remove", "path": format!("/metadata/finalizers/{position}") },
    ]);
    match patch_json(api, object, patch, "remove finalizer").await {
        // Gone already: an earlier pass released it before the cache caught up.
        Err(error) if error.is_not_found() => Ok(Action::await_change()),
        Err(error) => Err(error),
        Ok(()) => Ok(Action::await_change()),
    }
}

async fn add_finalizer<K>(api: &Api<K>, object: &K, finalizer: &str) -> Result<()>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
{
    let patch = match &object.meta().finalizers {
        None => json!([
            { "op": "test", "path": "/metadata/finalizers", "value": null },
            { "op": "add", "path": "/metadata/finalizers", "value": [finalizer] },
        ]),
        Some(current) => json!([
            { "op": "test", "path": "/metadata/finalizers", "value": current },
            { "op": "add", "path": "/metadata/finalizers/-", "value": finalizer },
        ]),
    };
    patch_json(api, object, patch, "add finalizer").await
}

async fn patch_json<K>(api: &Api<K>, object: &K, patch: serde_json::Value, action: &str) -> Result<()>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
{
    let patch: json_patch::Patch =
        serde_json::from_value(patch).map_err(|source| Error::Serialize { what: "finalizer patch", source })?;
    api.patch::<()>(&object.name_any(), &PatchParams::default(), &Patch::Json(patch))
        .await
        .map_err(Error::kube(format!("{action} of {} {}", K::kind(&()), object.name_any())))?;
    Ok(())
}

/// Writes status if it changed; an invalid spec is announced once, when it first shows.
async fn write_status<R: Reconciler>(
    reconciler: &R,
    object: &R::Object,
    new_status: &R::Status,
    outcome: &Outcome,
) -> Result<()> {
    let ctx = reconciler.context();
    if !status::write_if_changed(ctx, R::CONTROLLER, object, R::current_status(object), new_status).await? {
        return Ok(());
    }
    if let Some(invalid) = &outcome.invalid {
        let (namespace, name) = (object.namespace().unwrap_or_default(), object.name_any());
        tracing::warn!(namespace, name, field = invalid.field, "invalid spec: {}", invalid.message);
        let note = invalid.message.clone();
        ctx.event(&object.object_ref(&()), EventType::Warning, "InvalidSpec", "Validate", note).await;
    }
    reconciler.announce(object, new_status, outcome).await;
    Ok(())
}
