//! What deleting a MyDatabase does to its data, by `spec.deletionPolicy`.
//! Runs while the finalizer holds the object; the finalizer goes only after
//! this succeeded, so a delete issued while the operator was down completes
//! when it comes back.

use std::sync::Arc;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::reconcile::{namespace_of, write_status_if_changed};
use super::{backup, names, status};
use crate::api::mydatabase::{DeletionPolicy, MyDatabase};
use crate::runtime::Context;
use crate::{Error, Result};

pub async fn cleanup(db: Arc<MyDatabase>, ctx: Arc<Context>) -> Result<Action> {
    let namespace = namespace_of(&db)?;
    let observed = status::Observed { deleting: true, ..Default::default() };
    let deleting = status::compute(&db, &observed, &crate::runtime::status::now());
    if let Err(error) = write_status_if_changed(&db, deleting, &ctx).await {
        tracing::debug!(%error, "could not mark MyDatabase as Deleting");
    }
    let reference = db.object_ref(&());
    let name = db.name_any();
    match db.spec.deletion_policy {
        DeletionPolicy::Retain => {
            release_credentials(&db, &namespace, &ctx).await?;
            let claims = data_claims(&db, &namespace, &ctx).await?;
            let note = format!(
                "deletionPolicy Retain: kept data PVCs [{}], backups PVC {} (if any) and Secret {}",
                claims.iter().map(|c| c.name_any()).collect::<Vec<_>>().join(", "),
                names::backups_pvc(&db),
                names::credentials(&db)
            );
            tracing::info!(namespace, name, "{note}");
            ctx.event(&reference, EventType::Normal, "Retained", "Delete", note).await;
        }
        DeletionPolicy::Delete => {
            let removed = delete_data_claims(&db, &namespace, &ctx).await?;
            delete_claim(&namespace, &names::backups_pvc(&db), &ctx).await?;
            let note = format!(
                "deletionPolicy Delete: deleted data PVCs [{}] and backups PVC {}",
                removed.join(", "),
                names::backups_pvc(&db)
            );
            tracing::info!(namespace, name, "{note}");
            ctx.event(&reference, EventType::Normal, "DataDeleted", "Delete", note).await;
        }
        DeletionPolicy::Snapshot => {
            final_backup(&db, &namespace, &ctx).await?;
            let removed = delete_data_claims(&db, &namespace, &ctx).await?;
            let note = format!(
                "deletionPolicy Snapshot: final backup in PVC {}; deleted data PVCs [{}]",
                names::backups_pvc(&db),
                removed.join(", ")
            );
            tracing::info!(namespace, name, "{note}");
            ctx.event(&reference, EventType::Normal, "SnapshotTaken", "Delete", note).await;
        }
    }
    Ok(Action::await_change())
}

/// Runs the final backup Job and waits for it (each call checks once).
async fn final_backup(db: &MyDatabase, namespace: &str, ctx: &Context) -> Result<()> {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), namespace);
    let claim = backup::volume_claim(db);
    let result = pvcs
        .patch(&names::backups_pvc(db), &PatchParams::apply(crate::runtime::FIELD_MANAGER), &Patch::Apply(&claim))
        .await;
    ctx.metrics.api_request("apply", &result);
    result.map_err(Error::kube("apply backups PVC"))?;

    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), namespace);
    let job_name = names::final_backup_job(db);
    let existing = jobs.get_opt(&job_name).await;
    ctx.metrics.api_request("get", &existing);
    let job = match existing.map_err(Error::kube("get final backup Job"))? {
        Some(job) => job,
        None => {
            let created = jobs.create(&PostParams::default(), &backup::final_backup_job(db)?).await;
            ctx.metrics.api_request("create", &created);
            let created = created.map_err(Error::kube("create final backup Job"))?;
            let note = format!("deletionPolicy Snapshot: running final backup Job {job_name}");
            ctx.event(&db.object_ref(&()), EventType::Normal, "FinalBackupStarted", "Delete", note).await;
            created
        }
    };
    let outcome = status::observe_backups(std::slice::from_ref(&job));
    if outcome.last_success.is_some() {
        return Ok(());
    }
    if outcome.newest_failed.is_some() {
        let note = format!(
            "final backup Job {job_name} failed; the data is kept. Fix the cause and delete the Job to retry, \
             or set spec.deletionPolicy to Retain or Delete"
        );
        ctx.event(&db.object_ref(&()), EventType::Warning, "FinalBackupFailed", "Delete", note.clone()).await;
        return Err(Error::Finalizer(note));
    }
    Err(Error::Waiting(format!("final backup Job {namespace}/{job_name}")))
}

async fn data_claims(db: &MyDatabase, namespace: &str, ctx: &Context) -> Result<Vec<PersistentVolumeClaim>> {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), namespace);
    let selector = format!("{}={},app.kubernetes.io/component=database", names::CLUSTER_LABEL, db.name_any());
    let list = pvcs.list(&ListParams::default().labels(&selector)).await;
    ctx.metrics.api_request("list", &list);
    Ok(list.map_err(Error::kube("list data PVCs"))?.items)
}

async fn delete_claim(namespace: &str, name: &str, ctx: &Context) -> Result<()> {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), namespace);
    let result = pvcs.delete(name, &DeleteParams::background()).await;
    ctx.metrics.api_request("delete", &result);
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(source) => Err(Error::Kube { action: format!("delete PVC {name}"), source }),
    }
}

async fn delete_data_claims(db: &MyDatabase, namespace: &str, ctx: &Context) -> Result<Vec<String>> {
    let mut removed = Vec::new();
    for claim in data_claims(db, namespace, ctx).await? {
        delete_claim(namespace, &claim.name_any(), ctx).await?;
        removed.push(claim.name_any());
    }
    Ok(removed)
}

/// Drops the owner reference from the credentials so they outlive the
/// MyDatabase with the data they unlock.
async fn release_credentials(db: &MyDatabase, namespace: &str, ctx: &Context) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    let name = names::credentials(db);
    let existing = secrets.get_metadata_opt(&name).await;
    ctx.metrics.api_request("get", &existing);
    let Some(secret) = existing.map_err(Error::kube("get credentials Secret"))? else { return Ok(()) };
    if secret.owner_references().is_empty() {
        return Ok(());
    }
    let patch = json!({"metadata": {"ownerReferences": null}});
    let result = secrets.patch_metadata(&name, &PatchParams::default(), &Patch::Merge(&patch)).await;
    ctx.metrics.api_request("patch", &result);
    result.map_err(Error::kube("release credentials Secret"))?;
    Ok(())
}
