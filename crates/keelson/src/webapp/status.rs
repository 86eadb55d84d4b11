//! WebApp status, computed from what the cluster reports about the Deployment.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::observed::Observed;
use crate::api::conditions::{DesiredCondition, merge_conditions};
use crate::api::webapp::{WebApp, WebAppPhase, WebAppStatus};
use crate::runtime::Outcome;
use crate::runtime::pods::{self, StartFailure};

/// Computes the status `app` should have, given its Deployment as the API
/// server returned it and what this reconcile's applier recorded.
pub fn compute(app: &WebApp, observed_children: &Observed, outcome: &Outcome, now: &Time) -> WebAppStatus {
    let deployment = observed_children.deployment.as_ref();
    let desired = app.spec.replicas;
    let observed = deployment.and_then(|d| d.status.as_ref());
    let available = observed.and_then(|s| s.available_replicas).unwrap_or(0);
    let replicas = observed.and_then(|s| s.replicas).unwrap_or(0);
    let updated = observed.and_then(|s| s.updated_replicas).unwrap_or(0);
    let deployment_current = deployment.is_some_and(|d| {
        let generation = d.metadata.generation.unwrap_or(0);
        observed.and_then(|s| s.observed_generation).unwrap_or(0) >= generation
    });
    let running = deployment_current
        && available == desired
        && replicas == desired
        && updated == desired
        && outcome.failures.is_empty();
    let phase = if running { WebAppPhase::Running } else { WebAppPhase::Scaling };

    let available_condition = if available >= desired {
        DesiredCondition::new(
            "Available",
            true,
            "MinimumReplicasAvailable",
            format!("{available}/{desired} replicas available"),
        )
    } else {
        // Name what keeps pods away: the ReplicaSet's refusal (quota, admission)
        // or the kubelet's and scheduler's reason, when the Deployment is stuck.
        let counts = format!("{available}/{desired} replicas available");
        match replica_failure(deployment).or_else(|| pods::start_failure(&observed_children.pods)) {
            Some(failure) => {
                DesiredCondition::new("Available", false, failure.reason, format!("{counts}; {}", failure.message))
            }
            None => DesiredCondition::new("Available", false, "ReplicasUnavailable", counts),
        }
    };
    let progressing_condition = if running {
        DesiredCondition::new("Progressing", false, "Complete", "the Deployment matches the spec")
    } else {
        DesiredCondition::new(
            "Progressing",
            true,
            "Scaling",
            format!("{replicas} pods, {updated} up to date, {available} available; want {desired}"),
        )
    };
    let degraded_condition = match outcome.failure_message() {
        Some(message) => DesiredCondition::new("Degraded", true, "ReconcileFailed", message),
        None => DesiredCondition::new("Degraded", false, "AsExpected", ""),
    };
    // What tools read (kstatus, `kubectl wait --for=condition=Ready`, Argo CD, Flux): the phase as a condition.
    let ready_condition = match outcome.failure_message() {
        Some(message) => DesiredCondition::new("Ready", false, "ReconcileFailed", message),
        None if running => {
            DesiredCondition::new("Ready", true, "Running", format!("{available}/{desired} replicas available"))
        }
        None => DesiredCondition::new(
            "Ready",
            false,
            "Scaling",
            format!("{replicas} pods, {updated} up to date, {available} available; want {desired}"),
        ),
    };
    let previous = app.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    let generation = app.metadata.generation;
    WebAppStatus {
        phase: Some(phase),
        available_replicas: available,
        replicas,
        selector: Some(crate::runtime::meta::selector(&super::deployment::selector_labels(app))),
        observed_generation: generation,
        conditions: merge_conditions(
            previous,
            &[ready_condition, available_condition, progressing_condition, degraded_condition]
                .into_iter()
                .chain(outcome.paused.then(crate::api::conditions::paused))
                .collect::<Vec<_>>(),
            generation,
            now,
        ),
    }
}

