//! Drains and scale-downs hand the primary over before its pod goes.
//!
//! A drain cordons the node, then evicts its pods. The primary's
//! PodDisruptionBudget (see `pdb`) refuses the primary's eviction; Keelson
//! sees the cordon (a watch of cordoned nodes, not of every node) and
//! switches over to a replica on a node that is not cordoned. The former
//! primary is then a replica, which the replicas' budget lets go, and the
//! drain goes on. A scale-down that would remove the primary's ordinal is
//! held back the same way: a switchover to a lower ordinal first.

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};

use futures::{Stream, StreamExt, future};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Resource, ResourceExt};

use super::failover;
use crate::mydatabase::names;
use crate::runtime::health::WatchHealth;

/// The nodes cordoned now (`spec.unschedulable`), by name.
#[derive(Clone, Debug, Default)]
pub struct Cordoned(Arc<RwLock<BTreeSet<String>>>);

impl Cordoned {
    pub fn contains(&self, node: &str) -> bool {
        self.0.read().unwrap_or_else(|p| p.into_inner()).contains(node)
    }

    /// A fixed set, for tests.
    pub fn of(nodes: &[&str]) -> Self {
        Self(Arc::new(RwLock::new(nodes.iter().map(|n| n.to_string()).collect())))
    }

    /// Takes in one watch event; returns the nodes cordoned by it (a drain may begin on them).
    fn take(&self, event: watcher::Event<Node>, relisting: &mut Option<BTreeSet<String>>) -> Vec<String> {
        let mut nodes = self.0.write().unwrap_or_else(|p| p.into_inner());
        match event {
            // The watch selects cordoned nodes: one that stops matching arrives as deleted.
            watcher::Event::Apply(node) => {
                let name = node.name_any();
                if nodes.insert(name.clone()) { vec![name] } else { Vec::new() }
            }
            watcher::Event::Delete(node) => {
                nodes.remove(&node.name_any());
                Vec::new()
            }
            watcher::Event::Init => {
                *relisting = Some(BTreeSet::new());
                Vec::new()
            }
            watcher::Event::InitApply(node) => {
                relisting.get_or_insert_with(BTreeSet::new).insert(node.name_any());
                Vec::new()
            }
            watcher::Event::InitDone => {
                let listed = relisting.take().unwrap_or_default();
                let new: Vec<String> = listed.difference(&nodes).cloned().collect();
                *nodes = listed;
                new
            }
        }
    }
}

/// Watches the cordoned nodes (a field selector: uncordoned nodes cost
/// nothing). Returns the set, and a stream of each node as it is cordoned.
pub fn watch(api: Api<Node>, health: WatchHealth) -> (Cordoned, impl Stream<Item = String> + Send + 'static) {
    let cordoned = Cordoned::default();
    let set = cordoned.clone();
    let config = watcher::Config::default().fields("spec.unschedulable=true");
    let mut relisting = None;
    // Backed off like every other watch: without it a failing watch (a right revoked, an
    // API server restarting) is retried at once, thousands of times a minute.
    let stream = watcher(api, config)
        .backoff(crate::runtime::cache::retry_backoff())
        .inspect(move |event| match event {
            Ok(_) => health.working(),
            Err(error) => health.failed(error),
        })
        .filter_map(|event| future::ready(event.ok()))
        .flat_map(move |event| futures::stream::iter(set.take(event, &mut relisting)));
    (cordoned, stream)
}

/// The node a pod runs on.
pub fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

/// The primary labelled so among `pods` on `node`: the MyDatabases to look at when it is cordoned.
pub fn primaries_on<'a>(pods: impl IntoIterator<Item = &'a Pod>, node: &str) -> Vec<&'a Pod> {
    pods.into_iter()
        .filter(|pod| {
            pod.labels().get(names::ROLE_LABEL).map(String::as_str) == Some(crate::mydatabase::services::PRIMARY)
        })
        .filter(|pod| node_of(pod) == Some(node) && pod.meta().deletion_timestamp.is_none())
        .collect()
}

