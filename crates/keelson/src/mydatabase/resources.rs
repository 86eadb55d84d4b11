//! Compute resources of the instances' containers: the user's (or the
//! defaults) for PostgreSQL, and a fixed share for the instance manager that
//! keeps the pod's QoS class what the user's choice implies.

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::api::MyDatabase;
use crate::runtime::{Invalid, drift};

const DEFAULT_MEMORY: &str = "256Mi";
/// The instance manager's share. Its CPU limit (Guaranteed pods only) is
/// generous: a throttled manager answers late, and late looks fence primaries.
const MANAGER_CPU: &str = "200m";
const MANAGER_MEMORY: &str = "128Mi";
const MANAGER_MEMORY_REQUEST: &str = "64Mi";

fn quantities(pairs: &[(&str, &str)]) -> Option<std::collections::BTreeMap<String, Quantity>> {
    Some(pairs.iter().map(|(k, v)| (k.to_string(), Quantity(v.to_string()))).collect())
}

/// PostgreSQL's container: `spec.resources`, or a memory request of 256Mi (Burstable). No
/// CPU request by default: on a crowded node a CPU share would let every instance's I/O
/// work outcompete the kubelet and the instance managers, whose late answers fence primaries.
pub fn postgres(db: &MyDatabase) -> ResourceRequirements {
    db.spec.resources.clone().unwrap_or_else(|| ResourceRequirements {
        requests: quantities(&[("memory", DEFAULT_MEMORY)]),
        ..Default::default()
    })
}

/// Whether `resources` alone would make a pod Guaranteed: CPU and memory
/// limits, with requests absent (they default to the limits) or equal.
fn guaranteed(resources: &ResourceRequirements) -> bool {
    let limits = resources.limits.clone().unwrap_or_default();
    let requests = resources.requests.clone().unwrap_or_default();
    ["cpu", "memory"].iter().all(|key| {
        let limit = limits.get(*key).and_then(|q| drift::parse_quantity(&q.0));
        let request = requests.get(*key).map(|q| drift::parse_quantity(&q.0));
        limit.is_some() && request.is_none_or(|request| request == limit)
    })
}

/// The instance manager's containers (and its installer): equal requests and
/// limits when PostgreSQL's are Guaranteed, so the pod is; otherwise a memory
/// request and limit only (Burstable, never throttled).
pub fn manager(postgres: &ResourceRequirements) -> ResourceRequirements {
    match guaranteed(postgres) {
        true => ResourceRequirements {
            requests: quantities(&[("cpu", MANAGER_CPU), ("memory", MANAGER_MEMORY)]),
            limits: quantities(&[("cpu", MANAGER_CPU), ("memory", MANAGER_MEMORY)]),
            ..Default::default()
        },
        false => ResourceRequirements {
            requests: quantities(&[("memory", MANAGER_MEMORY_REQUEST)]),
            limits: quantities(&[("memory", MANAGER_MEMORY)]),
            ..Default::default()
        },
    }
}

/// What the API server would only refuse on the pods: a request above its limit.
pub fn validate(db: &MyDatabase) -> Result<(), Invalid> {
    let Some(resources) = &db.spec.resources else { return Ok(()) };
    let limits = resources.limits.clone().unwrap_or_default();
    for (key, request) in resources.requests.iter().flatten() {
        let invalid = |message: String| Invalid { field: "spec.resources", reason: "InvalidResources", message };
        let Some(requested) = drift::parse_quantity(&request.0) else {
            return Err(invalid(format!("spec.resources.requests.{key} {:?} is not a quantity", request.0)));
        };
        if let Some(limit) = limits.get(key) {
            match drift::parse_quantity(&limit.0) {
                None => return Err(invalid(format!("spec.resources.limits.{key} {:?} is not a quantity", limit.0))),
                Some(limited) if requested > limited => {
                    return Err(invalid(format!(
                        "spec.resources.requests.{key} {} is above spec.resources.limits.{key} {}",
                        request.0, limit.0
                    )));
                }
                Some(_) => {}
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mydatabase::tests::sample;

    fn with(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> MyDatabase {
        let mut db = sample();
        db.spec.resources = Some(ResourceRequirements {
            requests: (!requests.is_empty()).then(|| quantities(requests)).flatten(),
            limits: (!limits.is_empty()).then(|| quantities(limits)).flatten(),
            ..Default::default()
        });
        db
    }

    #[test]
    fn defaults_are_burstable_and_the_manager_is_never_cpu_limited() {
        let postgres = postgres(&sample());
        assert_eq!(postgres.requests.as_ref().and_then(|r| r.get("memory")).map(|q| q.0.as_str()), Some("256Mi"));
        assert!(postgres.limits.is_none());
        assert!(postgres.requests.as_ref().is_some_and(|r| !r.contains_key("cpu")), "no CPU share by default");
        let manager = manager(&postgres);
        assert!(manager.limits.as_ref().is_some_and(|l| !l.contains_key("cpu")), "{manager:?}");
    }

    #[test]
    fn guaranteed_postgres_makes_the_manager_guaranteed_too() {
        for db in [
            with(&[("cpu", "1"), ("memory", "1Gi")], &[("cpu", "1000m"), ("memory", "1Gi")]),
            with(&[], &[("cpu", "2"), ("memory", "2Gi")]),
        ] {
            let manager = manager(&postgres(&db));
            assert_eq!(manager.requests, manager.limits);
            assert!(manager.limits.as_ref().is_some_and(|l| l.contains_key("cpu") && l.contains_key("memory")));
        }
        let burstable = manager(&postgres(&with(&[("cpu", "500m"), ("memory", "1Gi")], &[("memory", "1Gi")])));
        assert_ne!(burstable.requests, burstable.limits);
    }

    #[test]
    fn a_request_above_its_limit_is_refused_by_field() {
        validate(&with(&[("memory", "1Gi")], &[("memory", "2Gi")])).expect("valid");
        let invalid = validate(&with(&[("memory", "4Gi")], &[("memory", "2Gi")])).expect_err("refused");
        assert_eq!(invalid.field, "spec.resources");
        assert!(invalid.message.contains("spec.resources.requests.memory 4Gi is above"), "{invalid:?}");
        assert!(validate(&with(&[("cpu", "lots")], &[])).is_err());
    }
}
