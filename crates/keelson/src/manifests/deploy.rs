//! The objects that run Keelson in a cluster: namespace, ServiceAccount,
//! bindings and the manager Deployment (kubebuilder's `config/manager`).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, HTTPGetAction, Namespace, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, Service,
    ServiceAccount, ServicePort, ServiceSpec,
};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::ObjectMeta;

use super::rbac::{CLUSTER_ROLE_NAME, LEADER_ROLE_NAME, METRICS_AUTH_ROLE_NAME, NODE_READER_ROLE_NAME};
use crate::operator::MANAGER_CONTAINER;
use crate::runtime::{meta, security};

pub const NAMESPACE: &str = "keelson-system";
pub const SERVICE_ACCOUNT: &str = "keelson-controller-manager";
/// distroless's `nonroot` user.
const MANAGER_UID: i64 = 65532;
/// The image `config/` and the chart name by default (`make deploy IMG=…` sets another).
pub const IMAGE: &str = concat!("keelson:", env!("CARGO_PKG_VERSION"));

fn labels() -> BTreeMap<String, String> {
    [("app.kubernetes.io/name", "keelson"), ("app.kubernetes.io/component", "manager")]
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect()
}

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: namespace.map(Into::into),
        labels: Some(labels()),
        ..Default::default()
    }
}

/// The operator's namespace, admitted under the `restricted` Pod Security Standard.
pub fn namespace() -> Namespace {
    let mut metadata = meta(NAMESPACE, None);
    metadata.labels.get_or_insert_with(Default::default).extend([
        ("pod-security.kubernetes.io/enforce".to_string(), "restricted".to_string()),
        ("pod-security.kubernetes.io/enforce-version".to_string(), "latest".to_string()),
    ]);
    Namespace { metadata, ..Default::default() }
}

pub fn service_account() -> ServiceAccount {
    ServiceAccount { metadata: meta(SERVICE_ACCOUNT, Some(NAMESPACE)), ..Default::default() }
}

fn subject() -> Vec<Subject> {
    vec![Subject {
        kind: "ServiceAccount".into(),
        name: SERVICE_ACCOUNT.into(),
        namespace: Some(NAMESPACE.into()),
        ..Default::default()
    }]
}

pub fn cluster_role_binding() -> ClusterRoleBinding {
    cluster_binding(CLUSTER_ROLE_NAME)
}

/// Binds the node reader cluster-wide, also in namespaced mode (nodes have no namespace).
pub fn node_reader_binding() -> ClusterRoleBinding {
    cluster_binding(NODE_READER_ROLE_NAME)
}

pub fn metrics_auth_binding() -> ClusterRoleBinding {
    cluster_binding(METRICS_AUTH_ROLE_NAME)
}

/// The ClusterRole `role` bound cluster-wide to the manager, under the same name.
fn cluster_binding(role: &str) -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: meta(role, None),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: role.into(),
        },
        subjects: Some(subject()),
    }
}

pub fn leader_election_role_binding() -> RoleBinding {
    RoleBinding {
        metadata: meta(LEADER_ROLE_NAME, Some(NAMESPACE)),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: LEADER_ROLE_NAME.into(),
        },
        subjects: Some(subject()),
    }
}

fn probe(path: &str, initial_delay: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("health".into()),
            ..Default::default()
        }),
        initial_delay_seconds: Some(initial_delay),
        period_seconds: Some(10),
        ..Default::default()
    }
}

/// The manager Deployment running `image`: non-root, read-only root filesystem,
/// no privilege escalation, all capabilities dropped, RuntimeDefault seccomp.
/// MyDatabase pods copy the instance manager from the same image.
pub fn manager_deployment(image: &str) -> Deployment {
    let quantity = |q: &str| Quantity(q.into());
    let container = Container {
        name: MANAGER_CONTAINER.into(),
        image: Some(image.into()),
        args: Some(vec!["run".into(), "--leader-elect".into(), "--log-format=json".into()]),
        env: Some(vec![
            meta::field_env("POD_NAME", "metadata.name"),
            meta::field_env("POD_NAMESPACE", "metadata.namespace"),
        ]),
        ports: Some(vec![
            ContainerPort {
                name: Some("metrics".into()),
                container_port: 8080,
                protocol: Some("TCP".into()),
                ..Default::default()
            },
            ContainerPort {
                name: Some("health".into()),
                container_port: 8081,
                protocol: Some("TCP".into()),
                ..Default::default()
            },
        ]),
        liveness_probe: Some(probe("/healthz", 15)),
        readiness_probe: Some(probe("/readyz", 5)),
        resources: Some(ResourceRequirements {
            requests: Some([("cpu".to_string(), quantity("10m")), ("memory".to_string(), quantity("32Mi"))].into()),
            limits: Some([("cpu".to_string(), quantity("500m")), ("memory".to_string(), quantity("128Mi"))].into()),
            ..Default::default()
        }),
        security_context: Some(security::restricted_container()),
        ..Default::default()
    };
    Deployment {
        metadata: meta("keelson-controller-manager", Some(NAMESPACE)),
        spec: Some(DeploymentSpec {
            replicas: Some(1),
            selector: LabelSelector { match_labels: Some(labels()), ..Default::default() },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta { labels: Some(labels()), ..Default::default() }),
                spec: Some(PodSpec {
                    service_account_name: Some(SERVICE_ACCOUNT.into()),
                    termination_grace_period_seconds: Some(10),
                    security_context: Some(security::restricted_pod(MANAGER_UID, None)),
                    containers: vec![container],
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Service in front of `/metrics`, for Prometheus.
pub fn metrics_service() -> Service {
    Service {
        metadata: meta("keelson-controller-manager-metrics", Some(NAMESPACE)),
        spec: Some(ServiceSpec {
            selector: Some(labels()),
            ports: Some(vec![ServicePort {
                name: Some("metrics".into()),
                port: 8080,
                target_port: Some(IntOrString::String("metrics".into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}
