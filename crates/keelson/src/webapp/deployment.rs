//! The Deployment that runs a WebApp's pods.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{Container, ContainerPort, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use kube::api::ObjectMeta;

use crate::Result;
use crate::api::WebApp;
use crate::runtime::meta;

/// Name of the one container in every WebApp pod.
pub const CONTAINER_NAME: &str = "webapp";

/// The tutorial's selector label, kept so `kubectl get pods -l app=<name>` works.
pub fn selector_labels(app: &WebApp) -> BTreeMap<String, String> {
    [("app".to_string(), app.name_any())].into()
}

/// `app.kubernetes.io/name` of everything a WebApp owns.
pub const APP_NAME: &str = "webapp";

/// Selector and recommended labels for everything a WebApp owns.
pub fn labels(app: &WebApp) -> BTreeMap<String, String> {
    let mut labels = meta::recommended_labels(APP_NAME, "server", &app.name_any());
    labels.extend(selector_labels(app));
    labels
}

/// Builds the desired Deployment `<name>` for `app`.
pub fn build(app: &WebApp) -> Result<Deployment> {
    Ok(Deployment {
        metadata: meta::owned(app, app.name_any(), labels(app))?,
        spec: Some(DeploymentSpec {
            replicas: Some(app.spec.replicas),
            selector: LabelSelector { match_labels: Some(selector_labels(app)), ..Default::default() },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta { labels: Some(labels(app)), ..Default::default() }),
                spec: Some(PodSpec {
                    // The tutorial's web server needs no API access: no token in its pods.
                    automount_service_account_token: Some(false),
                    containers: vec![Container {
                        name: CONTAINER_NAME.into(),
                        image: Some(app.spec.image.clone()),
                        ports: Some(vec![ContainerPort {
                            name: Some("http".into()),
                            container_port: app.spec.port,
                            protocol: Some("TCP".into()),
                            ..Default::default()
                        }]),
                        env: (!app.spec.env.is_empty()).then(|| app.spec.env.clone()),
                        env_from: (!app.spec.env_from.is_empty()).then(|| app.spec.env_from.clone()),
                        resources: app.spec.resources.clone(),
                        readiness_probe: app.spec.readiness_probe.clone(),
                        liveness_probe: app.spec.liveness_probe.clone(),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::webapp::tests::sample;

    #[test]
    fn deployment_follows_the_tutorial() {
        let deployment = build(&sample()).expect("builds");
        assert_eq!(deployment.metadata.name.as_deref(), Some("sandy-app"));
        assert_eq!(deployment.metadata.namespace.as_deref(), Some("default"));
        let owner = &deployment.metadata.owner_references.as_ref().expect("owned")[0];
        assert_eq!((owner.kind.as_str(), owner.controller), ("WebApp", Some(true)));
        let spec = deployment.spec.expect("spec");
        assert_eq!(spec.replicas, Some(3));
        assert_eq!(spec.selector.match_labels, Some([("app".to_string(), "sandy-app".to_string())].into()));
        let template_labels = spec.template.metadata.and_then(|m| m.labels).expect("labels");
        assert_eq!(template_labels.get("app").map(String::as_str), Some("sandy-app"));
        assert_eq!(template_labels.get("app.kubernetes.io/managed-by").map(String::as_str), Some("keelson"));
        let container = &spec.template.spec.expect("pod spec").containers[0];
        assert_eq!(container.name, "webapp");
        assert_eq!(container.image.as_deref(), Some("nginx:1.25-alpine"));
        assert_eq!(container.ports.as_ref().expect("ports")[0].container_port, 80);
    }

    #[test]
    fn env_resources_and_probes_reach_the_container_and_their_absence_adds_nothing() {
        use k8s_openapi::api::core::v1::{EnvVar, HTTPGetAction, Probe, ResourceRequirements};
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
        let plain = build(&sample()).expect("builds").spec.and_then(|s| s.template.spec).expect("pod");
        let container = &plain.containers[0];
        assert!(container.env.is_none() && container.resources.is_none() && container.readiness_probe.is_none());

        let mut app = sample();
        app.spec.env = vec![EnvVar { name: "MODE".into(), value: Some("production".into()), ..Default::default() }];
        app.spec.resources = Some(ResourceRequirements {
            requests: Some([("cpu".to_string(), Quantity("100m".into()))].into()),
            ..Default::default()
        });
        app.spec.readiness_probe = Some(Probe {
            http_get: Some(HTTPGetAction { path: Some("/".into()), port: IntOrString::Int(80), ..Default::default() }),
            ..Default::default()
        });
        let pod = build(&app).expect("builds").spec.and_then(|s| s.template.spec).expect("pod");
        let container = &pod.containers[0];
        assert_eq!(container.env, Some(app.spec.env.clone()));
        assert_eq!(container.resources, app.spec.resources);
        assert_eq!(container.readiness_probe, app.spec.readiness_probe);
    }

    #[test]
    fn object_without_uid_is_an_error_not_a_panic() {
        let mut app = sample();
        app.metadata.uid = None;
        assert!(build(&app).is_err());
    }
}
