//! The primary's I/O: who it is (a failover or switchover decided by
//! `failover`, recorded on the MyDatabase before any pod is told), the role,
//! upstream, hold and fence orders on each pod, and the durability record of
//! `synchronous`. Run by the reconcile's apply stage; the decisions are pure
//! functions in the sibling modules.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::DeleteParams;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::failover::{self, Decision};
use super::{drain, synchronous};
use crate::api::instance::{
    FENCE, FENCE_REASON, HOLD_STREAMING, INSTANCES, LEASE, LEASE_EXPIRES_AFTER, POSITION_REQUEST, Role,
    SYNCHRONOUS_STANDBYS, UPSTREAM, UPSTREAM_SSLMODE,
};
use crate::api::mydatabase::{
    AsynchronousPeriod, FORCE_FAILOVER_ANNOTATION, FailoverRecord, MyDatabase, ReplicationMode, SWITCHOVER_ANNOTATION,
    is_fenced,
};
use crate::mydatabase::observed::Observed;
use crate::mydatabase::rollout::{self, Step};
use crate::mydatabase::watches::Caches;
use crate::mydatabase::{instances, names, services, statefulset};
use crate::runtime::Applier;
use crate::runtime::Context;

/// This process's decisions about one database's primary.
#[derive(Clone, Debug, Default)]
pub struct PrimaryState {
    /// The primary chosen last (labels and status follow it), and its pod's uid.
    pub(crate) chosen: Option<String>,
    pub(crate) chosen_uid: Option<String>,
    /// A failover or switchover under way.
    pending: Option<Pending>,
    /// The newest failover or switchover decided: status carries it even when
    /// a reconcile reads a cached MyDatabase from before that status write.
    pub(crate) last: Option<FailoverRecord>,
    /// When `last` began, to measure its write downtime (status times are whole seconds).
    last_began: Option<Instant>,
    /// Why the failover under way may not promote anyone (quorum), for status.
    pub(crate) blocked: Option<String>,
    /// The primary's lease as last seen moving: its pod, its count, and when.
    lease_seen: Option<(String, String, Instant)>,
    /// The replicas seen streaming from the chosen primary (its reports), for the quorum.
    streamed: std::collections::BTreeSet<String>,
    /// `status.asynchronous` as this process last decided it (None: not yet; then status says).
    asynchronous: Option<Option<AsynchronousPeriod>>,
    /// What `synchronous::step` saw of the primary's standbys, and when to look again.
    synchronous: synchronous::Watch,
    pub(crate) synchronous_recheck: Option<Duration>,
    /// The Event of a failover blocked on the lost primary itself was sent.
    told_alone: bool,
}

/// A failover or switchover waiting for the replicas' positions.
#[derive(Clone, Debug)]
struct Pending {
    /// The position request sent, and when (monotonic and wall clock).
    token: String,
    asked_at: Instant,
    /// When the primary stopped taking writes, as far as Keelson can tell: its
    /// lease's last renewal seen, or the moment the loss was seen.
    began: Instant,
    lost_at: Time,
    /// Why the primary counted as lost when the failover began (fencing may add reasons later).
    why: String,
    switchover: Option<Switchover>,
    /// When the replicas were told to hold (stop streaming): only if they
    /// still stream after the wait (the old primary's end, a clean shutdown
    /// or the kubelet's kill, normally ends their streams first).
    held_at: Option<Instant>,
    /// The blocked failover's Event was sent.
    blocked_told: bool,
}

#[derive(Clone, Debug)]
struct Switchover {
    to: String,
    why: String,
    /// Asked for by the annotation (removed when done).
    requested: bool,
}

/// How long a failover or switchover waits for its replicas to stop streaming
/// on their own before they are told to hold, and how long held replicas may take to
/// answer before a failover says it is blocked.
const POSITION_WAIT: Duration = Duration::from_secs(3);

fn uid_of(pods: &[Pod], name: &str) -> Option<String> {
    pods.iter().find(|p| p.name_any() == name).and_then(|p| p.metadata.uid.clone())
}

pub(crate) fn key(db: &MyDatabase) -> String {
    format!("{}/{}", db.namespace().unwrap_or_default(), db.name_any())
}

/// What one pass knows of the primary when it decides (see `Keeper::elect_primary`).
struct Election<'a, 'b> {
    db: &'a MyDatabase,
    observed: &'a Observed,
    applier: &'a Applier<'b>,
    /// This process's decisions as they stood when the pass began.
    state: &'a PrimaryState,
    forced: bool,
    bootstrap: bool,
    /// The primary on record.
    recorded: &'a String,
    lease_unrenewed: Option<Duration>,
    lease_expired: bool,
}

/// The primary's side of one MyDatabase reconcile: this process's decisions
/// about each database's primary (by `namespace/name`, they outrank the caches,
/// which may lag its own writes), with what acting on them needs.
pub struct Keeper<'a> {
    pub ctx: &'a Context,
    pub caches: &'a Caches,
    pub primaries: &'a Mutex<HashMap<String, PrimaryState>>,
    /// The controller's name, for the status-write metric.
    pub controller: &'static str,
}

