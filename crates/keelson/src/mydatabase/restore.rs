//! `spec.restoreFrom`: before the first instance starts, a Job fills pod 0's
//! data volume (made ahead of the StatefulSet, under the name it adopts) from
//! a backup in another MyDatabase's backups volume: a fresh `initdb` with this
//! database's own roles and passwords, then `pg_restore` of the dump.
//! Replicas then clone pod 0 as usual.

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Container, PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, PodTemplateSpec, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::names;
use super::observed::Observed;
use super::statefulset::{
    DATA_MOUNT, data_claim, empty_dir, env, image, instance_env, job_pod, mount, password_env, scripts_volume,
};
use crate::Result;
use crate::api::MyDatabase;
use crate::api::mydatabase::{RESTORE_TO_ANNOTATION, RestoreFrom};
use crate::runtime::{jobs, pods, security};

/// Where the source's backups volume is mounted, read-only.
const SOURCE_MOUNT: &str = "/restore-source";

/// What a restore needs before the StatefulSet exists.
pub struct Restore {
    pub data_claim: PersistentVolumeClaim,
    pub job: Job,
}

pub fn build(db: &MyDatabase) -> Result<Option<Restore>> {
    let Some(from) = &db.spec.restore_from else { return Ok(None) };
    Ok(Some(Restore { data_claim: data_claim(db, &names::first_data_claim(db)), job: job(db, from)? }))
}

/// Where a requested restore stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// No `spec.restoreFrom`, or the instances exist already.
    NotNeeded,
    /// The source's backups volume is not in this namespace.
    SourceMissing { volume: String },
    /// The source does not let this database restore from its backups.
    NotAllowed { volume: String },
    /// The Job is to be created or has not finished.
    Running,
    /// The Job failed; its pod's termination message says why.
    Failed { message: String },
    /// The data is in place: the StatefulSet may start.
    Done,
}

pub fn progress(db: &MyDatabase, observed: &Observed) -> Progress {
    let Some(from) = &db.spec.restore_from else { return Progress::NotNeeded };
    if observed.statefulset.is_some() {
        return Progress::NotNeeded;
    }
    let volume = names::backups_pvc_of(&from.database);
    let Some(job) = &observed.restore_job else {
        return match &observed.restore_source {
            Some(source) if restore_allowed(source, db) => Progress::Running,
            Some(_) => Progress::NotAllowed { volume },
            None => Progress::SourceMissing { volume },
        };
    };
    match jobs::job_finished(job) {
        None => Progress::Running,
        Some((_, true)) => Progress::Done,
        Some((_, false)) => {
            // The script's own words, from the failed pod's termination message, else the Job's.
            let message = pods::terminations(&observed.restore_pods)
                .filter(|t| t.exit_code != 0)
                .find_map(|t| t.message.as_deref().map(str::trim).filter(|m| !m.is_empty()))
                .or_else(|| jobs::job_condition(job, "Failed")?.message.as_deref())
                .unwrap_or("the restore Job failed");
            Progress::Failed { message: message.to_string() }
        }
    }
}

/// Whether the backups volume `source` lets `db` restore from it: it is
/// `db`'s own name's, or its source named `db` (or `*`) in `spec.restoreTo`.
pub fn restore_allowed(source: &PersistentVolumeClaim, db: &MyDatabase) -> bool {
    if source.metadata.name.as_deref() == Some(names::backups_pvc(db).as_str()) {
        return true;
    }
    let allowed = source.metadata.annotations.as_ref().and_then(|a| a.get(RESTORE_TO_ANNOTATION));
    allowed.is_some_and(|names| {
        names
            .split(',')
            .map(str::trim)
            .any(|name| name == "*" || name == db.metadata.name.as_deref().unwrap_or_default())
    })
}

fn claim_volume(name: &str, claim: String, read_only: bool) -> Volume {
    Volume {
        name: name.into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: claim,
            read_only: read_only.then_some(true),
        }),
        ..Default::default()
    }
}

