//! The deletion stage: what deleting a MyDatabase does to its data, by
//! `spec.deletionPolicy`. Runs while the finalizer holds the object; the
//! pipeline releases the finalizer only once this recorded neither a failure
//! nor a wait, so a delete issued while the operator was down completes when
//! it comes back.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
use kube::api::DeleteParams;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::observed::Observed;
use super::watches::Caches;
use super::{backup, names};
use crate::api::mydatabase::{DeletionPolicy, MyDatabase};
use crate::runtime::outcome::ChildFailure;
use crate::runtime::ownership::labelled_for;
use crate::runtime::{Applier, Context, cache, jobs};

/// Where the final backup of the Snapshot policy stands.
#[derive(Debug, PartialEq, Eq)]
pub enum FinalBackup {
    NotStarted,
    Running,
    Succeeded,
    Failed,
}

pub fn final_backup_state(db: &MyDatabase, observed: &Observed) -> FinalBackup {
    let name = names::final_backup_job(db);
    let Some(job) = observed.backup_jobs.iter().find(|j| j.name_any() == name) else {
        return FinalBackup::NotStarted;
    };
    match jobs::job_finished(job) {
        None => FinalBackup::Running,
        Some((_, true)) => FinalBackup::Succeeded,
        Some((_, false)) => FinalBackup::Failed,
    }
}

pub async fn clean_up(db: &MyDatabase, observed: &Observed, caches: &Caches, ctx: &Context, applier: &Applier<'_>) {
    let (namespace, name) = (db.namespace().unwrap_or_default(), db.name_any());
    let (namespace, name) = (namespace.as_str(), name.as_str());
    let event = |type_, reason: &'static str, note: String| async move {
        tracing::info!(namespace, name, reason, "{note}");
        ctx.event(&db.object_ref(&()), type_, reason, "Delete", note).await;
    };
    match db.spec.deletion_policy {
        DeletionPolicy::Retain => {
            event(EventType::Normal, "Retained", retained_note(db, observed, "deletionPolicy Retain")).await;
        }
        DeletionPolicy::Delete => {
            let mut removed = Vec::new();
            for claim in observed.data_claims.iter().filter(|claim| labelled_for(*claim, name)) {
                if applier.delete::<PersistentVolumeClaim>(&claim.name_any(), &DeleteParams::background()).await {
                    removed.push(claim.name_any());
                }
            }
            // By name only what carries Keelson's labels naming this database: never a stranger's.
            let backups = cache::get(&caches.claims, namespace, &names::backups_pvc(db));
            if backups.is_some_and(|claim| labelled_for(&claim, name)) {
                applier.delete::<PersistentVolumeClaim>(&names::backups_pvc(db), &DeleteParams::background()).await;
            }
            for secret in [names::credentials(db), names::replication_secret(db), names::ca_secret(db)] {
                if cache::get(&caches.secrets, namespace, &secret).is_some_and(|s| labelled_for(&s, name)) {
                    applier.delete::<Secret>(&secret, &DeleteParams::background()).await;
                }
            }
            if applier.failures().is_empty() {
                let note = format!(
                    "deletionPolicy Delete: deleted data PVCs [{}], backups PVC {} and Secrets {}, {}, {}",
                    removed.join(", "),
                    names::backups_pvc(db),
                    names::credentials(db),
                    names::replication_secret(db),
                    names::ca_secret(db)
                );
                event(EventType::Normal, "DataDeleted", note).await;
            }
        }
        DeletionPolicy::Snapshot => match final_backup_state(db, observed) {
            FinalBackup::NotStarted => match start_final_backup(db, caches, applier).await {
                Ok(()) => {
                    let note =
                        format!("deletionPolicy Snapshot: running final backup Job {}", names::final_backup_job(db));
                    event(EventType::Normal, "FinalBackupStarted", note).await;
                    applier.wait("the final backup Job to finish");
                }
                Err(failure) if failure.namespace_terminating() => {
                    let why = format!("the final backup cannot run ({failure})");
                    keep_data(db, observed, &why, event).await;
                }
                Err(failure) => applier.record_failure(failure),
            },
            FinalBackup::Running => applier.wait("the final backup Job to finish"),
            FinalBackup::Failed => {
                let why = format!("the final backup Job {} failed", names::final_backup_job(db));
                keep_data(db, observed, &why, event).await;
            }
            FinalBackup::Succeeded => {
                let mut removed = Vec::new();
                for claim in observed.data_claims.iter().filter(|claim| labelled_for(*claim, name)) {
                    if applier.delete::<PersistentVolumeClaim>(&claim.name_any(), &DeleteParams::background()).await {
                        removed.push(claim.name_any());
                    }
                }
                // The credentials Secret, never owned, stays: the backup's roles need it.
                if applier.failures().is_empty() {
                    let note = format!(
                        "deletionPolicy Snapshot: final backup in PVC {}; deleted data PVCs [{}]; kept Secrets {}, {}, {}",
                        names::backups_pvc(db),
                        removed.join(", "),
                        names::credentials(db),
                        names::replication_secret(db),
                        names::ca_secret(db)
                    );
                    event(EventType::Normal, "SnapshotTaken", note).await;
                }
            }
        },
    }
}

/// Applies the backups volume and the final backup Job (owned by that volume).
async fn start_final_backup(db: &MyDatabase, caches: &Caches, applier: &Applier<'_>) -> Result<(), ChildFailure> {
    let claim = applier.attempt(&caches.claims, backup::volume_claim(db)).await?;
    let job = backup::final_backup_job(db, &claim)
        .map_err(|error| ChildFailure::new(format!("Job {}", names::final_backup_job(db)), "apply", &error))?;
    applier.attempt::<Job>(&caches.jobs, job).await.map(|_| ())
}

/// The Snapshot fallback: nothing is deleted when no final backup exists.
async fn keep_data<F, Fut>(db: &MyDatabase, observed: &Observed, why: &str, event: F)
where
    F: Fn(EventType, &'static str, String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let kept = retained_note(db, observed, "deletionPolicy Snapshot");
    event(EventType::Warning, "FinalBackupFailed", format!("{why}; nothing deleted, as under Retain: {kept}")).await;
}

fn retained_note(db: &MyDatabase, observed: &Observed, policy: &str) -> String {
    format!(
        "{policy}: kept data PVCs [{}], backups PVC {} (if any) and Secrets {}, {}, {}",
        observed.data_claims.iter().map(|c| c.name_any()).collect::<Vec<_>>().join(", "),
        names::backups_pvc(db),
        names::credentials(db),
        names::replication_secret(db),
        names::ca_secret(db)
    )
}