impl Keeper<'_> {
    /// Forgets what this process decided about `db`'s primary (it is being deleted).
    pub(crate) fn forget_primary(&self, db: &MyDatabase) {
        self.primaries.lock().unwrap_or_else(|p| p.into_inner()).remove(&key(db));
    }

    pub(crate) fn state(&self, db: &MyDatabase) -> PrimaryState {
        self.primaries.lock().unwrap_or_else(|p| p.into_inner()).get(&key(db)).cloned().unwrap_or_default()
    }

    pub(crate) fn update_state(&self, db: &MyDatabase, change: impl FnOnce(&mut PrimaryState)) {
        change(self.primaries.lock().unwrap_or_else(|p| p.into_inner()).entry(key(db)).or_default());
    }

    /// How long the lease of `primary` has not been seen renewed, if its
    /// manager holds one (managers on fake nodes, or from before leases, do not).
    pub(crate) fn lease_unrenewed(&self, db: &MyDatabase, primary: &str, pods: &[Pod]) -> Option<Duration> {
        let pod = pods.iter().find(|p| p.name_any() == primary)?;
        let count = pod.annotations().get(LEASE)?;
        let mut unrenewed = Duration::ZERO;
        self.update_state(db, |state| match &state.lease_seen {
            Some((pod, seen, at)) if pod == primary && seen == count => unrenewed = at.elapsed(),
            _ => state.lease_seen = Some((primary.to_string(), count.clone(), Instant::now())),
        });
        Some(unrenewed)
    }

    /// Keeps the primary Keelson chose (see `failover`), replacing a lost
    /// one; returns it, and whether a failover or switchover waits for positions.
    pub(crate) async fn elect_primary(
        &self,
        db: &MyDatabase,
        observed: &Observed,
        applier: &Applier<'_>,
    ) -> (String, bool) {
        let state = self.state(db);
        let status_primary =
            db.status.as_ref().and_then(|s| s.current_primary.as_deref()).filter(|primary| !primary.is_empty());
        // Recorded with its uid: written before any instance was told, so it outranks the labels.
        let status_uid =
            db.status.as_ref().and_then(|s| s.current_primary_uid.as_deref()).filter(|_| status_primary.is_some());
        // Re-created over Retained volumes: no primary on record, data from before. Elect one.
        let retained = retained_instances(db, observed);
        let bootstrap = state.chosen.is_none()
            && status_primary.is_none()
            && !retained.is_empty()
            && !observed
                .pods
                .iter()
                .any(|p| p.labels().get(names::ROLE_LABEL).map(String::as_str) == Some(services::PRIMARY));
        let recorded = match (&state.chosen, bootstrap, status_uid.and(status_primary)) {
            (Some(chosen), _, _) => chosen.clone(),
            (None, true, _) => String::new(),
            (None, false, Some(recorded)) => recorded.to_string(),
            (None, false, None) => failover::recorded_primary(&observed.pods, status_primary, &names::statefulset(db)),
        };
        // The pod chosen: known to this process, or recorded with the choice.
        let chosen_uid = match &state.chosen {
            Some(chosen) if *chosen == recorded => state.chosen_uid.as_deref(),
            Some(_) => None,
            None => status_uid.filter(|_| status_primary == Some(recorded.as_str())),
        };
        let lease_unrenewed = self.lease_unrenewed(db, &recorded, &observed.pods);
        let pending = state.pending.as_ref();
        let waited = pending.and_then(|p| p.held_at).is_some_and(|held| held.elapsed() >= POSITION_WAIT);
        let switchover = pending.and_then(|p| p.switchover.as_ref());
        let forced = db.annotations().contains_key(FORCE_FAILOVER_ANNOTATION);
        // Standbys that could have confirmed a commit: seen streaming from this primary, or whose
        // server ran (a report). One still cloning, or never started, confirmed nothing.
        let confirmed = |name: &String| {
            state.streamed.contains(name)
                || observed.pods.iter().any(|p| p.name_any() == *name && instances::report(p).is_some())
        };
        let standbys = match bootstrap {
            true => retained,
            false => synchronous::standbys(db, &recorded).into_iter().filter(confirmed).collect(),
        };
        // The primary on record acknowledged commits alone (status.asynchronous), and still may.
        let alone = self
            .asynchronous(db)
            .filter(|period| period.primary == recorded && db.spec.replication != ReplicationMode::Asynchronous);
        let situation = failover::Situation {
            asked: pending.map(|p| p.token.as_str()),
            stepping_down: switchover.map(|s| s.why.as_str()),
            prefer: switchover.map(|s| s.to.as_str()),
            waited_enough: waited,
            forced,
            chosen_uid,
            lease_expired: lease_unrenewed.is_some_and(|unrenewed| unrenewed >= LEASE_EXPIRES_AFTER),
            now: Some(k8s_openapi::jiff::Timestamp::now()),
            standbys: &standbys,
            asynchronous: alone.is_some(),
            data_from_before: alone.as_ref().is_some_and(|period| data_older_than(observed, &recorded, &period.since)),
            bootstrap,
        };
        let lease_expired = situation.lease_expired;
        let decision = failover::decide(&recorded, &observed.pods, &situation);
        let e = Election {
            db,
            observed,
            applier,
            state: &state,
            forced,
            bootstrap,
            recorded: &recorded,
            lease_unrenewed,
            lease_expired,
        };
        match decision {
            Decision::Keep(primary) => self.keep(&e, primary).await,
            Decision::AwaitStop { primary, why } => {
                // Handing over: the pod's SIGTERM stops PostgreSQL (fast), then the replicas are asked.
                let (namespace, name) = (db.namespace().unwrap_or_default(), db.name_any());
                tracing::debug!(namespace, name, primary, why, "primary leaving; no promotion until it has stopped");
                (primary, true)
            }
            Decision::AskPositions { lost, why, ask, token } => self.ask(&e, lost, why, ask, token).await,
            Decision::Blocked { lost, why, waiting_for, ask } => self.blocked(&e, lost, why, waiting_for, ask).await,
            Decision::Promote(promotion) => self.promote(&e, promotion).await,
            Decision::NoCandidate { lost, why } => self.no_candidate(&e, lost, why).await,
        }
    }

    /// The primary serves (or is to): record it, carry out durability, label the pods.
    async fn keep(&self, e: &Election<'_, '_>, primary: String) -> (String, bool) {
        let Election { db, observed, applier, forced, .. } = *e;

        let serving = observed.pods.iter().find(|p| p.name_any() == primary).and_then(instances::report);
        let serving = serving.is_some_and(|r| r.role == Role::Primary && !r.unresponsive);
        let streaming: Vec<String> = observed
            .pods
            .iter()
            .find(|p| p.name_any() == primary)
            .and_then(instances::report)
            .map(|r| r.replicas.into_iter().filter(|r| r.state == "streaming").map(|r| r.name).collect())
            .unwrap_or_default();
        self.update_state(db, |state| {
            if state.chosen.as_ref() != Some(&primary) {
                state.streamed.clear();
            }
            state.streamed.extend(streaming);
            state.chosen_uid = uid_of(&observed.pods, &primary).or(state.chosen_uid.take());
            state.chosen = Some(primary.clone());
            state.pending = None;
            state.blocked = None;
            state.told_alone = false;
            // The first report of the promoted instance taking writes ends the downtime.
            if let Some(record) = state.last.as_mut().filter(|r| r.to == primary && r.serving_at.is_none())
                && serving
            {
                record.writes_down_ms = state.last_began.map(|began| began.elapsed().as_millis() as i64);
                record.serving_at = Some(crate::runtime::status::now());
            }
        });
        let asynchronous = self.durability(db, &primary, observed).await;
        label_pods(db, &observed.pods, &primary, asynchronous.as_ref(), applier).await;
        if forced {
            // Nothing is blocked: an override left standing would apply to some later failover.
            forget_annotation(db, FORCE_FAILOVER_ANNOTATION, applier).await;
            let note = format!("{FORCE_FAILOVER_ANNOTATION} removed: no failover was blocked ({primary} serves)");
            self.ctx.event(&db.object_ref(&()), EventType::Normal, "ForceFailoverIgnored", "Failover", note).await;
        }
        (primary, false)
    }

    /// The primary is lost: ask the replicas for their positions, then have them hold.
    async fn ask(
        &self,
        e: &Election<'_, '_>,
        lost: String,
        why: String,
        ask: Vec<String>,
        token: String,
    ) -> (String, bool) {
        let Election { db, observed, applier, state, bootstrap, recorded, lease_unrenewed, lease_expired, .. } = *e;
        let (namespace, name) = (db.namespace().unwrap_or_default(), db.name_any());
        let pending = state.pending.as_ref();

        if token.is_empty() {
            tracing::warn!(namespace, name, primary = lost, why, replicas = ?ask, "primary lost; asking the replicas for their positions");
            fence_unresponsive(db, &observed.pods, &lost, applier).await;
            let mut pending = ask_positions(&lost, &why, &ask, None, applier).await;
            if bootstrap {
                // Nobody serves, nobody may stream: held from the start, each gives its position.
                resend(&observed.pods, &ask, &pending.token, true, applier).await;
                pending.held_at = Some(Instant::now());
            }
            // Cut off, it stopped taking writes before its lease expired.
            if lease_expired
                && let Some(unrenewed) = lease_unrenewed
                && let Some(since) = Instant::now().checked_sub(unrenewed)
            {
                pending.began = since;
                pending.lost_at = Time(pending.lost_at.0 - unrenewed);
            }
            self.update_state(db, |state| state.pending = Some(pending));
        } else if pending.is_some_and(|p| p.held_at.is_some()) {
            resend(&observed.pods, &ask, &token, true, applier).await;
        } else if let Some(pending) = pending.filter(|p| p.held_at.is_none()) {
            resend(&observed.pods, &ask, &token, false, applier).await;
            // Their streams ended (the old primary's end), or still run after the wait (it may
            // still run): either way they hold now, so that their positions stay final.
            let ended = ask.iter().all(|name| {
                observed
                    .pods
                    .iter()
                    .find(|p| p.name_any() == *name)
                    .and_then(|p| failover::answer(p, &token))
                    .is_some_and(|answer| !answer.streaming)
            });
            if !ended && pending.asked_at.elapsed() < POSITION_WAIT {
                return (recorded.clone(), true);
            }
            if !ended {
                tracing::warn!(namespace, name, primary = lost, replicas = ?ask, "replicas still stream from the old primary; telling them to hold");
            }
            hold(&ask, &token, applier).await;
            self.update_state(db, |state| {
                if let Some(pending) = state.pending.as_mut() {
                    pending.held_at = Some(Instant::now());
                }
            });
        }
        (recorded.clone(), true)
    }

    /// No promotion yet: say who is waited for (once), keep asking those who come back.
    async fn blocked(
        &self,
        e: &Election<'_, '_>,
        lost: String,
        why: String,
        waiting_for: Vec<String>,
        ask: Vec<String>,
    ) -> (String, bool) {
        let Election { db, observed, applier, state, recorded, .. } = *e;
        let (namespace, name) = (db.namespace().unwrap_or_default(), db.name_any());
        let pending = state.pending.as_ref();

        // A standby that comes back (or its replacement) is asked and held at once.
        if let Some(token) = pending.map(|p| p.token.clone()) {
            resend(&observed.pods, &ask, &token, true, applier).await;
        }
        let note = match waiting_for == [lost.clone()] {
            // status.asynchronous: the lost primary itself is waited for.
            true => format!(
                "primary {lost} lost ({why}); no replica promoted: {lost} acknowledged commits no standby \
                 confirmed (replication Preferred, status.asynchronous), so only it holds them. It takes the \
                 role again once its pod runs; annotate the MyDatabase {FORCE_FAILOVER_ANNOTATION}=true to \
                 promote the best replica, accepting that those commits are lost"
            ),
            false => format!(
                "primary {lost} lost ({why}); no replica promoted: {} may hold the last acknowledged commits \
                 and gave no final position. It is promoted once they answer; annotate the MyDatabase \
                 {FORCE_FAILOVER_ANNOTATION}=true to promote the best of the others, accepting that those \
                 commits may be lost",
                waiting_for.join(", ")
            ),
        };
        // Waiting for the lost primary itself asks nobody: no failover is under way (a forced one
        // starts afresh, fencing and asking as any other).
        let alone = waiting_for == [lost.clone()];
        let told = match alone {
            true => state.told_alone,
            false => pending.is_some_and(|p| p.blocked_told),
        };
        if !told {
            tracing::warn!(namespace, name, primary = lost, waiting_for = ?waiting_for, "failover blocked");
            self.ctx.event(&db.object_ref(&()), EventType::Warning, "FailoverBlocked", "Failover", note.clone()).await;
            self.update_state(db, |state| match state.pending.as_mut() {
                Some(pending) if !alone => pending.blocked_told = true,
                _ => state.told_alone = alone,
            });
        }
        self.update_state(db, |state| state.blocked = Some(note));
        (recorded.clone(), true)
    }

    /// Promote: on record first, then the labels, the Event and this process's record.
    async fn promote(&self, e: &Election<'_, '_>, promotion: failover::Promotion) -> (String, bool) {
        let Election { db, observed, applier, state, forced, bootstrap, recorded, .. } = *e;
        let (namespace, name) = (db.namespace().unwrap_or_default(), db.name_any());
        let pending = state.pending.as_ref();
        let switchover = pending.and_then(|p| p.switchover.as_ref());

        let lost_at = state.pending.as_ref().map(|p| p.lost_at.clone());
        let began = state.pending.as_ref().map(|p| p.began);
        let why = state.pending.as_ref().map_or(promotion.why.clone(), |p| p.why.clone());
        let positions: Vec<String> = promotion.positions.iter().map(|(pod, lsn)| format!("{pod} at {lsn}")).collect();
        let (kind, event_type) = match switchover {
            Some(_) => ("Switchover", EventType::Normal),
            None if bootstrap => ("Election", EventType::Normal),
            None => ("Failover", EventType::Warning),
        };
        let mut note = match bootstrap {
            true => format!(
                "election: {why}; promoted {}, the instance with the most WAL ({})",
                promotion.to,
                positions.join(", ")
            ),
            false => format!(
                "{}: primary {} ({}); promoted {}, the replica that received the most WAL ({})",
                kind.to_lowercase(),
                promotion.from,
                why,
                promotion.to,
                positions.join(", ")
            ),
        };
        if forced && state.blocked.is_some() {
            note.push_str(&format!(
                "; forced by {FORCE_FAILOVER_ANNOTATION}: replicas that did not answer may have held \
                 acknowledged commits that are lost"
            ));
        }
        if let Some(wanted) = switchover.map(|s| &s.to).filter(|to| **to != promotion.to) {
            note.push_str(&format!("; {wanted} had received less"));
        }
        // On record before any instance is told: a restarted operator carries on from it.
        let uid = uid_of(&observed.pods, &promotion.to);
        if !self.record_primary(db, &promotion.to, uid.as_deref()).await {
            return (recorded.clone(), true);
        }
        tracing::warn!(namespace, name, from = promotion.from, to = promotion.to, "{note}");
        label_pods(db, &observed.pods, &promotion.to, None, applier).await;
        self.ctx.event(&db.object_ref(&()), event_type, kind, "Promote", note).await;
        if switchover.is_some_and(|s| s.requested) {
            forget_switchover_request(db, applier).await;
        }
        if forced {
            forget_annotation(db, FORCE_FAILOVER_ANNOTATION, applier).await;
        }
        let record = FailoverRecord {
            kind: kind.into(),
            from: promotion.from,
            to: promotion.to.clone(),
            reason: why,
            lost_at,
            promoted_at: Some(crate::runtime::status::now()),
            positions,
            ..Default::default()
        };
        self.update_state(db, |state| {
            state.streamed.clear();
            state.chosen_uid = uid;
            state.chosen = Some(promotion.to.clone());
            state.pending = None;
            state.blocked = None;
            state.told_alone = false;
            // The new primary names its standbys: what the old one acknowledged alone is given up (forced).
            state.asynchronous = Some(None);
            state.synchronous = synchronous::Watch::default();
            state.last = Some(record);
            state.last_began = began;
        });
        (promotion.to, false)
    }

    /// Nobody can take over: the pod on record keeps (or gets) the role.
    async fn no_candidate(&self, e: &Election<'_, '_>, lost: String, why: String) -> (String, bool) {
        let Election { db, observed, applier, .. } = *e;
        let (namespace, name) = (db.namespace().unwrap_or_default(), db.name_any());

        // Starting, or every replica is gone too: the pod on record keeps (or gets) the role.
        let starting = observed.pods.is_empty();
        if starting || observed.pods.iter().any(|p| p.name_any() == lost && p.metadata.deletion_timestamp.is_none()) {
            tracing::debug!(namespace, name, primary = lost, why, "no replica to take over; the role stays");
        } else {
            tracing::warn!(namespace, name, primary = lost, why, "primary lost and no replica can take over");
        }
        self.update_state(db, |state| {
            state.chosen_uid = uid_of(&observed.pods, &lost);
            state.chosen = Some(lost.clone());
            state.pending = None;
            state.blocked = None;
        });
        label_pods(db, &observed.pods, &lost, self.asynchronous(db).as_ref(), applier).await;
        (lost, false)
    }

    /// Moves the primary when asked to (the switchover annotation) or when a
    /// rollout needs it, and replaces outdated pods (see `rollout`). True when
    /// a switchover began.
    pub(crate) async fn move_primary(
        &self,
        db: &MyDatabase,
        observed: &Observed,
        statefulset: Option<&StatefulSet>,
        primary: &str,
        applier: &Applier<'_>,
    ) -> bool {
        let (namespace, name) = (db.namespace().unwrap_or_default(), db.name_any());
        // The primary acknowledged commits alone: no move until a standby has them too.
        let alone = self.asynchronous(db).filter(|period| period.primary == primary).map(|period| {
            format!(
                "{primary} acknowledged commits no standby confirmed (status.asynchronous since {}); a switchover \
                 waits until a standby has caught up",
                period.since.0
            )
        });
        if let Some(target) = db.annotations().get(SWITCHOVER_ANNOTATION) {
            let why = format!("switchover to {target} requested");
            let standbys = synchronous::standbys(db, primary);
            let refusal = match [primary, target.as_str()].into_iter().find(|p| is_fenced(db.annotations(), p)) {
                Some(fenced) => Some(format!("{fenced} is fenced for maintenance; unfence it first")),
                None => failover::switchover_refusal(target, primary, &observed.pods, &standbys).or(alone.clone()),
            };
            match refusal {
                None => return self.switch_over(db, observed, primary, target, why, true, applier).await,
                Some(refusal) => {
                    let already = target == primary;
                    if !already {
                        tracing::warn!(namespace, name, target, "switchover refused: {refusal}");
                        let note = format!("switchover to {target} refused: {refusal}");
                        self.ctx
                            .event(&db.object_ref(&()), EventType::Warning, "SwitchoverRefused", "Switchover", note)
                            .await;
                    }
                    forget_switchover_request(db, applier).await;
                    return false;
                }
            }
        }
        if is_fenced(db.annotations(), primary) {
            // Stopped on purpose: no handover or rollout moves writes elsewhere meanwhile.
            applier.wait(format!("the primary {primary} to be unfenced"));
            return false;
        }
        // A drain or a scale-down is about to take the primary's pod: hand over first.
        let instances = db.spec.replicas.max(0) as u32;
        let cordoned = &self.caches.cordoned;
        if let Some(why) = drain::handover_reason(instances, primary, &observed.pods, cordoned) {
            if let Some(alone) = alone {
                applier.wait(format!("a standby to catch up before handing the primary over ({why}): {alone}"));
                return false;
            }
            let standbys = synchronous::standbys(db, primary);
            match drain::successor(instances, primary, &observed.pods, cordoned, &standbys) {
                Some(to) => return self.switch_over(db, observed, primary, &to, why, false, applier).await,
                None => {
                    applier.wait(format!("a streaming replica to hand the primary over to ({why})"));
                    return false;
                }
            }
        }
        let Some(statefulset) = statefulset else { return false };
        match rollout::next_step(statefulset, &observed.pods, primary) {
            Step::Done => false,
            Step::Wait(reason) => {
                tracing::debug!(namespace, name, "rollout waits for {reason}");
                false
            }
            Step::Replace(pod) => {
                let revision = statefulset.status.as_ref().and_then(|s| s.update_revision.clone()).unwrap_or_default();
                let note = format!("replacing {pod} with the new pod template (revision {revision})");
                tracing::info!(namespace, name, pod, "{note}");
                if applier.delete::<Pod>(&pod, &DeleteParams::default()).await {
                    self.ctx.event(&db.object_ref(&()), EventType::Normal, "RollingUpdate", "Replace", note).await;
                }
                false
            }
            Step::SwitchoverTo(_) if alone.is_some() => {
                applier.wait(format!(
                    "a standby to catch up before the primary's pod is replaced: {}",
                    alone.unwrap_or_default()
                ));
                false
            }
            Step::SwitchoverTo(target) => {
                let why = "rolling update: the primary's pod is the last outdated".to_string();
                self.switch_over(db, observed, primary, &target, why, false, applier).await
            }
        }
    }

    /// Begins a switchover: the primary is stepped down first (it leaves
    /// `-rw` and shuts down cleanly, its replicas receive all it wrote), and
    /// the replicas are asked for their positions; `elect_primary` promotes.
    #[allow(clippy::too_many_arguments)]
    async fn switch_over(
        &self,
        db: &MyDatabase,
        observed: &Observed,
        primary: &str,
        target: &str,
        why: String,
        requested: bool,
        applier: &Applier<'_>,
    ) -> bool {
        let (namespace, name) = (db.namespace().unwrap_or_default(), db.name_any());
        tracing::info!(namespace, name, from = primary, to = target, why, "switchover: stepping the primary down");
        let patch = json!({"metadata": {"labels": {names::ROLE_LABEL: services::REPLICA}}});
        if !applier.merge_patch::<Pod>(primary, &patch, "step-down").await {
            return false;
        }
        // Every replica the promotion will wait for, streaming or not (one not asked would cost the whole wait).
        let mut replicas: Vec<String> =
            failover::candidates(primary, &observed.pods).iter().map(|p| p.name_any()).collect();
        for standby in synchronous::standbys(db, primary) {
            if !replicas.contains(&standby) && observed.pods.iter().any(|p| p.name_any() == standby) {
                replicas.push(standby);
            }
        }
        let switchover = Switchover { to: target.to_string(), why, requested };
        let why = switchover.why.clone();
        let pending = ask_positions(primary, &why, &replicas, Some(switchover), applier).await;
        self.update_state(db, |state| state.pending = Some(pending));
        true
    }
}

