//! Which pod is the primary: Keelson's choice, not an ordinal. The choice is
//! recorded as the pods' role label (which `-rw` and `-ro` select, and which
//! each instance manager hands to its PostgreSQL) and in `status.currentPrimary`.
//!
//! While the primary serves, it stays. When its pod is gone, going, or its
//! PostgreSQL container is not running, the replicas are asked for their
//! positions at that moment (a request annotation their managers answer at
//! once), and the one that received the most WAL is promoted: with
//! synchronous replication to at least one replica, it holds every commit a
//! client saw acknowledged. Pure: the reconcile does the I/O.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::instances;
use super::names;
use crate::api::instance::{InstanceReport, Role};

/// A WAL position (`X/Y` in hex) as a number.
pub fn parse_lsn(lsn: &str) -> Option<u64> {
    let (high, low) = lsn.split_once('/')?;
    Some((u64::from_str_radix(high, 16).ok()? << 32) | u64::from_str_radix(low, 16).ok()?)
}

/// What the reconcile should do about the primary.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// This pod is (or is to be) the primary; nothing else to do.
    Keep(String),
    /// The primary is lost; these replicas must report their positions now
    /// (the token is what their answer must carry).
    AskPositions { lost: String, why: String, ask: Vec<String>, token: String },
    /// Promote `to`: every live replica answered, `to` received the most.
    Promote(Promotion),
    /// The primary is lost and no replica can take over (none live).
    NoCandidate { lost: String, why: String },
}

#[derive(Debug, PartialEq, Eq)]
pub struct Promotion {
    pub from: String,
    pub to: String,
    pub why: String,
    /// Each candidate's received position, as it reported it.
    pub positions: Vec<(String, String)>,
}

/// The primary on record: the pod labelled so, else what status says, else ordinal 0.
pub fn recorded_primary(pods: &[Pod], status_primary: Option<&str>, statefulset: &str) -> String {
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .find(|p| p.labels().get(names::ROLE_LABEL).map(String::as_str) == Some(super::services::PRIMARY))
        .map(|p| p.name_any())
        .or_else(|| status_primary.map(str::to_string))
        .unwrap_or_else(|| format!("{statefulset}-0"))
}

/// Why `pod` cannot serve as the primary, if it cannot.
fn lost(pod: Option<&Pod>) -> Option<String> {
    let Some(pod) = pod else { return Some("its pod is gone".into()) };
    if pod.metadata.deletion_timestamp.is_some() {
        return Some("its pod is being deleted".into());
    }
    let postgres = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|statuses| statuses.iter().find(|c| c.name == "postgres"));
    // A container that ran before and is not running now has died (a fresh pod has not started yet).
    match postgres {
        Some(c) if c.restart_count > 0 && c.state.as_ref().and_then(|s| s.running.as_ref()).is_none() => {
            Some("its PostgreSQL container stopped".into())
        }
        _ => None,
    }
}

/// The answer `pod` gave to the position request `token`, if it gave it.
pub fn answer(pod: &Pod, token: &str) -> Option<InstanceReport> {
    instances::report(pod).filter(|r| r.answering.as_deref() == Some(token))
}

