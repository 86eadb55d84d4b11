//! The database's NetworkPolicy (`spec.networkPolicy`): the instances take
//! PostgreSQL connections from the clients and from the database's own pods
//! (replicas streaming, backup Jobs dumping), metrics scrapes from the metrics
//! clients, and nothing else. Ingress only: the instances' own connections
//! (to the API server, to each other) are left to the cluster's egress rules.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::names::{self, PORT};
use crate::Result;
use crate::api::MyDatabase;

/// The policy, or None when `spec.networkPolicy.enabled` is false.
pub fn build(db: &MyDatabase) -> Result<Option<NetworkPolicy>> {
    let settings = db.spec.network_policy.as_ref();
    if settings.is_some_and(|s| !s.enabled) {
        return Ok(None);
    }
    let selector =
        |labels: BTreeMap<String, String>| LabelSelector { match_labels: Some(labels), ..Default::default() };
    // Every pod of the namespace: an empty pod selector and no namespace selector.
    let namespace = NetworkPolicyPeer { pod_selector: Some(LabelSelector::default()), ..Default::default() };
    // The database's own pods: instances, backup and restore Jobs (they all carry both labels).
    let own_pods = NetworkPolicyPeer {
        pod_selector: Some(selector(
            [
                (names::CLUSTER_LABEL.to_string(), db.name_any()),
                ("app.kubernetes.io/name".to_string(), names::APP_NAME.to_string()),
            ]
            .into(),
        )),
        ..Default::default()
    };
    let clients = match settings.and_then(|s| s.clients.clone()) {
        None => vec![namespace],
        Some(clients) => std::iter::once(own_pods).chain(clients).collect(),
    };
    let tcp = |port: i32| NetworkPolicyPort {
        port: Some(IntOrString::Int(port)),
        protocol: Some("TCP".into()),
        ..Default::default()
    };
    let postgres = NetworkPolicyIngressRule { from: Some(clients), ports: Some(vec![tcp(PORT)]) };
    let metrics = NetworkPolicyIngressRule {
        // No `from`: anyone; an empty list would admit no one.
        from: settings.and_then(|s| s.metrics_clients.clone()),
        ports: Some(vec![tcp(i32::from(crate::instance::metrics::PORT))]),
    };
    Ok(Some(NetworkPolicy {
        metadata: names::owned_meta(db, names::network_policy(db), "database")?,
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(selector(names::pod_selector(db))),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![postgres, metrics]),
            egress: None,
        }),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::mydatabase::NetworkPolicySpec as Settings;
    use crate::mydatabase::tests::sample;

    fn rules(db: &MyDatabase) -> Vec<NetworkPolicyIngressRule> {
        build(db).expect("builds").and_then(|p| p.spec).and_then(|s| s.ingress).expect("ingress rules")
    }

    fn port(rule: &NetworkPolicyIngressRule) -> Option<IntOrString> {
        rule.ports.as_ref()?.first()?.port.clone()
    }

    #[test]
    fn by_default_the_namespace_may_connect_and_anyone_may_scrape() {
        let db = sample();
        let policy = build(&db).expect("builds").expect("on by default");
        let spec = policy.spec.expect("spec");
        let selected = spec.pod_selector.and_then(|s| s.match_labels).expect("selects pods");
        assert_eq!(selected, names::pod_selector(&db), "the instances, not the backup Jobs");
        assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
        let [postgres, metrics] = &rules(&db)[..] else { panic!("two rules") };
        assert_eq!(port(postgres), Some(IntOrString::Int(5432)));
        let from = postgres.from.as_ref().expect("from");
        assert_eq!(from.len(), 1);
        assert_eq!(from[0].pod_selector, Some(LabelSelector::default()), "every pod of the namespace");
        assert!(from[0].namespace_selector.is_none(), "not other namespaces");
        assert_eq!(port(metrics), Some(IntOrString::Int(9187)));
        assert!(metrics.from.is_none(), "anyone may scrape");
    }

    #[test]
    fn named_clients_replace_the_namespace_and_the_databases_own_pods_stay() {
        let mut db = sample();
        let app = NetworkPolicyPeer {
            pod_selector: Some(LabelSelector {
                match_labels: Some([("app".to_string(), "shop".to_string())].into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        db.spec.network_policy =
            Some(Settings { enabled: true, clients: Some(vec![app.clone()]), metrics_clients: Some(vec![]) });
        let [postgres, metrics] = &rules(&db)[..] else { panic!("two rules") };
        let from = postgres.from.clone().expect("from");
        assert_eq!(from.len(), 2);
        let own = from[0].pod_selector.as_ref().and_then(|s| s.match_labels.as_ref()).expect("own pods");
        assert_eq!(own.get(names::CLUSTER_LABEL).map(String::as_str), Some("production-db"));
        assert!(!own.contains_key("app.kubernetes.io/component"), "backup Jobs too, not only instances");
        assert_eq!(from[1], app);
        assert_eq!(metrics.from, Some(vec![]), "an empty list: no one scrapes");
        db.spec.network_policy = Some(Settings { enabled: false, clients: None, metrics_clients: None });
        assert!(build(&db).expect("builds").is_none(), "opted out");
    }
}