impl Keeper<'_> {
    /// Writes the new primary (and its pod's uid) to `status` before any
    /// instance is told: the one record a restarted operator, and anyone
    /// reading the MyDatabase, goes by. False when the write failed (the
    /// promotion waits for the next pass).
    async fn record_primary(&self, db: &MyDatabase, primary: &str, uid: Option<&str>) -> bool {
        let patch = json!({"status": {"currentPrimary": primary, "currentPrimaryUid": uid}});
        self.patch_status(db, &patch).await
    }

    /// A record on the MyDatabase's status that must land before anyone acts
    /// on it (a merge patch of those fields alone). False when it failed.
    async fn patch_status(&self, db: &MyDatabase, patch: &serde_json::Value) -> bool {
        let api: kube::Api<MyDatabase> =
            kube::Api::namespaced(self.ctx.client.clone(), &db.namespace().unwrap_or_default());
        let result =
            api.patch_status(&db.name_any(), &kube::api::PatchParams::default(), &kube::api::Patch::Merge(patch)).await;
        let labels = crate::runtime::metrics::ControllerLabels { controller: self.controller };
        self.ctx.metrics.status_writes.get_or_create(&labels).inc();
        if let Err(error) = result {
            tracing::warn!(namespace = %db.namespace().unwrap_or_default(), name = %db.name_any(), %patch, %error, "could not record on status; acting on it waits");
            return false;
        }
        true
    }
}

