//! Least-privilege RBAC, generated from the rules each controller declares
//! (`runtime::permissions`, the `rbac` of each entry of `operator::CONTROLLERS`).

use std::collections::BTreeMap;

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use kube::api::ObjectMeta;

use crate::operator::CONTROLLERS;
use crate::runtime::permissions::{EVENTS, LEADER_ELECTION, METRICS_AUTH, NODES, Permission};

pub const CLUSTER_ROLE_NAME: &str = "keelson-manager";
pub const LEADER_ROLE_NAME: &str = "keelson-leader-election";
pub const NODE_READER_ROLE_NAME: &str = "keelson-node-reader";
pub const METRICS_AUTH_ROLE_NAME: &str = "keelson-metrics-auth";
pub const METRICS_READER_ROLE_NAME: &str = "keelson-metrics-reader";

fn labels() -> BTreeMap<String, String> {
    [("app.kubernetes.io/name", "keelson"), ("app.kubernetes.io/managed-by", "keelson")]
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect()
}

/// Merges permissions by (group, resource) so each pair appears once, with sorted verbs.
fn rules(permissions: &[&[Permission]]) -> Vec<PolicyRule> {
    let mut merged: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for permission in permissions.iter().flat_map(|p| p.iter()) {
        for resource in permission.resources {
            let verbs = merged.entry((permission.group.to_string(), resource.to_string())).or_default();
            for verb in permission.verbs {
                if !verbs.iter().any(|v| v == verb) {
                    verbs.push(verb.to_string());
                }
            }
            verbs.sort();
        }
    }
    merged
        .into_iter()
        .map(|((group, resource), verbs)| PolicyRule {
            api_groups: Some(vec![group]),
            resources: Some(vec![resource]),
            verbs,
            ..Default::default()
        })
        .collect()
}

/// The ClusterRole the manager runs with: exactly what the controllers use.
pub fn cluster_role() -> ClusterRole {
    ClusterRole {
        metadata: ObjectMeta { name: Some(CLUSTER_ROLE_NAME.into()), labels: Some(labels()), ..Default::default() },
        rules: Some(rules(&CONTROLLERS.iter().map(|c| c.rbac).chain([EVENTS]).collect::<Vec<_>>())),
        ..Default::default()
    }
}

/// Which nodes are cordoned: cluster-scoped, so bound cluster-wide in every mode.
pub fn node_reader_role() -> ClusterRole {
    ClusterRole {
        metadata: ObjectMeta { name: Some(NODE_READER_ROLE_NAME.into()), labels: Some(labels()), ..Default::default() },
        rules: Some(rules(&[NODES])),
        ..Default::default()
    }
}

/// Checking who scrapes `/metrics` (`--metrics-secure`): cluster-scoped
/// reviews, so bound cluster-wide in every mode.
pub fn metrics_auth_role() -> ClusterRole {
    ClusterRole {
        metadata: ObjectMeta {
            name: Some(METRICS_AUTH_ROLE_NAME.into()),
            labels: Some(labels()),
            ..Default::default()
        },
        rules: Some(rules(&[METRICS_AUTH])),
        ..Default::default()
    }
}

/// What a scraper needs of `--metrics-secure`: bind it to Prometheus's ServiceAccount.
pub fn metrics_reader_role() -> ClusterRole {
    ClusterRole {
        metadata: ObjectMeta {
            name: Some(METRICS_READER_ROLE_NAME.into()),
            labels: Some(labels()),
            ..Default::default()
        },
        rules: Some(vec![PolicyRule {
            non_resource_urls: Some(vec!["/metrics".into()]),
            verbs: vec!["get".into()],
            ..Default::default()
        }]),
        ..Default::default()
    }
}

/// The Role for leader election, bound in the operator's namespace.
pub fn leader_election_role(namespace: &str) -> Role {
    Role {
        metadata: ObjectMeta {
            name: Some(LEADER_ROLE_NAME.into()),
            namespace: Some(namespace.into()),
            labels: Some(labels()),
            ..Default::default()
        },
        rules: Some(rules(&[LEADER_ELECTION])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_wildcards_and_each_resource_once() {
        let role = cluster_role();
        let rules = role.rules.expect("rules");
        let mut seen = std::collections::HashSet::new();
        for rule in &rules {
            for field in [rule.api_groups.as_ref(), rule.resources.as_ref(), Some(&rule.verbs)].into_iter().flatten() {
                assert!(!field.iter().any(|v| v == "*"), "wildcard in {rule:?}");
            }
            let key = (rule.api_groups.clone(), rule.resources.clone());
            assert!(seen.insert(key), "duplicate rule {rule:?}");
        }
    }

    #[test]
    fn webapp_may_apply_deployments_but_not_delete_them() {
        let rules = cluster_role().rules.expect("rules");
        let deployments = rules
            .iter()
            .find(|r| r.resources.as_deref() == Some(&["deployments".to_string()]))
            .expect("deployments rule");
        assert!(deployments.verbs.contains(&"patch".to_string()));
        assert!(!deployments.verbs.contains(&"delete".to_string()));
    }
}
