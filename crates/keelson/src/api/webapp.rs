//! `WebApp` (`apps.keelson.dev/v1`): a stateless image served by a Deployment and a Service.

use k8s_openapi::api::core::v1::{EnvFromSource, EnvVar, Probe, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::reference;

/// Desired state of a WebApp: how many copies of which image, and how it is exposed.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "apps.keelson.dev",
    version = "v1",
    kind = "WebApp",
    doc = "A web application: Keelson runs its image in a Deployment behind a Service and keeps both as the spec says.",
    namespaced,
    status = "WebAppStatus",
    shortname = "wa",
    category = "keelson",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Available", type_ = "integer", json_path = ".status.availableReplicas"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct WebAppSpec {
    /// Number of pods to run. 0 stops the app but keeps its Service.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0, max = 10000))]
    pub replicas: i32,

    /// Container image to run, e.g. `nginx:1.25-alpine`.
    #[schemars(length(min = 1, max = 512))]
    #[x_kube(validation = Rule::new(reference::IMAGE_RULE).message(reference::IMAGE_MESSAGE))]
    pub image: String,

    /// Port the container listens on; the Service exposes the same port.
    #[serde(default = "default_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,

    /// How the Service is exposed: ClusterIP, NodePort (the default) or LoadBalancer.
    #[serde(default)]
    pub service_type: ServiceType,

    /// Environment variables of the container (as in a pod).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128))]
    pub env: Vec<EnvVar>,

    /// Whole ConfigMaps or Secrets as environment variables (as in a pod).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub env_from: Vec<EnvFromSource>,

    /// Compute resources of the container (as in a pod); none by default. An HPA on CPU
    /// needs a CPU request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// When a pod receives traffic (as in a pod); none by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_probe: Option<Probe>,

    /// When a pod is restarted (as in a pod); none by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness_probe: Option<Probe>,
}

/// The kind of Service in front of the pods.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
pub enum ServiceType {
    ClusterIP,
    #[default]
    NodePort,
    LoadBalancer,
}

impl ServiceType {
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceType::ClusterIP => "ClusterIP",
            ServiceType::NodePort => "NodePort",
            ServiceType::LoadBalancer => "LoadBalancer",
        }
    }
}

fn default_replicas() -> i32 {
    1
}

fn default_port() -> i32 {
    80
}

/// Observed state of a WebApp, written by Keelson only.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebAppStatus {
    /// Scaling while the Deployment converges, Running once every desired pod is available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<WebAppPhase>,
    /// Pods of the Deployment that are available.
    #[serde(default)]
    pub available_replicas: i32,
    /// Pods of the Deployment, available or not (used by the scale subresource).
    #[serde(default)]
    pub replicas: i32,
    /// Label selector of the pods, for the scale subresource and HPAs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Available, Progressing and Degraded, in the Kubernetes condition format.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Lifecycle phase of a WebApp.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum WebAppPhase {
    Scaling,
    Running,
}
