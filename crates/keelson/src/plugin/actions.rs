//! The commands that ask for a change: each writes what the operator watches
//! (an annotation, a new MyDatabase), then waits for its answer in status.

use std::time::Instant;

use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::{OPERATOR_WAIT, PluginError, Result, Target, api_error, instance_pods};
use crate::api::MyDatabase;
use crate::api::conditions::PAUSED_ANNOTATION;
use crate::api::instance::ROLE_LABEL;
use crate::api::mydatabase::{
    BACKUP_REQUEST_ANNOTATION, FENCED_INSTANCES_ANNOTATION, SWITCHOVER_ANNOTATION, fenced_instances, is_fenced,
};
use crate::mydatabase::names;

const FIELD_MANAGER: &str = "kubectl-keelson";
const POLL: std::time::Duration = std::time::Duration::from_millis(500);

async fn annotate(target: &Target, database: &str, key: &str, value: Option<&str>) -> Result<()> {
    let patch = Patch::Merge(json!({"metadata": {"annotations": {key: value}}}));
    target
        .api::<MyDatabase>()
        .patch(database, &PatchParams::default(), &patch)
        .await
        .map_err(api_error(format!("annotate MyDatabase {database}")))?;
    Ok(())
}

/// Polls `database` until `done` says how it ended (Ok or a refusal), or the operator's wait ends.
async fn wait_for<T>(
    target: &Target,
    database: &str,
    what: &str,
    mut done: impl FnMut(&MyDatabase) -> Option<Result<T>>,
) -> Result<T> {
    let started = Instant::now();
    loop {
        let db = target.database(database).await?;
        if let Some(outcome) = done(&db) {
            return outcome;
        }
        if started.elapsed() > OPERATOR_WAIT {
            return Err(PluginError::NoAnswer(what.to_string()));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The newest Event of `reason` about `database` since `since`, if any.
async fn newest_event(
    target: &Target,
    database: &str,
    reason: &str,
    since: &k8s_openapi::jiff::Timestamp,
) -> Option<String> {
    let events = target
        .api::<Event>()
        .list(&ListParams::default().fields(&format!("regarding.name={database},reason={reason}")))
        .await
        .ok()?;
    events
        .items
        .into_iter()
        .filter(|e| e.event_time.as_ref().map(|t| t.0) >= Some(*since) || e.series.is_some())
        .max_by_key(|e| e.event_time.as_ref().map(|t| t.0))
        .and_then(|e| e.note)
}

pub async fn promote(target: &Target, database: &str, instance: &str) -> Result<()> {
    let db = target.database(database).await?;
    let before = db.status.as_ref().and_then(|s| s.last_failover.clone());
    if db.status.as_ref().and_then(|s| s.current_primary.as_deref()) == Some(instance) {
        println!("{instance} is already the primary of {database}");
        return Ok(());
    }
    let asked = k8s_openapi::jiff::Timestamp::now();
    annotate(target, database, SWITCHOVER_ANNOTATION, Some(instance)).await?;
    println!("switchover of {database} to {instance} requested; waiting");
    let mut annotation_gone_at: Option<Instant> = None;
    let outcome = wait_for(target, database, &format!("the switchover of {database} to {instance}"), |db| {
        let status = db.status.as_ref()?;
        let record = status.last_failover.as_ref().filter(|r| Some(*r) != before.as_ref());
        if let Some(record) = record.filter(|r| r.to == instance) {
            return Some(Ok(record.clone()));
        }
        // The operator removes the annotation once done or refused.
        if !db.annotations().contains_key(SWITCHOVER_ANNOTATION) {
            let gone = *annotation_gone_at.get_or_insert_with(Instant::now);
            // Its record and the annotation's removal may arrive in either order.
            if gone.elapsed() > std::time::Duration::from_secs(5) {
                return Some(Err(PluginError::Refused(String::new())));
            }
        }
        None
    })
    .await;
    // The writes-down figure follows the promotion, once the new primary's first commit is in.
    let outcome = match outcome {
        Ok(record) if record.writes_down_ms.is_none() => {
            let started = Instant::now();
            loop {
                let db = target.database(database).await?;
                let latest = db.status.and_then(|s| s.last_failover).filter(|r| r.to == record.to);
                match latest {
                    Some(latest) if latest.writes_down_ms.is_some() => break Ok(latest),
                    _ if started.elapsed() > std::time::Duration::from_secs(15) => break Ok(record),
                    _ => tokio::time::sleep(POLL).await,
                }
            }
        }
        other => other,
    };
    match outcome {
        Ok(record) => {
            println!(
                "{} → {}: promoted at {}{}",
                record.from,
                record.to,
                record.promoted_at.map(|t| t.0.to_string()).unwrap_or_default(),
                record.writes_down_ms.map(|ms| format!(", writes down {ms} ms")).unwrap_or_default()
            );
            Ok(())
        }
        Err(PluginError::Refused(_)) => {
            let why = newest_event(target, database, "SwitchoverRefused", &asked).await;
            Err(PluginError::Refused(format!(
                "the operator refused the switchover of {database} to {instance}: {}",
                why.unwrap_or_else(|| "see `kubectl get events`".into())
            )))
        }
        Err(error) => Err(error),
    }
}

pub async fn backup(target: &Target, database: &str, wait: bool) -> Result<()> {
    let db = target.database(database).await?;
    if db.spec.backup.is_none() {
        return Err(PluginError::Refused(format!("{database} has no spec.backup: nowhere to keep a backup")));
    }
    let token = k8s_openapi::jiff::Timestamp::now().strftime("%Y%m%dT%H%M%S%.3fZ").to_string();
    let before = db.status.as_ref().and_then(|s| s.last_backup_name.clone());
    annotate(target, database, BACKUP_REQUEST_ANNOTATION, Some(&token)).await?;
    let job = names::requested_backup_job(database, &token);
    let what = format!("the backup Job {job} to start");
    wait_for(target, database, &what, |db| {
        (db.status.as_ref()?.last_backup_request.as_deref() == Some(token.as_str())).then_some(Ok(()))
    })
    .await?;
    println!("backup of {database} started: Job {job} (kubectl logs job/{job})");
    if !wait {
        return Ok(());
    }
    let jobs = target.api::<k8s_openapi::api::batch::v1::Job>();
    let started = Instant::now();
    loop {
        let status = jobs.get(&job).await.map_err(api_error(format!("get Job {job}")))?.status.unwrap_or_default();
        if status.succeeded.unwrap_or(0) > 0 {
            break;
        }
        if status.conditions.unwrap_or_default().iter().any(|c| c.type_ == "Failed" && c.status == "True") {
            return Err(PluginError::Refused(format!("the backup failed: kubectl logs job/{job}")));
        }
        if started.elapsed() > OPERATOR_WAIT * 10 {
            return Err(PluginError::NoAnswer(format!("the backup Job {job} to finish")));
        }
        tokio::time::sleep(POLL).await;
    }
    let taken = wait_for(target, database, "the backup to show in status", |db| {
        let status = db.status.as_ref()?;
        let name = status.last_backup_name.clone().filter(|n| Some(n) != before.as_ref())?;
        Some(Ok((name, status.last_backup_size_bytes.unwrap_or_default())))
    })
    .await?;
    println!("backup taken and verified: {} ({} bytes)", taken.0, taken.1);
    Ok(())
}

/// Adds `instance` to the database's fenced instances (or takes it off), then
/// waits until its PostgreSQL stopped (its manager says so, the pod is not
/// ready) or, unfenced, until the pod is ready again.
pub async fn fence(target: &Target, database: &str, instance: &str, fenced: bool) -> Result<()> {
    let db = target.database(database).await?;
    let pods = instance_pods(target, &db).await?;
    let names: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
    if instance != "*" && !names.iter().any(|n| n == instance) {
        return Err(PluginError::Refused(format!(
            "{instance} is not an instance of {database} (its instances: {})",
            names.join(", ")
        )));
    }
    let mut listed = fenced_instances(db.annotations());
    match (fenced, instance) {
        (true, _) if listed.iter().any(|n| n == instance) => {}
        (true, _) => listed.push(instance.to_string()),
        (false, "*") => listed.clear(),
        (false, _) if listed.iter().any(|n| n == "*") => {
            return Err(PluginError::Refused(format!(
                "every instance of {database} is fenced (`*`): `kubectl keelson unfence {database} '*'` ends it"
            )));
        }
        (false, _) => listed.retain(|n| n != instance),
    }
    let value = (!listed.is_empty()).then(|| listed.join(","));
    // With the version read: a fence written meanwhile by someone else is not lost.
    let patch = Patch::Merge(json!({"metadata": {
        "resourceVersion": db.resource_version(),
        "annotations": {FENCED_INSTANCES_ANNOTATION: value}}}));
    target
        .api::<MyDatabase>()
        .patch(database, &PatchParams::default(), &patch)
        .await
        .map_err(api_error(format!("annotate MyDatabase {database}")))?;
    let affected: Vec<&String> = names.iter().filter(|n| instance == "*" || *n == instance).collect();
    let started = Instant::now();
    loop {
        let db = target.database(database).await?;
        let pods = instance_pods(target, &db).await?;
        let settled = affected.iter().all(|name| {
            let Some(pod) = pods.iter().find(|p| p.name_any() == **name) else { return false };
            let stopped = crate::mydatabase::instances::report(pod).is_some_and(|r| r.fenced);
            match is_fenced(db.annotations(), name) {
                true => stopped && !crate::runtime::pods::is_ready(pod),
                false => !stopped && crate::runtime::pods::is_ready(pod),
            }
        });
        if settled {
            break;
        }
        if started.elapsed() > OPERATOR_WAIT {
            let what = if fenced { "PostgreSQL to stop" } else { "the instance to be ready" };
            return Err(PluginError::NoAnswer(format!("{what} on {}", instance)));
        }
        tokio::time::sleep(POLL).await;
    }
    match fenced {
        true => println!(
            "{instance} fenced: PostgreSQL stopped, the pod not ready (`kubectl keelson unfence {database} {instance}` ends it)"
        ),
        false => println!("{instance} unfenced: PostgreSQL runs, the pod is ready"),
    }
    Ok(())
}

pub async fn pause(target: &Target, database: &str, paused: bool) -> Result<()> {
    target.database(database).await?;
    annotate(target, database, PAUSED_ANNOTATION, paused.then_some("true")).await?;
    let what = if paused { "the Paused condition" } else { "the Paused condition to go" };
    wait_for(target, database, what, |db| {
        let shown = db.status.as_ref()?.conditions.iter().any(|c| c.type_ == "Paused" && c.status == "True");
        (shown == paused).then_some(Ok(()))
    })
    .await?;
    match paused {
        true => println!("{database} paused: Keelson changes none of its children (no failover either) until resumed"),
        false => println!("{database} resumed"),
    }
    Ok(())
}

pub async fn restore(
    target: &Target,
    name: &str,
    from: &str,
    backup: Option<String>,
    replicas: i32,
    storage: Option<String>,
) -> Result<()> {
    let source = target.database(from).await?;
    if let Some(backup) = &backup {
        let kept = source.status.as_ref().map(|s| s.backups.as_slice()).unwrap_or_default();
        if !kept.is_empty() && !kept.iter().any(|b| b.name == *backup) {
            let names: Vec<&str> = kept.iter().map(|b| b.name.as_str()).collect();
            return Err(PluginError::Refused(format!(
                "{from} keeps no backup {backup} (it keeps: {})",
                names.join(", ")
            )));
        }
    }
    let db: MyDatabase = serde_json::from_value(json!({
        "apiVersion": "db.keelson.dev/v1", "kind": "MyDatabase", "metadata": {"name": name},
        "spec": {"replicas": replicas, "version": source.spec.version,
                 "storage": storage.unwrap_or_else(|| source.spec.storage.clone()),
                 "restoreFrom": {"database": from, "backup": backup}}
    }))
    .map_err(|e| PluginError::Print(e.to_string()))?;
    target
        .api::<MyDatabase>()
        .create(&PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() }, &db)
        .await
        .map_err(api_error(format!("create MyDatabase {name}")))?;
    let which = backup.map_or_else(|| format!("the newest backup of {from}"), |b| format!("{from}'s backup {b}"));
    println!("MyDatabase {name} created from {which}; follow it with `kubectl keelson status {name}`");
    if !source.spec.restore_to.iter().any(|allowed| allowed == name) {
        println!("note: {from} does not list {name} in spec.restoreTo; the restore waits until it does");
    }
    Ok(())
}

/// `kubectl exec -it` of psql in the primary's (or a replica's) PostgreSQL container.
pub async fn psql(target: &Target, database: &str, replica: bool, args: &[String]) -> Result<()> {
    let db = target.database(database).await?;
    let pods = instance_pods(target, &db).await?;
    let role = if replica { "replica" } else { "primary" };
    let pod = pods
        .iter()
        .filter(|p| p.labels().get(ROLE_LABEL).map(String::as_str) == Some(role))
        .find(|p| crate::runtime::pods::is_ready(p))
        .ok_or_else(|| PluginError::Refused(format!("{database} has no ready {role}")))?;
    let interactive = args.is_empty() && std::io::IsTerminal::is_terminal(&std::io::stdin());
    let mut command = std::process::Command::new(std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into()));
    command.args(["-n", &target.namespace, "exec"]);
    if interactive {
        command.arg("-it");
    }
    command.args([&pod.name_any(), "-c", "postgres", "--", "psql", "-X", "-d", names::APP_DB]).args(args);
    let status = command.status().map_err(|source| PluginError::Io { what: "kubectl exec".into(), source })?;
    match status.success() {
        true => Ok(()),
        false => Err(PluginError::Refused(format!("psql on {} ended with {status}", pod.name_any()))),
    }
}
