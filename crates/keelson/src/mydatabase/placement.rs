//! Where the instances (and the Jobs beside them) may run: the user's node
//! selector, tolerations, affinity, priority and pull secrets, on top of
//! Keelson's spread of the instances over nodes.
//!
//! The spread is a topology spread constraint on the node (`maxSkew: 1`,
//! `DoNotSchedule`), counting only nodes an instance may use (its node
//! selector and affinity, its tolerations): with a node for each instance,
//! each is required to be on a node of its own; with fewer, they are spread
//! as evenly as the nodes allow, and a scale-up past the number of nodes
//! still schedules. The `InstancesSpread` condition says which it is, from
//! where the pods are. A user's own `spec.affinity.podAntiAffinity` replaces it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodSpec, TopologySpreadConstraint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;

use super::names;
use crate::api::MyDatabase;
use crate::api::conditions::DesiredCondition;

/// One instance per node where the nodes allow it, else as even as they allow.
fn spread(db: &MyDatabase) -> Option<Vec<TopologySpreadConstraint>> {
    let users = db.spec.affinity.as_ref().is_some_and(|a| a.pod_anti_affinity.is_some());
    (!users).then(|| {
        vec![TopologySpreadConstraint {
            max_skew: 1,
            topology_key: "kubernetes.io/hostname".into(),
            when_unsatisfiable: "DoNotSchedule".into(),
            label_selector: Some(LabelSelector { match_labels: Some(names::pod_selector(db)), ..Default::default() }),
            // Only nodes an instance may use count (a tainted node it does not tolerate is no domain).
            node_affinity_policy: Some("Honor".into()),
            node_taints_policy: Some("Honor".into()),
            ..Default::default()
        }]
    })
}

/// Whether the scheduled instances are on nodes of their own, from the pods.
pub fn spread_condition(pods: &[Pod]) -> Option<DesiredCondition> {
    let mut by_node: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for pod in pods.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
            by_node.entry(node).or_default().push(pod.name_any());
        }
    }
    if by_node.is_empty() {
        return None;
    }
    let shared: Vec<String> = by_node
        .iter()
        .filter(|(_, pods)| pods.len() > 1)
        .map(|(node, pods)| format!("{} share {node}", pods.join(" and ")))
        .collect();
    Some(match shared.is_empty() {
        true => DesiredCondition::new(
            "InstancesSpread",
            true,
            "OneInstancePerNode",
            "each instance is on a node of its own",
        ),
        false => DesiredCondition::new(
            "InstancesSpread",
            false,
            "InstancesShareNodes",
            format!(
                "{}: fewer usable nodes than instances when they were placed; losing one of those nodes loses each \
                 instance on it",
                shared.join("; ")
            ),
        ),
    })
}

/// An instance's pod: everything the user set.
pub fn instance(db: &MyDatabase, pod: PodSpec) -> PodSpec {
    PodSpec {
        affinity: db.spec.affinity.clone(),
        topology_spread_constraints: spread(db),
        priority_class_name: db.spec.priority_class_name.clone(),
        ..job(db, pod)
    }
}

/// A backup's or restore's pod: the image's pull secrets and the nodes it may
/// use (not the instances' affinity, which speaks of instances).
pub fn job(db: &MyDatabase, pod: PodSpec) -> PodSpec {
    let spec = &db.spec;
    PodSpec {
        node_selector: (!spec.node_selector.is_empty()).then(|| spec.node_selector.clone()),
        tolerations: (!spec.tolerations.is_empty()).then(|| spec.tolerations.clone()),
        image_pull_secrets: (!spec.image_pull_secrets.is_empty()).then(|| spec.image_pull_secrets.clone()),
        ..pod
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mydatabase::tests::sample;
    use k8s_openapi::api::core::v1::{Affinity, LocalObjectReference, NodeAffinity, PodAntiAffinity, Toleration};

    #[test]
    fn instances_spread_one_per_node_unless_told_otherwise() {
        let pod = instance(&sample(), PodSpec::default());
        let spread = pod.topology_spread_constraints.expect("a spread")[0].clone();
        assert_eq!((spread.max_skew, spread.when_unsatisfiable.as_str()), (1, "DoNotSchedule"));
        assert_eq!(spread.node_taints_policy.as_deref(), Some("Honor"));
        assert!(pod.affinity.is_none() && pod.node_selector.is_none() && pod.tolerations.is_none());

        let mut db = sample();
        db.spec.affinity = Some(Affinity {
            node_affinity: Some(NodeAffinity::default()),
            pod_anti_affinity: Some(PodAntiAffinity::default()),
            ..Default::default()
        });
        let pod = instance(&db, PodSpec::default());
        assert!(pod.topology_spread_constraints.is_none(), "the user's anti-affinity replaces it");
        assert_eq!(pod.affinity, db.spec.affinity);
    }

    fn placed(name: &str, node: &str) -> Pod {
        Pod {
            metadata: kube::api::ObjectMeta { name: Some(name.into()), ..Default::default() },
            spec: Some(PodSpec { node_name: Some(node.into()), ..Default::default() }),
            ..Default::default()
        }
    }

    #[test]
    fn instances_sharing_a_node_are_named() {
        assert_eq!(spread_condition(&[]), None, "nothing placed yet");
        let apart = [placed("db-0", "a"), placed("db-1", "b")];
        assert_eq!(spread_condition(&apart).map(|c| c.status), Some(true));
        let shared =
            spread_condition(&[placed("db-0", "a"), placed("db-1", "b"), placed("db-2", "a")]).expect("placed");
        assert!(!shared.status && shared.message.starts_with("db-0 and db-2 share a"), "{}", shared.message);
    }

    #[test]
    fn jobs_get_the_nodes_and_pull_secrets_but_not_the_instances_affinity() {
        let mut db = sample();
        db.spec.node_selector = [("disk".to_string(), "ssd".to_string())].into();
        db.spec.tolerations = vec![Toleration { key: Some("dedicated".into()), ..Default::default() }];
        db.spec.image_pull_secrets = vec![LocalObjectReference { name: "registry".into() }];
        db.spec.priority_class_name = Some("databases".into());
        let pod = job(&db, PodSpec { restart_policy: Some("Never".into()), ..Default::default() });
        assert_eq!(pod.restart_policy.as_deref(), Some("Never"), "the job's own settings stay");
        assert!(pod.node_selector.is_some() && pod.tolerations.is_some() && pod.image_pull_secrets.is_some());
        assert!(pod.affinity.is_none() && pod.priority_class_name.is_none());
        let instance = instance(&db, PodSpec::default());
        assert_eq!(instance.priority_class_name.as_deref(), Some("databases"));
    }
}
