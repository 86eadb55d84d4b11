//! What both controllers share: context, server-side apply with drift
//! detection, metrics, health endpoints and leader election.

pub mod apply;
pub mod client;
pub mod context;
pub mod controller;
pub mod drift;
pub mod health;
pub mod leader;
pub mod metrics;
pub mod status;

pub use apply::{ChildChange, Current, apply_child};
pub use context::{Context, FIELD_MANAGER};
pub use metrics::Metrics;

/// Labels on every child object, after the Kubernetes recommended labels.
pub fn recommended_labels(
    app_name: &str,
    component: &str,
    instance: &str,
) -> std::collections::BTreeMap<String, String> {
    [
        ("app.kubernetes.io/name", app_name),
        ("app.kubernetes.io/instance", instance),
        ("app.kubernetes.io/component", component),
        ("app.kubernetes.io/managed-by", "keelson"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// An API for `K` in `namespace`, or across all namespaces.
pub fn scoped_api<K>(client: &kube::Client, namespace: Option<&str>) -> kube::Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => kube::Api::namespaced(client.clone(), ns),
        None => kube::Api::all(client.clone()),
    }
}

/// Label selector matching every object Keelson manages, for owned watches.
pub const MANAGED_BY_SELECTOR: &str = "app.kubernetes.io/managed-by=keelson";
