//! One MyDatabase reconcile, as a pipeline: finalizer → validate → build the
//! desired children → apply those that differ → label pod roles → compute
//! status from the StatefulSet and backup Jobs → write it if it changed.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{self, finalizer};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::validation::{self, Invalid};
use super::{backup, credentials, deletion, names, pdb, scripts, services, statefulset, status};
use crate::api::mydatabase::{MyDatabase, MyDatabaseStatus};
use crate::runtime::controller::report_child_change;
use crate::runtime::metrics::ChildWriteLabels;
use crate::runtime::{Context, Current, apply_child};
use crate::{Error, Result};

pub const CONTROLLER: &str = "mydatabase";
pub const FINALIZER: &str = "db.keelson.dev/cleanup";
const RESYNC: Duration = Duration::from_secs(3600);

pub fn namespace_of(db: &MyDatabase) -> Result<String> {
    db.namespace().ok_or_else(|| Error::MissingMetadata(format!("MyDatabase {} has no namespace", db.name_any())))
}

pub async fn reconcile(db: Arc<MyDatabase>, ctx: Arc<Context>) -> Result<Action> {
    let namespace = namespace_of(&db)?;
    let api: Api<MyDatabase> = Api::namespaced(ctx.client.clone(), &namespace);
    finalizer(&api, FINALIZER, db, |event| async {
        match event {
            finalizer::Event::Apply(db) => apply_spec(db, ctx.clone()).await,
            finalizer::Event::Cleanup(db) => deletion::cleanup(db, ctx.clone()).await,
        }
    })
    .await
    .map_err(|error| match error {
        finalizer::Error::ApplyFailed(error) | finalizer::Error::CleanupFailed(error) => error,
        other => Error::Finalizer(other.to_string()),
    })
}

/// Applies `desired` and reports what changed; returns the object as the API server has it.
async fn apply_and_report<K>(
    ctx: &Context,
    db: &MyDatabase,
    api: &Api<K>,
    desired: K,
    current: Current<'_, K>,
    failure: &mut Option<Error>,
) -> Option<K>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned + 'static,
{
    let name = desired.meta().name.clone().unwrap_or_default();
    let reconciled_before = db.status.as_ref().and_then(|s| s.observed_generation).is_some();
    match apply_child(api, desired, current, &ctx.metrics).await {
        Ok((applied, change)) => {
            report_child_change::<K>(ctx, &db.object_ref(&()), &name, &change, reconciled_before).await;
            Some(applied)
        }
        Err(error) => {
            failure.get_or_insert(error);
            None
        }
    }
}