impl Keeper<'_> {
    /// `status.asynchronous` as it stands: this process's last decision, else status.
    pub(crate) fn asynchronous(&self, db: &MyDatabase) -> Option<AsynchronousPeriod> {
        match self.state(db).asynchronous {
            Some(decided) => decided,
            None => db.status.as_ref().and_then(|s| s.asynchronous.clone()),
        }
    }

    /// With `replication: Preferred`, lets the serving `primary` stop waiting
    /// for standbys once none has streamed for a while, after recording
    /// `status.asynchronous` (a failover reads it), and removes the record once
    /// a standby has caught up (see `synchronous`). Returns the record in force.
    async fn durability(&self, db: &MyDatabase, primary: &str, observed: &Observed) -> Option<AsynchronousPeriod> {
        let (namespace, name) = (db.namespace().unwrap_or_default(), db.name_any());
        let recorded = self.asynchronous(db);
        let report = observed.pods.iter().find(|p| p.name_any() == primary).and_then(instances::report);
        let mut watch = self.state(db).synchronous;
        let (change, again) =
            synchronous::step(db, primary, recorded.as_ref(), report.as_ref(), &mut watch, Instant::now());
        let recorded = match change {
            synchronous::Change::Nothing => recorded,
            synchronous::Change::StopWaiting => {
                let period = AsynchronousPeriod { primary: primary.to_string(), since: crate::runtime::status::now() };
                let patch = json!({"status": {"asynchronous": period}});
                match self.patch_status(db, &patch).await {
                    true => {
                        let note = format!(
                            "no standby has streamed from {primary} for {}s: it acknowledges commits alone until one \
                             has caught up (replication Preferred); a lost primary is not failed over meanwhile",
                            synchronous::PREFERRED_WAIT.as_secs()
                        );
                        tracing::warn!(namespace, name, primary, "{note}");
                        self.ctx
                            .event(
                                &db.object_ref(&()),
                                EventType::Warning,
                                "ReplicationAsynchronous",
                                "Replicate",
                                note,
                            )
                            .await;
                        Some(period)
                    }
                    false => recorded,
                }
            }
            synchronous::Change::Confirmed => {
                if let Some(period) = recorded.as_ref().filter(|period| period.primary == primary) {
                    let note = format!(
                        "a standby of {primary} has every commit again: synchronous, failover automatic (asynchronous \
                         since {})",
                        period.since.0
                    );
                    tracing::info!(namespace, name, primary, "{note}");
                    self.ctx
                        .event(&db.object_ref(&()), EventType::Normal, "ReplicationSynchronous", "Replicate", note)
                        .await;
                }
                None
            }
        };
        self.update_state(db, |state| {
            state.synchronous = watch;
            state.synchronous_recheck = again;
            state.asynchronous = Some(recorded.clone());
        });
        recorded
    }
}

