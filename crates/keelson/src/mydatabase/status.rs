//! MyDatabase status, computed from what the cluster reports: the
//! StatefulSet's readiness and the backup Jobs' outcomes.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use super::names;
use super::observed::Observed;
use super::restore::Progress;
use super::statefulset::TemplateChange;
use super::upgrade::Managers;
use crate::api::conditions::{DesiredCondition, merge_conditions};
use crate::api::mydatabase::{
    BackupRecord, DatabasePhase, FENCED_INSTANCES_ANNOTATION, MyDatabase, MyDatabaseStatus, ReplicationMode,
    fenced_instances, is_fenced,
};
use crate::runtime::jobs::job_finished;
use crate::runtime::{Outcome, pods};

/// The outcome of the newest finished backup Job, and the newest success.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Backups {
    pub last_success: Option<Time>,
    /// Name of the newest successful Job.
    pub last_success_job: Option<String>,
    /// Name of the newest finished Job when it failed.
    pub newest_failed: Option<String>,
}

/// What a backup pod reported in its termination message.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupReport {
    pub name: String,
    pub size_bytes: i64,
    /// Every backup on the volume after pruning, newest first (at most 40).
    #[serde(default)]
    pub kept: Vec<KeptBackup>,
}

#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeptBackup {
    pub name: String,
    pub size_bytes: i64,
}

/// A kept backup as status lists it; its time comes from its name (`app-20261206T144737Z.dump`).
fn backup_record(kept: &KeptBackup) -> BackupRecord {
    let stamp = kept.name.strip_suffix(".dump").and_then(|n| n.rsplit('-').next()).unwrap_or_default();
    let time = chrono::NaiveDateTime::parse_from_str(stamp, "%Y%m%dT%H%M%SZ")
        .ok()
        .and_then(|t| k8s_openapi::jiff::Timestamp::from_second(t.and_utc().timestamp()).ok())
        .map(Time);
    // Only a dump that was read back is renamed into place (`keelson-postgres.sh backup`).
    BackupRecord { name: kept.name.clone(), time, size_bytes: kept.size_bytes, verified: true }
}

/// The report of the succeeded pod of Job `job`, if it left one.
pub fn backup_report(pods: &[Pod], job: &str) -> Option<BackupReport> {
    let of_job =
        pods.iter().filter(|pod| pod.labels().get("batch.kubernetes.io/job-name").map(String::as_str) == Some(job));
    pods::terminations(of_job)
        .filter(|t| t.exit_code == 0)
        .find_map(|t| serde_json::from_str(t.message.as_deref()?).ok())
}

/// Reads the finished backup Jobs (from the CronJob and the final Snapshot).
pub fn observe_backups(jobs: &[Job]) -> Backups {
    let mut finished: Vec<(Time, bool, String)> =
        jobs.iter().filter_map(|job| job_finished(job).map(|(time, ok)| (time, ok, job.name_any()))).collect();
    finished.sort_by_key(|(time, _, _)| time.0);
    let last_success = finished.iter().rev().find(|(_, ok, _)| *ok);
    Backups {
        last_success: last_success.map(|(t, _, _)| t.clone()),
        last_success_job: last_success.map(|(_, _, name)| name.clone()),
        newest_failed: finished.last().filter(|(_, ok, _)| !ok).map(|(_, _, name)| name.clone()),
    }
}

fn restore_blocks(progress: &Progress) -> bool {
    matches!(
        progress,
        Progress::SourceMissing { .. } | Progress::NotAllowed { .. } | Progress::Running | Progress::Failed { .. }
    )
}

