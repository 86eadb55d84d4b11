//! Backups: a volume for them, a CronJob on the spec's schedule, and the
//! one-off Job the Snapshot deletion policy runs.

use k8s_openapi::api::batch::v1::{CronJob, CronJobSpec, Job, JobSpec, JobTemplateSpec};
use k8s_openapi::api::core::v1::{
    Container, PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, PodTemplateSpec,
    Volume, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};

use super::credentials::PASSWORD_KEY;
use super::names::{self, APP_DB, APP_USER, PORT};
use super::statefulset::{
    client_ca_mount, client_ca_volume, client_tls_env, empty_dir, env, image, job_pod, mount, scripts_volume,
    secret_env,
};
use crate::api::MyDatabase;
use crate::api::mydatabase::RESTORE_TO_ANNOTATION;
use crate::runtime::security;
use crate::{Error, Result};

/// Retention used by the final Snapshot backup when the spec has no backup section.
const DEFAULT_RETENTION: &str = "10000w";
const DEFAULT_BACKUP_STORAGE: &str = "10Gi";

/// The volume holding backups. Not owned by the MyDatabase: it must survive
/// deletion under the Retain and Snapshot policies.
pub fn volume_claim(db: &MyDatabase) -> PersistentVolumeClaim {
    let size = db.spec.backup.as_ref().map_or(DEFAULT_BACKUP_STORAGE, |b| b.storage.as_str());
    let mut metadata = names::unowned_meta(db, names::backups_pvc(db), "backup");
    // Who may restore from these backups, on the volume itself: it outlives the MyDatabase.
    let restore_to = db.spec.restore_to.join(",");
    metadata.annotations = Some([(RESTORE_TO_ANNOTATION.to_string(), restore_to)].into());
    PersistentVolumeClaim {
        metadata,
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some([("storage".to_string(), Quantity(size.into()))].into()),
                ..Default::default()
            }),
            storage_class_name: db.spec.backup.as_ref().and_then(|b| b.storage_class_name.clone()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The pod that runs `keelson-postgres.sh backup`, against a replica where one exists.
/// `verify_server`: the instances present the database's certificate (see `tls::served`).
fn backup_pod(db: &MyDatabase, retention: &str, verify_server: bool) -> PodTemplateSpec {
    PodTemplateSpec {
        metadata: Some(ObjectMeta { labels: Some(names::labels(db, "backup")), ..Default::default() }),
        spec: Some(job_pod(
            db,
            Container {
                name: "backup".into(),
                image: Some(image(db)),
                command: Some(vec!["/bin/bash".into(), format!("/scripts/{}", names::SCRIPT), "backup".into()]),
                env: Some(
                    vec![
                        env("PRIMARY_HOST", names::rw_service(db)),
                        // From a replica where one exists, so the primary is not loaded.
                        env(
                            "BACKUP_SOURCE_HOST",
                            if db.spec.replicas > 1 { names::ro_service(db) } else { names::rw_service(db) },
                        ),
                        env("PRIMARY_PORT", PORT.to_string()),
                        env("APP_DB", APP_DB),
                        env("APP_USER", APP_USER),
                        secret_env(db, "APP_PASSWORD", PASSWORD_KEY),
                        env("BACKUP_DIR", "/backups"),
                        env("RETENTION", retention),
                    ]
                    .into_iter()
                    .chain(client_tls_env(verify_server))
                    .collect(),
                ),
                // A failing container's last log lines become its termination message (shown in status).
                termination_message_policy: Some("FallbackToLogsOnError".into()),
                security_context: Some(security::restricted_container()),
                volume_mounts: Some(vec![
                    mount("backups", "/backups"),
                    mount("scripts", "/scripts"),
                    mount("tmp", "/tmp"),
                    client_ca_mount(),
                ]),
                ..Default::default()
            },
            vec![
                Volume {
                    name: "backups".into(),
                    persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                        claim_name: names::backups_pvc(db),
                        read_only: None,
                    }),
                    ..Default::default()
                },
                scripts_volume(db),
                empty_dir("tmp"),
                client_ca_volume(db),
            ],
        )),
    }
}

fn job_spec(db: &MyDatabase, retention: &str, verify_server: bool) -> JobSpec {
    JobSpec {
        // One retry for a blip; a real failure shows in status quickly.
        backoff_limit: Some(1),
        active_deadline_seconds: Some(6 * 3600),
        template: backup_pod(db, retention, verify_server),
        ..Default::default()
    }
}

