//! Rolling a new pod template out (a minor version, a new instance manager):
//! the StatefulSet's update strategy is `OnDelete`, and Keelson replaces the
//! outdated pods itself: replicas one at a time, each back and ready before
//! the next, then a switchover to an updated replica, then the former
//! primary. Writes stop for one switchover, not for a primary's restart.
//! Pure: the reconcile deletes pods and starts the switchover.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::ha::failover;
use super::instances;
use crate::api::instance::Role;
use crate::runtime::pods;

/// The label the StatefulSet controller puts on each pod: its template's revision.
const REVISION_LABEL: &str = "controller-revision-hash";

#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Every pod runs the current template.
    Done,
    /// Not now: the reason is what it waits for.
    Wait(String),
    /// Delete this outdated pod; the StatefulSet recreates it from the new template.
    Replace(String),
    /// Only the primary is outdated: move the primary to this updated replica first.
    SwitchoverTo(String),
}

fn revision(pod: &Pod) -> Option<&str> {
    pod.labels().get(REVISION_LABEL).map(String::as_str)
}

/// The next step of the rollout of `statefulset`'s update revision over `pods`.
pub fn next_step(statefulset: &StatefulSet, pods: &[Pod], primary: &str) -> Step {
    let status = statefulset.status.as_ref();
    let Some(target) = status.and_then(|s| s.update_revision.as_deref()) else { return Step::Done };
    // The controller has not seen the newest template yet: its revision is not known.
    if status.and_then(|s| s.observed_generation) < statefulset.metadata.generation {
        return Step::Wait("the StatefulSet controller to take in the new template".into());
    }
    let outdated: Vec<&Pod> = pods.iter().filter(|p| revision(p).is_some_and(|r| r != target)).collect();
    if outdated.is_empty() {
        return Step::Done;
    }
    let wanted = statefulset.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1) as usize;
    // No instance reports at all (no instance managers run, as on fake nodes): readiness is all there is.
    let unmanaged = pods.iter().all(|p| instances::report(p).is_none());
    let unready: Vec<String> =
        pods.iter().filter(|p| !in_service(p, primary, unmanaged)).map(|p| p.name_any()).collect();
    if pods.len() < wanted || !unready.is_empty() {
        return Step::Wait(format!("every instance to be ready before the next (not ready: {})", unready.join(", ")));
    }
    // Replicas first, the highest ordinal first (as a StatefulSet would).
    if let Some(replica) = outdated.iter().filter(|p| p.name_any() != primary).max_by_key(|p| ordinal(p)) {
        return Step::Replace(replica.name_any());
    }
    // Only the primary is left: hand its role to the most suitable updated replica.
    let successor = pods
        .iter()
        .filter(|p| revision(p) == Some(target))
        .map(|p| p.name_any())
        .find(|name| failover::switchover_refusal(name, primary, pods, &[]).is_none());
    // Unmanaged, a switchover cannot be coordinated: the primary is restarted as a StatefulSet would.
    match successor {
        Some(to) => Step::SwitchoverTo(to),
        None if wanted == 1 || unmanaged => Step::Replace(primary.to_string()),
        None => Step::Wait("an updated replica streaming from the primary, to switch over to".into()),
    }
}

/// Ready, staying, and (a replica of a managed database) streaming again: a
/// replica that is ready but not yet streaming does not count towards the
/// synchronous quorum, and replacing the next one then would stop commits.
fn in_service(pod: &Pod, primary: &str, unmanaged: bool) -> bool {
    let streaming = || instances::report(pod).is_some_and(|r| r.role == Role::Replica && r.streaming);
    pods::is_ready(pod)
        && pod.metadata.deletion_timestamp.is_none()
        && (unmanaged || pod.name_any() == primary || streaming())
}

