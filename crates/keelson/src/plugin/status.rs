//! `status`, `webapp` and `backups`: what a DBA asks first, from the objects.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use serde::Serialize;

use super::{Output, Result, Target, instance_pods, print, table};
use crate::api::MyDatabase;
use crate::api::instance::{ANNOTATION, InstanceReport, ROLE_LABEL};
use crate::api::mydatabase::{BackupRecord, FailoverRecord};

/// One instance as `status` shows it.
#[derive(Serialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct InstanceView {
    pub name: String,
    pub role: String,
    pub node: String,
    pub ready: bool,
    pub timeline: Option<i64>,
    pub lsn: Option<String>,
    pub lag_bytes: Option<i64>,
    pub lag_seconds: Option<String>,
}

#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseView {
    pub name: String,
    pub namespace: String,
    pub phase: Option<String>,
    pub primary: Option<String>,
    pub server_version: Option<String>,
    pub instances: Vec<InstanceView>,
    pub last_failover: Option<FailoverRecord>,
    pub backups: Vec<BackupRecord>,
    pub conditions: Vec<Condition>,
    /// What is wrong, in words; empty when nothing is.
    pub problems: Vec<String>,
}

/// A replica this far behind is worth a line (a WAL segment, 16 MiB, is what a replica that just
/// (re)connected may show for a moment).
const LAG_WORTH_SAYING: i64 = 64 << 20;

fn instance_view(db: &MyDatabase, pod: &Pod) -> InstanceView {
    let report: Option<InstanceReport> = pod.annotations().get(ANNOTATION).and_then(|r| serde_json::from_str(r).ok());
    let status = db.status.as_ref().and_then(|s| s.instance_statuses.iter().find(|i| i.name == pod.name_any()));
    InstanceView {
        name: pod.name_any(),
        role: match (pod.labels().get(ROLE_LABEL), report.as_ref().is_some_and(|r| r.fenced)) {
            (Some(role), true) => format!("{role} (fenced)"),
            (Some(role), false) => role.clone(),
            (None, _) => "-".into(),
        },
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_else(|| "-".into()),
        ready: crate::runtime::pods::is_ready(pod),
        timeline: report.as_ref().map(|r| r.timeline),
        lsn: report.as_ref().map(|r| r.lsn.clone()),
        lag_bytes: status.and_then(|s| s.lag_bytes),
        lag_seconds: status.and_then(|s| s.lag_seconds.clone()),
    }
}

/// What is wrong with the database, in words, from its conditions and instances.
pub fn problems(db: &MyDatabase, instances: &[InstanceView]) -> Vec<String> {
    let conditions = db.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    // The conditions whose bad state is True, and those whose bad state is False.
    let bad_when_true = ["FailoverBlocked", "RestartPending", "Paused", "Fenced"];
    let bad_when_false = ["Ready", "SpecValid", "LastBackupSucceeded", "InstanceManagersCurrent", "InstancesSpread"];
    let mut out: Vec<String> = conditions
        .iter()
        .filter(|c| {
            (bad_when_true.contains(&c.type_.as_str()) && c.status == "True")
                || (bad_when_false.contains(&c.type_.as_str()) && c.status == "False")
        })
        .map(|c| format!("{} ({}): {}", c.type_, c.reason, c.message))
        .collect();
    // Synchronous=False is a choice (one instance, Asynchronous) except when standbys stopped confirming.
    if let Some(c) = conditions.iter().find(|c| c.type_ == "Synchronous" && c.reason == "StandbysNotStreaming") {
        out.push(format!("{} ({}): {}", c.type_, c.reason, c.message));
    }
    for instance in instances {
        if !instance.ready {
            out.push(format!("{} is not ready", instance.name));
        }
        if let Some(lag) = instance.lag_bytes.filter(|lag| *lag > LAG_WORTH_SAYING) {
            out.push(format!("{} is {} MiB behind its primary", instance.name, lag >> 20));
        }
    }
    out
}

pub async fn database(target: &Target, name: &str, output: Output) -> Result<()> {
    let db = target.database(name).await?;
    let pods = instance_pods(target, &db).await?;
    let instances: Vec<InstanceView> = pods.iter().map(|pod| instance_view(&db, pod)).collect();
    let status = db.status.clone().unwrap_or_default();
    let view = DatabaseView {
        name: db.name_any(),
        namespace: target.namespace.clone(),
        phase: status.phase.map(|p| format!("{p:?}")),
        primary: status.current_primary.clone(),
        server_version: status.server_version.clone(),
        problems: problems(&db, &instances),
        instances,
        last_failover: status.last_failover.clone(),
        backups: status.backups.clone(),
        conditions: status.conditions.clone(),
    };
    print(output, &view, || render_database(&view))
}

