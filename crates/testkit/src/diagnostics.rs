//! What a person needs to see when a wait times out.

use std::fmt::Write as _;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod, Service};
use kube::api::{Api, ListParams};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

async fn list_names<K>(client: &Client, namespace: &str, out: &mut String, describe: impl Fn(&K) -> String)
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    match api.list(&ListParams::default()).await {
        Ok(list) => {
            let _ = writeln!(out, "{} ({}):", K::kind(&()), list.items.len());
            for item in &list.items {
                let _ = writeln!(out, "  {} {}", item.name_any(), describe(item));
            }
        }
        Err(error) => {
            let _ = writeln!(out, "{}: cannot list: {error}", K::kind(&()));
        }
    }
}

/// Summarizes the workloads, pods and recent Events of `namespace`.
pub async fn dump_namespace(client: Client, namespace: &str) -> String {
    let mut out = format!("--- namespace {namespace} ---\n");
    list_names::<Deployment>(&client, namespace, &mut out, |d| {
        let s = d.status.clone().unwrap_or_default();
        format!(
            "spec.replicas={:?} ready={:?} available={:?}",
            d.spec.as_ref().and_then(|s| s.replicas),
            s.ready_replicas,
            s.available_replicas
        )
    })
    .await;
    list_names::<StatefulSet>(&client, namespace, &mut out, |s| {
        format!(
            "spec.replicas={:?} ready={:?}",
            s.spec.as_ref().and_then(|s| s.replicas),
            s.status.as_ref().and_then(|s| s.ready_replicas)
        )
    })
    .await;
    list_names::<Service>(&client, namespace, &mut out, |s| {
        format!("type={:?}", s.spec.as_ref().and_then(|s| s.type_.clone()))
    })
    .await;
    list_names::<Pod>(&client, namespace, &mut out, |p| {
        format!(
            "phase={:?} node={:?}",
            p.status.as_ref().and_then(|s| s.phase.clone()),
            p.spec.as_ref().and_then(|s| s.node_name.clone())
        )
    })
    .await;
    list_names::<PersistentVolumeClaim>(&client, namespace, &mut out, |p| {
        format!("phase={:?}", p.status.as_ref().and_then(|s| s.phase.clone()))
    })
    .await;
    list_names::<Job>(&client, namespace, &mut out, |j| {
        format!(
            "succeeded={:?} failed={:?}",
            j.status.as_ref().and_then(|s| s.succeeded),
            j.status.as_ref().and_then(|s| s.failed)
        )
    })
    .await;
    list_names::<CronJob>(&client, namespace, &mut out, |c| format!("schedule={:?}", c.spec.schedule)).await;
    let events: Api<Event> = Api::namespaced(client, namespace);
    match events.list(&ListParams::default()).await {
        Ok(list) => {
            let _ = writeln!(out, "Events ({}), last 30:", list.items.len());
            for event in list.items.iter().rev().take(30).rev() {
                let _ = writeln!(
                    out,
                    "  {} {}/{} {}: {}",
                    event.type_.as_deref().unwrap_or("?"),
                    event.involved_object.kind.as_deref().unwrap_or("?"),
                    event.involved_object.name.as_deref().unwrap_or("?"),
                    event.reason.as_deref().unwrap_or("?"),
                    event.message.as_deref().unwrap_or("")
                );
            }
        }
        Err(error) => {
            let _ = writeln!(out, "Events: cannot list: {error}");
        }
    }
    out
}
