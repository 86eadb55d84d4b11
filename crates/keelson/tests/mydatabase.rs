//! MyDatabase user stories, end to end on the real control plane (Job and
//! database pods are driven by kwok; the PostgreSQL scripts themselves are
//! tested against real PostgreSQL in postgres_scripts.rs).

mod common;

use std::collections::BTreeMap;

use common::TestOperator;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use keelson::api::mydatabase::{DatabasePhase, MyDatabase};
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::{DEFAULT_TIMEOUT, TestNamespace, cluster_or_skip, eventually, kubectl, wait_for, wait_for_deletion};

const NAME: &str = "production-db";

/// The tutorial's manifest, with a deletion policy when given.
fn tutorial(policy: Option<&str>) -> anyhow::Result<MyDatabase> {
    let mut spec = json!({
        "replicas": 3, "version": "15.2", "storage": "100Gi",
        "backup": {"schedule": "0 2 * * *", "retention": "7d"}
    });
    if let Some(policy) = policy {
        spec["deletionPolicy"] = json!(policy);
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "db.keelson.dev/v1", "kind": "MyDatabase", "metadata": {"name": NAME}, "spec": spec
    }))?)
}

fn running(replicas: i32) -> impl Fn(&MyDatabase) -> bool {
    move |db| {
        db.status.as_ref().is_some_and(|s| {
            s.phase == Some(DatabasePhase::Running)
                && s.ready
                && s.ready_replicas == replicas
                && s.observed_generation == db.metadata.generation
                // Converged as far as the pods go too (status shows each instance).
                && s.instance_statuses.len() == replicas as usize
                && s.instance_statuses.iter().all(|i| i.ready)
        })
    }
}

async fn create_running(ns: &TestNamespace, policy: Option<&str>) -> anyhow::Result<MyDatabase> {
    let dbs = ns.api::<MyDatabase>();
    dbs.create(&PostParams::default(), &tutorial(policy)?).await?;
    wait_for(&dbs, NAME, "Running 3/3", DEFAULT_TIMEOUT, running(3)).await
}