fn render_database(view: &DatabaseView) -> String {
    let dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let mut out = format!(
        "MyDatabase {}/{}: {}, primary {}, PostgreSQL {}\n\n",
        view.namespace,
        view.name,
        dash(view.phase.clone()),
        dash(view.primary.clone()),
        dash(view.server_version.clone())
    );
    let mut rows = vec![
        ["INSTANCE", "ROLE", "NODE", "READY", "TIMELINE", "LSN", "LAG BYTES", "LAG SECONDS"].map(String::from).to_vec(),
    ];
    for i in &view.instances {
        rows.push(vec![
            i.name.clone(),
            i.role.clone(),
            i.node.clone(),
            i.ready.to_string(),
            dash(i.timeline.map(|t| t.to_string())),
            dash(i.lsn.clone()),
            dash(i.lag_bytes.map(|l| l.to_string())),
            dash(i.lag_seconds.clone()),
        ]);
    }
    out.push_str(&table(&rows));
    out.push('\n');
    match &view.last_failover {
        Some(f) => out.push_str(&format!(
            "Last {}: {} → {} at {} ({}){}\n",
            if f.kind.is_empty() { "failover" } else { f.kind.as_str() }.to_lowercase(),
            f.from,
            f.to,
            dash(f.promoted_at.as_ref().map(|t| t.0.to_string())),
            f.reason,
            f.writes_down_ms.map(|ms| format!(", writes down {ms} ms")).unwrap_or_default()
        )),
        None => out.push_str("No failover or switchover yet.\n"),
    }
    match view.backups.first() {
        Some(newest) => out.push_str(&format!(
            "Backups: {} kept, newest {} ({} bytes)\n",
            view.backups.len(),
            newest.name,
            newest.size_bytes
        )),
        None => out.push_str("Backups: none listed yet.\n"),
    }
    out.push_str("\nConditions:\n");
    for c in &view.conditions {
        out.push_str(&format!("  {}={} ({}) {}\n", c.type_, c.status, c.reason, c.message));
    }
    if view.problems.is_empty() {
        out.push_str("\nNothing is wrong.\n");
    } else {
        out.push_str("\nWhat is wrong:\n");
        for problem in &view.problems {
            out.push_str(&format!("  - {problem}\n"));
        }
    }
    out
}

pub async fn backups(target: &Target, name: &str, output: Output) -> Result<()> {
    let db = target.database(name).await?;
    let backups = db.status.map(|s| s.backups).unwrap_or_default();
    print(output, &backups, || {
        let mut rows = vec![["NAME", "TIME", "SIZE BYTES", "VERIFIED"].map(String::from).to_vec()];
        for b in &backups {
            let time = b.time.as_ref().map(|t| t.0.to_string()).unwrap_or_else(|| "-".into());
            rows.push(vec![b.name.clone(), time, b.size_bytes.to_string(), b.verified.to_string()]);
        }
        table(&rows)
    })
}

pub async fn webapp(target: &Target, name: &str, output: Output) -> Result<()> {
    let app = target.webapp(name).await?;
    let status = app.status.clone().unwrap_or_default();
    print(output, &app.status, || {
        let mut out = format!(
            "WebApp {}/{}: {}, {}/{} replicas available, image {}\n\nConditions:\n",
            target.namespace,
            name,
            status.phase.map(|p| format!("{p:?}")).unwrap_or_else(|| "-".into()),
            status.available_replicas,
            app.spec.replicas,
            app.spec.image
        );
        for c in &status.conditions {
            out.push_str(&format!("  {}={} ({}) {}\n", c.type_, c.status, c.reason, c.message));
        }
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::mydatabase::MyDatabaseStatus;

    fn condition(type_: &str, status: &str, reason: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: "because".into(),
            observed_generation: None,
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        }
    }

    #[test]
    fn what_is_wrong_is_said_in_words() {
        let mut db = crate::mydatabase::tests::sample();
        let healthy = [condition("Ready", "True", "AllInstancesReady"), condition("Paused", "False", "x")];
        db.status = Some(MyDatabaseStatus { conditions: healthy.to_vec(), ..Default::default() });
        let fine = InstanceView {
            name: "db-1".into(),
            role: "replica".into(),
            node: "n".into(),
            ready: true,
            timeline: Some(1),
            lsn: None,
            lag_bytes: Some(0),
            lag_seconds: None,
        };
        assert!(problems(&db, std::slice::from_ref(&fine)).is_empty());

        let troubled = [condition("Ready", "False", "InstancesNotReady"), condition("Paused", "True", "Annotated")];
        db.status = Some(MyDatabaseStatus { conditions: troubled.to_vec(), ..Default::default() });
        let behind = InstanceView { ready: false, lag_bytes: Some(65 << 20), ..fine };
        let said = problems(&db, &[behind]);
        assert_eq!(
            said,
            [
                "Ready (InstancesNotReady): because",
                "Paused (Annotated): because",
                "db-1 is not ready",
                "db-1 is 65 MiB behind its primary"
            ]
        );
    }
}
