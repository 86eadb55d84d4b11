//! Which pod is the primary: Keelson's choice, not an ordinal. A new choice is
//! recorded first in `status.currentPrimary` (with its pod's uid), then as the
//! pods' role label (which `-rw` and `-ro` select, and which each instance
//! manager hands to its PostgreSQL).
//!
//! While the primary serves, it stays. A primary whose pod is being deleted
//! still runs until the kubelet stops it (SIGTERM: a fast shutdown that ends
//! every session and sends its last WAL to the replicas): Keelson waits for
//! its PostgreSQL to stop, or for the deletion's deadline to pass. When its
//! pod is gone, its PostgreSQL stopped or hung, or its lease expired (cut
//! off), the replicas are told to hold: they stop streaming and report their
//! final positions (a request annotation their managers answer at once). Once
//! every live replica has, the old primary can acknowledge nothing more
//! (synchronous replication to named standbys), and the one that received the
//! most WAL holds every commit a client saw acknowledged: it is promoted. A
//! replica that does not answer blocks the promotion (quorum) unless forced.
//!
//! A switchover is the same path, begun by Keelson: the primary is stepped
//! down first (it shuts down cleanly, its replicas receive everything it
//! wrote), then the replica asked for wins among equals. Pure: the reconcile
//! does the I/O.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::api::instance::{InstanceReport, LEASE_EXPIRES_AFTER, Role};
use crate::mydatabase::instances;
use crate::mydatabase::names;

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
    /// The primary's pod is being deleted while its PostgreSQL still runs:
    /// no promotion until it has stopped (look again soon).
    AwaitStop { primary: String, why: String },
    /// The primary is lost; these replicas must report their positions now
    /// (the token is what their answer must carry).
    AskPositions { lost: String, why: String, ask: Vec<String>, token: String },
    /// Promote `to`: every live replica answered, `to` received the most.
    Promote(Promotion),
    /// The primary is lost, but replicas that may hold the last acknowledged
    /// commit have not given a final position: no promotion (quorum), unless
    /// forced. The request stands for the pods in `ask`.
    Blocked { lost: String, why: String, waiting_for: Vec<String>, ask: Vec<String> },
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

/// The primary on record when status has no uid-stamped choice (a database
/// from before those records): the pod labelled so, else what status says, else ordinal 0.
pub fn recorded_primary(pods: &[Pod], status_primary: Option<&str>, statefulset: &str) -> String {
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .find(|p| p.labels().get(names::ROLE_LABEL).map(String::as_str) == Some(crate::mydatabase::services::PRIMARY))
        .map(|p| p.name_any())
        .or_else(|| status_primary.map(str::to_string))
        .unwrap_or_else(|| format!("{statefulset}-0"))
}

/// Why `pod` cannot serve as the primary, if it cannot. A pod being deleted
/// whose PostgreSQL still runs is not lost yet (see [`Stopping`]).
fn lost(pod: Option<&Pod>, now: Option<Timestamp>) -> Option<String> {
    let Some(pod) = pod else { return Some("its pod is gone".into()) };
    if let Some(deleted) = &pod.metadata.deletion_timestamp {
        // For a pod, the deletion timestamp is the end of its grace period.
        let deadline_passed = now.is_some_and(|now| now >= deleted.0);
        return match (postgres_running(pod), deadline_passed) {
            (false, _) => Some("its pod is being deleted and its PostgreSQL stopped".into()),
            (true, true) => Some("its pod is being deleted and its grace period is over".into()),
            (true, false) => None,
        };
    }
    let postgres = postgres_status(pod);
    // A container that ran before and is not running now has died (a fresh pod has not started yet).
    match postgres {
        Some(c) if c.restart_count > 0 && c.state.as_ref().and_then(|s| s.running.as_ref()).is_none() => {
            Some("its PostgreSQL container stopped".into())
        }
        _ if instances::report(pod).is_some_and(|r| r.unresponsive) => Some("its PostgreSQL stopped answering".into()),
        _ => None,
    }
}

fn labelled_primary(pod: &Pod) -> bool {
    pod.labels().get(names::ROLE_LABEL).map(String::as_str) == Some(crate::mydatabase::services::PRIMARY)
}