/// Whether `pod`'s data volume was made before `at`: a pod coming back on it has what the
/// instance wrote then (a newer one, or none, is empty).
fn data_older_than(observed: &Observed, pod: &str, at: &Time) -> bool {
    let claim = format!("data-{pod}");
    observed
        .data_claims
        .iter()
        .filter(|c| c.name_any() == claim && c.metadata.deletion_timestamp.is_none())
        .any(|c| c.metadata.creation_timestamp.as_ref().is_some_and(|created| created.0 < at.0))
}

/// The instances whose data volumes are older than `db` itself: it was
/// re-created over volumes a former MyDatabase of that name retained.
fn retained_instances(db: &MyDatabase, observed: &Observed) -> Vec<String> {
    let Some(created) = db.metadata.creation_timestamp.as_ref() else { return Vec::new() };
    let instances = names::instance_pods(db);
    let mut retained: Vec<String> = observed
        .data_claims
        .iter()
        .filter(|claim| claim.metadata.creation_timestamp.as_ref().is_some_and(|at| at.0 < created.0))
        .filter_map(|claim| claim.name_any().strip_prefix("data-").map(str::to_string))
        .filter(|pod| instances.contains(pod))
        .collect();
    retained.sort();
    retained
}

/// A primary that stopped answering may answer again (a frozen process, a
/// stalled disk): before another is promoted, its pod is deleted (killed by
/// the kubelet after a second) and relabelled, so it can never take writes
/// beside the new primary. Its replacement rejoins as a replica.
async fn fence_unresponsive(db: &MyDatabase, pods: &[Pod], lost: &str, applier: &Applier<'_>) {
    let Some(pod) = pods.iter().find(|p| p.name_any() == lost && p.metadata.deletion_timestamp.is_none()) else {
        return;
    };
    if !instances::report(pod).is_some_and(|r| r.unresponsive) {
        return;
    }
    let (namespace, name) = (db.namespace().unwrap_or_default(), db.name_any());
    tracing::warn!(namespace, name, pod = lost, "fencing the unresponsive primary: deleting its pod");
    let patch = json!({"metadata": {"labels": {names::ROLE_LABEL: services::REPLICA}}});
    applier.merge_patch::<Pod>(lost, &patch, "fence").await;
    applier.delete::<Pod>(lost, &DeleteParams { grace_period_seconds: Some(1), ..Default::default() }).await;
}

