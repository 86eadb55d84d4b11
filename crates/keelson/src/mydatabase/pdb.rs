//! A PodDisruptionBudget, only when there is more than one instance.

use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::names;
use crate::Result;
use crate::api::MyDatabase;

/// At most one instance down at a time through voluntary disruptions; None for a single instance
/// (a budget there would block node drains forever).
pub fn build(db: &MyDatabase) -> Result<Option<PodDisruptionBudget>> {
    if db.spec.replicas <= 1 {
        return Ok(None);
    }
    Ok(Some(PodDisruptionBudget {
        metadata: names::owned_meta(db, names::statefulset(db), "database")?,
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector { match_labels: Some(names::pod_selector(db)), ..Default::default() }),
            ..Default::default()
        }),
        ..Default::default()
    }))
}