/// The Deployment's `ReplicaFailure` condition: pods it could not even create.
fn replica_failure(deployment: Option<&Deployment>) -> Option<StartFailure> {
    let conditions = deployment?.status.as_ref()?.conditions.as_ref()?;
    let failure = conditions.iter().find(|c| c.type_ == "ReplicaFailure" && c.status == "True")?;
    Some(StartFailure {
        reason: failure.reason.clone().unwrap_or_else(|| "ReplicaFailure".into()),
        message: failure.message.clone().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::webapp::tests::sample;
    use k8s_openapi::api::apps::v1::DeploymentStatus;
    use k8s_openapi::jiff::Timestamp;

    fn deployment(generation: i64, observed: i64, replicas: i32, updated: i32, available: i32) -> Deployment {
        let mut d = Deployment::default();
        d.metadata.generation = Some(generation);
        d.status = Some(DeploymentStatus {
            observed_generation: Some(observed),
            replicas: Some(replicas),
            updated_replicas: Some(updated),
            available_replicas: Some(available),
            ..Default::default()
        });
        d
    }

    fn with(deployment: Deployment) -> Observed {
        Observed { deployment: Some(deployment), ..Default::default() }
    }

    fn now() -> Time {
        Time(Timestamp::UNIX_EPOCH)
    }

    fn condition<'a>(status: &'a WebAppStatus, type_: &str) -> &'a str {
        status.conditions.iter().find(|c| c.type_ == type_).map(|c| c.status.as_str()).unwrap_or("missing")
    }

    #[test]
    fn all_available_is_running() {
        let status = compute(&sample(), &with(deployment(2, 2, 3, 3, 3)), &Outcome::default(), &now());
        assert_eq!(status.phase, Some(WebAppPhase::Running));
        assert_eq!(status.available_replicas, 3);
        assert_eq!(condition(&status, "Available"), "True");
        assert_eq!(condition(&status, "Progressing"), "False");
        assert_eq!(condition(&status, "Degraded"), "False");
        assert_eq!(condition(&status, "Ready"), "True", "kubectl wait --for=condition=Ready");
        assert_eq!(status.selector.as_deref(), Some("app=sandy-app"));
    }

    #[test]
    fn extra_pods_after_outside_scale_is_scaling() {
        let status = compute(&sample(), &with(deployment(3, 3, 10, 10, 10)), &Outcome::default(), &now());
        assert_eq!(status.phase, Some(WebAppPhase::Scaling));
        assert_eq!(condition(&status, "Ready"), "False");
        assert_eq!(condition(&status, "Progressing"), "True");
    }

    #[test]
    fn unobserved_generation_is_scaling_even_if_counts_match() {
        let status = compute(&sample(), &with(deployment(3, 2, 3, 3, 3)), &Outcome::default(), &now());
        assert_eq!(status.phase, Some(WebAppPhase::Scaling));
    }

    #[test]
    fn missing_deployment_and_failure_is_degraded() {
        let failed = Outcome {
            failures: vec![crate::runtime::outcome::ChildFailure {
                child: "Deployment sandy-app".into(),
                action: "apply",
                reason: "Invalid".into(),
                message: "apply failed".into(),
                conflict: false,
            }],
            ..Default::default()
        };
        let status = compute(&sample(), &Observed::default(), &failed, &now());
        assert_eq!(status.phase, Some(WebAppPhase::Scaling));
        assert_eq!(condition(&status, "Available"), "False");
        assert_eq!(condition(&status, "Degraded"), "True");
    }

    #[test]
    fn zero_replicas_is_running_when_nothing_runs() {
        let mut app = sample();
        app.spec.replicas = 0;
        let status = compute(&app, &with(deployment(1, 1, 0, 0, 0)), &Outcome::default(), &now());
        assert_eq!(status.phase, Some(WebAppPhase::Running));
    }

    #[test]
    fn same_observation_gives_identical_status() {
        let mut app = sample();
        let first = compute(&app, &with(deployment(2, 2, 3, 3, 3)), &Outcome::default(), &now());
        app.status = Some(first.clone());
        let later = Time(Timestamp::from_second(1000).unwrap_or(Timestamp::UNIX_EPOCH));
        assert_eq!(compute(&app, &with(deployment(2, 2, 3, 3, 3)), &Outcome::default(), &later), first);
    }

    #[test]
    fn why_pods_are_missing_is_named_in_available() {
        let mut stuck = deployment(1, 1, 3, 3, 0);
        let observed = Observed {
            pods: vec![crate::runtime::pods::tests::waiting("sandy-app-x", "InvalidImageName")],
            ..with(stuck.clone())
        };
        let status = compute(&sample(), &observed, &Outcome::default(), &now());
        let available = status.conditions.iter().find(|c| c.type_ == "Available").expect("Available");
        assert_eq!((available.status.as_str(), available.reason.as_str()), ("False", "InvalidImageName"));

        if let Some(s) = stuck.status.as_mut() {
            s.conditions = Some(vec![k8s_openapi::api::apps::v1::DeploymentCondition {
                type_: "ReplicaFailure".into(),
                status: "True".into(),
                reason: Some("FailedCreate".into()),
                message: Some("pods \"sandy-app-x\" is forbidden: exceeded quota".into()),
                ..Default::default()
            }]);
        }
        let status = compute(&sample(), &with(stuck), &Outcome::default(), &now());
        let available = status.conditions.iter().find(|c| c.type_ == "Available").expect("Available");
        assert_eq!(available.reason, "FailedCreate");
        assert!(available.message.contains("exceeded quota"));
    }
}