fn condition(db: &MyDatabase, type_: &str) -> Option<(String, String, String)> {
    db.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

async fn events(ns: &TestNamespace, reason: &str) -> anyhow::Result<Vec<Event>> {
    let list = ns.api::<Event>().list(&ListParams::default()).await?;
    Ok(list.items.into_iter().filter(|e| e.reason.as_deref() == Some(reason)).collect())
}

async fn wait_for_event(ns: &TestNamespace, reason: &str) -> anyhow::Result<Event> {
    eventually(DEFAULT_TIMEOUT, &format!("a {reason} event"), || async {
        events(ns, reason).await.is_ok_and(|e| !e.is_empty())
    })
    .await?;
    Ok(events(ns, reason).await?.remove(0))
}

async fn data_claims(ns: &TestNamespace) -> anyhow::Result<Vec<PersistentVolumeClaim>> {
    let selector = format!("keelson.dev/cluster={NAME},app.kubernetes.io/component=database");
    Ok(ns.api::<PersistentVolumeClaim>().list(&ListParams::default().labels(&selector)).await?.items)
}

/// A PVC is gone, or going (kubernetes.io/pvc-protection holds it while a pod uses it).
fn deleted_or_deleting(claim: Option<&PersistentVolumeClaim>) -> bool {
    claim.is_none_or(|c| c.metadata.deletion_timestamp.is_some())
}

#[tokio::test]
async fn tutorial_database_runs_with_every_child() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "mydb-create").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    let db = create_running(&ns, None).await?;
    assert_eq!(db.status.as_ref().and_then(|s| s.instances.as_deref()), Some("3/3"));
    assert_eq!(condition(&db, "BackupScheduled").map(|c| c.0).as_deref(), Some("True"));

    let sts = ns.api::<StatefulSet>().get(NAME).await?;
    let pod = sts.spec.as_ref().and_then(|s| s.template.spec.clone()).unwrap_or_default();
    assert_eq!(pod.containers[0].image.as_deref(), Some("postgres:15.2"));
    assert_eq!(sts.owner_references()[0].kind, "MyDatabase");
    let claims = data_claims(&ns).await?;
    assert_eq!(claims.len(), 3);
    assert!(claims.iter().all(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")));

    // Roles: pod 0 primary, others replicas; -rw and -ro select them.
    let pods = ns.api::<Pod>().list(&ListParams::default().labels(&format!("keelson.dev/cluster={NAME}"))).await?;
    let roles: BTreeMap<String, String> = pods
        .items
        .iter()
        .map(|p| (p.name_any(), p.labels().get("keelson.dev/role").cloned().unwrap_or_default()))
        .collect();
    let want: BTreeMap<String, String> =
        [("production-db-0", "primary"), ("production-db-1", "replica"), ("production-db-2", "replica")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    assert_eq!(roles, want);
    let services = ns.api::<Service>();
    for (name, role) in
        [("production-db-rw", Some("primary")), ("production-db-ro", Some("replica")), ("production-db-headless", None)]
    {
        let selector = services.get(name).await?.spec.and_then(|s| s.selector).unwrap_or_default();
        assert_eq!(selector.get("keelson.dev/role").map(String::as_str), role, "{name}");
    }
    // One of the two replicas may go at a time; the primary not until it has handed over.
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let budgets = ns.api::<PodDisruptionBudget>();
    let min_available = |budget: PodDisruptionBudget| budget.spec.and_then(|s| s.min_available);
    assert_eq!(min_available(budgets.get(NAME).await?), Some(IntOrString::Int(1)));
    assert_eq!(min_available(budgets.get(&format!("{NAME}-primary")).await?), Some(IntOrString::Int(1)));
    let cronjob = ns.api::<CronJob>().get("production-db-backup").await?;
    assert_eq!(
        (cronjob.spec.schedule.as_str(), cronjob.spec.concurrency_policy.as_deref()),
        ("0 2 * * *", Some("Forbid"))
    );

    // Credentials: generated once, complete, and nowhere in status or Events.
    let secret = ns.api::<Secret>().get("production-db-credentials").await?;
    let data = secret.data.clone().unwrap_or_default();
    for key in ["username", "password", "host", "port", "database", "uri"] {
        assert!(data.contains_key(key), "credentials lack {key}");
    }
    let password = String::from_utf8(data["password"].0.clone())?;
    assert_eq!(password.len(), 32);
    let status_text = serde_json::to_string(&db.status)?;
    assert!(!status_text.contains(&password));
    let all_events = ns.api::<Event>().list(&ListParams::default()).await?;
    assert!(all_events.items.iter().all(|e| !e.message.as_deref().unwrap_or_default().contains(&password)));

    let table = kubectl(&["-n", &ns.name, "get", "mydb"])?;
    let header: Vec<&str> = table.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "PHASE", "READY", "REPLICAS", "PRIMARY", "VERSION", "LAST", "BACKUP", "AGE"],
        "{table}"
    );
    let row: Vec<&str> = table.lines().nth(1).unwrap_or_default().split_whitespace().take(6).collect();
    assert_eq!(row, ["production-db", "Running", "true", "3/3", "production-db-0", "15.2"], "{table}");

    // The scale subresource: `kubectl scale` sets spec.replicas, within the schema's bounds.
    let refused =
        kubectl(&["-n", &ns.name, "scale", "mydb", "production-db", "--replicas=0"]).expect_err("0 instances");
    assert!(refused.to_string().contains("spec.replicas"), "{refused}");
    kubectl(&["-n", &ns.name, "scale", "mydb", "production-db", "--replicas=2"])?;
    assert_eq!(ns.api::<MyDatabase>().get(NAME).await?.spec.replicas, 2);
    Ok(())
}

