//! Where the instances (and the Jobs beside them) may run: the user's node
//! selector, tolerations, affinity, priority and pull secrets, on top of
//! Keelson's preference for one instance per node.

use k8s_openapi::api::core::v1::{Affinity, PodAffinityTerm, PodAntiAffinity, PodSpec, WeightedPodAffinityTerm};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::names;
use crate::api::MyDatabase;

/// Unless the user's affinity says otherwise, instances prefer nodes of their own.
fn affinity(db: &MyDatabase) -> Affinity {
    let mut affinity = db.spec.affinity.clone().unwrap_or_default();
    if affinity.pod_anti_affinity.is_none() {
        affinity.pod_anti_affinity = Some(PodAntiAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![WeightedPodAffinityTerm {
                weight: 100,
                pod_affinity_term: PodAffinityTerm {
                    topology_key: "kubernetes.io/hostname".into(),
                    label_selector: Some(LabelSelector {
                        match_labels: Some(names::pod_selector(db)),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            }]),
            ..Default::default()
        });
    }
    affinity
}

/// An instance's pod: everything the user set.
pub fn instance(db: &MyDatabase, pod: PodSpec) -> PodSpec {
    PodSpec { affinity: Some(affinity(db)), priority_class_name: db.spec.priority_class_name.clone(), ..job(db, pod) }
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
    use k8s_openapi::api::core::v1::{LocalObjectReference, NodeAffinity, Toleration};

    #[test]
    fn instances_prefer_nodes_of_their_own_unless_told_otherwise() {
        let pod = instance(&sample(), PodSpec::default());
        let anti = pod.affinity.and_then(|a| a.pod_anti_affinity).expect("anti-affinity");
        assert!(anti.preferred_during_scheduling_ignored_during_execution.is_some());
        assert!(pod.node_selector.is_none() && pod.tolerations.is_none() && pod.priority_class_name.is_none());

        let mut db = sample();
        db.spec.affinity = Some(Affinity {
            node_affinity: Some(NodeAffinity::default()),
            pod_anti_affinity: Some(PodAntiAffinity::default()),
            ..Default::default()
        });
        let affinity = instance(&db, PodSpec::default()).affinity.expect("affinity");
        assert_eq!(affinity.pod_anti_affinity, Some(PodAntiAffinity::default()), "the user's anti-affinity wins");
        assert!(affinity.node_affinity.is_some());
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