fn postgres_status(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::ContainerStatus> {
    pod.status.as_ref()?.container_statuses.as_ref()?.iter().find(|c| c.name == "postgres")
}

fn postgres_running(pod: &Pod) -> bool {
    postgres_status(pod).and_then(|c| c.state.as_ref()).is_some_and(|s| s.running.is_some())
}

/// Why the primary's pod must be waited for: it is being deleted and its
/// PostgreSQL still runs (it may still acknowledge commits).
fn stopping(pod: Option<&Pod>) -> Option<String> {
    let pod = pod?;
    (pod.metadata.deletion_timestamp.is_some() && postgres_running(pod))
        .then(|| "its pod is being deleted; waiting for its PostgreSQL to stop before a promotion".into())
}

/// Why `target` cannot take over from `primary` in a switchover, if it cannot:
/// it must be a ready replica of this database, streaming, answering; and
/// every named standby must stream too (a promotion waits for each of them).
pub fn switchover_refusal(target: &str, primary: &str, pods: &[Pod], standbys: &[String]) -> Option<String> {
    let Some(pod) = pods.iter().find(|p| p.name_any() == target) else {
        let names: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
        return Some(format!("{target} is not a pod of this database (its pods: {})", names.join(", ")));
    };
    if target == primary {
        return Some(format!("{target} is the primary already"));
    }
    let report = instances::report(pod);
    let healthy = pod.metadata.deletion_timestamp.is_none()
        && lost(Some(pod), None).is_none()
        && crate::runtime::pods::is_ready(pod)
        && report.as_ref().is_some_and(|r| r.role == Role::Replica && r.streaming);
    if !healthy {
        return Some(format!("{target} is not a healthy replica (it must be ready and streaming from {primary})"));
    }
    let streams = |name: &String| {
        pods.iter().find(|p| p.name_any() == *name).and_then(instances::report).is_some_and(|r| r.streaming)
    };
    let down: Vec<&String> = standbys.iter().filter(|name| *name != primary && !streams(name)).collect();
    (!down.is_empty()).then(|| {
        let down: Vec<&str> = down.iter().map(|name| name.as_str()).collect();
        format!(
            "{} do not stream from {primary}: a promotion waits for every synchronous standby, which may hold the \
             last commits; bring them back first",
            down.join(", ")
        )
    })
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
    /// The replicas were told to hold (stop streaming) long enough ago that
    /// any of them still without a final answer is not going to give one soon.
    pub waited_enough: bool,
    /// A person forced the failover: past the wait, the best of the replicas
    /// that answered is promoted even though others did not.
    pub forced: bool,
    /// The uid of the pod this process chose as primary: a pod of that name
    /// without the role is that same pod whose label write failed (label it
    /// again), not a replacement. None: not known (this process did not choose).
    pub chosen_uid: Option<&'a str>,
    /// The primary's lease has not been renewed for `LEASE_EXPIRES_AFTER`: it
    /// is cut off (and has fenced itself), or its node is gone.
    pub lease_expired: bool,
    /// The time, for a deleted pod's grace period; None: it has not passed.
    pub now: Option<Timestamp>,
    /// The lost primary's synchronous standbys: any of them may hold the
    /// last acknowledged commit, so each must give a final position, even one
    /// that is down now (it answers once it runs again), unless forced.
    pub standbys: &'a [String],
    /// The lost primary acknowledged commits no standby confirmed
    /// (`status.asynchronous`): it alone may hold them, so it keeps the role
    /// (its pod replaced on its data, cut off) or is waited for, unless forced.
    pub asynchronous: bool,
    /// The lost primary's data volume is older than that record: its pod, back, has those commits.
    pub data_from_before: bool,
    /// No primary was ever recorded for this MyDatabase, but volumes from
    /// before it hold data (it was re-created over Retained volumes): the
    /// most advanced of them becomes the primary, as in a failover, and each
    /// instance in `standbys` (those volumes) must answer.
    pub bootstrap: bool,
}

/// Why a re-created database elects its primary.
pub const BOOTSTRAP: &str = "no primary on record, and volumes from before this MyDatabase hold data";

pub fn decide(primary: &str, pods: &[Pod], situation: &Situation) -> Decision {
    let Situation {
        asked,
        stepping_down,
        prefer,
        waited_enough,
        forced,
        chosen_uid,
        lease_expired,
        now,
        standbys,
        asynchronous,
        data_from_before,
        bootstrap,
    } = *situation;
    let current = pods.iter().find(|p| p.name_any() == primary);
    // A pod of that name without the role is a new one (the StatefulSet
    // replaced the primary's pod, or the database is starting): it serves
    // nothing until it is given a role, so a live replica takes over first.
    let replaced = |p: &&Pod| chosen_uid.is_none_or(|uid| p.metadata.uid.as_deref() != Some(uid));
    let unlabelled =
        current.filter(|p| !labelled_primary(p)).filter(replaced).map(|_| "its pod was replaced".to_string());
    let stepped_down = stepping_down.map(str::to_string);
    let expired = (lease_expired && current.is_some()).then(|| {
        format!(
            "its lease was not renewed for {}s (its node or its instance manager is cut off)",
            LEASE_EXPIRES_AFTER.as_secs()
        )
    });
    let elect = bootstrap.then(|| BOOTSTRAP.to_string());
    let Some(why) = elect.or(stepped_down).or_else(|| lost(current, now)).or(unlabelled).or(expired) else {
        if let Some(why) = stopping(current) {
            return Decision::AwaitStop { primary: primary.to_string(), why };
        }
        return Decision::Keep(primary.to_string());
    };
    if asynchronous && stepping_down.is_none() && !bootstrap && !forced {
        // Its pod is here on its data and runs (replaced, or its lease expired): the role stays.
        // On a new volume it would start empty: wait (or be forced).
        let here = current.is_some_and(|p| p.metadata.deletion_timestamp.is_none()) && lost(current, now).is_none();
        if here && data_from_before {
            return Decision::Keep(primary.to_string());
        }
        return Decision::Blocked {
            lost: primary.to_string(),
            why,
            waiting_for: vec![primary.to_string()],
            ask: vec![],
        };
    }
    let candidates = candidates(primary, pods);
    // Electing, nobody runs before it is asked (and held): ask rather than give up.
    if candidates.is_empty() && !bootstrap {
        return Decision::NoCandidate { lost: primary.to_string(), why };
    }
    // Who must give a final position: every replica that could take over,
    // and every standby the lost primary named, running or not.
    let mut names: Vec<String> = candidates.iter().map(|p| p.name_any()).collect();
    for standby in standbys.iter().filter(|name| *name != primary) {
        if !names.contains(standby) {
            names.push(standby.clone());
        }
    }
    names.sort();
    // Asked: those whose pods exist (a replacement is asked when it appears).
    let ask: Vec<String> = names
        .iter()
        .filter(|name| pods.iter().any(|p| p.name_any() == **name && p.metadata.deletion_timestamp.is_none()))
        .cloned()
        .collect();
    let Some(token) = asked else {
        return Decision::AskPositions { lost: primary.to_string(), why, token: String::new(), ask };
    };
    // An answer counts once the replica holds (no upstream) and no longer
    // streams: while it could stream, the old primary may still run (a deleted pod's processes outlive its object,
    // a hung postmaster's backends go on committing, a partitioned node keeps
    // serving its own clients) and have commits confirmed by it. A replica
    // told to hold stops streaming; once every replica that could confirm a
    // commit has, the old primary can acknowledge nothing more (synchronous
    // replication), and the most advanced of them holds every commit it did.
    let answers: Vec<(String, InstanceReport)> = pods
        .iter()
        .filter(|p| names.contains(&p.name_any()) && p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| Some((p.name_any(), answer(p, token)?)))
        .filter(|(_, report)| report.held && !report.streaming)
        .collect();
    let waiting_for: Vec<String> =
        names.iter().filter(|name| !answers.iter().any(|(answered, _)| answered == *name)).cloned().collect();
    let overridden = waited_enough && forced && !answers.is_empty();
    if !waiting_for.is_empty() && !overridden {
        if waited_enough {
            return Decision::Blocked { lost: primary.to_string(), why, waiting_for, ask };
        }
        return Decision::AskPositions { lost: primary.to_string(), why, token: token.to_string(), ask };
    }
    // Timeline first (a replica that followed a newer primary holds its history), then WAL received.
    let position =
        |r: &InstanceReport| (r.timeline, r.received_lsn.as_deref().or(Some(&r.lsn)).and_then(parse_lsn).unwrap_or(0));
    let most = answers.iter().map(|(_, r)| position(r)).max();
    // Only a replica that runs can take over; one that answered and stopped since holds what it held.
    let promotable = |name: &String| candidates.iter().any(|p| p.name_any() == *name);
    // The most advanced; among equals, the preferred one, then the lowest name (a stable choice).
    let preferred = |name: &String| Some(name.as_str()) == prefer;
    let to = answers
        .iter()
        .filter(|(name, r)| promotable(name) && (overridden || Some(position(r)) == most))
        .max_by(|(a_name, a), (b_name, b)| {
            position(a).cmp(&position(b)).then(preferred(a_name).cmp(&preferred(b_name))).then(b_name.cmp(a_name))
        })
        .map(|(name, _)| name.clone());
    let Some(to) = to else {
        // The most advanced answered but cannot take over now (it stopped): wait for it.
        let waiting_for: Vec<String> =
            answers.iter().filter(|(_, r)| Some(position(r)) == most).map(|(name, _)| name.clone()).collect();
        if waited_enough {
            return Decision::Blocked { lost: primary.to_string(), why, waiting_for, ask };
        }
        return Decision::AskPositions { lost: primary.to_string(), why, token: token.to_string(), ask };
    };
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
        .filter(|p| p.name_any() != primary && p.metadata.deletion_timestamp.is_none() && lost(Some(p), None).is_none())
        .filter(|p| pods_running(p) && instances::report(p).is_some_and(|r| r.role == Role::Replica))
        .collect()
}

fn pods_running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::instance::ANNOTATION;
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateRunning, ContainerStatus, PodStatus};

    pub(crate) fn pod(name: &str, role: Role, received: &str, answering: Option<&str>) -> Pod {
        let report = InstanceReport {
            role,
            server_version: "15.18".into(),
            timeline: 1,
            lsn: received.into(),
            received_lsn: (role == Role::Replica).then(|| received.to_string()),
            // An answer comes once the old primary is gone: held, no longer streaming.
            streaming: role == Role::Replica && answering.is_none(),
            held: role == Role::Replica && answering.is_some(),
            answering: answering.map(str::to_string),
            replicas: vec![],
            unresponsive: false,
            fenced: false,
            synchronous_standby_names: None,
            rebuilt: None,
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

    pub(crate) fn labelled(mut pod: Pod, role: &str) -> Pod {
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
        // db-2 may hold the last acknowledged commit: past the wait, no promotion without it (quorum).
        assert_eq!(
            decide("db-0", &pods, &Situation { asked: Some("t1"), waited_enough: true, ..Default::default() }),
            Decision::Blocked {
                lost: "db-0".into(),
                why: "its pod is gone".into(),
                waiting_for: vec!["db-2".into()],
                ask: vec!["db-1".into(), "db-2".into()]
            }
        );
        // Forced by a person: db-2's old report said more, but only answers count, so db-1 is taken.
        let forced = Situation { asked: Some("t1"), waited_enough: true, forced: true, ..Default::default() };
        let Decision::Promote(promotion) = decide("db-0", &pods, &forced) else { panic!("no promotion") };
        assert_eq!(promotion.to, "db-1");
        // Forcing does not skip the wait.
        assert!(matches!(
            decide("db-0", &pods, &Situation { waited_enough: false, ..forced }),
            Decision::AskPositions { .. }
        ));
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
        // Past the wait too: a streaming replica may still confirm the old primary's commits.
        assert!(matches!(
            decide("db-0", &pods, &Situation { asked: Some("t1"), waited_enough: true, ..Default::default() }),
            Decision::Blocked { ref waiting_for, .. } if waiting_for == &["db-1"]
        ));
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
            ..Default::default()
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
        let none: [String; 0] = [];
        assert_eq!(switchover_refusal("db-1", "db-0", &pods, &none), None);
        assert!(switchover_refusal("db-2", "db-0", &pods, &none).is_some_and(|r| r.contains("not a healthy replica")));
        assert!(switchover_refusal("db-0", "db-0", &pods, &none).is_some_and(|r| r.contains("primary already")));
        assert!(
            switchover_refusal("other-0", "db-0", &pods, &none)
                .is_some_and(|r| r.contains("not a pod of this database"))
        );
        // A named standby that does not stream would have to answer before any promotion: refused up front.
        let standbys = ["db-1".to_string(), "db-2".to_string(), "db-3".to_string()];
        assert!(
            switchover_refusal("db-1", "db-0", &pods, &standbys).is_some_and(|r| r.starts_with("db-3 do not stream")),
            "{:?}",
            switchover_refusal("db-1", "db-0", &pods, &standbys)
        );
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
        stop_postgres(&mut leaving);
        let mut dead = pod("db-1", Role::Replica, "0/500", None);
        dead.status = None;
        let decision = decide("db-0", &[leaving, dead], &Situation::default());
        assert_eq!(
            decision,
            Decision::NoCandidate {
                lost: "db-0".into(),
                why: "its pod is being deleted and its PostgreSQL stopped".into()
            }
        );
    }

    fn stop_postgres(pod: &mut Pod) {
        for status in pod.status.iter_mut().flat_map(|s| s.container_statuses.iter_mut().flatten()) {
            status.state = Some(ContainerState {
                terminated: Some(k8s_openapi::api::core::v1::ContainerStateTerminated::default()),
                ..Default::default()
            });
        }
    }

    #[test]
    fn a_primary_being_deleted_is_waited_for_until_its_postgres_stops_or_its_grace_period_ends() {
        let mut leaving = labelled(pod("db-0", Role::Primary, "0/500", None), "primary");
        let grace_ends = Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(30);
        leaving.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(grace_ends));
        let replicas = [pod("db-1", Role::Replica, "0/500", None), pod("db-2", Role::Replica, "0/400", None)];
        let with = |primary: &Pod| [vec![primary.clone()], replicas.to_vec()].concat();
        // Still running, within its grace period: it may acknowledge commits, so no promotion.
        let during = Situation { now: Some(Timestamp::now()), ..Default::default() };
        assert!(
            matches!(decide("db-0", &with(&leaving), &during), Decision::AwaitStop { ref primary, .. } if primary == "db-0")
        );
        // Past its grace period (its node may be unreachable): lost.
        let after = Situation { now: Some(grace_ends), ..Default::default() };
        assert!(matches!(
            decide("db-0", &with(&leaving), &after),
            Decision::AskPositions { ref why, .. } if why == "its pod is being deleted and its grace period is over"
        ));
        // Its PostgreSQL stopped (the kubelet's SIGTERM: a fast shutdown): lost, the replicas are asked.
        stop_postgres(&mut leaving);
        assert!(matches!(
            decide("db-0", &with(&leaving), &during),
            Decision::AskPositions { ref ask, .. } if ask == &["db-1", "db-2"]
        ));
    }

    #[test]
    fn streaming_answers_never_count_and_held_ones_do() {
        // A hung primary: fenced (relabelled a replica), its report still says primary.
        let mut hung = labelled(pod("db-0", Role::Primary, "0/900", None), "replica");
        let mut report = instances::report(&hung).expect("report");
        report.unresponsive = true;
        hung.metadata.annotations =
            Some([(ANNOTATION.to_string(), serde_json::to_string(&report).expect("json"))].into());
        // Both answered, still streaming from it (its backends go on committing).
        let streaming = |name: &str, lsn: &str, streaming: bool| {
            let mut replica = pod(name, Role::Replica, lsn, Some("t1"));
            let mut report = instances::report(&replica).expect("report");
            report.streaming = streaming;
            report.held = !streaming;
            replica.metadata.annotations =
                Some([(ANNOTATION.to_string(), serde_json::to_string(&report).expect("json"))].into());
            replica
        };
        let before_hold = [hung.clone(), streaming("db-1", "0/900", true), streaming("db-2", "0/880", true)];
        let waiting = Situation { asked: Some("t1"), ..Default::default() };
        assert!(matches!(decide("db-0", &before_hold, &waiting), Decision::AskPositions { .. }));
        // Holding, they stopped streaming: their positions are final, the old primary confirms nothing more.
        let held = [hung, streaming("db-1", "0/900", false), streaming("db-2", "0/880", false)];
        assert!(matches!(decide("db-0", &held, &waiting), Decision::Promote(ref p) if p.to == "db-1"));
    }

    #[test]
    fn a_primary_whose_lease_expired_is_lost_though_its_pod_looks_fine() {
        // A partitioned or powered-off node: the pod still says Running, its report is the last it sent.
        let pods =
            [labelled(pod("db-0", Role::Primary, "0/500", None), "primary"), pod("db-1", Role::Replica, "0/500", None)];
        assert_eq!(decide("db-0", &pods, &Situation::default()), Decision::Keep("db-0".into()));
        let expired = Situation { lease_expired: true, ..Default::default() };
        assert!(matches!(
            decide("db-0", &pods, &expired),
            Decision::AskPositions { ref why, .. } if why.starts_with("its lease was not renewed")
        ));
    }

    #[test]
    fn a_primary_that_acknowledged_alone_keeps_its_role_or_is_waited_for_unless_forced() {
        let asynchronous = Situation { asynchronous: true, data_from_before: true, ..Default::default() };
        // Its pod replaced (no label yet) or its lease expired: its data takes the role again.
        let pods = [pod("db-0", Role::Primary, "0/500", None), pod("db-1", Role::Replica, "0/400", None)];
        assert_eq!(decide("db-0", &pods, &asynchronous), Decision::Keep("db-0".into()));
        // ... unless its volume is newer than the record (lost and made anew: it would start empty).
        let new_volume = Situation { data_from_before: false, ..asynchronous };
        assert!(
            matches!(decide("db-0", &pods, &new_volume), Decision::Blocked { ref waiting_for, .. } if waiting_for == &["db-0"])
        );
        let labelled_pods =
            [labelled(pod("db-0", Role::Primary, "0/500", None), "primary"), pod("db-1", Role::Replica, "0/400", None)];
        let expired = Situation { lease_expired: true, ..asynchronous };
        assert_eq!(decide("db-0", &labelled_pods, &expired), Decision::Keep("db-0".into()));
        // Gone, or its PostgreSQL stopped: wait for it; no replica is asked or held.
        let blocked = decide("db-0", &pods[1..], &asynchronous);
        assert_eq!(
            blocked,
            Decision::Blocked {
                lost: "db-0".into(),
                why: "its pod is gone".into(),
                waiting_for: vec!["db-0".into()],
                ask: vec![]
            }
        );
        // A switchover hands everything over first (a clean shutdown): not blocked.
        let stepping = Situation { stepping_down: Some("switchover"), ..asynchronous };
        assert!(matches!(decide("db-0", &labelled_pods, &stepping), Decision::AskPositions { .. }));
        // Forced: the best replica, once it answered and the wait passed.
        let forced = Situation { forced: true, asked: Some("t1"), waited_enough: true, ..asynchronous };
        let answered = [pod("db-1", Role::Replica, "0/400", Some("t1"))];
        assert!(matches!(decide("db-0", &answered, &forced), Decision::Promote(ref p) if p.to == "db-1"));
    }

    #[test]
    fn a_chosen_primary_whose_label_write_failed_is_kept_not_failed_over() {
        let mut chosen = pod("db-1", Role::Replica, "0/500", None);
        chosen.metadata.uid = Some("uid-1".into());
        let pods = [chosen, pod("db-2", Role::Replica, "0/400", None)];
        // Chosen by this process, its label not written yet: label it again.
        let known = Situation { chosen_uid: Some("uid-1"), ..Default::default() };
        assert_eq!(decide("db-1", &pods, &known), Decision::Keep("db-1".into()));
        // A pod of that name with another uid is the StatefulSet's replacement.
        let replaced = Situation { chosen_uid: Some("uid-0"), ..Default::default() };
        assert!(
            matches!(decide("db-1", &pods, &replaced), Decision::AskPositions { ref why, .. } if why == "its pod was replaced")
        );
    }

    #[test]
    fn every_named_standby_must_answer_even_one_that_is_down() {
        let standbys = ["db-1".to_string(), "db-2".to_string()];
        let mut down = pod("db-2", Role::Replica, "0/900", None);
        down.status = None;
        let answered = pod("db-1", Role::Replica, "0/500", Some("t1"));
        let situation = Situation { standbys: &standbys, ..Default::default() };
        // Asked, though not running: its manager answers once it runs.
        assert!(matches!(
            decide("db-0", &[answered.clone(), down.clone()], &situation),
            Decision::AskPositions { ref ask, .. } if ask == &["db-1", "db-2"]
        ));
        let waited = Situation { asked: Some("t1"), waited_enough: true, ..situation };
        assert!(matches!(
            decide("db-0", &[answered.clone(), down.clone()], &waited),
            Decision::Blocked { ref waiting_for, ref ask, .. } if waiting_for == &["db-2"] && ask == &["db-1", "db-2"]
        ));
        // Its pod gone: still waited for, not asked (its replacement will be).
        assert!(matches!(
            decide("db-0", std::slice::from_ref(&answered), &waited),
            Decision::Blocked { ref waiting_for, ref ask, .. } if waiting_for == &["db-2"] && ask == &["db-1"]
        ));
        // Forced: the best of those that answered.
        let forced = Situation { forced: true, ..waited };
        assert!(matches!(decide("db-0", &[answered, down], &forced), Decision::Promote(ref p) if p.to == "db-1"));
    }

    #[test]
    fn a_newer_timeline_wins_over_more_wal_and_the_most_advanced_must_run() {
        let mut newer = pod("db-1", Role::Replica, "0/500", Some("t1"));
        let mut report = instances::report(&newer).expect("report");
        report.timeline = 2;
        newer.metadata.annotations =
            Some([(ANNOTATION.to_string(), serde_json::to_string(&report).expect("json"))].into());
        let older = pod("db-2", Role::Replica, "0/900", Some("t1"));
        let asked = Situation { asked: Some("t1"), ..Default::default() };
        let pods = [newer.clone(), older.clone()];
        assert!(matches!(decide("db-0", &pods, &asked), Decision::Promote(ref p) if p.to == "db-1"));
        // The most advanced answered, then its PostgreSQL stopped: no promotion of a less advanced one.
        let mut stopped = newer;
        stop_postgres(&mut stopped);
        if let Some(status) = stopped.status.as_mut() {
            for container in status.container_statuses.iter_mut().flatten() {
                container.restart_count = 1;
            }
        }
        let standbys = ["db-1".to_string(), "db-2".to_string()];
        let waited = Situation { waited_enough: true, standbys: &standbys, ..asked };
        assert!(matches!(
            decide("db-0", &[stopped, older], &waited),
            Decision::Blocked { ref waiting_for, .. } if waiting_for == &["db-1"]
        ));
    }

    #[test]
    fn a_re_created_database_elects_the_most_advanced_of_its_retained_instances() {
        let retained = ["db-0".to_string(), "db-1".to_string(), "db-2".to_string()];
        let electing = Situation { bootstrap: true, standbys: &retained, ..Default::default() };
        // Nothing runs before it is asked and held: every instance with a volume is asked, none given up on.
        let silent: Vec<Pod> = retained
            .iter()
            .map(|name| {
                let mut pod = pod(name, Role::Replica, "0/0", None);
                pod.metadata.annotations = None;
                pod
            })
            .collect();
        assert!(matches!(
            decide("", &silent, &electing),
            Decision::AskPositions { ref ask, ref why, .. } if ask.len() == 3 && why == BOOTSTRAP
        ));
        let answered = [
            pod("db-0", Role::Replica, "0/500", Some("t1")),
            pod("db-1", Role::Replica, "0/900", Some("t1")),
            pod("db-2", Role::Replica, "0/700", Some("t1")),
        ];
        let asked = Situation { asked: Some("t1"), ..electing };
        assert!(matches!(decide("", &answered, &asked), Decision::Promote(ref p) if p.to == "db-1"));
        // One of them silent: no election without it.
        let waited = Situation { waited_enough: true, ..asked };
        assert!(matches!(
            decide("", &answered[..2], &waited),
            Decision::Blocked { ref waiting_for, .. } if waiting_for == &["db-2"]
        ));
    }

    #[test]
    fn a_replica_being_deleted_is_no_candidate() {
        let mut leaving = pod("db-2", Role::Replica, "0/900", None);
        leaving.metadata.deletion_timestamp = Some(crate::runtime::status::now());
        let pods = [pod("db-1", Role::Replica, "0/500", None), leaving];
        let names: Vec<String> = candidates("db-0", &pods).iter().map(|p| p.name_any()).collect();
        assert_eq!(names, ["db-1"]);
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