/// `asked`: the position request already sent in this failover, if any;
/// `waited_enough`: replicas that have not answered it by now are taken for
/// dead, and the best of those that did is promoted.
pub fn decide(primary: &str, pods: &[Pod], asked: Option<&str>, waited_enough: bool) -> Decision {
    let current = pods.iter().find(|p| p.name_any() == primary);
    // A pod of that name without the role is a new one (the StatefulSet
    // replaced the primary's pod, or the database is starting): it serves
    // nothing until it is given a role, so a live replica takes over first.
    let unlabelled = current
        .filter(|p| p.labels().get(names::ROLE_LABEL).map(String::as_str) != Some(super::services::PRIMARY))
        .map(|_| "its pod was replaced".to_string());
    let Some(why) = lost(current).or(unlabelled) else { return Decision::Keep(primary.to_string()) };
    // Live replicas: running pods, not leaving, whose manager said they replicate.
    let candidates: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.name_any() != primary && lost(Some(p)).is_none())
        .filter(|p| pods_running(p) && instances::report(p).is_some_and(|r| r.role == Role::Replica))
        .collect();
    if candidates.is_empty() {
        return Decision::NoCandidate { lost: primary.to_string(), why };
    }
    let names: Vec<String> = candidates.iter().map(|p| p.name_any()).collect();
    let Some(token) = asked else {
        return Decision::AskPositions { lost: primary.to_string(), why, token: String::new(), ask: names };
    };
    // An answer counts once the replica no longer streams: while it does, the
    // old primary still runs (a deleted pod's processes outlive its object for
    // a moment) and may send more WAL, so the positions are not final yet.
    let answers: Vec<(String, InstanceReport)> = candidates
        .iter()
        .filter_map(|p| Some((p.name_any(), answer(p, token)?)))
        .filter(|(_, report)| !report.streaming || waited_enough)
        .collect();
    if answers.is_empty() || (answers.len() < candidates.len() && !waited_enough) {
        return Decision::AskPositions { lost: primary.to_string(), why, token: token.to_string(), ask: names };
    }
    let position = |r: &InstanceReport| r.received_lsn.as_deref().or(Some(&r.lsn)).and_then(parse_lsn).unwrap_or(0);
    // The most WAL received; among equals, the lowest name (a stable choice).
    let to = answers
        .iter()
        .max_by(|(a_name, a), (b_name, b)| position(a).cmp(&position(b)).then(b_name.cmp(a_name)))
        .map(|(name, _)| name.clone())
        .unwrap_or_default();
    let positions = answers
        .iter()
        .map(|(name, r)| (name.clone(), r.received_lsn.clone().unwrap_or_else(|| r.lsn.clone())))
        .collect();
    Decision::Promote(Promotion { from: primary.to_string(), to, why, positions })
}

