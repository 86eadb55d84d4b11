//! `report`: a support bundle a DBA can attach to an issue. The database's
//! objects, Events and recent logs, with no secret value in it: Secrets are
//! listed by name and key only, and any value of the database's Secrets that
//! shows up elsewhere (a log line) is replaced.

use std::fmt::Write as _;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{Api, ListParams, LogParams};

use super::{PluginError, Result, Target};
use crate::mydatabase::names::CLUSTER_LABEL;

const LOG_LINES: i64 = 200;
const REDACTED: &str = "<redacted>";

/// Objects as YAML without what only adds noise (managed fields).
fn yaml<K: serde::Serialize + kube::Resource>(mut objects: Vec<K>) -> String {
    for object in &mut objects {
        object.meta_mut().managed_fields = None;
    }
    objects.iter().filter_map(|o| serde_yaml::to_string(o).ok()).collect::<Vec<_>>().join("---\n")
}

/// `text` with every value in `secrets` replaced.
pub fn redact(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_string();
    // Longest first: a value that contains another is replaced whole.
    let mut values: Vec<&String> = secrets.iter().filter(|v| v.len() >= 6).collect();
    values.sort_by_key(|v| std::cmp::Reverse(v.len()));
    for value in values {
        out = out.replace(value.as_str(), REDACTED);
    }
    out
}

async fn section<K>(out: &mut String, title: &str, api: &Api<K>, params: &ListParams)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    let _ = writeln!(out, "=== {title} ===");
    match api.list(params).await {
        Ok(list) => out.push_str(&yaml(list.items)),
        Err(error) => {
            let _ = writeln!(out, "(not readable: {error})");
        }
    }
    out.push('\n');
}