fn job(db: &MyDatabase, from: &RestoreFrom) -> Result<Job> {
    let container = Container {
        name: "restore".into(),
        image: Some(image(db)),
        command: Some(vec!["/bin/bash".into(), format!("/scripts/{}", names::SCRIPT), "restore-new".into()]),
        env: Some(
            instance_env()
                .into_iter()
                .chain(password_env(db))
                .chain([
                    env("BACKUP_DIR", SOURCE_MOUNT),
                    env("RESTORE_SOURCE", names::backups_pvc_of(&from.database)),
                    env("RESTORE_BACKUP", from.backup.clone().unwrap_or_default()),
                ])
                .collect(),
        ),
        // A failing container's last log lines become its termination message (shown in status).
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        security_context: Some(security::restricted_container()),
        volume_mounts: Some(vec![
            mount("data", DATA_MOUNT),
            mount("source", SOURCE_MOUNT),
            mount("scripts", "/scripts"),
            mount("run", "/var/run/postgresql"),
            mount("tmp", "/tmp"),
        ]),
        ..Default::default()
    };
    Ok(Job {
        metadata: names::owned_meta(db, names::restore_job(db), "restore")?,
        spec: Some(JobSpec {
            // A wrong backup name does not become right by retrying.
            backoff_limit: Some(1),
            active_deadline_seconds: Some(6 * 3600),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta { labels: Some(names::labels(db, "restore")), ..Default::default() }),
                // A restore talks to no API server.
                spec: Some(job_pod(
                    db,
                    container,
                    vec![
                        claim_volume("data", names::first_data_claim(db), false),
                        claim_volume("source", names::backups_pvc_of(&from.database), true),
                        scripts_volume(db),
                        empty_dir("run"),
                        empty_dir("tmp"),
                    ],
                )),
            },
            ..Default::default()
        }),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mydatabase::tests::sample;

    #[test]
    fn only_a_source_that_names_the_database_may_be_restored_from() {
        let db = sample();
        let mut source = sample();
        source.metadata.name = Some("old-db".into());
        let volume = |restore_to: &[&str]| {
            let mut source = source.clone();
            source.spec.restore_to = restore_to.iter().map(|n| n.to_string()).collect();
            crate::mydatabase::backup::volume_claim(&source)
        };
        assert!(!restore_allowed(&volume(&[]), &db), "a database's backups are its own");
        assert!(!restore_allowed(&volume(&["other-db"]), &db));
        assert!(restore_allowed(&volume(&["other-db", "production-db"]), &db));
        assert!(restore_allowed(&volume(&["*"]), &db));
        // Its own name's backups (a database re-created under it) always.
        assert!(restore_allowed(&crate::mydatabase::backup::volume_claim(&db), &db));
    }

    #[test]
    fn restore_fills_the_first_instances_volume_from_the_sources_backups() {
        let mut db = sample();
        assert!(build(&db).expect("build").is_none(), "no restore without spec.restoreFrom");
        db.spec.restore_from = Some(RestoreFrom { database: "old-db".into(), backup: Some("app-1.dump".into()) });
        let restore = build(&db).expect("build").expect("a restore");
        assert_eq!(restore.data_claim.metadata.name.as_deref(), Some("data-production-db-0"));
        let pod = restore.job.spec.as_ref().and_then(|s| s.template.spec.as_ref()).expect("pod");
        let claims: Vec<(String, Option<bool>)> = pod
            .volumes
            .iter()
            .flatten()
            .filter_map(|v| v.persistent_volume_claim.as_ref().map(|c| (c.claim_name.clone(), c.read_only)))
            .collect();
        assert_eq!(claims, [("data-production-db-0".into(), None), ("old-db-backups".into(), Some(true))]);
        let env = pod.containers[0].env.as_ref().expect("env");
        let value = |name: &str| env.iter().find(|e| e.name == name).and_then(|e| e.value.clone());
        assert_eq!(value("RESTORE_BACKUP").as_deref(), Some("app-1.dump"));
        assert!(
            env.iter().any(|e| e.name == "APP_PASSWORD" && e.value_from.is_some()),
            "its own password, from its Secret"
        );
    }

    fn failed_restore(pod_message: Option<&str>) -> Observed {
        let job: Job = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "production-db-restore"},
            "status": {"conditions": [{"type": "Failed", "status": "True", "lastTransitionTime": "2026-12-03T08:00:00Z",
                "message": "Job has reached the specified backoff limit"}]}
        }))
        .expect("job");
        let pods = pod_message.map(|message| {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "production-db-restore-x"},
                "status": {"containerStatuses": [{"name": "restore", "image": "postgres:15.2", "imageID": "", "ready": false,
                    "restartCount": 0, "state": {"terminated": {"exitCode": 1, "message": message}}}]}
            }))
            .expect("pod")
        });
        Observed { restore_job: Some(job), restore_pods: pods.into_iter().collect(), ..Default::default() }
    }

    #[test]
    fn a_failed_restore_says_why_in_the_scripts_words_else_the_jobs() {
        let mut db = sample();
        db.spec.restore_from = Some(RestoreFrom { database: "old-db".into(), backup: None });
        let said = progress(&db, &failed_restore(Some("spec.restoreFrom.backup x.dump: no such backup\n")));
        assert_eq!(said, Progress::Failed { message: "spec.restoreFrom.backup x.dump: no such backup".into() });
        let fallback = progress(&db, &failed_restore(None));
        assert_eq!(fallback, Progress::Failed { message: "Job has reached the specified backoff limit".into() });
        assert_eq!(progress(&db, &Observed::default()), Progress::SourceMissing { volume: "old-db-backups".into() });
    }
}