fn ordinal(pod: &Pod) -> u32 {
    super::names::ordinal(&pod.name_any()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::instance::{ANNOTATION, InstanceReport};
    use k8s_openapi::api::apps::v1::{StatefulSetSpec, StatefulSetStatus};
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};

    fn statefulset(replicas: i32) -> StatefulSet {
        let mut sts = StatefulSet {
            spec: Some(StatefulSetSpec { replicas: Some(replicas), ..Default::default() }),
            status: Some(StatefulSetStatus {
                update_revision: Some("new".into()),
                observed_generation: Some(2),
                ..Default::default()
            }),
            ..Default::default()
        };
        sts.metadata.generation = Some(2);
        sts
    }

    fn pod(name: &str, revision: &str, role: Role, ready: bool) -> Pod {
        let report = InstanceReport {
            role,
            server_version: "15.18".into(),
            timeline: 1,
            lsn: "0/100".into(),
            received_lsn: None,
            streaming: role == Role::Replica,
            answering: None,
            replicas: vec![],
            unresponsive: false,
            fenced: false,
            synchronous_standby_names: None,
            rebuilt: None,
            held: false,
        };
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.metadata.labels = Some([(REVISION_LABEL.to_string(), revision.to_string())].into());
        pod.metadata.annotations =
            Some([(ANNOTATION.to_string(), serde_json::to_string(&report).expect("json"))].into());
        let condition = PodCondition {
            type_: "Ready".into(),
            status: if ready { "True" } else { "False" }.into(),
            ..Default::default()
        };
        pod.status =
            Some(PodStatus { phase: Some("Running".into()), conditions: Some(vec![condition]), ..Default::default() });
        pod
    }

    #[test]
    fn replicas_go_first_one_at_a_time_then_a_switchover_then_the_former_primary() {
        let sts = statefulset(3);
        let mut pods = vec![
            pod("db-0", "old", Role::Primary, true),
            pod("db-1", "old", Role::Replica, true),
            pod("db-2", "old", Role::Replica, true),
        ];
        assert_eq!(next_step(&sts, &pods, "db-0"), Step::Replace("db-2".into()));
        pods[2] = pod("db-2", "new", Role::Replica, false);
        assert!(matches!(next_step(&sts, &pods, "db-0"), Step::Wait(w) if w.contains("db-2")));
        // Ready but not streaming yet: not part of the quorum, so db-1 must wait.
        pods[2] = pod("db-2", "new", Role::Replica, true);
        let mut report = instances::report(&pods[2]).expect("report");
        report.streaming = false;
        let json = serde_json::to_string(&report).expect("json");
        pods[2].metadata.annotations = Some([(ANNOTATION.to_string(), json)].into());
        assert!(matches!(next_step(&sts, &pods, "db-0"), Step::Wait(w) if w.contains("db-2")));
        pods[2] = pod("db-2", "new", Role::Replica, true);
        assert_eq!(next_step(&sts, &pods, "db-0"), Step::Replace("db-1".into()));
        pods[1] = pod("db-1", "new", Role::Replica, true);
        assert_eq!(next_step(&sts, &pods, "db-0"), Step::SwitchoverTo("db-1".into()));
        // After the switchover db-0 is an outdated replica like any other.
        pods[0] = pod("db-0", "old", Role::Replica, true);
        assert_eq!(next_step(&sts, &pods, "db-1"), Step::Replace("db-0".into()));
        pods[0] = pod("db-0", "new", Role::Replica, true);
        assert_eq!(next_step(&sts, &pods, "db-1"), Step::Done);
    }

    #[test]
    fn a_single_instance_is_replaced_and_nothing_moves_before_the_controller_saw_the_template() {
        let pods = [pod("db-0", "old", Role::Primary, true)];
        assert_eq!(next_step(&statefulset(1), &pods, "db-0"), Step::Replace("db-0".into()));
        let mut behind = statefulset(1);
        behind.metadata.generation = Some(3);
        assert!(matches!(next_step(&behind, &pods, "db-0"), Step::Wait(_)));
        let missing = [pod("db-0", "old", Role::Primary, true)];
        assert!(matches!(next_step(&statefulset(2), &missing, "db-0"), Step::Wait(_)), "an instance is missing");
        // Nothing reports (no instance managers): the primary is restarted in place.
        let mut unmanaged = [pod("db-0", "old", Role::Primary, true), pod("db-1", "new", Role::Replica, true)];
        for pod in &mut unmanaged {
            pod.metadata.annotations = None;
        }
        assert_eq!(next_step(&statefulset(2), &unmanaged, "db-0"), Step::Replace("db-0".into()));
    }
}