#[tokio::test]
async fn invalid_specs_are_rejected_or_reported_naming_the_field() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "mydb-invalid").await?;
    let operator = TestOperator::start(&cluster, &ns).await?;
    let base = json!({"replicas": 1, "version": "15", "storage": "1Gi"});
    let cases = [
        (json!({"replicas": 0}), "spec.replicas"),
        (json!({"version": "9.6"}), "spec.version"),
        (json!({"version": "14.9"}), "13 and 14 are past end of life"),
        (json!({"version": "latest"}), "spec.version"),
        (json!({"storage": "lots"}), "spec.storage"),
        (json!({"storage": "0"}), "spec.storage"),
        (json!({"storage": "-1Gi"}), "spec.storage"),
        (json!({"backup": {"schedule": "0 2 * * *", "retention": "7d", "storage": "0"}}), "spec.backup.storage"),
        (json!({"imageRepository": "my registry/postgres"}), "spec.imageRepository"),
        (json!({"imageRepository": "postgres:15"}), "spec.imageRepository"),
        (json!({"backup": {"schedule": "0 2 * *", "retention": "7d"}}), "spec.backup.schedule"),
        (json!({"backup": {"schedule": "0 2 * * *", "retention": "7 days"}}), "spec.backup.retention"),
        (json!({"deletionPolicy": "Shred"}), "spec.deletionPolicy"),
        (json!({"postgresql": {"parameters": {"synchronous_commit": "off"}}}), "synchronous_commit is set by Keelson"),
        (json!({"postgresql": {"parameters": {"shared_preload_libraries": "x"}}}), "spec.postgresql.parameters"),
        (json!({"storageClassName": ""}), "spec.storageClassName"),
        (json!({"tolerations": "all"}), "spec.tolerations"),
    ];
    for (index, (overrides, field)) in cases.into_iter().enumerate() {
        let mut spec = base.clone();
        for (k, v) in overrides.as_object().into_iter().flatten() {
            spec[k] = v.clone();
        }
        let manifest = json!({"apiVersion": "db.keelson.dev/v1", "kind": "MyDatabase",
            "metadata": {"name": format!("bad-{index}"), "namespace": ns.name}, "spec": spec});
        let path = std::env::temp_dir().join(format!("{}-bad-{index}.json", ns.name));
        std::fs::write(&path, manifest.to_string())?;
        let error = kubectl(&["apply", "-f", &path.to_string_lossy()]).expect_err("accepted an invalid MyDatabase");
        assert!(error.to_string().contains(field), "error for {spec} does not name {field}: {error}");
        let _ = std::fs::remove_file(path);
    }

    let dbs = ns.api::<MyDatabase>();
    // What only the reconciler can see: a condition naming the field, phase Failed, no hot loop.
    let bad_cron: MyDatabase = serde_json::from_value(json!({"apiVersion": "db.keelson.dev/v1", "kind": "MyDatabase",
        "metadata": {"name": "bad-cron"}, "spec": {"version": "15", "storage": "1Gi",
        "backup": {"schedule": "61 2 * * *", "retention": "7d"}}}))?;
    dbs.create(&PostParams::default(), &bad_cron).await?;
    let failed = wait_for(&dbs, "bad-cron", "phase Failed", DEFAULT_TIMEOUT, |db| {
        db.status.as_ref().and_then(|s| s.phase) == Some(DatabasePhase::Failed)
    })
    .await?;
    let (status, reason, message) = condition(&failed, "SpecValid").unwrap_or_default();
    assert_eq!((status.as_str(), reason.as_str()), ("False", "InvalidSchedule"));
    assert!(message.contains("spec.backup.schedule") && message.contains("minute"), "{message}");
    assert!(ns.api::<StatefulSet>().get_opt("bad-cron").await?.is_none(), "an invalid spec was applied");
    let event = wait_for_event(&ns, "InvalidSpec").await?;
    assert!(event.message.unwrap_or_default().contains("spec.backup.schedule"));
    let reconciles = operator.counter("keelson_reconcile_total");
    dbs.patch("bad-cron", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"annotations": {"poke": "1"}}})))
        .await?;
    eventually(DEFAULT_TIMEOUT, "the reconcile after the poke", || async {
        operator.counter("keelson_reconcile_total") > reconciles
            && operator.counter("keelson_reconciles_in_flight") == 0
    })
    .await?;
    // One reconcile per change, no retry storm: at most a couple beyond the poke.
    assert!(operator.counter("keelson_reconcile_total") <= reconciles + 2, "hot loop on an invalid spec");

    // Values only the reconciler checks: a condition naming the field, and nothing applied.
    for (name, spec, reason, field) in [
        (
            "bad-value",
            json!({"postgresql": {"parameters": {"work_mem": "lots"}}}),
            "InvalidParameter",
            "spec.postgresql.parameters.work_mem",
        ),
        (
            "bad-resources",
            json!({"resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}}),
            "InvalidResources",
            "spec.resources.requests.memory 2Gi is above spec.resources.limits.memory",
        ),
    ] {
        let mut full = json!({"version": "15", "storage": "1Gi"});
        for (k, v) in spec.as_object().into_iter().flatten() {
            full[k] = v.clone();
        }
        let bad: MyDatabase = serde_json::from_value(json!({"apiVersion": "db.keelson.dev/v1", "kind": "MyDatabase",
            "metadata": {"name": name}, "spec": full}))?;
        dbs.create(&PostParams::default(), &bad).await?;
        let failed = wait_for(&dbs, name, "SpecValid False", DEFAULT_TIMEOUT, |db| {
            condition(db, "SpecValid").is_some_and(|c| c.0 == "False")
        })
        .await?;
        let (_, got_reason, message) = condition(&failed, "SpecValid").unwrap_or_default();
        assert_eq!(got_reason, reason, "{message}");
        assert!(message.contains(field), "{message} does not name {field}");
        assert!(ns.api::<StatefulSet>().get_opt(name).await?.is_none(), "an invalid spec was applied");
    }

    // Storage never shrinks, the major version never changes in place, the data volumes keep
    // their class, and max_connections does not shrink (CEL transition rules).
    let created: MyDatabase = serde_json::from_value(json!({"apiVersion": "db.keelson.dev/v1", "kind": "MyDatabase",
        "metadata": {"name": "grow"}, "spec": {"version": "15", "storage": "2Gi",
        "postgresql": {"parameters": {"max_connections": "200"}}}}))?;
    dbs.create(&PostParams::default(), &created).await?;
    let class = json!({"spec": {"storageClassName": "fast"}});
    let class = dbs.patch("grow", &PatchParams::default(), &Patch::Merge(class)).await;
    assert!(format!("{class:?}").contains("spec.storageClassName can be set only when"), "{class:?}");
    let fewer = json!({"spec": {"postgresql": {"parameters": {"max_connections": "100"}}}});
    let fewer = dbs.patch("grow", &PatchParams::default(), &Patch::Merge(fewer)).await;
    assert!(format!("{fewer:?}").contains("max_connections may grow but not shrink"), "{fewer:?}");
    let more = json!({"spec": {"postgresql": {"parameters": {"max_connections": "300"}}}});
    dbs.patch("grow", &PatchParams::default(), &Patch::Merge(more)).await?;
    let shrink = dbs.patch("grow", &PatchParams::default(), &Patch::Merge(json!({"spec": {"storage": "1Gi"}}))).await;
    assert!(format!("{shrink:?}").contains("storage may grow but never shrink"), "{shrink:?}");
    let major = dbs.patch("grow", &PatchParams::default(), &Patch::Merge(json!({"spec": {"version": "16"}}))).await;
    assert!(format!("{major:?}").contains("major version cannot change"), "{major:?}");

    // Fixing the spec recovers.
    dbs.patch(
        "bad-cron",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"backup": {"schedule": "1 2 * * *"}}})),
    )
    .await?;
    wait_for(&dbs, "bad-cron", "Running after the fix", DEFAULT_TIMEOUT, running(1)).await?;
    // The CRD takes the macros a CronJob takes, and so does the reconciler: one rule.
    dbs.patch("bad-cron", &PatchParams::default(), &Patch::Merge(json!({"spec": {"backup": {"schedule": "@daily"}}})))
        .await?;
    let daily = wait_for(&dbs, "bad-cron", "observed @daily", DEFAULT_TIMEOUT, |db| {
        db.status.as_ref().and_then(|s| s.observed_generation) == db.metadata.generation
    })
    .await?;
    assert_eq!(condition(&daily, "SpecValid").map(|c| c.0).as_deref(), Some("True"));
    Ok(())
}