/// The CronJob for `spec.backup`; None when backups are off.
pub fn cronjob(db: &MyDatabase, verify_server: bool) -> Result<Option<CronJob>> {
    let Some(backup) = &db.spec.backup else { return Ok(None) };
    Ok(Some(CronJob {
        metadata: names::owned_meta(db, names::backup_cronjob(db), "backup")?,
        spec: CronJobSpec {
            schedule: backup.schedule.trim().to_string(),
            concurrency_policy: Some("Forbid".into()),
            starting_deadline_seconds: Some(3600),
            successful_jobs_history_limit: Some(3),
            failed_jobs_history_limit: Some(3),
            job_template: JobTemplateSpec {
                metadata: Some(ObjectMeta { labels: Some(names::labels(db, "backup")), ..Default::default() }),
                spec: Some(job_spec(db, &backup.retention, verify_server)),
            },
            ..Default::default()
        },
        ..Default::default()
    }))
}

/// The Job of a backup requested now (`BACKUP_REQUEST_ANNOTATION`), as the
/// CronJob would run it; removed a day after it ends.
pub fn requested_job(db: &MyDatabase, token: &str, verify_server: bool) -> Result<Option<Job>> {
    let Some(backup) = &db.spec.backup else { return Ok(None) };
    Ok(Some(Job {
        metadata: names::owned_meta(db, names::requested_backup_job(&db.name_any(), token), "backup")?,
        spec: Some(JobSpec {
            ttl_seconds_after_finished: Some(24 * 3600),
            ..job_spec(db, &backup.retention, verify_server)
        }),
        ..Default::default()
    }))
}

/// The last backup before the data volumes go (Snapshot deletion policy).
/// Owned by the backups volume, not the MyDatabase: its record lasts as
/// long as the backup it took.
pub fn final_backup_job(db: &MyDatabase, backups: &PersistentVolumeClaim) -> Result<Job> {
    let retention = db.spec.backup.as_ref().map_or(DEFAULT_RETENTION, |b| b.retention.as_str());
    let owner = backups.controller_owner_ref(&()).ok_or_else(|| {
        Error::MissingMetadata(format!("PVC {} has no uid yet", backups.metadata.name.as_deref().unwrap_or_default()))
    })?;
    let metadata = names::unowned_meta(db, names::final_backup_job(db), "backup");
    Ok(Job {
        metadata: ObjectMeta {
            owner_references: Some(vec![OwnerReference { controller: None, block_owner_deletion: None, ..owner }]),
            ..metadata
        },
        spec: Some(job_spec(db, retention, true)),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mydatabase::tests::sample;

    #[test]
    fn cronjob_follows_the_schedule_and_never_overlaps() {
        let cronjob = cronjob(&sample(), true).expect("builds").expect("backup configured");
        let spec = cronjob.spec;
        assert_eq!(spec.schedule, "0 2 * * *");
        assert_eq!(spec.concurrency_policy.as_deref(), Some("Forbid"));
        let pod = spec.job_template.spec.expect("job").template.spec.expect("pod");
        let env = pod.containers[0].env.clone().expect("env");
        let retention = env.iter().find(|e| e.name == "RETENTION").and_then(|e| e.value.clone());
        assert_eq!(retention.as_deref(), Some("7d"));
        let sslmode = env.iter().find(|e| e.name == "PGSSLMODE").and_then(|e| e.value.clone());
        assert_eq!(sslmode.as_deref(), Some("verify-full"), "a backup verifies the server as applications do");
        let claim = pod.volumes.expect("volumes")[0].persistent_volume_claim.clone().expect("pvc");
        assert_eq!(claim.claim_name, "production-db-backups");
    }

    #[test]
    fn a_requested_backup_runs_as_the_cronjob_would_and_is_named_by_its_request() {
        let job = requested_job(&sample(), "20261206T160000Z", true).expect("builds").expect("backup configured");
        let name = job.metadata.name.clone().expect("name");
        assert_eq!(name, names::requested_backup_job("production-db", "20261206T160000Z"));
        assert_ne!(name, names::requested_backup_job("production-db", "20261206T160001Z"));
        let scheduled = cronjob(&sample(), true).expect("builds").expect("backup configured");
        let spec = job.spec.expect("spec");
        assert_eq!(Some(spec.template), scheduled.spec.job_template.spec.map(|s| s.template));
        assert_eq!(spec.ttl_seconds_after_finished, Some(86400));
    }

    #[test]
    fn no_backup_section_means_no_cronjob() {
        let mut db = sample();
        db.spec.backup = None;
        assert!(cronjob(&db, true).expect("builds").is_none());
    }

    #[test]
    fn backups_volume_is_not_owned_and_owns_the_final_backup() {
        let mut claim = volume_claim(&sample());
        assert!(claim.metadata.owner_references.is_none());
        assert!(final_backup_job(&sample(), &claim).is_err(), "a claim without uid cannot own");
        claim.metadata.uid = Some("pvc-uid".into());
        let job = final_backup_job(&sample(), &claim).expect("builds");
        let owner = &job.metadata.owner_references.expect("owned")[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("PersistentVolumeClaim", "pvc-uid"));
    }
}