/// Asks `replicas` for their positions now (a request their managers answer
/// at once). They are told to hold (see `hold`) only once their streams have
/// ended, or after the wait: a deleted pod's processes outlive its object for
/// a moment, and holding (then promoting) before would leave two primaries
/// taking connections. Only a held replica's answer counts (`failover::decide`).
async fn ask_positions(
    lost: &str,
    why: &str,
    replicas: &[String],
    switchover: Option<Switchover>,
    applier: &Applier<'_>,
) -> Pending {
    let token = format!("{lost}@{}", crate::runtime::status::now().0.as_millisecond());
    let patch = json!({"metadata": {"annotations": {POSITION_REQUEST: token}}});
    for pod in replicas {
        applier.merge_patch::<Pod>(pod, &patch, "ask-position").await;
    }
    let asked_at = Instant::now();
    Pending {
        token,
        asked_at,
        began: asked_at,
        lost_at: crate::runtime::status::now(),
        why: why.into(),
        switchover,
        held_at: None,
        blocked_told: false,
    }
}

/// Tells `replicas` to hold: stop streaming, so that their positions are
/// final and an old primary that still runs (hung, cut off) can have no more
/// commits confirmed by them.
async fn hold(replicas: &[String], token: &str, applier: &Applier<'_>) {
    let patch = json!({"metadata": {"annotations": {HOLD_STREAMING: token}}});
    for pod in replicas {
        applier.merge_patch::<Pod>(pod, &patch, "hold").await;
    }
}

/// Sends the position request (and the hold, once given) again to the pods
/// in `ask` that do not carry it: a patch that failed, or a pod that appeared
/// since (a standby's replacement). A pod without a role yet is made a
/// replica, so that its PostgreSQL starts (held) and answers.
async fn resend(pods: &[Pod], ask: &[String], token: &str, held: bool, applier: &Applier<'_>) {
    for pod in pods.iter().filter(|p| ask.contains(&p.name_any())) {
        let carries = |annotation: &str| pod.annotations().get(annotation).map(String::as_str) == Some(token);
        if carries(POSITION_REQUEST) && (!held || carries(HOLD_STREAMING)) {
            continue;
        }
        let mut patch = json!({"metadata": {"annotations": {POSITION_REQUEST: token}}});
        if held {
            patch["metadata"]["annotations"][HOLD_STREAMING] = json!(token);
        }
        if !pod.labels().contains_key(names::ROLE_LABEL) {
            patch["metadata"]["labels"] = json!({names::ROLE_LABEL: services::REPLICA});
        }
        applier.merge_patch::<Pod>(&pod.name_any(), &patch, "ask-position").await;
    }
}

/// Removes the switchover annotation: the request is done, or refused (an Event says why).
async fn forget_switchover_request(db: &MyDatabase, applier: &Applier<'_>) {
    forget_annotation(db, SWITCHOVER_ANNOTATION, applier).await;
}

async fn forget_annotation(db: &MyDatabase, annotation: &str, applier: &Applier<'_>) {
    let patch = json!({"metadata": {"annotations": {annotation: null}}});
    applier.merge_patch::<MyDatabase>(&db.name_any(), &patch, "annotation-done").await;
}

/// Puts each pod's role label (which `-rw` and `-ro` select, and which its
/// instance manager hands to PostgreSQL), synchronous standbys and upstream
/// (the primary's pod address) in place, and lifts a failover's hold in the
/// same write as the new upstream. A pod that loses the primary role is
/// relabelled first: it leaves `-rw` before another pod is announced there.
async fn label_pods(
    db: &MyDatabase,
    pods: &[Pod],
    primary: &str,
    asynchronous: Option<&AsynchronousPeriod>,
    applier: &Applier<'_>,
) {
    let wanted = |pod: &Pod| if pod.name_any() == primary { services::PRIMARY } else { services::REPLICA };
    let primary_pod = pods.iter().find(|p| p.name_any() == primary);
    let upstream = primary_pod.and_then(|p| p.status.as_ref()?.pod_ip.clone());
    let sslmode = primary_pod.map_or(statefulset::UPSTREAM_SSLMODE, statefulset::upstream_sslmode);
    // The pod losing the role first, then the new primary, then the others.
    let stepping_down = |pod: &Pod| pod.labels().get(names::ROLE_LABEL).map(String::as_str) == Some(services::PRIMARY);
    let mut ordered: Vec<&Pod> = pods.iter().collect();
    ordered.sort_by_key(|pod| match wanted(pod) {
        services::PRIMARY => 1,
        _ if stepping_down(pod) => 0,
        _ => 2,
    });
    for pod in ordered {
        let role = wanted(pod);
        // Nothing further until the pod losing the role has lost it and the new primary has it:
        // else `-rw` could select two pods.
        let must_land = role == services::PRIMARY || stepping_down(pod);
        let Some(patch) = role_patch(db, pod, role, upstream.as_deref(), sslmode, asynchronous) else { continue };
        if applier.merge_patch::<Pod>(&pod.name_any(), &patch, "label").await {
            tracing::info!(namespace = ?pod.namespace(), pod = %pod.name_any(), role, "labelled pod role");
        } else if must_land {
            return;
        }
    }
}

/// The fence order on each pod as `FENCED_INSTANCES_ANNOTATION` says, in every
/// pass whatever the failover's state: an unfence must reach a replica that a
/// blocked failover waits to hear from.
pub(crate) async fn sync_fences(db: &MyDatabase, pods: &[Pod], applier: &Applier<'_>) {
    for pod in pods.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
        let Some(patch) = fence_patch(db, pod) else { continue };
        if applier.merge_patch::<Pod>(&pod.name_any(), &patch, "fence").await {
            tracing::info!(namespace = ?pod.namespace(), pod = %pod.name_any(), fenced = !patch["metadata"]["annotations"][FENCE].is_null(), "fence order");
        }
    }
}