/// The longest name whose children all fit is accepted and runs; one more character is refused.
#[tokio::test]
async fn names_are_limited_by_the_longest_child_name() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "mydb-name-limit").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    let dbs = ns.api::<MyDatabase>();
    let named = |name: String| -> anyhow::Result<MyDatabase> {
        Ok(serde_json::from_value(json!({"apiVersion": "db.keelson.dev/v1", "kind": "MyDatabase",
            "metadata": {"name": name}, "spec": {"replicas": 1, "version": "15", "storage": "1Gi",
            "backup": {"schedule": "0 2 * * *", "retention": "7d"}}}))?)
    };
    let refused =
        dbs.create(&PostParams::default(), &named("a".repeat(46))?).await.expect_err("46 characters accepted");
    assert!(refused.to_string().contains("at most 45 characters"), "{refused}");
    let longest = "b".repeat(45);
    dbs.create(&PostParams::default(), &named(longest.clone())?).await?;
    wait_for(&dbs, &longest, "Running with every child", DEFAULT_TIMEOUT, running(1)).await?;
    assert!(ns.api::<CronJob>().get_opt(&format!("{longest}-backup")).await?.is_some());
    Ok(())
}

#[tokio::test]
async fn backups_are_reported_in_status_success_and_failure() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "mydb-backups").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    create_running(&ns, None).await?;
    let dbs = ns.api::<MyDatabase>();

    // A backup run now, from the CronJob's own template (as the schedule would).
    kubectl(&["-n", &ns.name, "create", "job", "--from=cronjob/production-db-backup", "backup-now"])?;
    let db = wait_for(&dbs, NAME, "a reported backup", DEFAULT_TIMEOUT, |db| {
        db.status.as_ref().is_some_and(|s| s.last_backup_time.is_some())
    })
    .await?;
    assert_eq!(condition(&db, "LastBackupSucceeded").map(|c| c.0).as_deref(), Some("True"));
    let table = kubectl(&["-n", &ns.name, "get", "mydb", NAME, "-o", "jsonpath={.status.lastBackupTime}"])?;
    assert!(!table.is_empty());

    // A backup that fails (its pod can never run; the deadline fails the Job).
    let template = ns.api::<CronJob>().get("production-db-backup").await?.spec.job_template;
    let mut spec = template.spec.unwrap_or_default();
    spec.active_deadline_seconds = Some(1);
    spec.backoff_limit = Some(0);
    if let Some(pod) = spec.template.spec.as_mut() {
        pod.node_selector = Some([("keelson.dev/no-such-node".to_string(), "true".to_string())].into());
    }
    let failing = Job {
        metadata: kube::api::ObjectMeta {
            name: Some("backup-fails".into()),
            labels: template.metadata.and_then(|m| m.labels),
            ..Default::default()
        },
        spec: Some(spec),
        ..Default::default()
    };
    ns.api::<Job>().create(&PostParams::default(), &failing).await?;
    let db = wait_for(&dbs, NAME, "LastBackupSucceeded False", DEFAULT_TIMEOUT, |db| {
        condition(db, "LastBackupSucceeded").is_some_and(|c| c.0 == "False")
    })
    .await?;
    let (_, reason, message) = condition(&db, "LastBackupSucceeded").unwrap_or_default();
    assert_eq!(reason, "BackupFailed");
    assert!(message.contains("backup-fails"), "{message}");
    assert!(db.status.as_ref().and_then(|s| s.last_backup_time.clone()).is_some(), "the last good backup time is kept");
    wait_for_event(&ns, "BackupFailed").await?;
    Ok(())
}

