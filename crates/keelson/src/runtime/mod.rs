//! What both controllers share: the reconcile queue, the pipeline and its
//! applier, watch caches, child metadata, context, metrics, health endpoints, leader
//! election and the RBAC declarations.

pub mod apply;
pub mod backoff;
pub mod cache;
pub mod client;
pub mod context;
pub mod controller;
pub mod drift;
#[cfg(test)]
pub mod fake_api;
pub mod health;
pub mod jobs;
pub mod leader;
pub mod meta;
pub mod metrics;
pub mod outcome;
pub mod own_writes;
pub mod ownership;
pub mod packed;
pub mod permissions;
pub mod pipeline;
pub mod pods;
pub mod queue;
pub mod report;
pub mod secure_metrics;
pub mod security;
pub mod status;
pub mod status_writes;

pub use apply::Applier;
pub use context::{Context, FIELD_MANAGER, Settings};
pub use metrics::Metrics;
pub use outcome::{Invalid, Outcome};
pub use pipeline::Reconciler;
pub use queue::Action;

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