pub async fn write(target: &Target, database: &str, file: Option<&std::path::Path>) -> Result<()> {
    let db = target.database(database).await?;
    let of_database = ListParams::default().labels(&format!("{CLUSTER_LABEL}={database}"));
    let mut out = format!(
        "Keelson support bundle: MyDatabase {}/{database}, {}\nkeelson {}\n\n",
        target.namespace,
        k8s_openapi::jiff::Timestamp::now(),
        env!("CARGO_PKG_VERSION")
    );
    let _ = writeln!(out, "=== MyDatabase ===");
    out.push_str(&yaml(vec![db.clone()]));
    out.push('\n');
    section(&mut out, "StatefulSets", &target.api::<StatefulSet>(), &of_database).await;
    section(&mut out, "Pods", &target.api::<Pod>(), &of_database).await;
    section(&mut out, "Services", &target.api::<Service>(), &of_database).await;
    section(&mut out, "PersistentVolumeClaims", &target.api::<PersistentVolumeClaim>(), &of_database).await;
    section(&mut out, "PodDisruptionBudgets", &target.api::<PodDisruptionBudget>(), &of_database).await;
    section(&mut out, "NetworkPolicies", &target.api::<NetworkPolicy>(), &of_database).await;
    section(&mut out, "CronJobs", &target.api::<CronJob>(), &of_database).await;
    section(&mut out, "Jobs", &target.api::<Job>(), &of_database).await;

    // Secrets: names and keys, never values; the values are read (where allowed) only to redact.
    let mut values = Vec::new();
    let _ = writeln!(out, "=== Secrets (keys only) ===");
    let secrets = target.api::<Secret>().list(&of_database).await;
    // Without the values, logs cannot be redacted: they are left out.
    let redactable = secrets.is_ok();
    match secrets {
        Ok(list) => {
            for secret in list.items {
                let keys: Vec<String> = secret.data.iter().flat_map(|d| d.keys().cloned()).collect();
                let _ = writeln!(out, "{}: {}", secret.name_any(), keys.join(", "));
                for value in secret.data.into_iter().flat_map(|d| d.into_values()) {
                    values.push(String::from_utf8_lossy(&value.0).into_owned());
                }
            }
        }
        Err(error) => {
            let _ = writeln!(out, "(not readable: {error})");
        }
    }
    out.push('\n');

    let _ = writeln!(out, "=== Events ===");
    match target.api::<Event>().list(&ListParams::default()).await {
        Ok(list) => {
            let mut events: Vec<_> = list
                .items
                .into_iter()
                .filter(|e| {
                    e.regarding.as_ref().and_then(|r| r.name.as_deref()).is_some_and(|n| n.starts_with(database))
                })
                .collect();
            events.sort_by_key(|e| {
                e.event_time.as_ref().map(|t| t.0).or(e.deprecated_last_timestamp.as_ref().map(|t| t.0))
            });
            for e in events {
                let when = e.event_time.map(|t| t.0.to_string()).unwrap_or_default();
                let regarding = e.regarding.and_then(|r| r.name).unwrap_or_default();
                let _ = writeln!(
                    out,
                    "{when} {} {regarding} {}: {}",
                    e.type_.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.note.unwrap_or_default()
                );
            }
        }
        Err(error) => {
            let _ = writeln!(out, "(not readable: {error})");
        }
    }
    out.push('\n');

    let pods = target.api::<Pod>();
    if !redactable {
        out.push_str(
            "=== Logs ===\n(left out: the database's Secrets are not readable, so logs could not be redacted)\n",
        );
    }
    let logged =
        if redactable { pods.list(&of_database).await.map(|l| l.items).unwrap_or_default() } else { Vec::new() };
    for pod in logged {
        for container in pod.spec.iter().flat_map(|s| s.containers.iter()) {
            let params = LogParams {
                container: Some(container.name.clone()),
                tail_lines: Some(LOG_LINES),
                ..Default::default()
            };
            let _ = writeln!(out, "=== Log of {}/{} (last {LOG_LINES} lines) ===", pod.name_any(), container.name);
            match pods.logs(&pod.name_any(), &params).await {
                Ok(log) => out.push_str(&log),
                Err(error) => {
                    let _ = writeln!(out, "(not readable: {error})");
                }
            }
            out.push('\n');
        }
    }
    // The operator's log, wherever it runs in-cluster (the user may not see it: then said so).
    let operators: Api<Pod> = Api::all(target.client.clone());
    let manager = ListParams::default().labels("app.kubernetes.io/name=keelson,app.kubernetes.io/component=manager");
    match operators.list(&manager).await.map_err(|e| e.to_string()).and_then(|list| match redactable {
        true => Ok(list),
        false => Err("left out: logs could not be redacted".to_string()),
    }) {
        Ok(list) if list.items.is_empty() => {
            out.push_str("=== Operator ===\n(no operator pod found: running with `make run`?)\n")
        }
        Ok(list) => {
            for pod in list.items {
                let namespace = pod.namespace().unwrap_or_default();
                let api: Api<Pod> = Api::namespaced(target.client.clone(), &namespace);
                let params = LogParams { tail_lines: Some(LOG_LINES * 2), ..Default::default() };
                let _ = writeln!(out, "=== Log of operator {namespace}/{} ===", pod.name_any());
                match api.logs(&pod.name_any(), &params).await {
                    Ok(log) => out.extend(
                        log.lines()
                            .filter(|l| l.contains(&format!("\"{database}\"")) && l.contains(&target.namespace))
                            .map(|l| format!("{l}\n")),
                    ),
                    Err(error) => {
                        let _ = writeln!(out, "(not readable: {error})");
                    }
                }
            }
        }
        Err(error) => {
            let _ = writeln!(out, "=== Operator ===\n(not readable: {error})");
        }
    }

    let out = redact(&out, &values);
    match file {
        Some(path) => {
            std::fs::write(path, &out)
                .map_err(|source| PluginError::Io { what: path.display().to_string(), source })?;
            eprintln!("wrote {} ({} bytes)", path.display(), out.len());
        }
        None => {
            use std::io::Write as _;
            let _ = std::io::stdout().write_all(out.as_bytes());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_values_are_replaced_wherever_they_show() {
        let secrets = vec!["s3cret-password".to_string(), "s3cret".to_string(), "abc".to_string()];
        let text = "uri: postgresql://app:s3cret-password@db-rw/app, abc stays (too short to be a secret)";
        assert_eq!(
            redact(text, &secrets),
            "uri: postgresql://app:<redacted>@db-rw/app, abc stays (too short to be a secret)"
        );
    }
}