#[tokio::test]
async fn deletion_policy_retain_keeps_data_and_credentials() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "mydb-retain").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    let db = create_running(&ns, None).await?;
    assert!(db.finalizers().iter().any(|f| f == "db.keelson.dev/cleanup"));
    ns.api::<MyDatabase>().delete(NAME, &DeleteParams::background()).await?;
    wait_for_deletion(&ns.api::<MyDatabase>(), NAME, "the MyDatabase to go", DEFAULT_TIMEOUT).await?;
    wait_for_deletion(&ns.api::<StatefulSet>(), NAME, "the StatefulSet to go", DEFAULT_TIMEOUT).await?;
    let claims = data_claims(&ns).await?;
    assert_eq!(claims.len(), 3);
    assert!(claims.iter().all(|c| c.metadata.deletion_timestamp.is_none()), "Retain deleted data");
    assert!(ns.api::<PersistentVolumeClaim>().get_opt("production-db-backups").await?.is_some());
    let secret = ns.api::<Secret>().get("production-db-credentials").await?;
    assert!(secret.owner_references().is_empty() && secret.metadata.deletion_timestamp.is_none());
    let event = wait_for_event(&ns, "Retained").await?;
    assert!(event.message.unwrap_or_default().contains("data-production-db-0"));
    Ok(())
}

#[tokio::test]
async fn deletion_policy_delete_removes_data_and_backups() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "mydb-delete").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    create_running(&ns, Some("Delete")).await?;
    ns.api::<MyDatabase>().delete(NAME, &DeleteParams::background()).await?;
    wait_for_deletion(&ns.api::<MyDatabase>(), NAME, "the MyDatabase to go", DEFAULT_TIMEOUT).await?;
    let pvcs = ns.api::<PersistentVolumeClaim>();
    for claim in ["data-production-db-0", "data-production-db-1", "data-production-db-2", "production-db-backups"] {
        eventually(DEFAULT_TIMEOUT, &format!("{claim} deleted"), || async {
            pvcs.get_opt(claim).await.is_ok_and(|c| deleted_or_deleting(c.as_ref()))
        })
        .await?;
    }
    wait_for_event(&ns, "DataDeleted").await?;
    Ok(())
}

#[tokio::test]
async fn deletion_policy_snapshot_takes_a_final_backup_first() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "mydb-snapshot").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    create_running(&ns, Some("Snapshot")).await?;
    ns.api::<MyDatabase>().delete(NAME, &DeleteParams::background()).await?;
    wait_for_deletion(&ns.api::<MyDatabase>(), NAME, "the MyDatabase to go", DEFAULT_TIMEOUT).await?;
    let started = wait_for_event(&ns, "FinalBackupStarted").await?;
    let taken = wait_for_event(&ns, "SnapshotTaken").await?;
    let time = |e: &Event| e.event_time.clone().map(|t| t.0).or(e.first_timestamp.clone().map(|t| t.0));
    let (started_at, taken_at) = (time(&started), time(&taken));
    assert!(started_at.is_some() && taken_at.is_some(), "events without times");
    assert!(started_at <= taken_at, "data removed before the final backup");
    // The final backup really ran to completion.
    let job = ns.api::<Job>().get("production-db-final-backup").await?;
    assert_eq!(job.status.and_then(|s| s.succeeded), Some(1), "the final backup Job did not succeed");
    let pvcs = ns.api::<PersistentVolumeClaim>();
    for claim in ["data-production-db-0", "data-production-db-1", "data-production-db-2"] {
        eventually(DEFAULT_TIMEOUT, &format!("{claim} deleted"), || async {
            pvcs.get_opt(claim).await.is_ok_and(|c| deleted_or_deleting(c.as_ref()))
        })
        .await?;
    }
    let backups = pvcs.get("production-db-backups").await?;
    assert!(backups.metadata.deletion_timestamp.is_none(), "the backups must survive a Snapshot deletion");
    // The backup's roles need their passwords: the Secret stays with the backup.
    let secret = ns.api::<Secret>().get("production-db-credentials").await?;
    assert!(secret.owner_references().is_empty() && secret.metadata.deletion_timestamp.is_none());
    Ok(())
}