/// Why the primary must hand over before its pod goes, if it must.
pub fn handover_reason(instances: u32, primary: &str, pods: &[Pod], cordoned: &Cordoned) -> Option<String> {
    let pod = pods.iter().find(|p| p.name_any() == primary)?;
    if instances >= 1 && names::ordinal(primary).is_some_and(|ordinal| ordinal >= instances) {
        return Some(format!("scaling down to {instances} removes the primary's pod {primary}"));
    }
    // One instance: nobody to hand over to; it has no budget to block a drain.
    if instances < 2 {
        return None;
    }
    let node = node_of(pod).filter(|node| cordoned.contains(node))?;
    Some(format!("the primary's node {node} is cordoned (a drain): handing over before the eviction"))
}

/// How many instances the StatefulSet keeps: the spec's, or more while the
/// primary's ordinal is beyond them (a scale-down waits for its handover), or
/// while the primary still waits for a standby beyond them (`named`: its
/// `synchronous_standby_names` as it reports them applied). Such a standby may
/// hold a commit that no other has confirmed: it goes once it is not named.
/// Only `pods` that exist count: a name in the setting is what the server says
/// (a superuser may write anything there), never a reason to grow.
pub fn instances_to_keep(instances: u32, primary: Option<&str>, named: Option<&str>, pods: &[Pod]) -> u32 {
    let beyond = primary.and_then(names::ordinal).filter(|ordinal| instances >= 1 && *ordinal >= instances);
    let named = named.map(quoted_names).unwrap_or_default();
    let waited_for = named
        .iter()
        .filter(|name| pods.iter().any(|pod| pod.name_any() == **name))
        .filter_map(|name| names::ordinal(name))
        .filter(|ordinal| *ordinal >= instances);
    beyond.into_iter().chain(waited_for).map(|ordinal| ordinal.saturating_add(1)).fold(instances, u32::max)
}

/// The names in a `synchronous_standby_names` value: `ANY 1 ("db-1", "db-2")`.
fn quoted_names(setting: &str) -> Vec<&str> {
    setting.split('"').skip(1).step_by(2).collect()
}

