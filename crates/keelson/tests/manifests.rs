//! The committed `config/` tree is exactly what the code generates.

use serde::Deserialize;

#[test]
fn committed_manifests_are_current() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let files = keelson::manifests::files().expect("manifests render");
    let mut stale = Vec::new();
    for (path, expected) in &files {
        match std::fs::read_to_string(root.join(path)) {
            Ok(actual) if &actual == expected => {}
            Ok(_) => stale.push(format!("{path} differs")),
            Err(_) => stale.push(format!("{path} is missing")),
        }
    }
    assert!(stale.is_empty(), "generated manifests are stale; run `make manifests`:\n{}", stale.join("\n"));
}

/// `helm template` of charts/keelson with `extra` values; None without helm.
fn helm_run(extra: &[&str]) -> Option<std::process::Output> {
    let helm = match std::env::var("HELM") {
        Ok(helm) => helm,
        Err(_) if std::env::var("CI").is_ok_and(|v| v == "true") => panic!("HELM is not set (make test sets it)"),
        Err(_) => {
            eprintln!("SKIPPING: HELM is not set (hack/helm.sh provides helm)");
            return None;
        }
    };
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let output = std::process::Command::new(helm)
        .args(["template", "keelson", "charts/keelson", "--namespace", keelson::manifests::deploy::NAMESPACE])
        .args(extra)
        .current_dir(&root)
        .output()
        .expect("run helm");
    Some(output)
}

/// The same, rendered, as JSON objects.
fn helm_template(extra: &[&str]) -> Option<Vec<serde_json::Value>> {
    let output = helm_run(extra)?;
    assert!(output.status.success(), "helm template failed: {}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).expect("utf8");
    let mut rendered = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let value = serde_json::to_value(serde_yaml::Value::deserialize(document).expect("yaml")).expect("json");
        if !value.is_null() {
            rendered.push(value);
        }
    }
    Some(rendered)
}

fn key(v: &serde_json::Value) -> String {
    format!("{}/{}", v["kind"].as_str().unwrap_or(""), v["metadata"]["name"].as_str().unwrap_or(""))
}

/// `helm template` of charts/keelson with default values renders exactly the
/// objects `make deploy` applies (CRDs ship in the chart's crds/ folder).
#[test]
fn helm_chart_renders_the_generated_objects() {
    let Some(rendered) = helm_template(&[]) else { return };
    let expected = keelson::manifests::chart_objects().expect("objects");
    assert_eq!(rendered.len(), expected.len(), "chart renders {:?}", rendered.iter().map(key).collect::<Vec<_>>());
    for want in expected {
        let have =
            rendered.iter().find(|r| key(r) == key(&want)).unwrap_or_else(|| panic!("chart lacks {}", key(&want)));
        assert_eq!(have, &want, "{} differs between the chart and the generated manifests", key(&want));
    }
}