/// Deleting a namespace never hangs on a MyDatabase: under Snapshot the
/// final backup cannot be created in a terminating namespace, so the data is
/// kept as under Retain and the finalizer released.
#[tokio::test]
async fn deleting_the_namespace_completes_under_every_policy() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "mydb-ns-delete").await?;
    // The operator's identity must outlive the namespace, as a deployed one's does.
    let home = common::namespace(&cluster, "mydb-ns-delete-operator").await?;
    let _operator = TestOperator::start_from(&cluster, &home, &ns).await?;
    let dbs = ns.api::<MyDatabase>();
    for policy in ["Retain", "Snapshot", "Delete"] {
        let mut db = tutorial(Some(policy))?;
        db.metadata.name = Some(format!("db-{}", policy.to_lowercase()));
        db.spec.replicas = 1;
        dbs.create(&PostParams::default(), &db).await?;
    }
    for policy in ["retain", "snapshot", "delete"] {
        wait_for(&dbs, &format!("db-{policy}"), "Running", DEFAULT_TIMEOUT, running(1)).await?;
    }
    let namespaces = kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(cluster.client.clone());
    namespaces.delete(&ns.name, &DeleteParams::background()).await?;
    eventually(DEFAULT_TIMEOUT, "the namespace to be gone", || async {
        namespaces.get_opt(&ns.name).await.is_ok_and(|n| n.is_none())
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn delete_while_the_operator_is_down_completes_when_it_returns() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "mydb-delete-offline").await?;
    let operator = TestOperator::start(&cluster, &ns).await?;
    create_running(&ns, Some("Delete")).await?;
    operator.stop().await?;
    let dbs = ns.api::<MyDatabase>();
    dbs.delete(NAME, &DeleteParams::background()).await?;
    let held = dbs.get(NAME).await?;
    assert!(held.metadata.deletion_timestamp.is_some() && !held.finalizers().is_empty(), "the finalizer must hold it");
    assert!(data_claims(&ns).await?.iter().all(|c| c.metadata.deletion_timestamp.is_none()));
    let _back = TestOperator::start_as_service_account(&cluster, &ns).await?;
    wait_for_deletion(&dbs, NAME, "the MyDatabase to go once the operator is back", DEFAULT_TIMEOUT).await?;
    wait_for_event(&ns, "DataDeleted").await?;
    Ok(())
}

#[tokio::test]
async fn updates_replicas_version_storage_and_schedule() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "mydb-updates").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    create_running(&ns, None).await?;
    let dbs = ns.api::<MyDatabase>();
    let sets = ns.api::<StatefulSet>();
    let patch = |spec: serde_json::Value| Patch::Merge(json!({ "spec": spec }));

    dbs.patch(NAME, &PatchParams::default(), &patch(json!({"replicas": 4}))).await?;
    wait_for(&dbs, NAME, "Running 4/4", DEFAULT_TIMEOUT, running(4)).await?;
    dbs.patch(NAME, &PatchParams::default(), &patch(json!({"replicas": 1}))).await?;
    wait_for(&dbs, NAME, "Running 1/1", DEFAULT_TIMEOUT, running(1)).await?;
    wait_for_deletion(&ns.api::<PodDisruptionBudget>(), NAME, "no PDB for one instance", DEFAULT_TIMEOUT).await?;
    dbs.patch(NAME, &PatchParams::default(), &patch(json!({"replicas": 3}))).await?;
    wait_for(&dbs, NAME, "Running 3/3", DEFAULT_TIMEOUT, running(3)).await?;

    dbs.patch(NAME, &PatchParams::default(), &patch(json!({"version": "15.4"}))).await?;
    wait_for(&sets, NAME, "the new minor version rolled out", DEFAULT_TIMEOUT, |s| {
        let image = s.spec.as_ref().and_then(|s| s.template.spec.as_ref()).and_then(|p| p.containers[0].image.clone());
        let status = s.status.clone().unwrap_or_default();
        image.as_deref() == Some("postgres:15.4")
            && status.updated_replicas == Some(3)
            && status.current_revision == status.update_revision
    })
    .await?;
    wait_for(&dbs, NAME, "Running after the upgrade", DEFAULT_TIMEOUT, running(3)).await?;

    dbs.patch(NAME, &PatchParams::default(), &patch(json!({"storage": "200Gi"}))).await?;
    wait_for(&sets, NAME, "a StatefulSet with 200Gi claims", DEFAULT_TIMEOUT, |s| {
        keelson::mydatabase::statefulset::template_storage(s).as_deref() == Some("200Gi")
    })
    .await?;
    for claim in data_claims(&ns).await? {
        let request = claim
            .spec
            .clone()
            .and_then(|s| s.resources)
            .and_then(|r| r.requests)
            .and_then(|r| r.get("storage").cloned());
        assert_eq!(request.map(|q| q.0).as_deref(), Some("200Gi"), "{} not expanded", claim.name_any());
    }
    wait_for_event(&ns, "StorageExpanding").await?;
    wait_for(&dbs, NAME, "Running after the expansion", DEFAULT_TIMEOUT, running(3)).await?;

    dbs.patch(NAME, &PatchParams::default(), &patch(json!({"backup": {"schedule": "30 3 * * 0", "retention": "4w"}})))
        .await?;
    wait_for(&ns.api::<CronJob>(), "production-db-backup", "the new schedule and retention", DEFAULT_TIMEOUT, |c| {
        let env = c
            .spec
            .job_template
            .spec
            .as_ref()
            .and_then(|j| j.template.spec.as_ref())
            .and_then(|p| p.containers[0].env.clone());
        c.spec.schedule == "30 3 * * 0"
            && env.is_some_and(|e| e.iter().any(|v| v.name == "RETENTION" && v.value.as_deref() == Some("4w")))
    })
    .await?;
    dbs.patch(NAME, &PatchParams::default(), &Patch::Merge(json!({"spec": {"backup": null}}))).await?;
    wait_for_deletion(&ns.api::<CronJob>(), "production-db-backup", "no CronJob without spec.backup", DEFAULT_TIMEOUT)
        .await?;
    Ok(())
}