/// The patch that makes `pod`'s fence order what `db` asks, if it is not.
fn fence_patch(db: &MyDatabase, pod: &Pod) -> Option<serde_json::Value> {
    let wanted = is_fenced(db.annotations(), &pod.name_any()).then_some(FENCE_REASON);
    (pod.annotations().get(FENCE).map(String::as_str) != wanted)
        .then(|| json!({"metadata": {"annotations": {FENCE: wanted}}}))
}

/// What `pod` needs to take `role` under the primary at `upstream`, if
/// anything. A replica's hold is lifted only with an upstream to stream
/// from: the new primary's address, never the old one's.
fn role_patch(
    db: &MyDatabase,
    pod: &Pod,
    role: &str,
    upstream: Option<&str>,
    sslmode: &str,
    asynchronous: Option<&AsynchronousPeriod>,
) -> Option<serde_json::Value> {
    let streaming = synchronous::streaming(instances::report(pod).as_ref());
    let synchronous = synchronous::standby_names(db, &pod.name_any(), asynchronous, &streaming);
    let annotations = pod.annotations();
    let (wanted_upstream, lift_hold) = match role {
        services::PRIMARY => (None, true),
        _ => (upstream, upstream.is_some()),
    };
    let upstream_ok = match (role, wanted_upstream) {
        (services::PRIMARY, _) => !annotations.contains_key(UPSTREAM),
        (_, Some(wanted)) => {
            annotations.get(UPSTREAM).map(String::as_str) == Some(wanted)
                && annotations.get(UPSTREAM_SSLMODE).map(String::as_str) == Some(sslmode)
        }
        (_, None) => true,
    };
    let instances = db.spec.replicas.max(0).to_string();
    if pod.labels().get(names::ROLE_LABEL).map(String::as_str) == Some(role)
        && annotations.get(SYNCHRONOUS_STANDBYS) == Some(&synchronous)
        && annotations.get(INSTANCES) == Some(&instances)
        && (!lift_hold || !annotations.contains_key(HOLD_STREAMING))
        && upstream_ok
    {
        return None;
    }
    let mut patch = json!({"metadata": {
        "labels": {names::ROLE_LABEL: role},
        "annotations": {SYNCHRONOUS_STANDBYS: synchronous, INSTANCES: instances}}});
    if lift_hold {
        patch["metadata"]["annotations"][HOLD_STREAMING] = serde_json::Value::Null;
    }
    match (role, wanted_upstream) {
        (services::PRIMARY, _) => {
            patch["metadata"]["annotations"][UPSTREAM] = serde_json::Value::Null;
            patch["metadata"]["annotations"][UPSTREAM_SSLMODE] = serde_json::Value::Null;
        }
        (_, Some(wanted)) => {
            patch["metadata"]["annotations"][UPSTREAM] = json!(wanted);
            patch["metadata"]["annotations"][UPSTREAM_SSLMODE] = json!(sslmode);
        }
        (_, None) => {}
    }
    Some(patch)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::api::mydatabase::MyDatabaseStatus;
    use crate::mydatabase::reconcile::tests::{held, instances, reconciler};
    use crate::mydatabase::tests::sample;
    use crate::runtime::fake_api::FakeApi;
    use crate::runtime::pipeline;
    use serde_json::Value;

    #[test]
    fn a_hold_is_lifted_only_with_the_new_primarys_address_to_stream_from() {
        let db = sample();
        let mut held = Pod::default();
        held.metadata.name = Some("production-db-1".into());
        held.metadata.labels = Some([(names::ROLE_LABEL.to_string(), services::REPLICA.to_string())].into());
        held.metadata.annotations = Some(
            [
                (HOLD_STREAMING.to_string(), "t1".to_string()),
                (UPSTREAM.to_string(), "10.0.0.1".to_string()),
                (SYNCHRONOUS_STANDBYS.to_string(), synchronous::standby_names(&db, "production-db-1", None, &[])),
                (INSTANCES.to_string(), "3".to_string()),
            ]
            .into(),
        );
        // The new primary has no address yet: the hold stays, the old address too.
        assert_eq!(role_patch(&db, &held, services::REPLICA, None, "verify-ca", None), None);
        let patch = role_patch(&db, &held, services::REPLICA, Some("10.0.0.2"), "verify-ca", None).expect("a patch");
        let annotations = &patch["metadata"]["annotations"];
        assert_eq!(
            (annotations[HOLD_STREAMING].clone(), annotations[UPSTREAM].clone(), annotations[UPSTREAM_SSLMODE].clone()),
            (Value::Null, json!("10.0.0.2"), json!("verify-ca"))
        );
        assert!(annotations.as_object().is_some_and(|a| a.contains_key(HOLD_STREAMING)), "the hold is removed");
        // Told how many instances there are (its fence depends on it), once.
        let mut untold = held.clone();
        untold.metadata.annotations.get_or_insert_default().remove(INSTANCES);
        let patch = role_patch(&db, &untold, services::REPLICA, None, "verify-ca", None).expect("a patch");
        assert_eq!(patch["metadata"]["annotations"][INSTANCES], json!("3"));
        // Chosen as the primary: no upstream, no hold.
        let patch = role_patch(&db, &held, services::PRIMARY, Some("10.0.0.2"), "verify-ca", None).expect("a patch");
        assert_eq!(patch["metadata"]["labels"][names::ROLE_LABEL], json!("primary"));
        assert_eq!(patch["metadata"]["annotations"][UPSTREAM], Value::Null);
    }

    #[test]
    fn a_fenced_instance_is_told_so_on_its_pod_and_unfenced_by_removing_it() {
        let mut db = sample();
        let mut pod = Pod::default();
        pod.metadata.name = Some("production-db-1".into());
        assert_eq!(fence_patch(&db, &pod), None, "nothing to do");
        db.metadata.annotations = Some(
            [(
                crate::api::mydatabase::FENCED_INSTANCES_ANNOTATION.to_string(),
                "production-db-2, production-db-1".into(),
            )]
            .into(),
        );
        let patch = fence_patch(&db, &pod).expect("the fence order");
        assert_eq!(patch["metadata"]["annotations"][FENCE], json!(FENCE_REASON));
        pod.metadata.annotations = Some([(FENCE.to_string(), FENCE_REASON.to_string())].into());
        assert_eq!(fence_patch(&db, &pod), None, "told once");
        db.metadata.annotations = None;
        let patch = fence_patch(&db, &pod).expect("the order goes");
        let annotations = patch["metadata"]["annotations"].as_object().cloned().unwrap_or_default();
        assert_eq!(annotations.get(FENCE), Some(&Value::Null), "removed by the merge patch");
    }

    /// Which request first sent `pod` its primary role label, by position.
    fn labelled_primary_at(api: &FakeApi, pod: &str) -> Option<usize> {
        api.requests().iter().position(|r| {
            r.method == "PATCH"
                && r.path.ends_with(&format!("/pods/{pod}"))
                && r.body["metadata"]["labels"][names::ROLE_LABEL] == "primary"
        })
    }

    #[tokio::test]
    async fn a_promotion_is_recorded_on_the_mydatabase_before_any_pod_is_told() {
        use crate::mydatabase::ha::failover::tests::pod;
        let db = held();
        // production-db-0 is gone; both standbys hold and answered: production-db-1 received most.
        let pods = vec![
            pod("production-db-1", Role::Replica, "0/700", Some("t1")),
            pod("production-db-2", Role::Replica, "0/500", Some("t1")),
        ];
        let pending = |reconciler: &crate::mydatabase::reconcile::MyDatabaseReconciler| {
            reconciler.keeper().update_state(&db, |state| {
                state.chosen = Some("production-db-0".into());
                state.chosen_uid = Some("uid-production-db-0".into());
                state.pending = Some(Pending { held_at: Some(Instant::now()), ..ask_pending("production-db-0", "t1") });
            })
        };
        let (api, client) = FakeApi::new(&db);
        let first = reconciler(client, instances(&db, pods.clone()));
        pending(&first);
        pipeline::reconcile(Arc::new(db.clone()), first).await.expect("reconciles");
        let requests = api.requests();
        let recorded = requests.iter().position(|r| {
            r.path.ends_with("/mydatabases/production-db/status")
                && r.body["status"]["currentPrimary"] == "production-db-1"
                && r.body["status"]["currentPrimaryUid"] == "uid-production-db-1"
        });
        let labelled = labelled_primary_at(&api, "production-db-1");
        assert!(
            recorded.is_some() && labelled.is_some() && recorded < labelled,
            "recorded {recorded:?}, labelled {labelled:?}"
        );

        // The record refused: no pod is told, the failover stays pending.
        let (api, client) = FakeApi::new(&db);
        api.refuse("PATCH", "/mydatabases/production-db/status", 500, "InternalError", "etcd is away");
        let reconciler = reconciler(client, instances(&db, pods));
        pending(&reconciler);
        pipeline::reconcile(Arc::new(db.clone()), reconciler.clone()).await.ok();
        assert_eq!(labelled_primary_at(&api, "production-db-1"), None);
        assert!(reconciler.keeper().state(&db).pending.is_some(), "the failover waits for its record");
    }

    #[tokio::test]
    async fn preferred_records_going_on_alone_before_the_primary_is_told() {
        use crate::mydatabase::ha::failover::tests::{labelled, pod};
        let mut db = held();
        db.spec.replicas = 2;
        db.spec.replication = ReplicationMode::Preferred;
        // production-db-0 serves; no standby has streamed from it for longer than the wait.
        let pods = vec![
            labelled(pod("production-db-0", Role::Primary, "0/500", None), "primary"),
            labelled(pod("production-db-1", Role::Replica, "0/400", None), "replica"),
        ];
        let alone = |reconciler: &crate::mydatabase::reconcile::MyDatabaseReconciler| {
            reconciler.keeper().update_state(&db, |state| {
                state.chosen = Some("production-db-0".into());
                state.chosen_uid = Some("uid-production-db-0".into());
                let since = Instant::now().checked_sub(synchronous::PREFERRED_WAIT * 2).unwrap_or_else(Instant::now);
                state.synchronous = synchronous::Watch::alone_since(since);
            })
        };
        let told = |api: &FakeApi, names: &str| {
            api.requests().iter().position(|r| {
                r.method == "PATCH"
                    && r.path.ends_with("/pods/production-db-0")
                    && r.body["metadata"]["annotations"][SYNCHRONOUS_STANDBYS] == names
            })
        };
        let (api, client) = FakeApi::new(&db);
        let first = reconciler(client, instances(&db, pods.clone()));
        alone(&first);
        pipeline::reconcile(Arc::new(db.clone()), first.clone()).await.expect("reconciles");
        let recorded = api.requests().iter().position(|r| {
            r.path.ends_with("/mydatabases/production-db/status")
                && r.body["status"]["asynchronous"]["primary"] == "production-db-0"
        });
        let stopped_waiting = told(&api, "");
        assert!(
            recorded.is_some() && stopped_waiting.is_some() && recorded < stopped_waiting,
            "recorded {recorded:?}, told {stopped_waiting:?}"
        );
        assert!(first.keeper().asynchronous(&db).is_some());

        // The record refused: the primary keeps waiting for its standby.
        let (api, client) = FakeApi::new(&db);
        api.refuse("PATCH", "/mydatabases/production-db/status", 500, "InternalError", "etcd is away");
        let reconciler = reconciler(client, instances(&db, pods));
        alone(&reconciler);
        pipeline::reconcile(Arc::new(db.clone()), reconciler.clone()).await.ok();
        assert_eq!(told(&api, ""), None, "told to go on alone without the record");
        assert!(told(&api, r#"ANY 1 ("production-db-1")"#).is_some(), "its standby stays named");
        assert_eq!(reconciler.keeper().asynchronous(&db), None);
    }

    #[tokio::test]
    async fn a_restarted_operator_follows_the_recorded_primary_not_a_stale_label() {
        use crate::mydatabase::ha::failover::tests::{labelled, pod};
        let mut db = held();
        // Promoted and recorded, but the label writes never landed; the operator then restarted.
        db.status = Some(MyDatabaseStatus {
            current_primary: Some("production-db-1".into()),
            current_primary_uid: Some("uid-production-db-1".into()),
            ..Default::default()
        });
        let pods = vec![
            labelled(pod("production-db-0", Role::Replica, "0/500", None), "primary"),
            pod("production-db-1", Role::Replica, "0/700", Some("t1")),
            pod("production-db-2", Role::Replica, "0/500", Some("t1")),
        ];
        let (api, client) = FakeApi::new(&db);
        pipeline::reconcile(Arc::new(db.clone()), reconciler(client, instances(&db, pods))).await.expect("reconciles");
        assert!(labelled_primary_at(&api, "production-db-1").is_some(), "the recorded primary gets its label");
        let asked = api.requests().iter().any(|r| r.body.to_string().contains(POSITION_REQUEST));
        assert!(!asked, "no second failover: the recorded pod is the one chosen, not a replacement");
    }

    fn ask_pending(lost: &str, token: &str) -> Pending {
        Pending {
            token: token.into(),
            asked_at: Instant::now(),
            began: Instant::now(),
            lost_at: crate::runtime::status::now(),
            why: format!("{lost}: its pod is gone"),
            switchover: None,
            held_at: None,
            blocked_told: false,
        }
    }
}