/// With `watchNamespace`, the manager watches that namespace and holds its rights there only.
#[test]
fn helm_chart_in_namespaced_mode_binds_the_watched_namespace_only() {
    let Some(rendered) = helm_template(&["--set", "watchNamespace=team-a"]) else { return };
    // Cluster-wide, only what has no namespace: which nodes are cordoned, and the reviews of who
    // scrapes /metrics (creating a review reads nothing).
    let cluster_wide: Vec<String> = rendered.iter().filter(|r| r["kind"] == "ClusterRoleBinding").map(key).collect();
    assert_eq!(
        cluster_wide,
        [keelson::manifests::rbac::METRICS_AUTH_ROLE_NAME, keelson::manifests::rbac::NODE_READER_ROLE_NAME]
            .map(|role| format!("ClusterRoleBinding/{role}"))
    );
    let reviews = rendered.iter().find(|r| key(r) == "ClusterRole/keelson-metrics-auth").expect("the reviews' role");
    for rule in reviews["rules"].as_array().into_iter().flatten() {
        assert_eq!(rule["verbs"], serde_json::json!(["create"]), "{rule}");
        let resource = rule["resources"][0].as_str().unwrap_or_default();
        assert!(["tokenreviews", "subjectaccessreviews"].contains(&resource), "{rule}");
    }
    let binding = rendered.iter().find(|r| key(r) == "RoleBinding/keelson-manager").expect("a RoleBinding");
    assert_eq!(binding["metadata"]["namespace"], "team-a");
    assert_eq!(binding["roleRef"]["name"], keelson::manifests::rbac::CLUSTER_ROLE_NAME);
    let manager = rendered.iter().find(|r| r["kind"] == "Deployment").expect("the manager");
    let args = manager["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains("--namespace=team-a"), "{args}");
}

/// One image setting reaches the manager; the instance manager follows it unless
/// `instanceImage` says otherwise; pull secrets, placement and labels reach their objects;
/// values the schema refuses are refused by name.
#[test]
fn helm_chart_values_reach_the_manager_and_are_checked() {
    let Some(rendered) = helm_template(&[
        "--set",
        "image.repository=registry.example.com/keelson",
        "--set",
        "image.tag=1.2.3",
        "--set",
        "imagePullSecrets[0].name=registry",
        "--set",
        "nodeSelector.pool=system",
        "--set",
        "podAnnotations.team=platform",
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.serviceMonitor.labels.release=prometheus",
    ]) else {
        return;
    };
    let manager = rendered.iter().find(|r| r["kind"] == "Deployment").expect("the manager");
    let pod = &manager["spec"]["template"];
    assert_eq!(pod["spec"]["containers"][0]["image"], "registry.example.com/keelson:1.2.3");
    assert_eq!(pod["spec"]["imagePullSecrets"][0]["name"], "registry");
    assert_eq!(pod["spec"]["nodeSelector"]["pool"], "system");
    assert_eq!(pod["metadata"]["annotations"]["team"], "platform");
    let env = pod["spec"]["containers"][0]["env"].to_string();
    assert!(!env.contains("KEELSON_INSTANCE_IMAGE"), "the instance manager follows the manager's image: {env}");
    let monitor = rendered.iter().find(|r| r["kind"] == "ServiceMonitor").expect("a ServiceMonitor");
    assert_eq!(monitor["metadata"]["labels"]["release"], "prometheus");

    let Some(pinned) = helm_template(&["--set", "instanceImage=registry.example.com/keelson:1.2.2"]) else { return };
    let manager = pinned.iter().find(|r| r["kind"] == "Deployment").expect("the manager");
    let env = manager["spec"]["template"]["spec"]["containers"][0]["env"].to_string();
    assert!(env.contains("KEELSON_INSTANCE_IMAGE") && env.contains("keelson:1.2.2"), "{env}");
}

#[test]
fn helm_chart_refuses_values_outside_its_schema() {
    let Some(output) = helm_run(&["--set", "logFormat=xml"]) else { return };
    assert!(!output.status.success(), "an unknown logFormat was rendered");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("logFormat"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The monitoring values render the PodMonitor, the PrometheusRule and the
/// dashboard exactly as config/prometheus and config/grafana hold them, in the
/// release namespace, with the labels a Prometheus or Grafana selects by.
#[test]
fn helm_chart_ships_the_monitoring_objects_on_request() {
    let Some(rendered) = helm_template(&[
        "--set",
        "monitoring.podMonitor.enabled=true",
        "--set",
        "monitoring.podMonitor.labels.release=prometheus",
        "--set",
        "monitoring.prometheusRule.enabled=true",
        "--set",
        "monitoring.prometheusRule.labels.release=prometheus",
        "--set",
        "monitoring.grafanaDashboard.enabled=true",
    ]) else {
        return;
    };
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let config = |file: &str| -> serde_json::Value {
        let text = std::fs::read_to_string(root.join(file)).expect("read");
        serde_json::to_value(serde_yaml::from_str::<serde_yaml::Value>(&text).expect("yaml")).expect("json")
    };
    for (kind, file) in [
        ("PodMonitor", "config/prometheus/podmonitor.yaml"),
        ("PrometheusRule", "config/prometheus/prometheusrule.yaml"),
    ] {
        let have = rendered.iter().find(|r| r["kind"] == kind).unwrap_or_else(|| panic!("no {kind}"));
        assert_eq!(have["spec"], config(file)["spec"], "{kind} differs from {file}");
        assert_eq!(have["metadata"]["namespace"], keelson::manifests::deploy::NAMESPACE);
        assert_eq!(have["metadata"]["labels"]["release"], "prometheus", "{kind}");
    }
    let dashboard = rendered.iter().find(|r| r["kind"] == "ConfigMap").expect("the dashboard's ConfigMap");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let shipped: serde_json::Value =
        serde_json::from_str(dashboard["data"]["keelson-mydatabase.json"].as_str().expect("json")).expect("parses");
    let source: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("config/grafana/keelson-mydatabase.json")).expect("read"),
    )
    .expect("parses");
    assert_eq!(shipped, source, "the chart's dashboard differs from config/grafana");
    // Off by default.
    let Some(default) = helm_template(&[]) else { return };
    assert!(!default.iter().any(|r| r["kind"] == "PodMonitor" || r["kind"] == "PrometheusRule"));
}
