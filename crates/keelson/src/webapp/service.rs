//! The Service `<name>-service` in front of a WebApp's pods.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::deployment::{labels, selector_labels};
use crate::Result;
use crate::api::WebApp;
use crate::runtime::meta::{self, DerivedName};

const SUFFIX: &str = "-service";

pub fn name(app: &WebApp) -> String {
    format!("{}{SUFFIX}", app.name_any())
}

/// Names that grow with the WebApp's: the admission limit on its name comes from these.
pub const DERIVED_NAMES: &[DerivedName] = &[
    DerivedName { suffix: SUFFIX, added_by_kubernetes: 0, limit: 63, what: "a Service name (DNS label)" },
    DerivedName { suffix: "", added_by_kubernetes: 0, limit: 63, what: "the pods' app label" },
];

/// Builds the desired Service for `app`: the spec's type, port → same target port.
pub fn build(app: &WebApp) -> Result<Service> {
    Ok(Service {
        metadata: meta::owned(app, name(app), labels(app))?,
        spec: Some(ServiceSpec {
            type_: Some(app.spec.service_type.as_str().into()),
            selector: Some(selector_labels(app)),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: app.spec.port,
                target_port: Some(IntOrString::Int(app.spec.port)),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::webapp::ServiceType;
    use crate::webapp::tests::sample;

    #[test]
    fn service_is_node_port_80_to_80() {
        let service = build(&sample()).expect("builds");
        assert_eq!(service.metadata.name.as_deref(), Some("sandy-app-service"));
        let spec = service.spec.expect("spec");
        assert_eq!(spec.type_.as_deref(), Some("NodePort"));
        assert_eq!(spec.selector, Some([("app".to_string(), "sandy-app".to_string())].into()));
        let port = &spec.ports.expect("ports")[0];
        assert_eq!((port.port, port.target_port.clone()), (80, Some(IntOrString::Int(80))));
    }

    #[test]
    fn service_type_and_port_follow_the_spec() {
        let mut app = sample();
        app.spec.service_type = ServiceType::ClusterIP;
        app.spec.port = 8080;
        let spec = build(&app).expect("builds").spec.expect("spec");
        assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
        assert_eq!(spec.ports.expect("ports")[0].port, 8080);
    }
}
