//! Which pod is the primary: Keelson's choice, not an ordinal. The choice is
//! recorded as the pods' role label (which `-rw` and `-ro` select, and which
//! each instance manager hands to its PostgreSQL) and in `status.currentPrimary`.
//!
//! While the primary serves, it stays. When its pod is gone, going, or its
//! PostgreSQL container is not running, the replicas are asked for their
//! positions at that moment (a request annotation their managers answer at
//! once), and the one that received the most WAL is promoted: with
//! synchronous replication to at least one replica, it holds every commit a
//! client saw acknowledged. A PostgreSQL that answered before and stopped
//! answering (hung) counts as lost too: its manager says so in its report.
//!
//! A switchover is the same path, begun by Keelson: the primary is stepped
//! down first (it shuts down cleanly, its replicas receive everything it
//! wrote), then the replica asked for wins among equals. Pure: the reconcile
//! does the I/O.

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
        _ if instances::report(pod).is_some_and(|r| r.unresponsive) => Some("its PostgreSQL stopped answering".into()),
        _ => None,
    }
}

/// Why `target` cannot take over from `primary` in a switchover, if it cannot:
/// it must be a ready replica of this database, streaming, answering.
pub fn switchover_refusal(target: &str, primary: &str, pods: &[Pod]) -> Option<String> {
    let Some(pod) = pods.iter().find(|p| p.name_any() == target) else {
        let names: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
        return Some(format!("{target} is not a pod of this database (its pods: {})", names.join(", ")));
    };
    if target == primary {
        return Some(format!("{target} is the primary already"));
    }
    let report = instances::report(pod);
    let healthy = lost(Some(pod)).is_none()
        && crate::runtime::pods::is_ready(pod)
        && report.as_ref().is_some_and(|r| r.role == Role::Replica && r.streaming);
    (!healthy).then(|| format!("{target} is not a healthy replica (it must be ready and streaming from {primary})"))
}

/// The answer `pod` gave to the position request `token`, if it gave it.
pub fn answer(pod: &Pod, token: &str) -> Option<InstanceReport> {
    instances::report(pod).filter(|r| r.answering.as_deref() == Some(token))
}

/// Where a failover or switchover stands.
#[derive(Debug, Default)]
pub struct Situation<'a> {
    /// The position request already sent, if any.
    pub asked: Option<&'a str>,
    /// A switchover stepped the primary down, for this reason.
    pub stepping_down: Option<&'a str>,
    /// A switchover's target: promoted when it received as much as any other.
    pub prefer: Option<&'a str>,
    /// Replicas that have not answered by now are taken for dead, and the
    /// best of those that did is promoted.
    pub waited_enough: bool,
}

pub fn decide(primary: &str, pods: &[Pod], situation: &Situation) -> Decision {
    let Situation { asked, stepping_down, prefer, waited_enough } = *situation;
    let current = pods.iter().find(|p| p.name_any() == primary);
    // A pod of that name without the role is a new one (the StatefulSet
    // replaced the primary's pod, or the database is starting): it serves
    // nothing until it is given a role, so a live replica takes over first.
    let unlabelled = current
        .filter(|p| p.labels().get(names::ROLE_LABEL).map(String::as_str) != Some(super::services::PRIMARY))
        .map(|_| "its pod was replaced".to_string());
    let stepped_down = stepping_down.map(str::to_string);
    let Some(why) = stepped_down.or_else(|| lost(current)).or(unlabelled) else {
        return Decision::Keep(primary.to_string());
    };
    let candidates = candidates(primary, pods);
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
    // The most WAL received; among equals, the preferred one, then the lowest name (a stable choice).
    let preferred = |name: &String| Some(name.as_str()) == prefer;
    let to = answers
        .iter()
        .max_by(|(a_name, a), (b_name, b)| {
            position(a).cmp(&position(b)).then(preferred(a_name).cmp(&preferred(b_name))).then(b_name.cmp(a_name))
        })
        .map(|(name, _)| name.clone())
        .unwrap_or_default();
    let positions = answers
        .iter()
        .map(|(name, r)| (name.clone(), r.received_lsn.clone().unwrap_or_else(|| r.lsn.clone())))
        .collect();
    Decision::Promote(Promotion { from: primary.to_string(), to, why, positions })
}