async fn apply_spec(db: Arc<MyDatabase>, ctx: Arc<Context>) -> Result<Action> {
    let namespace = namespace_of(&db)?;
    let client = ctx.client.clone();

    if let Err(invalid) = validation::validate(&db.spec) {
        return report_invalid(&db, &namespace, &invalid, &ctx).await;
    }

    let mut failure: Option<Error> = None;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let existing_secret = secrets.get_opt(&names::credentials(&db)).await;
    ctx.metrics.api_request("get", &existing_secret);
    let existing_secret = existing_secret.map_err(Error::kube("get credentials Secret"))?;
    let passwords = credentials::passwords(existing_secret.as_ref());
    let secret = credentials::build(&db, &passwords)?;
    apply_and_report(&ctx, &db, &secrets, secret, Current::Read(existing_secret), &mut failure).await;
    apply_and_report(
        &ctx,
        &db,
        &Api::<ConfigMap>::namespaced(client.clone(), &namespace),
        scripts::build(&db)?,
        Current::Unknown,
        &mut failure,
    )
    .await;
    let service_api: Api<Service> = Api::namespaced(client.clone(), &namespace);
    for service in services::build(&db)? {
        apply_and_report(&ctx, &db, &service_api, service, Current::Unknown, &mut failure).await;
    }

    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &namespace);
    let existing_sts = grow_storage_if_needed(&db, &namespace, &sets, &ctx).await?;
    let desired_sts = statefulset::build(&db)?;
    let observed_sts = apply_and_report(&ctx, &db, &sets, desired_sts, Current::Read(existing_sts), &mut failure).await;

    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &namespace);
    match pdb::build(&db)? {
        Some(budget) => {
            apply_and_report(&ctx, &db, &budgets, budget, Current::Unknown, &mut failure).await;
        }
        None => delete_if_present(&budgets, &names::statefulset(&db), &ctx).await?,
    }

    let cronjobs: Api<CronJob> = Api::namespaced(client.clone(), &namespace);
    let backup_scheduled = match backup::cronjob(&db)? {
        Some(cronjob) => {
            let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &namespace);
            apply_and_report(&ctx, &db, &pvcs, backup::volume_claim(&db), Current::Unknown, &mut failure).await;
            apply_and_report(&ctx, &db, &cronjobs, cronjob, Current::Unknown, &mut failure).await.is_some()
        }
        None => {
            delete_if_present(&cronjobs, &names::backup_cronjob(&db), &ctx).await?;
            false
        }
    };

    if let Err(error) = label_pod_roles(&db, &namespace, &ctx).await {
        failure.get_or_insert(error);
    }

    let jobs: Api<Job> = Api::namespaced(client.clone(), &namespace);
    let selector = format!("{}={},app.kubernetes.io/component=backup", names::CLUSTER_LABEL, db.name_any());
    let backup_jobs = jobs.list(&ListParams::default().labels(&selector)).await;
    ctx.metrics.api_request("list", &backup_jobs);
    let backup_jobs = backup_jobs.map_err(Error::kube("list backup Jobs"))?;
    let backups = status::observe_backups(&backup_jobs.items);

    let observed = status::Observed {
        statefulset: observed_sts.as_ref(),
        backups,
        backup_scheduled,
        failure: failure.as_ref().map(ToString::to_string),
        ..Default::default()
    };
    let new_status = status::compute(&db, &observed, &crate::runtime::status::now());
    announce_backup_failure(&db, &new_status, &ctx).await;
    write_status_if_changed(&db, new_status, &ctx).await?;
    match failure {
        Some(error) => Err(error),
        None => Ok(Action::requeue(RESYNC)),
    }
}

/// What only the reconciler can reject: a condition naming the field, an
/// Event, and no requeue until the spec changes (no hot loop).
async fn report_invalid(db: &MyDatabase, namespace: &str, invalid: &Invalid, ctx: &Context) -> Result<Action> {
    let observed = status::Observed { invalid: Some(invalid), ..Default::default() };
    let new_status = status::compute(db, &observed, &crate::runtime::status::now());
    if db.status.as_ref() != Some(&new_status) {
        tracing::warn!(namespace, name = %db.name_any(), field = invalid.field, "invalid spec: {}", invalid.message);
        let note = invalid.message.clone();
        ctx.event(&db.object_ref(&()), EventType::Warning, "InvalidSpec", "Validate", note).await;
    }
    write_status_if_changed(db, new_status, ctx).await?;
    Ok(Action::await_change())
}

/// A StatefulSet's claim templates cannot change, so growing storage means:
/// expand each existing data PVC, then recreate the StatefulSet without
/// touching its pods (orphan delete); the next reconcile applies the new one.
/// Returns the StatefulSet as it is when nothing needs to grow.
async fn grow_storage_if_needed(
    db: &MyDatabase,
    namespace: &str,
    sets: &Api<StatefulSet>,
    ctx: &Context,
) -> Result<Option<StatefulSet>> {
    let existing = sets.get_opt(&names::statefulset(db)).await;
    ctx.metrics.api_request("get", &existing);
    let Some(existing) = existing.map_err(Error::kube("get StatefulSet"))? else { return Ok(None) };
    if existing.metadata.deletion_timestamp.is_some() {
        return Err(Error::Waiting(format!("StatefulSet {namespace}/{} to be recreated", existing.name_any())));
    }
    let Some(current) = statefulset::template_storage(&existing) else { return Ok(Some(existing)) };
    let grows = match (
        crate::runtime::drift::parse_quantity(&current),
        crate::runtime::drift::parse_quantity(&db.spec.storage),
    ) {
        (Some(have), Some(want)) => want > have,
        _ => false,
    };
    if !grows {
        return Ok(Some(existing));
    }
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), namespace);
    let selector = format!("{}={},app.kubernetes.io/component=database", names::CLUSTER_LABEL, db.name_any());
    let claims = pvcs.list(&ListParams::default().labels(&selector)).await;
    ctx.metrics.api_request("list", &claims);
    for claim in claims.map_err(Error::kube("list data PVCs"))?.items {
        let patch = json!({"spec": {"resources": {"requests": {"storage": db.spec.storage}}}});
        let result = pvcs.patch(&claim.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await;
        ctx.metrics.api_request("patch", &result);
        result.map_err(Error::kube(format!("expand PVC {}", claim.name_any())))?;
    }
    let deleted = sets.delete(&existing.name_any(), &DeleteParams::orphan()).await;
    ctx.metrics.api_request("delete", &deleted);
    deleted.map_err(Error::kube("recreate StatefulSet"))?;
    let note = format!(
        "storage {current} → {}: expanded the data PVCs; recreating the StatefulSet (pods keep running)",
        db.spec.storage
    );
    tracing::info!(namespace, name = %db.name_any(), "{note}");
    ctx.event(&db.object_ref(&()), EventType::Normal, "StorageExpanding", "Expand", note).await;
    Err(Error::Waiting(format!("StatefulSet {namespace}/{} to be recreated", existing.name_any())))
}