/// The replica to hand over to: one that a switchover accepts, on a node
/// that is not cordoned, that stays after a scale-down; the lowest ordinal.
pub fn successor(
    instances: u32,
    primary: &str,
    pods: &[Pod],
    cordoned: &Cordoned,
    standbys: &[String],
) -> Option<String> {
    let mut names: Vec<String> = pods
        .iter()
        .filter(|pod| node_of(pod).is_none_or(|node| !cordoned.contains(node)))
        .map(|pod| pod.name_any())
        .filter(|name| names::ordinal(name).is_some_and(|ordinal| ordinal < instances))
        .filter(|name| failover::switchover_refusal(name, primary, pods, standbys).is_none())
        .collect();
    names.sort_by_key(|name| names::ordinal(name));
    names.into_iter().next()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::instance::Role;
    use crate::mydatabase::ha::failover::tests::{labelled, pod};
    use k8s_openapi::api::core::v1::{PodCondition, PodSpec};

    fn on(mut pod: Pod, node: &str) -> Pod {
        pod.spec = Some(PodSpec { node_name: Some(node.into()), ..Default::default() });
        let status = pod.status.get_or_insert_with(Default::default);
        status.conditions =
            Some(vec![PodCondition { type_: "Ready".into(), status: "True".into(), ..Default::default() }]);
        pod
    }

    fn database() -> Vec<Pod> {
        vec![
            labelled(on(pod("db-0", Role::Replica, "0/500", None), "node-a"), "replica"),
            labelled(on(pod("db-1", Role::Replica, "0/500", None), "node-b"), "replica"),
            labelled(on(pod("db-2", Role::Primary, "0/500", None), "node-c"), "primary"),
        ]
    }

    #[test]
    fn a_cordoned_primary_node_hands_over_to_a_replica_elsewhere() {
        let pods = database();
        let standbys = ["db-0".to_string(), "db-1".to_string()];
        assert_eq!(handover_reason(3, "db-2", &pods, &Cordoned::default()), None, "nothing cordoned");
        assert_eq!(handover_reason(3, "db-2", &pods, &Cordoned::of(&["node-a"])), None, "a replica's node");
        let cordoned = Cordoned::of(&["node-c", "node-a"]);
        let why = handover_reason(3, "db-2", &pods, &cordoned).expect("hands over");
        assert!(why.contains("node-c is cordoned"), "{why}");
        assert_eq!(successor(3, "db-2", &pods, &cordoned, &standbys).as_deref(), Some("db-1"), "not on node-a");
        // One instance never hands over (and has no budget to block the drain).
        assert_eq!(handover_reason(1, "db-0", &pods, &cordoned), None, "db-0's node-a is cordoned");
    }

    #[test]
    fn a_scale_down_that_removes_the_primary_hands_over_to_a_remaining_ordinal() {
        let pods = database();
        let why = handover_reason(2, "db-2", &pods, &Cordoned::default()).expect("hands over");
        assert!(why.contains("scaling down to 2"), "{why}");
        let standbys = ["db-0".to_string(), "db-1".to_string()];
        assert_eq!(successor(2, "db-2", &pods, &Cordoned::default(), &standbys).as_deref(), Some("db-0"));
        assert_eq!(successor(1, "db-2", &pods, &Cordoned::of(&["node-a"]), &standbys), None, "db-0 is cordoned");
        assert!(handover_reason(1, "db-2", &pods, &Cordoned::default()).is_some(), "down to one: still handed over");
        // The StatefulSet keeps the primary's pod until then.
        assert_eq!(instances_to_keep(2, Some("db-2"), None, &pods), 3);
        assert_eq!(instances_to_keep(2, Some("db-1"), None, &pods), 2);
        assert_eq!(instances_to_keep(3, None, None, &pods), 3);
    }

    #[test]
    fn a_scale_down_keeps_a_standby_until_the_primary_no_longer_waits_for_it() {
        let pods = database();
        // 3 → 2: the primary db-0 still applies the old list, which names db-2.
        assert_eq!(instances_to_keep(2, Some("db-0"), Some(r#"ANY 1 ("db-1", "db-2")"#), &pods), 3);
        // It applied the new one: db-2 may go.
        assert_eq!(instances_to_keep(2, Some("db-0"), Some(r#"ANY 1 ("db-1")"#), &pods), 2);
        // 3 → 1: nothing named (asynchronous), or a manager from before the report said it.
        assert_eq!(instances_to_keep(1, Some("db-0"), Some(""), &pods), 1);
        assert_eq!(instances_to_keep(1, Some("db-0"), None, &pods), 1);
        // The primary's own ordinal and a named standby: the larger wins.
        assert_eq!(instances_to_keep(1, Some("db-1"), Some(r#"ANY 1 ("db-0", "db-2")"#), &pods), 3);
        // A name that is no pod of the database (a superuser's ALTER SYSTEM) never grows it.
        assert_eq!(instances_to_keep(2, Some("db-0"), Some(r#"ANY 1 ("db-1", "db-4000000000")"#), &pods), 2);
        assert_eq!(instances_to_keep(2, Some("db-0"), Some(r#"ANY 1 ("other-2")"#), &pods), 2);
    }

    #[test]
    fn the_cordoned_set_follows_the_watch_and_names_newly_cordoned_nodes() {
        let node = |name: &str| Node {
            metadata: kube::api::ObjectMeta { name: Some(name.into()), ..Default::default() },
            ..Default::default()
        };
        let set = Cordoned::default();
        let mut relisting = None;
        assert!(set.take(watcher::Event::Init, &mut relisting).is_empty());
        assert!(set.take(watcher::Event::InitApply(node("a")), &mut relisting).is_empty());
        assert_eq!(set.take(watcher::Event::InitDone, &mut relisting), ["a"]);
        assert_eq!(set.take(watcher::Event::Apply(node("b")), &mut relisting), ["b"]);
        assert!(set.take(watcher::Event::Apply(node("b")), &mut relisting).is_empty(), "b was cordoned already");
        assert!(set.take(watcher::Event::Delete(node("a")), &mut relisting).is_empty());
        assert!(!set.contains("a") && set.contains("b"));
        // A relist replaces the set.
        set.take(watcher::Event::Init, &mut relisting);
        set.take(watcher::Event::InitApply(node("c")), &mut relisting);
        assert_eq!(set.take(watcher::Event::InitDone, &mut relisting), ["c"]);
        assert!(!set.contains("b"));
    }
}