/// An outsider's rename of an env var or of a volume (with its mount) is
/// set back exactly: server-side apply alone would keep both entries.
#[tokio::test]
async fn edited_env_and_volumes_of_the_statefulset_are_taken_back() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "mydb-list-drift").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    create_running(&ns, None).await?;
    let sets = ns.api::<StatefulSet>();
    let pod_spec = |s: &StatefulSet| s.spec.as_ref().and_then(|s| s.template.spec.clone()).unwrap_or_default();
    let original = pod_spec(&sets.get(NAME).await?);
    let env_names = |s: &StatefulSet| -> Vec<String> {
        pod_spec(s).containers[0].env.clone().unwrap_or_default().into_iter().map(|e| e.name).collect()
    };
    let volume_names = |s: &StatefulSet| -> Vec<String> {
        pod_spec(s).volumes.unwrap_or_default().into_iter().map(|v| v.name).collect()
    };
    let want_env: Vec<String> =
        original.containers[0].env.clone().unwrap_or_default().into_iter().map(|e| e.name).collect();
    let want_volumes: Vec<String> = original.volumes.clone().unwrap_or_default().into_iter().map(|v| v.name).collect();
    let tmp_volume = want_volumes.iter().position(|v| v == "tmp").expect("a tmp volume");
    let tmp_mount = original.containers[0]
        .volume_mounts
        .clone()
        .unwrap_or_default()
        .iter()
        .position(|m| m.name == "tmp")
        .expect("a tmp mount");

    let rename_env = r#"[{"op":"replace","path":"/spec/template/spec/containers/0/env/1/name","value":"RENAMED"}]"#;
    kubectl(&["-n", &ns.name, "patch", "statefulset", NAME, "--type=json", "-p", rename_env])?;
    wait_for(&sets, NAME, "the env list exactly as before", DEFAULT_TIMEOUT, |s| env_names(s) == want_env).await?;

    let rename_volume = format!(
        r#"[{{"op":"replace","path":"/spec/template/spec/volumes/{tmp_volume}/name","value":"scratch"}},
            {{"op":"replace","path":"/spec/template/spec/containers/0/volumeMounts/{tmp_mount}/name","value":"scratch"}}]"#
    );
    kubectl(&["-n", &ns.name, "patch", "statefulset", NAME, "--type=json", "-p", &rename_volume])?;
    wait_for(&sets, NAME, "the volumes exactly as before", DEFAULT_TIMEOUT, |s| volume_names(s) == want_volumes)
        .await?;
    wait_for(&ns.api::<MyDatabase>(), NAME, "Running 3/3 again", DEFAULT_TIMEOUT, running(3)).await?;
    Ok(())
}

#[tokio::test]
async fn restart_over_a_running_database_writes_nothing() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "mydb-restart").await?;
    let operator = TestOperator::start(&cluster, &ns).await?;
    create_running(&ns, None).await?;
    let before = ns.api::<Secret>().get("production-db-credentials").await?;
    operator.stop().await?;
    let status_before = ns.api::<MyDatabase>().get(NAME).await?.status;
    let restarted = TestOperator::start_as_service_account(&cluster, &ns).await?;
    eventually(DEFAULT_TIMEOUT, "the first reconcile after restart", || async {
        restarted.counter("keelson_reconcile_total") >= 1 && restarted.counter("keelson_reconciles_in_flight") == 0
    })
    .await?;
    assert_eq!(restarted.counter("keelson_child_writes_total"), 0, "{}", restarted.metrics.render());
    let status_after = ns.api::<MyDatabase>().get(NAME).await?.status;
    assert_eq!(
        restarted.counter("keelson_status_writes_total"),
        0,
        "before: {:?}\nafter: {status_after:?}",
        status_before
    );
    assert_eq!(restarted.counter("keelson_drift_corrections_total"), 0);
    let after = ns.api::<Secret>().get("production-db-credentials").await?;
    assert_eq!(before.data, after.data, "credentials changed on restart");
    assert_eq!(before.resource_version(), after.resource_version());
    Ok(())
}

