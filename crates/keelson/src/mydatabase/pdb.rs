//! Two PodDisruptionBudgets, only when there is more than one instance: the
//! replicas may go one at a time; the primary may not be evicted at all, so a
//! drain waits until Keelson has handed its role over (see `drain`).

use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{names, services};
use crate::Result;
use crate::api::MyDatabase;

/// The replicas' budget and the primary's; None for a single instance (a
/// budget there would block node drains forever).
pub struct Budgets {
    pub replicas: Option<PodDisruptionBudget>,
    pub primary: Option<PodDisruptionBudget>,
}

pub fn build(db: &MyDatabase) -> Result<Budgets> {
    if db.spec.replicas <= 1 {
        return Ok(Budgets { replicas: None, primary: None });
    }
    let budget = |name: String, role: &str, limit: PodDisruptionBudgetSpec| -> Result<PodDisruptionBudget> {
        let mut selector = names::pod_selector(db);
        selector.insert(names::ROLE_LABEL.into(), role.into());
        Ok(PodDisruptionBudget {
            metadata: names::owned_meta(db, name, "database")?,
            spec: Some(PodDisruptionBudgetSpec {
                selector: Some(LabelSelector { match_labels: Some(selector), ..Default::default() }),
                // A pod that is not ready serves nothing: evicting it costs nothing.
                unhealthy_pod_eviction_policy: Some("AlwaysAllow".into()),
                ..limit
            }),
            ..Default::default()
        })
    };
    // `minAvailable`, not `maxUnavailable`: with a selector that picks some of a StatefulSet's
    // pods, `maxUnavailable` counts against the StatefulSet's whole size, and no replica could
    // ever be evicted. All replicas but one stay; the primary stays.
    let available =
        |count: i32| PodDisruptionBudgetSpec { min_available: Some(IntOrString::Int(count)), ..Default::default() };
    let (one_at_a_time, never) = (available(db.spec.replicas - 2), available(1));
    Ok(Budgets {
        replicas: Some(budget(names::statefulset(db), services::REPLICA, one_at_a_time)?),
        primary: Some(budget(names::primary_budget(db), services::PRIMARY, never)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mydatabase::tests::sample;

    #[test]
    fn replicas_go_one_at_a_time_and_the_primary_not_at_all() {
        let mut db = sample();
        let Budgets { replicas, primary } = build(&db).expect("builds");
        let spec = |budget: Option<PodDisruptionBudget>| budget.and_then(|b| b.spec).expect("a budget");
        let (replicas, primary) = (spec(replicas), spec(primary));
        // Three instances: one of the two replicas may go, the primary may not.
        assert_eq!(replicas.min_available, Some(IntOrString::Int(1)));
        assert_eq!(primary.min_available, Some(IntOrString::Int(1)));
        let role = |spec: &PodDisruptionBudgetSpec| {
            spec.selector.as_ref().and_then(|s| s.match_labels.as_ref()).and_then(|l| l.get(names::ROLE_LABEL).cloned())
        };
        assert_eq!((role(&replicas).as_deref(), role(&primary).as_deref()), (Some("replica"), Some("primary")));
        db.spec.replicas = 1;
        let single = build(&db).expect("builds");
        assert!(single.replicas.is_none() && single.primary.is_none(), "one instance: never blocks a drain");
    }
}