/// Ready=False while the data of `spec.restoreFrom` is not in place, saying why.
fn restore_condition(db: &MyDatabase, progress: &Progress) -> DesiredCondition {
    let from = db.spec.restore_from.as_ref();
    let database = from.map(|f| f.database.as_str()).unwrap_or_default();
    let backup = from.and_then(|f| f.backup.clone()).unwrap_or_else(|| "the newest backup".into());
    match progress {
        Progress::SourceMissing { volume } => DesiredCondition::new(
            "Ready",
            false,
            "RestoreSourceMissing",
            format!("spec.restoreFrom.database {database:?}: no backups volume {volume} in this namespace"),
        ),
        Progress::NotAllowed { volume } => DesiredCondition::new(
            "Ready",
            false,
            "RestoreNotAllowed",
            format!(
                "spec.restoreFrom.database {database:?}: its backups ({volume}) may not be restored into this database; \
                 the source must name it in spec.restoreTo"
            ),
        ),
        Progress::Failed { message } => DesiredCondition::new("Ready", false, "RestoreFailed", message.clone()),
        _ => DesiredCondition::new("Ready", false, "Restoring", format!("restoring {backup} of {database}")),
    }
}

/// Rebuilds after this are new: the last recorded, else the database's creation.
pub fn rebuilds_since(db: &MyDatabase) -> Option<&Time> {
    let recorded = db.status.as_ref().and_then(|s| s.last_replica_rebuild.as_ref()).map(|r| &r.at);
    recorded.or(db.metadata.creation_timestamp.as_ref())
}

/// Which instances are fenced for maintenance, and what that costs; a name
/// that is no instance of this database is said, not ignored.
fn fenced_condition(db: &MyDatabase, pods: &[Pod]) -> Option<DesiredCondition> {
    let listed = fenced_instances(db.annotations());
    if listed.is_empty() {
        return None;
    }
    let names: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
    let unknown: Vec<&String> = listed.iter().filter(|n| *n != "*" && !names.contains(n)).collect();
    if !unknown.is_empty() {
        let unknown: Vec<&str> = unknown.iter().map(|n| n.as_str()).collect();
        return Some(DesiredCondition::new(
            "Fenced",
            true,
            "UnknownInstance",
            format!(
                "{FENCED_INSTANCES_ANNOTATION}: {} is not an instance of this database (its instances: {})",
                unknown.join(", "),
                names.join(", ")
            ),
        ));
    }
    let fenced: Vec<&Pod> = pods.iter().filter(|p| is_fenced(db.annotations(), &p.name_any())).collect();
    // Stopped as its manager says, not as ordered: an old script may not have stopped yet.
    let (stopped, stopping): (Vec<&Pod>, Vec<&Pod>) =
        fenced.iter().partition(|p| super::instances::report(p).is_some_and(|r| r.fenced));
    let list = |pods: &[&Pod]| pods.iter().map(|p| p.name_any()).collect::<Vec<_>>().join(", ");
    let mut said = Vec::new();
    if !stopped.is_empty() {
        said.push(format!("{} fenced: PostgreSQL stopped, not ready", list(&stopped)));
    }
    if !stopping.is_empty() {
        said.push(format!("{} fenced: PostgreSQL not yet reported stopped", list(&stopping)));
    }
    let primary = db.status.as_ref().and_then(|s| s.current_primary.as_deref());
    if primary.is_some_and(|primary| fenced.iter().any(|p| p.name_any() == primary)) {
        said.push("the primary is among them: no writes, and no failover, until it is unfenced".into());
    }
    Some(DesiredCondition::new(
        "Fenced",
        true,
        "FencedForMaintenance",
        format!("{} (`kubectl keelson unfence` ends it)", said.join("; ")),
    ))
}

