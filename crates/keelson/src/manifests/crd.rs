//! CustomResourceDefinitions of every Keelson kind.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::ValidationRule;

use crate::api::{MyDatabase, WebApp};
use crate::runtime::meta::{DerivedName, max_name_length};

pub fn all() -> Vec<CustomResourceDefinition> {
    vec![
        with_name_limit(WebApp::crd(), crate::webapp::service::DERIVED_NAMES),
        with_name_limit(MyDatabase::crd(), crate::mydatabase::names::DERIVED_NAMES),
    ]
}

/// Refuses names whose derived names Kubernetes would refuse: a half-created
/// set of children is worse than a clear "no" at admission.
fn with_name_limit(mut crd: CustomResourceDefinition, derived: &[DerivedName]) -> CustomResourceDefinition {
    let (max, tightest) = max_name_length(derived);
    let kind = crd.spec.names.kind.clone();
    let rule = ValidationRule {
        rule: format!("self.metadata.name.size() <= {max}"),
        message: Some(
            format!(
                "metadata.name: a {kind} name may have at most {max} characters, since {} must fit in {} characters",
                if tightest.suffix.is_empty() {
                    format!("<name> plus {} characters", tightest.added_by_kubernetes)
                } else {
                    format!("<name>{}", tightest.suffix)
                },
                tightest.limit
            ) + &format!(" ({})", tightest.what),
        ),
        ..Default::default()
    };
    for version in &mut crd.spec.versions {
        if let Some(schema) = version.schema.as_mut().and_then(|s| s.open_api_v3_schema.as_mut()) {
            schema.x_kubernetes_validations.get_or_insert_with(Vec::new).push(rule.clone());
        }
    }
    crd
}

#[cfg(test)]
mod tests {
    use super::*;

    fn printer_columns(crd: &CustomResourceDefinition) -> Vec<String> {
        crd.spec.versions[0].additional_printer_columns.iter().flatten().map(|c| c.name.clone()).collect()
    }

    #[test]
    fn webapp_crd_matches_the_tutorial() {
        let crd = WebApp::crd();
        assert_eq!(crd.spec.group, "apps.keelson.dev");
        assert_eq!(crd.spec.names.short_names, Some(vec!["wa".to_string()]));
        assert_eq!(crd.spec.names.categories, Some(vec!["keelson".to_string()]));
        assert_eq!(printer_columns(&crd), ["Phase", "Replicas", "Available", "Age"]);
        let subresources = crd.spec.versions[0].subresources.as_ref().expect("subresources");
        assert!(subresources.status.is_some());
        assert_eq!(subresources.scale.as_ref().expect("scale").spec_replicas_path, ".spec.replicas");
    }

    #[test]
    fn webapp_schema_has_defaults_bounds_and_descriptions() {
        let crd = serde_json::to_value(WebApp::crd()).expect("serializes");
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        assert_eq!(spec["required"], serde_json::json!(["image"]));
        assert_eq!(spec["properties"]["replicas"]["default"], 1);
        assert_eq!(spec["properties"]["replicas"]["minimum"].as_f64(), Some(0.0));
        assert_eq!(spec["properties"]["image"]["minLength"], 1);
        assert_eq!(spec["properties"]["port"]["default"], 80);
        assert_eq!(spec["properties"]["serviceType"]["default"], "NodePort");
        assert_eq!(
            spec["properties"]["serviceType"]["enum"],
            serde_json::json!(["ClusterIP", "NodePort", "LoadBalancer"])
        );
        for field in ["replicas", "image", "port", "serviceType"] {
            assert!(spec["properties"][field]["description"].is_string(), "{field} lacks a description");
        }
    }

    #[test]
    fn name_limits_come_from_the_longest_derived_names() {
        let rules: Vec<String> = all()
            .iter()
            .flat_map(|crd| crd.spec.versions[0].schema.clone())
            .flat_map(|s| s.open_api_v3_schema)
            .flat_map(|s| s.x_kubernetes_validations.unwrap_or_default())
            .map(|r| r.rule)
            .collect();
        // WebApp: <name>-service is a DNS label; MyDatabase: <name>-backup is a CronJob name (52).
        assert!(rules.contains(&"self.metadata.name.size() <= 55".to_string()), "{rules:?}");
        assert!(rules.contains(&"self.metadata.name.size() <= 45".to_string()), "{rules:?}");
    }

    #[test]
    fn mydatabase_crd_has_transition_rules() {
        let crd = MyDatabase::crd();
        assert_eq!(crd.spec.names.short_names, Some(vec!["mydb".to_string()]));
        assert_eq!(printer_columns(&crd), ["Phase", "Ready", "Replicas", "Primary", "Version", "Last Backup", "Age"]);
        let text = serde_json::to_string(&crd).expect("serializes");
        assert!(text.contains("storage may grow but never shrink"));
        assert!(text.contains("x-kubernetes-validations"));
    }
}