/// A Secret someone made under the database's credentials name is neither
/// adopted nor read: its password never reaches a pod, and it is left as it
/// was, with a condition and an Event naming it.
#[tokio::test]
async fn a_foreign_secret_of_the_credentials_name_is_left_untouched() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "mydb-foreign").await?;
    let secrets = ns.api::<Secret>();
    let foreign: Secret = serde_json::from_value(json!({
        "metadata": {"name": "victim-credentials"}, "stringData": {"password": "strangers-secret"}}))?;
    let before = secrets.create(&PostParams::default(), &foreign).await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    let mut db = tutorial(None)?;
    db.metadata.name = Some("victim".into());
    let dbs = ns.api::<MyDatabase>();
    dbs.create(&PostParams::default(), &db).await?;
    let refusal = "Secret victim-credentials exists and is not Keelson's";
    wait_for(&dbs, "victim", "a condition naming the foreign Secret", DEFAULT_TIMEOUT, |db| {
        db.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.message.contains(refusal)))
    })
    .await?;
    eventually(DEFAULT_TIMEOUT, "a NotOurs Event naming it", || async {
        let events = ns.api::<Event>().list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
        events.iter().any(|e| {
            e.reason.as_deref() == Some("NotOurs") && e.message.as_deref().unwrap_or_default().contains(refusal)
        })
    })
    .await?;
    let after = secrets.get("victim-credentials").await?;
    assert_eq!(after.metadata.resource_version, before.metadata.resource_version, "the foreign Secret was written");
    // Nothing that would mount it: no StatefulSet, no backup CronJob.
    assert!(ns.api::<StatefulSet>().get_opt("victim").await?.is_none());
    assert!(ns.api::<CronJob>().get_opt("victim-backup").await?.is_none());
    Ok(())
}

/// A database restores another's backups only if that one allows it
/// (`spec.restoreTo`, recorded on its backups volume).
#[tokio::test]
async fn a_restore_from_backups_that_do_not_allow_it_is_refused() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "mydb-restore-to").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    let dbs = ns.api::<MyDatabase>();
    let source: MyDatabase = serde_json::from_value(json!({"apiVersion": "db.keelson.dev/v1", "kind": "MyDatabase",
        "metadata": {"name": "source"}, "spec": {"version": "15", "storage": "1Gi",
        "backup": {"schedule": "0 2 * * *", "retention": "7d"}, "restoreTo": ["allowed"]}}))?;
    dbs.create(&PostParams::default(), &source).await?;
    let claims = ns.api::<PersistentVolumeClaim>();
    eventually(DEFAULT_TIMEOUT, "the source's backups volume", || async {
        claims.get_opt("source-backups").await.ok().flatten().is_some()
    })
    .await?;
    let restoring = |name: &str| -> anyhow::Result<MyDatabase> {
        Ok(serde_json::from_value(json!({"apiVersion": "db.keelson.dev/v1", "kind": "MyDatabase",
            "metadata": {"name": name}, "spec": {"version": "15", "storage": "1Gi",
            "restoreFrom": {"database": "source"}}}))?)
    };
    dbs.create(&PostParams::default(), &restoring("intruder")?).await?;
    dbs.create(&PostParams::default(), &restoring("allowed")?).await?;
    let refused = wait_for(&dbs, "intruder", "Ready=False RestoreNotAllowed", DEFAULT_TIMEOUT, |db| {
        condition(db, "Ready").is_some_and(|(status, reason, _)| status == "False" && reason == "RestoreNotAllowed")
    })
    .await?;
    let message = condition(&refused, "Ready").map(|c| c.2).unwrap_or_default();
    assert!(message.contains("spec.restoreFrom.database \"source\"") && message.contains("restoreTo"), "{message}");
    // Nothing reads the volume for it: no restore Job, no StatefulSet.
    let jobs = ns.api::<Job>();
    assert!(jobs.get_opt("intruder-restore").await?.is_none());
    assert!(ns.api::<StatefulSet>().get_opt("intruder").await?.is_none());
    // The database the source named gets its restore Job.
    eventually(DEFAULT_TIMEOUT, "the allowed database's restore Job", || async {
        jobs.get_opt("allowed-restore").await.ok().flatten().is_some()
    })
    .await?;
    Ok(())
}