/// The replicas that could take over from `primary`: running pods, not
/// leaving, whose manager said they replicate. Each is asked for its position,
/// and a promotion waits for all of them (up to the time limit).
pub fn candidates<'a>(primary: &str, pods: &'a [Pod]) -> Vec<&'a Pod> {
    pods.iter()
        .filter(|p| p.name_any() != primary && lost(Some(p)).is_none())
        .filter(|p| pods_running(p) && instances::report(p).is_some_and(|r| r.role == Role::Replica))
        .collect()
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
            unresponsive: false,
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
        assert_eq!(decide("db-0", &pods, &Situation::default()), Decision::Keep("db-0".into()));
        // The StatefulSet's new pod of the same name has no role yet.
        let pods = [pod("db-0", Role::Primary, "0/500", None), pod("db-1", Role::Replica, "0/500", None)];
        assert!(
            matches!(decide("db-0", &pods, &Situation::default()), Decision::AskPositions { ref why, .. } if why == "its pod was replaced")
        );
        // Starting: no replica yet, so the first pod is given the role.
        assert!(matches!(decide("db-0", &pods[..1], &Situation::default()), Decision::NoCandidate { .. }));
    }

    #[test]
    fn a_lost_primary_is_replaced_by_the_replica_that_received_most_once_all_answered() {
        let pods = [pod("db-1", Role::Replica, "0/500", Some("t1")), pod("db-2", Role::Replica, "0/700", None)];
        // First the question, then waiting for db-2's answer.
        assert!(
            matches!(decide("db-0", &pods, &Situation::default()), Decision::AskPositions { ref ask, .. } if ask == &["db-1", "db-2"])
        );
        assert!(matches!(
            decide("db-0", &pods, &Situation { asked: Some("t1"), ..Default::default() }),
            Decision::AskPositions { .. }
        ));
        // db-2's old report said more, but only answers count: past the wait, db-1 is taken.
        let Decision::Promote(promotion) =
            decide("db-0", &pods, &Situation { asked: Some("t1"), waited_enough: true, ..Default::default() })
        else {
            panic!("no promotion")
        };
        assert_eq!(promotion.to, "db-1");
        let pods = [pod("db-1", Role::Replica, "0/500", Some("t1")), pod("db-2", Role::Replica, "1/0", Some("t1"))];
        let Decision::Promote(promotion) =
            decide("db-0", &pods, &Situation { asked: Some("t1"), ..Default::default() })
        else {
            panic!("no promotion")
        };
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
        assert!(matches!(
            decide("db-0", &pods, &Situation { asked: Some("t1"), ..Default::default() }),
            Decision::AskPositions { .. }
        ));
        let Decision::Promote(promotion) =
            decide("db-0", &pods, &Situation { asked: Some("t1"), waited_enough: true, ..Default::default() })
        else {
            panic!("no promotion")
        };
        assert_eq!(promotion.to, "db-1", "past the wait, the most advanced all the same");
    }

    #[test]
    fn a_switchover_steps_a_serving_primary_down_and_its_target_wins_among_equals() {
        let pods = [
            labelled(pod("db-0", Role::Primary, "0/900", None), "replica"),
            pod("db-1", Role::Replica, "0/900", Some("t1")),
            pod("db-2", Role::Replica, "0/900", Some("t1")),
        ];
        let situation = Situation {
            asked: Some("t1"),
            stepping_down: Some("switchover to db-2 requested"),
            prefer: Some("db-2"),
            waited_enough: false,
        };
        let Decision::Promote(promotion) = decide("db-0", &pods, &situation) else { panic!("no promotion") };
        assert_eq!((promotion.to.as_str(), promotion.why.as_str()), ("db-2", "switchover to db-2 requested"));
        // A target that received less does not win: nothing acknowledged may be lost.
        let behind = [pods[0].clone(), pod("db-1", Role::Replica, "0/A00", Some("t1")), pods[2].clone()];
        let Decision::Promote(promotion) = decide("db-0", &behind, &situation) else { panic!("no promotion") };
        assert_eq!(promotion.to, "db-1");
    }

    #[test]
    fn switchover_targets_must_be_streaming_replicas_of_this_database() {
        let pods = [
            labelled(pod("db-0", Role::Primary, "0/900", None), "primary"),
            pod("db-1", Role::Replica, "0/900", None),
            pod("db-2", Role::Replica, "0/900", None),
        ];
        let ready = |mut pod: Pod| {
            let condition = k8s_openapi::api::core::v1::PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            };
            if let Some(status) = pod.status.as_mut() {
                status.conditions = Some(vec![condition]);
            }
            pod
        };
        let pods = [pods[0].clone(), ready(pods[1].clone()), pods[2].clone()];
        assert_eq!(switchover_refusal("db-1", "db-0", &pods), None);
        assert!(switchover_refusal("db-2", "db-0", &pods).is_some_and(|r| r.contains("not a healthy replica")));
        assert!(switchover_refusal("db-0", "db-0", &pods).is_some_and(|r| r.contains("primary already")));
        assert!(switchover_refusal("other-0", "db-0", &pods).is_some_and(|r| r.contains("not a pod of this database")));
    }

    #[test]
    fn a_primary_that_stopped_answering_is_lost() {
        let mut hung = labelled(pod("db-0", Role::Primary, "0/900", None), "primary");
        let mut report = instances::report(&hung).expect("report");
        report.unresponsive = true;
        hung.metadata.annotations =
            Some([(ANNOTATION.to_string(), serde_json::to_string(&report).expect("json"))].into());
        let pods = [hung, pod("db-1", Role::Replica, "0/900", None)];
        assert!(matches!(
            decide("db-0", &pods, &Situation::default()),
            Decision::AskPositions { ref why, .. } if why == "its PostgreSQL stopped answering"
        ));
    }

    #[test]
    fn a_leaving_primary_with_no_live_replica_has_no_successor() {
        let mut leaving = pod("db-0", Role::Primary, "0/500", None);
        leaving.metadata.deletion_timestamp = Some(crate::runtime::status::now());
        let mut dead = pod("db-1", Role::Replica, "0/500", None);
        dead.status = None;
        let decision = decide("db-0", &[leaving, dead], &Situation::default());
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