async fn delete_if_present<K>(api: &Api<K>, name: &str, ctx: &Context) -> Result<()>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let exists = api.get_metadata_opt(name).await;
    ctx.metrics.api_request("get", &exists);
    if exists.map_err(Error::kube(format!("get {} {name}", K::kind(&()))))?.is_none() {
        return Ok(());
    }
    let result = api.delete(name, &DeleteParams::background()).await;
    ctx.metrics.api_request("delete", &result);
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => Err(Error::Kube { action: format!("delete {} {name}", K::kind(&())), source: error }),
    }
}

/// Keeps `keelson.dev/role` on each pod so `-rw` and `-ro` select the right ones.
async fn label_pod_roles(db: &MyDatabase, namespace: &str, ctx: &Context) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let selector = format!("{}={},app.kubernetes.io/component=database", names::CLUSTER_LABEL, db.name_any());
    let list = pods.list_metadata(&ListParams::default().labels(&selector)).await;
    ctx.metrics.api_request("list", &list);
    for pod in list.map_err(Error::kube("list database pods"))?.items {
        let role = services::role_of_pod(&pod.name_any());
        if pod.labels().get(names::ROLE_LABEL).map(String::as_str) == Some(role) {
            continue;
        }
        let patch = json!({"metadata": {"labels": {names::ROLE_LABEL: role}}});
        let result = pods.patch_metadata(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await;
        ctx.metrics.api_request("patch", &result);
        result.map_err(Error::kube(format!("label pod {}", pod.name_any())))?;
        ctx.metrics.child_writes.get_or_create(&ChildWriteLabels { kind: "Pod".into(), action: "label" }).inc();
        tracing::info!(namespace, name = %db.name_any(), pod = %pod.name_any(), role, "labelled pod role");
    }
    Ok(())
}

/// Publishes BackupFailed once per failed Job (when the condition's message changes).
async fn announce_backup_failure(db: &MyDatabase, new_status: &MyDatabaseStatus, ctx: &Context) {
    let find = |conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]| {
        conditions.iter().find(|c| c.type_ == "LastBackupSucceeded" && c.status == "False").map(|c| c.message.clone())
    };
    let Some(message) = find(&new_status.conditions) else { return };
    let before = db.status.as_ref().and_then(|s| find(&s.conditions));
    if before.as_ref() != Some(&message) {
        tracing::warn!(name = %db.name_any(), "{message}");
        ctx.event(&db.object_ref(&()), EventType::Warning, "BackupFailed", "Backup", message).await;
    }
}

pub async fn write_status_if_changed(db: &MyDatabase, new_status: MyDatabaseStatus, ctx: &Context) -> Result<()> {
    if crate::runtime::status::write_if_changed(ctx, CONTROLLER, db, db.status.as_ref(), &new_status).await?
        && db.status.as_ref().and_then(|s| s.phase) != new_status.phase
    {
        let (namespace, name) = (db.namespace().unwrap_or_default(), db.name_any());
        tracing::info!(namespace, name, phase = ?new_status.phase, ready = new_status.ready_replicas, "MyDatabase phase changed");
    }
    Ok(())
}