/// The status `db` should have, from what the cluster holds and what this
/// reconcile's applier recorded. `ready` and `phase` never contradict the
/// conditions: a refused child means not ready.
/// Whether every instance manager runs this operator's image (see `upgrade`).
fn managers_condition(managers: &Managers) -> DesiredCondition {
    let Managers { image, current, reporting, .. } = managers;
    let running = format!("{current}/{reporting} instance managers run {image}");
    match (&managers.failed[..], managers.upgrading.as_ref().or(managers.next.as_ref())) {
        ([], _) if current == reporting => DesiredCondition::new("InstanceManagersCurrent", true, "Current", running),
        ([], Some(pod)) => DesiredCondition::new(
            "InstanceManagersCurrent",
            false,
            "UpgradingInPlace",
            format!("{running}; upgrading {pod}'s in place (PostgreSQL keeps running)"),
        ),
        ([], None) => DesiredCondition::new("InstanceManagersCurrent", false, "Waiting", running),
        (failed, _) => DesiredCondition::new(
            "InstanceManagersCurrent",
            false,
            "UpgradeFailed",
            format!("{running}; {}", failed.join("; ")),
        ),
    }
}

pub fn compute(db: &MyDatabase, observed: &Observed, outcome: &Outcome, now: &Time) -> MyDatabaseStatus {
    let desired = db.spec.replicas;
    let previous = db.status.as_ref();
    let deleting = db.metadata.deletion_timestamp.is_some();
    let invalid = outcome.invalid.as_ref();
    let failure = outcome.failure_message();
    let statefulset = observed.statefulset.as_ref();
    let sts_status = statefulset.and_then(|s| s.status.as_ref());
    // With no StatefulSet left to read while invalid or deleting, keep what was last known of it.
    let carried = statefulset.is_none() && (invalid.is_some() || deleting);
    let ready = match (carried, previous) {
        (true, Some(previous)) => previous.ready_replicas,
        _ => sts_status.and_then(|s| s.ready_replicas).unwrap_or(0),
    };
    let current = statefulset.is_some_and(|s| {
        let status = s.status.as_ref();
        status.and_then(|st| st.observed_generation).unwrap_or(0) >= s.metadata.generation.unwrap_or(0)
            && status.and_then(|st| st.updated_replicas).unwrap_or(0) == desired
            && status.map(|st| st.replicas).unwrap_or(0) == desired
    });
    let was_running = matches!(previous.and_then(|s| s.phase), Some(DatabasePhase::Running | DatabasePhase::Degraded));
    let restore = super::restore::progress(db, observed);
    let restore_failed = matches!(restore, Progress::Failed { .. });
    let phase = if deleting {
        DatabasePhase::Deleting
    } else if invalid.is_some() || restore_failed {
        DatabasePhase::Failed
    } else if statefulset.is_none() {
        DatabasePhase::Pending
    } else if ready == desired && current && failure.is_none() {
        DatabasePhase::Running
    } else if was_running {
        DatabasePhase::Degraded
    } else {
        DatabasePhase::Creating
    };
    let is_ready = phase == DatabasePhase::Running;

    let mut conditions = vec![match (invalid, &failure) {
        (Some(invalid), _) => DesiredCondition::new("Ready", false, invalid.reason, invalid.message.clone()),
        (None, Some(failure)) => DesiredCondition::new("Ready", false, "ReconcileFailed", failure.clone()),
        (None, None) if !deleting && restore_blocks(&restore) => restore_condition(db, &restore),
        (None, None) if is_ready => {
            DesiredCondition::new("Ready", true, "AllInstancesReady", format!("{ready}/{desired} instances ready"))
        }
        (None, None) => match pods::start_failure(&observed.pods) {
            // An image that cannot be pulled is a version this cluster does not have.
            Some(failure) if pods::is_image_failure(&failure.reason) => DesiredCondition::new(
                "Ready",
                false,
                "VersionUnavailable",
                format!(
                    "spec.version {:?}: image {} is not available ({}); {ready}/{desired} instances ready; {}",
                    db.spec.version,
                    super::statefulset::image(db),
                    failure.reason,
                    failure.message
                ),
            ),
            // Name what the kubelet or scheduler says, not just "not ready".
            Some(failure) => DesiredCondition::new(
                "Ready",
                false,
                failure.reason,
                format!("{ready}/{desired} instances ready; {}", failure.message),
            ),
            None => {
                DesiredCondition::new("Ready", false, "InstancesNotReady", format!("{ready}/{desired} instances ready"))
            }
        },
    }];
    conditions.push(match invalid {
        Some(invalid) => DesiredCondition::new("SpecValid", false, invalid.reason, invalid.message.clone()),
        None => DesiredCondition::new("SpecValid", true, "Valid", ""),
    });
    // Growing storage takes steps (the volumes, then a new StatefulSet): say so while it lasts.
    match super::statefulset::template_change(db, statefulset) {
        TemplateChange::Grow { from } => conditions.push(DesiredCondition::new(
            "StorageGrowing",
            true,
            "ExpandingVolumes",
            format!("data volumes growing from {from} to {}", db.spec.storage),
        )),
        TemplateChange::Recreating => conditions.push(DesiredCondition::new(
            "StorageGrowing",
            true,
            "RecreatingStatefulSet",
            format!("the StatefulSet is recreated with {} volumes; its pods keep running", db.spec.storage),
        )),
        TemplateChange::Migrate { .. } | TemplateChange::None => {}
    }
    conditions.push(synchronous_condition(db, observed));
    if let Some(blocked) = &observed.failover_blocked {
        conditions.push(DesiredCondition::new("FailoverBlocked", true, "QuorumNotReached", blocked.clone()));
    }
    if let Some(spread) = super::placement::spread_condition(&observed.pods) {
        conditions.push(spread);
    }
    if outcome.paused {
        conditions.push(crate::api::conditions::paused());
    }
    if let Some(fenced) = fenced_condition(db, &observed.pods) {
        conditions.push(fenced);
    }
    if let Some(pending) = &observed.restart_pending {
        conditions.push(DesiredCondition::new("RestartPending", true, "OperatorUpgrade", pending.clone()));
    }
    if let Some(managers) = observed.managers.as_ref().filter(|m| m.reporting > 0) {
        conditions.push(managers_condition(managers));
    }
    conditions.push(match (&db.spec.backup, observed.backup_cron_job.is_some()) {
        (Some(backup), true) => DesiredCondition::new(
            "BackupScheduled",
            true,
            "CronJobReady",
            format!("backups run on {:?}, kept {}", backup.schedule, backup.retention),
        ),
        (Some(_), false) => {
            DesiredCondition::new("BackupScheduled", false, "CronJobMissing", "the backup CronJob is not in place yet")
        }
        (None, _) => DesiredCondition::new("BackupScheduled", false, "NoBackupConfigured", "spec.backup is not set"),
    });
    let backups = observe_backups(&observed.backup_jobs);
    match (&backups.newest_failed, &backups.last_success) {
        (Some(job), _) => conditions.push(DesiredCondition::new(
            "LastBackupSucceeded",
            false,
            "BackupFailed",
            format!("backup Job {job} failed; see `kubectl logs job/{job}`"),
        )),
        (None, Some(_)) => conditions.push(DesiredCondition::new(
            "LastBackupSucceeded",
            true,
            "BackupCompleted",
            "the newest backup completed",
        )),
        (None, None) => {}
    }
    let previous_conditions = previous.map(|s| s.conditions.as_slice()).unwrap_or_default();
    let report = backups.last_success_job.as_deref().and_then(|job| backup_report(&observed.backup_pods, job));
    let topology = super::instances::observe(&observed.pods);
    MyDatabaseStatus {
        phase: Some(phase),
        ready: is_ready,
        ready_replicas: ready,
        instances: match (carried, previous) {
            (true, Some(previous)) => previous.instances.clone(),
            _ => Some(format!("{ready}/{desired}")),
        },
        last_backup_time: backups.last_success.clone().or_else(|| previous.and_then(|s| s.last_backup_time.clone())),
        last_backup_name: report
            .as_ref()
            .map(|r| r.name.clone())
            .or_else(|| previous.and_then(|s| s.last_backup_name.clone())),
        last_backup_size_bytes: report
            .as_ref()
            .map(|r| r.size_bytes)
            .or_else(|| previous.and_then(|s| s.last_backup_size_bytes)),
        backups: match report.as_ref().filter(|r| !r.kept.is_empty()) {
            Some(report) => report.kept.iter().map(backup_record).collect(),
            None => previous.map(|s| s.backups.clone()).unwrap_or_default(),
        },
        last_backup_request: observed
            .backup_request
            .clone()
            .or_else(|| previous.and_then(|s| s.last_backup_request.clone())),
        // Keelson's choice; kept as it was when no apply ran (invalid spec, deletion).
        current_primary: observed.primary.clone().or_else(|| previous.and_then(|s| s.current_primary.clone())),
        current_primary_uid: match &observed.primary {
            Some(_) => observed.primary_uid.clone(),
            None => previous.and_then(|s| s.current_primary_uid.clone()),
        },
        server_version: topology.server_version,
        instance_statuses: topology.instances,
        asynchronous: observed.asynchronous.clone(),
        last_failover: observed.failover.clone().or_else(|| previous.and_then(|s| s.last_failover.clone())),
        last_replica_rebuild: observed
            .replica_rebuild
            .clone()
            .or_else(|| previous.and_then(|s| s.last_replica_rebuild.clone())),
        credentials_secret: Some(names::credentials(db)),
        observed_generation: db.metadata.generation,
        conditions: merge_conditions(previous_conditions, &conditions, db.metadata.generation, now),
    }
}