fn pods_running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::instance::ANNOTATION;
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateRunning, ContainerStatus, PodStatus};

    fn pod(name: &str, role: Role, received: &str, answering: Option<&str>) -> Pod {
        let report = InstanceReport {
            role,
            server_version: "15.18".into(),
            timeline: 1,
            lsn: received.into(),
            received_lsn: (role == Role::Replica).then(|| received.to_string()),
            // An answer comes once the old primary is gone: no longer streaming.
            streaming: role == Role::Replica && answering.is_none(),
            answering: answering.map(str::to_string),
            replicas: vec![],
        };
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.metadata.annotations =
            Some([(ANNOTATION.to_string(), serde_json::to_string(&report).expect("json"))].into());
        pod.status = Some(PodStatus {
            phase: Some("Running".into()),
            container_statuses: Some(vec![ContainerStatus {
                name: "postgres".into(),
                state: Some(ContainerState { running: Some(ContainerStateRunning::default()), ..Default::default() }),
                ..Default::default()
            }]),
            ..Default::default()
        });
        pod
    }

    #[test]
    fn lsns_compare_as_numbers() {
        assert!(parse_lsn("1/0").expect("lsn") > parse_lsn("0/FFFFFFFF").expect("lsn"));
        assert_eq!(parse_lsn("0/3000148"), Some(0x3000148));
        assert_eq!(parse_lsn("nonsense"), None);
    }

    fn labelled(mut pod: Pod, role: &str) -> Pod {
        pod.metadata.labels = Some([(names::ROLE_LABEL.to_string(), role.to_string())].into());
        pod
    }

    #[test]
    fn a_serving_primary_stays_and_a_replaced_one_is_lost() {
        let pods =
            [labelled(pod("db-0", Role::Primary, "0/500", None), "primary"), pod("db-1", Role::Replica, "0/500", None)];
        assert_eq!(decide("db-0", &pods, None, false), Decision::Keep("db-0".into()));
        // The StatefulSet's new pod of the same name has no role yet.
        let pods = [pod("db-0", Role::Primary, "0/500", None), pod("db-1", Role::Replica, "0/500", None)];
        assert!(
            matches!(decide("db-0", &pods, None, false), Decision::AskPositions { ref why, .. } if why == "its pod was replaced")
        );
        // Starting: no replica yet, so the first pod is given the role.
        assert!(matches!(decide("db-0", &pods[..1], None, false), Decision::NoCandidate { .. }));
    }

    #[test]
    fn a_lost_primary_is_replaced_by_the_replica_that_received_most_once_all_answered() {
        let pods = [pod("db-1", Role::Replica, "0/500", Some("t1")), pod("db-2", Role::Replica, "0/700", None)];
        // First the question, then waiting for db-2's answer.
        assert!(
            matches!(decide("db-0", &pods, None, false), Decision::AskPositions { ref ask, .. } if ask == &["db-1", "db-2"])
        );
        assert!(matches!(decide("db-0", &pods, Some("t1"), false), Decision::AskPositions { .. }));
        // db-2's old report said more, but only answers count: past the wait, db-1 is taken.
        let Decision::Promote(promotion) = decide("db-0", &pods, Some("t1"), true) else { panic!("no promotion") };
        assert_eq!(promotion.to, "db-1");
        let pods = [pod("db-1", Role::Replica, "0/500", Some("t1")), pod("db-2", Role::Replica, "1/0", Some("t1"))];
        let Decision::Promote(promotion) = decide("db-0", &pods, Some("t1"), false) else { panic!("no promotion") };
        assert_eq!(
            (promotion.from.as_str(), promotion.to.as_str(), promotion.why.as_str()),
            ("db-0", "db-2", "its pod is gone")
        );
        assert_eq!(promotion.positions, [("db-1".to_string(), "0/500".to_string()), ("db-2".into(), "1/0".into())]);
    }

    #[test]
    fn positions_count_only_once_the_old_primary_stopped_sending() {
        let mut still_streaming = pod("db-1", Role::Replica, "0/900", Some("t1"));
        let mut report = instances::report(&still_streaming).expect("report");
        report.streaming = true;
        still_streaming.metadata.annotations =
            Some([(ANNOTATION.to_string(), serde_json::to_string(&report).expect("json"))].into());
        let pods = [still_streaming, pod("db-2", Role::Replica, "0/500", Some("t1"))];
        assert!(matches!(decide("db-0", &pods, Some("t1"), false), Decision::AskPositions { .. }));
        let Decision::Promote(promotion) = decide("db-0", &pods, Some("t1"), true) else { panic!("no promotion") };
        assert_eq!(promotion.to, "db-1", "past the wait, the most advanced all the same");
    }

    #[test]
    fn a_leaving_primary_with_no_live_replica_has_no_successor() {
        let mut leaving = pod("db-0", Role::Primary, "0/500", None);
        leaving.metadata.deletion_timestamp = Some(crate::runtime::status::now());
        let mut dead = pod("db-1", Role::Replica, "0/500", None);
        dead.status = None;
        let decision = decide("db-0", &[leaving, dead], None, false);
        assert_eq!(decision, Decision::NoCandidate { lost: "db-0".into(), why: "its pod is being deleted".into() });
    }

    #[test]
    fn the_primary_on_record_is_the_labelled_pod_then_status_then_ordinal_zero() {
        let mut labelled = pod("db-1", Role::Primary, "0/1", None);
        labelled.metadata.labels = Some([(names::ROLE_LABEL.to_string(), "primary".to_string())].into());
        assert_eq!(recorded_primary(&[labelled], Some("db-2"), "db"), "db-1");
        assert_eq!(recorded_primary(&[], Some("db-2"), "db"), "db-2");
        assert_eq!(recorded_primary(&[], None, "db"), "db-0");
    }
}