/// How commits wait for standbys now: the durability a client gets.
fn synchronous_condition(db: &MyDatabase, observed: &Observed) -> DesiredCondition {
    let primary = observed.primary.clone().unwrap_or_else(|| format!("{}-0", names::statefulset(db)));
    let standbys = super::ha::synchronous::standbys(db, &primary);
    let condition = |status, reason, message: String| DesiredCondition::new("Synchronous", status, reason, message);
    if let Some(period) = &observed.asynchronous {
        return condition(
            false,
            "StandbysNotStreaming",
            format!(
                "since {} {} acknowledges commits no standby confirmed (replication Preferred): a lost primary is not \
                 failed over automatically until a standby has caught up",
                period.since.0, period.primary
            ),
        );
    }
    let each = format!("each commit waits for ANY 1 of {}", standbys.join(", "));
    match db.spec.replication {
        _ if db.spec.replicas < 2 => condition(false, "SingleInstance", "one instance: no standby confirms".into()),
        ReplicationMode::Asynchronous => {
            condition(false, "Asynchronous", "commits wait for no standby; a failover may lose the last ones".into())
        }
        ReplicationMode::Synchronous => condition(true, "Required", format!("{each}; writes wait while none streams")),
        ReplicationMode::Preferred => condition(
            true,
            "Preferred",
            format!(
                "{each}; when none has streamed for {}s the primary acknowledges alone",
                super::ha::synchronous::PREFERRED_WAIT.as_secs()
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mydatabase::tests::sample;
    use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetStatus};
    use k8s_openapi::api::batch::v1::{CronJob, JobCondition, JobStatus};
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap_or(Timestamp::UNIX_EPOCH))
    }

    fn sts(ready: i32, replicas: i32) -> StatefulSet {
        let mut s = StatefulSet::default();
        s.metadata.generation = Some(1);
        s.status = Some(StatefulSetStatus {
            observed_generation: Some(1),
            replicas,
            ready_replicas: Some(ready),
            updated_replicas: Some(replicas),
            ..Default::default()
        });
        s
    }

    fn job(name: &str, kind: &str, secs: i64) -> Job {
        let mut j = Job::default();
        j.metadata.name = Some(name.into());
        j.status = Some(JobStatus {
            completion_time: (kind == "Complete").then(|| at(secs)),
            conditions: Some(vec![JobCondition {
                type_: kind.into(),
                status: "True".into(),
                last_transition_time: Some(at(secs)),
                ..Default::default()
            }]),
            ..Default::default()
        });
        j
    }

    fn observed(sts: Option<&StatefulSet>) -> Observed {
        Observed { statefulset: sts.cloned(), backup_cron_job: Some(CronJob::default()), ..Default::default() }
    }

    fn none() -> Outcome {
        Outcome::default()
    }

    fn condition(status: &MyDatabaseStatus, type_: &str) -> Option<(String, String)> {
        status.conditions.iter().find(|c| c.type_ == type_).map(|c| (c.status.clone(), c.reason.clone()))
    }

    #[test]
    fn all_instances_ready_is_running() {
        let s = sts(3, 3);
        let status = compute(&sample(), &observed(Some(&s)), &none(), &at(0));
        assert_eq!(status.phase, Some(DatabasePhase::Running));
        assert!(status.ready);
        assert_eq!(status.instances.as_deref(), Some("3/3"));
        assert_eq!(condition(&status, "Ready"), Some(("True".into(), "AllInstancesReady".into())));
    }

    #[test]
    fn not_ready_is_creating_first_and_degraded_after_running() {
        let s = sts(1, 3);
        let mut db = sample();
        assert_eq!(compute(&db, &observed(Some(&s)), &none(), &at(0)).phase, Some(DatabasePhase::Creating));
        db.status = Some(MyDatabaseStatus { phase: Some(DatabasePhase::Running), ..Default::default() });
        assert_eq!(compute(&db, &observed(Some(&s)), &none(), &at(0)).phase, Some(DatabasePhase::Degraded));
        assert_eq!(compute(&sample(), &observed(None), &none(), &at(0)).phase, Some(DatabasePhase::Pending));
    }

    #[test]
    fn invalid_spec_is_failed_naming_the_field() {
        let invalid = crate::runtime::Invalid {
            field: "spec.backup.schedule",
            reason: "InvalidSchedule",
            message: "spec.backup.schedule: bad".into(),
        };
        let s = sts(3, 3);
        let outcome = Outcome { invalid: Some(invalid), ..none() };
        let status = compute(&sample(), &observed(Some(&s)), &outcome, &at(0));
        assert_eq!(status.phase, Some(DatabasePhase::Failed));
        assert_eq!(condition(&status, "SpecValid"), Some(("False".into(), "InvalidSchedule".into())));
        assert!(status.conditions.iter().any(|c| c.message.contains("spec.backup.schedule")));
    }

    #[test]
    fn invalid_spec_and_deletion_keep_the_last_known_instances() {
        let mut db = sample();
        db.metadata.deletion_timestamp = Some(at(5));
        db.status = Some(MyDatabaseStatus { ready_replicas: 3, instances: Some("3/3".into()), ..Default::default() });
        let deleting = compute(&db, &observed(None), &none(), &at(0));
        assert_eq!(
            (deleting.phase, deleting.ready_replicas, deleting.instances.as_deref()),
            (Some(DatabasePhase::Deleting), 3, Some("3/3"))
        );
        let mut fresh_db = sample();
        fresh_db.metadata.deletion_timestamp = Some(at(5));
        let fresh = compute(&fresh_db, &observed(None), &none(), &at(0));
        assert_eq!((fresh.ready_replicas, fresh.instances.as_deref()), (0, Some("0/3")));
    }

    #[test]
    fn backups_report_newest_success_and_failure() {
        let jobs = vec![job("b-1", "Complete", 100), job("b-2", "Failed", 200)];
        let backups = observe_backups(&jobs);
        assert_eq!(backups.last_success, Some(at(100)));
        assert_eq!(backups.newest_failed.as_deref(), Some("b-2"));
        let s = sts(3, 3);
        let status = compute(&sample(), &Observed { backup_jobs: jobs, ..observed(Some(&s)) }, &none(), &at(0));
        assert_eq!(status.last_backup_time, Some(at(100)));
        assert_eq!(condition(&status, "LastBackupSucceeded"), Some(("False".into(), "BackupFailed".into())));

        assert_eq!(backups.last_success_job.as_deref(), Some("b-1"));

        let recovered = observe_backups(&[job("b-2", "Failed", 200), job("b-3", "Complete", 300)]);
        assert_eq!(recovered.newest_failed, None);
        assert_eq!(recovered.last_success, Some(at(300)));
    }

    #[test]
    fn a_refused_child_is_never_ready() {
        let s = sts(3, 3);
        let failure = crate::runtime::outcome::ChildFailure {
            child: "PersistentVolumeClaim production-db-backups".into(),
            action: "apply",
            reason: "Invalid".into(),
            message: "must be greater than zero".into(),
            conflict: false,
        };
        let outcome = Outcome { failures: vec![failure], ..none() };
        let status = compute(&sample(), &observed(Some(&s)), &outcome, &at(0));
        assert!(!status.ready);
        assert_ne!(status.phase, Some(DatabasePhase::Running));
        let (ready, reason) = condition(&status, "Ready").expect("Ready");
        assert_eq!((ready.as_str(), reason.as_str()), ("False", "ReconcileFailed"));
    }

    #[test]
    fn a_pod_that_cannot_start_is_named_in_ready() {
        let s = sts(2, 3);
        let observed = Observed {
            pods: vec![crate::runtime::pods::tests::waiting("production-db-2", "CrashLoopBackOff")],
            ..observed(Some(&s))
        };
        let status = compute(&sample(), &observed, &none(), &at(0));
        let (ready, reason) = condition(&status, "Ready").expect("Ready");
        assert_eq!((ready.as_str(), reason.as_str()), ("False", "CrashLoopBackOff"));
        assert!(status.conditions.iter().any(|c| c.message.contains("production-db-2")));
    }

    #[test]
    fn an_image_that_cannot_be_pulled_names_spec_version() {
        let s = sts(0, 3);
        let observed = Observed {
            pods: vec![crate::runtime::pods::tests::waiting("production-db-0", "ImagePullBackOff")],
            ..observed(Some(&s))
        };
        let status = compute(&sample(), &observed, &none(), &at(0));
        let ready = status.conditions.iter().find(|c| c.type_ == "Ready").expect("Ready");
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "VersionUnavailable"));
        assert!(
            ready.message.starts_with("spec.version \"15.2\": image postgres:15.2 is not available"),
            "{}",
            ready.message
        );
    }

    #[test]
    fn fenced_instances_are_said_and_a_name_that_is_no_instance_is_named() {
        let mut db = sample();
        let pods: Vec<Pod> = ["production-db-0", "production-db-1"]
            .map(|name| serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).expect("pod"))
            .to_vec();
        assert!(fenced_condition(&db, &pods).is_none(), "nothing fenced, no condition");
        let fence = |db: &mut MyDatabase, list: &str| {
            db.metadata.annotations = Some([(FENCED_INSTANCES_ANNOTATION.to_string(), list.to_string())].into());
        };
        fence(&mut db, "production-db-1");
        let fenced = fenced_condition(&db, &pods).expect("a condition");
        assert_eq!((fenced.type_, fenced.reason.as_str()), ("Fenced", "FencedForMaintenance"));
        assert!(
            fenced.message.starts_with("production-db-1 fenced: PostgreSQL not yet reported"),
            "{}",
            fenced.message
        );
        fence(&mut db, "production-db-1,production-db-7");
        let unknown = fenced_condition(&db, &pods).expect("a condition");
        assert_eq!(unknown.reason, "UnknownInstance");
        assert!(unknown.message.contains("production-db-7 is not an instance"), "{}", unknown.message);
        fence(&mut db, "*");
        let all = fenced_condition(&db, &pods).expect("a condition");
        assert!(all.message.starts_with("production-db-0, production-db-1 fenced"), "{}", all.message);
        let mut stopped = pods.clone();
        let report = serde_json::json!({"role": "replica", "serverVersion": "15.18", "timeline": 1, "lsn": "0/1", "fenced": true});
        stopped[1].metadata.annotations =
            Some([(crate::api::instance::ANNOTATION.to_string(), report.to_string())].into());
        let said = fenced_condition(&db, &stopped).expect("a condition").message;
        assert!(said.starts_with("production-db-1 fenced: PostgreSQL stopped"), "{said}");
        assert!(said.contains("production-db-0 fenced: PostgreSQL not yet reported stopped"), "{said}");
    }

    fn backup_pod(job: &str, exit_code: i32, message: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("{job}-x"), "labels": {"batch.kubernetes.io/job-name": job}},
            "status": {"containerStatuses": [{"name": "backup", "image": "postgres:15.2", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"terminated": {"exitCode": exit_code, "message": message}}}]}
        }))
        .expect("pod")
    }

    #[test]
    fn the_newest_backup_is_named_with_its_size_from_its_pod() {
        let jobs = vec![job("b-1", "Complete", 100), job("b-2", "Complete", 200)];
        let pods = vec![
            backup_pod("b-1", 0, r#"{"name":"app-1.dump","sizeBytes":10}"#),
            backup_pod("b-2", 1, "crashed"),
            backup_pod(
                "b-2",
                0,
                r#"{"name":"app-20261206T144737Z.dump","sizeBytes":2048,"kept":[
                    {"name":"app-20261206T144737Z.dump","sizeBytes":2048},{"name":"app-20261205T020000Z.dump","sizeBytes":9}]}"#,
            ),
        ];
        let s = sts(3, 3);
        let with_pods = Observed { backup_jobs: jobs, backup_pods: pods, ..observed(Some(&s)) };
        let status = compute(&sample(), &with_pods, &none(), &at(0));
        assert_eq!(status.last_backup_name.as_deref(), Some("app-20261206T144737Z.dump"));
        assert_eq!(status.last_backup_size_bytes, Some(2048));
        let listed: Vec<_> = status.backups.iter().map(|b| (b.name.as_str(), b.size_bytes, b.verified)).collect();
        assert_eq!(listed, [("app-20261206T144737Z.dump", 2048, true), ("app-20261205T020000Z.dump", 9, true)]);
        let taken = status.backups[1].time.as_ref().map(|t| t.0.to_string());
        assert_eq!(taken.as_deref(), Some("2026-12-05T02:00:00Z"));
        // Once the Job's pods are gone, the last known backup stays in status.
        let mut db = sample();
        db.status = Some(status);
        let later = compute(&db, &Observed { backup_jobs: vec![], ..observed(Some(&s)) }, &none(), &at(0));
        assert_eq!(later.last_backup_name.as_deref(), Some("app-20261206T144737Z.dump"));
        assert_eq!(later.backups.len(), 2, "the list stays too");
    }

    #[test]
    fn growing_storage_is_said_in_a_condition_until_the_new_template_is_in_place() {
        let mut grown =
            super::super::statefulset::build(&sample(), &crate::runtime::Settings::default()).expect("builds");
        grown.status = sts(3, 3).status;
        grown.metadata.generation = Some(1);
        let mut db = sample();
        db.spec.storage = "200Gi".into();
        let growing = compute(&db, &observed(Some(&grown)), &none(), &at(0));
        let condition = growing.conditions.iter().find(|c| c.type_ == "StorageGrowing").expect("StorageGrowing");
        assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("True", "ExpandingVolumes"));
        assert_eq!(condition.message, "data volumes growing from 100Gi to 200Gi");
        let done = compute(&sample(), &observed(Some(&grown)), &none(), &at(0));
        assert!(done.conditions.iter().all(|c| c.type_ != "StorageGrowing"), "the condition outlived the growth");
    }
}
