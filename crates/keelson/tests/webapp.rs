//! WebApp user stories, end to end on the real control plane.

mod common;

use common::TestOperator;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event, Service};
use keelson::api::webapp::{ServiceType, WebApp, WebAppPhase, WebAppSpec};
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::{DEFAULT_TIMEOUT, TestNamespace, cluster_or_skip, eventually, kubectl, wait_for, wait_for_deletion};

fn tutorial_app(replicas: i32) -> WebApp {
    WebApp::new(
        "sandy-app",
        WebAppSpec {
            replicas,
            image: "nginx:1.25-alpine".into(),
            port: 80,
            service_type: ServiceType::NodePort,
            ..Default::default()
        },
    )
}

fn is_running_with(replicas: i32) -> impl Fn(&WebApp) -> bool {
    move |app| {
        app.spec.replicas == replicas
            && app.status.as_ref().is_some_and(|s| {
                s.phase == Some(WebAppPhase::Running)
                    && s.available_replicas == replicas
                    && s.observed_generation == app.metadata.generation
            })
    }
}

fn deployment_replicas(replicas: i32) -> impl Fn(&Deployment) -> bool {
    move |d| d.spec.as_ref().and_then(|s| s.replicas) == Some(replicas)
}

fn deployment_image(d: &Deployment) -> Option<String> {
    d.spec.as_ref()?.template.spec.as_ref()?.containers.first()?.image.clone()
}

/// Creates the tutorial's WebApp and waits until it runs `replicas` pods.
async fn create_running(ns: &TestNamespace, replicas: i32) -> anyhow::Result<WebApp> {
    let apps = ns.api::<WebApp>();
    apps.create(&PostParams::default(), &tutorial_app(replicas)).await?;
    wait_for(&apps, "sandy-app", &format!("Running {replicas}/{replicas}"), DEFAULT_TIMEOUT, is_running_with(replicas))
        .await
}

async fn warning_events(ns: &TestNamespace, reason: &str) -> anyhow::Result<Vec<Event>> {
    let events = ns.api::<Event>().list(&ListParams::default()).await?;
    Ok(events.items.into_iter().filter(|e| e.reason.as_deref() == Some(reason)).collect())
}

async fn wait_for_event(ns: &TestNamespace, reason: &str, note_contains: &str) -> anyhow::Result<()> {
    eventually(DEFAULT_TIMEOUT, &format!("a {reason} event mentioning {note_contains:?}"), || async {
        warning_events(ns, reason)
            .await
            .is_ok_and(|events| events.iter().any(|e| e.message.as_deref().unwrap_or_default().contains(note_contains)))
    })
    .await
}

#[tokio::test]
async fn create_reaches_running_and_kubectl_shows_the_tutorial_columns() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "webapp-create").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    create_running(&ns, 3).await?;

    let deployment = ns.api::<Deployment>().get("sandy-app").await?;
    let owner = &deployment.owner_references()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str(), owner.controller), ("WebApp", "sandy-app", Some(true)));
    assert_eq!(deployment.labels().get("app.kubernetes.io/managed-by").map(String::as_str), Some("keelson"));
    let service = ns.api::<Service>().get("sandy-app-service").await?;
    let spec = service.spec.clone().unwrap_or_default();
    assert_eq!(spec.type_.as_deref(), Some("NodePort"));
    assert_eq!(spec.ports.unwrap_or_default()[0].port, 80);
    assert_eq!(service.owner_references()[0].kind, "WebApp");

    let table = kubectl(&["-n", &ns.name, "get", "webapps"])?;
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["NAME", "PHASE", "REPLICAS", "AVAILABLE", "AGE"], "{table}");
    let row: Vec<&str> = lines.next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(&row[..4], ["sandy-app", "Running", "3", "3"], "{table}");
    // The short name and the category work too.
    assert!(kubectl(&["-n", &ns.name, "get", "wa"])?.contains("sandy-app"));
    assert!(kubectl(&["-n", &ns.name, "get", "keelson"])?.contains("webapp.apps.keelson.dev/sandy-app"));
    // Tools that read health from a Ready condition (kstatus, Argo CD, Flux) see it.
    let waited = kubectl(&["-n", &ns.name, "wait", "--for=condition=Ready", "webapp/sandy-app", "--timeout=60s"])?;
    assert!(waited.contains("condition met"), "{waited}");
    Ok(())
}

#[tokio::test]
async fn kubectl_scale_deployment_is_taken_back() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "webapp-scale-drift").await?;
    let operator = TestOperator::start(&cluster, &ns).await?;
    create_running(&ns, 3).await?;

    kubectl(&["-n", &ns.name, "scale", "deployment", "sandy-app", "--replicas=10"])?;
    let deployments = ns.api::<Deployment>();
    // The operator may set it back before the first watch event arrives here,
    // so wait for the end state and prove the drift through the Event.
    wait_for(&deployments, "sandy-app", "replicas back at 3", DEFAULT_TIMEOUT, deployment_replicas(3)).await?;
    wait_for_event(&ns, "DriftCorrected", "spec.replicas was 10, set back to 3").await?;
    assert!(operator.counter("keelson_drift_corrections_total") >= 1);
    wait_for(&ns.api::<WebApp>(), "sandy-app", "Running 3/3 again", DEFAULT_TIMEOUT, is_running_with(3)).await?;
    // The revert (a one-field merge patch) left spec.replicas to Keelson alone: kubectl owns nothing,
    // and the next spec change still reaches the Deployment.
    let reverted = deployments.get("sandy-app").await?;
    let owners: Vec<String> = reverted
        .managed_fields()
        .iter()
        .filter(|entry| entry.fields_v1.as_ref().is_some_and(|f| f.0.pointer("/f:spec/f:replicas").is_some()))
        .map(|entry| entry.manager.clone().unwrap_or_default())
        .collect();
    assert!(!owners.is_empty() && owners.iter().all(|m| m == "keelson"), "spec.replicas owned by {owners:?}");
    let scale_up = json!({"spec": {"replicas": 4}});
    ns.api::<WebApp>().patch("sandy-app", &PatchParams::default(), &Patch::Merge(&scale_up)).await?;
    wait_for(&deployments, "sandy-app", "replicas at 4 from the spec", DEFAULT_TIMEOUT, deployment_replicas(4)).await?;
    Ok(())
}

#[tokio::test]
async fn swapped_image_is_reverted() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "webapp-image-drift").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    create_running(&ns, 2).await?;

    kubectl(&["-n", &ns.name, "set", "image", "deployment/sandy-app", "webapp=evil:latest"])?;
    wait_for(&ns.api::<Deployment>(), "sandy-app", "image back at nginx:1.25-alpine", DEFAULT_TIMEOUT, |d| {
        deployment_image(d).as_deref() == Some("nginx:1.25-alpine")
    })
    .await?;
    wait_for_event(&ns, "DriftCorrected", "evil:latest").await?;
    Ok(())
}

/// env, resources and probes reach the container; an outsider's `kubectl set env` is taken back.
#[tokio::test]
async fn env_resources_and_probes_reach_the_pods_and_set_env_is_taken_back() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "webapp-env").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    let apps = ns.api::<WebApp>();
    let app = json!({"apiVersion": "apps.keelson.dev/v1", "kind": "WebApp", "metadata": {"name": "sandy-app"},
        "spec": {"replicas": 1, "image": "nginx:1.25-alpine",
            "env": [{"name": "MODE", "value": "production"}],
            "envFrom": [{"configMapRef": {"name": "settings", "optional": true}}],
            "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
            "readinessProbe": {"httpGet": {"path": "/", "port": 80}, "periodSeconds": 2},
            "livenessProbe": {"tcpSocket": {"port": 80}}}});
    apps.create(&PostParams::default(), &serde_json::from_value(app)?).await?;
    wait_for(&apps, "sandy-app", "Running 1/1", DEFAULT_TIMEOUT, is_running_with(1)).await?;
    let container = |d: &Deployment| d.spec.as_ref()?.template.spec.as_ref()?.containers.first().cloned();
    let deployment = ns.api::<Deployment>().get("sandy-app").await?;
    let webapp = container(&deployment).expect("a container");
    let env = serde_json::to_value(&webapp.env)?;
    assert_eq!(env, json!([{"name": "MODE", "value": "production"}]));
    assert_eq!(serde_json::to_value(&webapp.env_from)?[0]["configMapRef"]["name"], "settings");
    let resources = serde_json::to_value(&webapp.resources)?;
    assert_eq!(
        (resources["requests"]["cpu"].as_str(), resources["limits"]["memory"].as_str()),
        (Some("50m"), Some("64Mi"))
    );
    assert!(webapp.readiness_probe.is_some() && webapp.liveness_probe.is_some());

    kubectl(&["-n", &ns.name, "set", "env", "deployment/sandy-app", "MODE=debug"])?;
    wait_for(&ns.api::<Deployment>(), "sandy-app", "MODE back at production", DEFAULT_TIMEOUT, |d| {
        let env = container(d).and_then(|c| c.env).unwrap_or_default();
        env.iter().any(|e| e.name == "MODE" && e.value.as_deref() == Some("production"))
    })
    .await?;
    wait_for_event(&ns, "DriftCorrected", "debug").await?;
    Ok(())
}

#[tokio::test]
async fn deleted_service_is_recreated_and_edited_type_reverted() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "webapp-service-drift").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    create_running(&ns, 1).await?;
    let services = ns.api::<Service>();
    let original = services.get("sandy-app-service").await?;

    services.delete("sandy-app-service", &DeleteParams::default()).await?;
    let recreated =
        wait_for(&services, "sandy-app-service", "a new Service", DEFAULT_TIMEOUT, |s| s.uid() != original.uid())
            .await?;
    assert_eq!(recreated.spec.and_then(|s| s.type_).as_deref(), Some("NodePort"));
    wait_for_event(&ns, "DriftCorrected", "was deleted").await?;

    kubectl(&["-n", &ns.name, "patch", "service", "sandy-app-service", "-p", r#"{"spec":{"type":"ClusterIP"}}"#])?;
    // The operator may revert before this watch starts: the end state and
    // the Event prove the round trip.
    wait_for(&services, "sandy-app-service", "type NodePort again", DEFAULT_TIMEOUT, |s| {
        s.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("NodePort")
    })
    .await?;
    wait_for_event(&ns, "DriftCorrected", "spec.type was \"ClusterIP\"").await?;
    Ok(())
}

/// Kubernetes merges list entries by key; an outsider who edits a key (a
/// port number, a container's name) must still see the list set back exactly.
#[tokio::test]
async fn edited_list_keys_are_taken_back_exactly() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "webapp-list-drift").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    create_running(&ns, 1).await?;
    let (services, deployments) = (ns.api::<Service>(), ns.api::<Deployment>());
    let json_patch = |kind: &str, name: &str, patch: &str| {
        kubectl(&["-n", &ns.name, "patch", kind, name, "--type=json", "-p", patch]).map(|_| ())
    };

    json_patch("service", "sandy-app-service", r#"[{"op":"replace","path":"/spec/ports/0/port","value":8080}]"#)?;
    wait_for(&services, "sandy-app-service", "exactly port 80 again", DEFAULT_TIMEOUT, |s| {
        let ports = s.spec.as_ref().and_then(|s| s.ports.clone()).unwrap_or_default();
        ports.len() == 1 && ports[0].port == 80
    })
    .await?;
    wait_for_event(&ns, "DriftCorrected", "8080").await?;

    let container_ports = |d: &Deployment| -> Vec<i32> {
        let containers = d.spec.as_ref().and_then(|s| s.template.spec.as_ref()).map(|p| p.containers.clone());
        containers
            .unwrap_or_default()
            .iter()
            .flat_map(|c| c.ports.clone().unwrap_or_default())
            .map(|p| p.container_port)
            .collect()
    };
    let path = "/spec/template/spec/containers/0/ports/0/containerPort";
    json_patch("deployment", "sandy-app", &format!(r#"[{{"op":"replace","path":"{path}","value":9090}}]"#))?;
    wait_for(&deployments, "sandy-app", "exactly container port 80 again", DEFAULT_TIMEOUT, |d| {
        container_ports(d) == [80]
    })
    .await?;

    let container_names = |d: &Deployment| -> Vec<String> {
        let containers = d.spec.as_ref().and_then(|s| s.template.spec.as_ref()).map(|p| p.containers.clone());
        containers.unwrap_or_default().into_iter().map(|c| c.name).collect()
    };
    json_patch(
        "deployment",
        "sandy-app",
        r#"[{"op":"replace","path":"/spec/template/spec/containers/0/name","value":"renamed"}]"#,
    )?;
    wait_for(&deployments, "sandy-app", "exactly the container webapp again", DEFAULT_TIMEOUT, |d| {
        container_names(d) == ["webapp"]
    })
    .await?;
    wait_for(&ns.api::<WebApp>(), "sandy-app", "Running again", DEFAULT_TIMEOUT, is_running_with(1)).await?;
    Ok(())
}

/// Pods the ReplicaSet cannot create (here: a quota) are named in `Available`.
#[tokio::test]
async fn why_pods_are_missing_is_named_in_the_conditions() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "webapp-quota").await?;
    let quota: k8s_openapi::api::core::v1::ResourceQuota =
        serde_json::from_value(json!({"metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}}))?;
    ns.api::<k8s_openapi::api::core::v1::ResourceQuota>().create(&PostParams::default(), &quota).await?;
    // Admission sees a new quota only once its caches do: wait until a dry-run pod is refused.
    let probe: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({"metadata": {"name": "probe"},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]}}))?;
    let dry_run = PostParams { dry_run: true, ..Default::default() };
    eventually(DEFAULT_TIMEOUT, "the quota to be enforced", || async {
        ns.api::<k8s_openapi::api::core::v1::Pod>()
            .create(&dry_run, &probe)
            .await
            .is_err_and(|e| e.to_string().contains("quota"))
    })
    .await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    ns.api::<WebApp>().create(&PostParams::default(), &tutorial_app(1)).await?;
    let app = wait_for(&ns.api::<WebApp>(), "sandy-app", "Available=False naming the quota", DEFAULT_TIMEOUT, |a| {
        a.status.as_ref().is_some_and(|s| {
            s.conditions.iter().any(|c| c.type_ == "Available" && c.status == "False" && c.message.contains("quota"))
        })
    })
    .await?;
    let available = app.status.map(|s| s.conditions).unwrap_or_default().into_iter().find(|c| c.type_ == "Available");
    assert_eq!(available.map(|c| c.reason).as_deref(), Some("FailedCreate"));
    Ok(())
}

#[tokio::test]
async fn spec_edits_are_followed() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "webapp-spec-edits").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    create_running(&ns, 3).await?;
    let apps = ns.api::<WebApp>();
    let deployments = ns.api::<Deployment>();

    for replicas in [5, 2, 0] {
        apps.patch("sandy-app", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": replicas}})))
            .await?;
        wait_for(
            &deployments,
            "sandy-app",
            &format!("{replicas} replicas"),
            DEFAULT_TIMEOUT,
            deployment_replicas(replicas),
        )
        .await?;
        wait_for(&apps, "sandy-app", &format!("Running {replicas}"), DEFAULT_TIMEOUT, is_running_with(replicas))
            .await?;
    }

    apps.patch(
        "sandy-app",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 2, "image": "nginx:1.26-alpine"}})),
    )
    .await?;
    wait_for(&deployments, "sandy-app", "the new image", DEFAULT_TIMEOUT, |d| {
        deployment_image(d).as_deref() == Some("nginx:1.26-alpine")
    })
    .await?;
    wait_for(&apps, "sandy-app", "Running 2 on the new image", DEFAULT_TIMEOUT, is_running_with(2)).await?;
    // A spec change is an update, not drift.
    assert!(warning_events(&ns, "DriftCorrected").await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn kubectl_scale_webapp_is_followed() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "webapp-scale-subresource").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    create_running(&ns, 1).await?;

    kubectl(&["-n", &ns.name, "scale", "webapp", "sandy-app", "--replicas=4"])?;
    wait_for(&ns.api::<WebApp>(), "sandy-app", "Running 4/4", DEFAULT_TIMEOUT, is_running_with(4)).await?;
    let scale = kubectl(&[
        "-n",
        &ns.name,
        "get",
        "--raw",
        &format!("/apis/apps.keelson.dev/v1/namespaces/{}/webapps/sandy-app/scale", ns.name),
    ])?;
    let scale: serde_json::Value = serde_json::from_str(&scale)?;
    assert_eq!(scale["status"]["replicas"], 4);
    assert_eq!(scale["status"]["selector"], "app=sandy-app");
    Ok(())
}

#[tokio::test]
async fn deleting_the_webapp_removes_its_children() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "webapp-delete").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    create_running(&ns, 2).await?;

    ns.api::<WebApp>().delete("sandy-app", &DeleteParams::foreground()).await?;
    wait_for_deletion(&ns.api::<Deployment>(), "sandy-app", "the Deployment to go", DEFAULT_TIMEOUT).await?;
    wait_for_deletion(&ns.api::<Service>(), "sandy-app-service", "the Service to go", DEFAULT_TIMEOUT).await?;
    wait_for_deletion(&ns.api::<WebApp>(), "sandy-app", "the WebApp to go", DEFAULT_TIMEOUT).await?;
    Ok(())
}

#[tokio::test]
async fn steady_state_and_restart_make_no_writes() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "webapp-no-writes").await?;
    let operator = TestOperator::start(&cluster, &ns).await?;
    create_running(&ns, 2).await?;
    let apps = ns.api::<WebApp>();
    let versions = || async {
        let app = apps.get("sandy-app").await?;
        let deployment = ns.api::<Deployment>().get("sandy-app").await?;
        let service = ns.api::<Service>().get("sandy-app-service").await?;
        anyhow::Ok((app.resource_version(), deployment.resource_version(), service.resource_version()))
    };
    // Running means the Deployment has settled; from here only Keelson could write to these objects.
    let before = versions().await?;

    // A metadata-only change triggers a reconcile but must not cause a write.
    let reconciles = operator.counter("keelson_reconcile_total");
    let writes = operator.counter("keelson_child_writes_total") + operator.counter("keelson_status_writes_total");
    apps.patch(
        "sandy-app",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"poke": "1"}}})),
    )
    .await?;
    eventually(DEFAULT_TIMEOUT, "a reconcile after the annotation", || async {
        operator.counter("keelson_reconcile_total") > reconciles
            && operator.counter("keelson_reconciles_in_flight") == 0
    })
    .await?;
    assert_eq!(
        operator.counter("keelson_child_writes_total") + operator.counter("keelson_status_writes_total"),
        writes
    );
    let after_poke = versions().await?;
    assert_eq!((&before.1, &before.2), (&after_poke.1, &after_poke.2), "children were written in steady state");

    // A restarted operator reconciles everything once and writes nothing.
    operator.stop().await?;
    let restarted = TestOperator::start_as_service_account(&cluster, &ns).await?;
    eventually(DEFAULT_TIMEOUT, "the first reconcile after restart", || async {
        restarted.counter("keelson_reconcile_total") >= 1 && restarted.counter("keelson_reconciles_in_flight") == 0
    })
    .await?;
    assert_eq!(restarted.counter("keelson_child_writes_total"), 0);
    assert_eq!(restarted.counter("keelson_status_writes_total"), 0);
    assert_eq!(versions().await?, after_poke, "a restart wrote to the WebApp or its children");
    assert_eq!(ns.api::<Deployment>().list(&ListParams::default()).await?.items.len(), 1, "duplicate Deployments");
    assert_eq!(ns.api::<Service>().list(&ListParams::default()).await?.items.len(), 1, "duplicate Services");
    restarted.stop().await?;
    Ok(())
}

#[tokio::test]
async fn invalid_specs_are_rejected_naming_the_field() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "webapp-invalid").await?;
    common::install(&cluster).await?;
    let cases = [
        (json!({"replicas": -1, "image": "nginx"}), "spec.replicas"),
        (json!({"replicas": 1, "image": ""}), "spec.image"),
        (json!({"replicas": 1}), "spec.image"),
        (json!({"replicas": 1, "image": "nginx", "serviceType": "Ingress"}), "spec.serviceType"),
        (json!({"replicas": 1, "image": "nginx", "port": 70000}), "spec.port"),
        (json!({"replicas": 1, "image": "nginx latest"}), "spec.image"),
        (json!({"replicas": 1, "image": "Registry/Team/App:1"}), "spec.image"),
        (json!({"replicas": 1, "image": " nginx"}), "spec.image"),
    ];
    for (index, (spec, field)) in cases.into_iter().enumerate() {
        let manifest = json!({
            "apiVersion": "apps.keelson.dev/v1", "kind": "WebApp",
            "metadata": {"name": format!("bad-{index}"), "namespace": ns.name}, "spec": spec,
        });
        let path = std::env::temp_dir().join(format!("{}-bad-{index}.json", ns.name));
        std::fs::write(&path, manifest.to_string())?;
        let error =
            kubectl(&["apply", "-f", &path.to_string_lossy()]).expect_err("the API server accepted an invalid WebApp");
        assert!(error.to_string().contains(field), "error for {spec} does not name {field}: {error}");
        let _ = std::fs::remove_file(path);
    }
    assert!(ns.api::<WebApp>().list(&ListParams::default()).await?.items.is_empty());
    // Defaults fill what the tutorial leaves out.
    let created = ns.api::<WebApp>().create(&PostParams::default(), &serde_json::from_value(json!({
        "apiVersion": "apps.keelson.dev/v1", "kind": "WebApp", "metadata": {"name": "defaults"}, "spec": {"image": "nginx"}
    }))?).await?;
    assert_eq!((created.spec.replicas, created.spec.port, created.spec.service_type), (1, 80, ServiceType::NodePort));
    // Valid references of every shape are accepted.
    for (index, image) in
        ["registry.example.com:5000/team/app:1.2.3", "ghcr.io/a_b/c-d", &format!("nginx@sha256:{}", "a".repeat(64))]
            .into_iter()
            .enumerate()
    {
        let app = WebApp::new(&format!("image-{index}"), WebAppSpec { image: image.into(), ..tutorial_app(1).spec });
        ns.api::<WebApp>().create(&PostParams::default(), &app).await?;
    }
    Ok(())
}

/// The longest name whose children all fit is accepted and runs; one more character is refused.
#[tokio::test]
async fn names_are_limited_by_the_longest_child_name() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "webapp-name-limit").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    let apps = ns.api::<WebApp>();
    let too_long = WebApp::new(&"a".repeat(56), tutorial_app(1).spec);
    let refused = apps.create(&PostParams::default(), &too_long).await.expect_err("56 characters accepted");
    assert!(refused.to_string().contains("at most 55 characters"), "{refused}");
    let longest = "b".repeat(55);
    apps.create(&PostParams::default(), &WebApp::new(&longest, tutorial_app(1).spec)).await?;
    wait_for(&apps, &longest, "Running with every child", DEFAULT_TIMEOUT, is_running_with(1)).await?;
    assert!(ns.api::<Service>().get_opt(&format!("{longest}-service")).await?.is_some());
    Ok(())
}

/// A Deployment someone made under the WebApp's name is never taken over: a
/// user who may only create WebApps cannot reach it through Keelson.
#[tokio::test]
async fn a_foreign_deployment_of_the_same_name_is_left_untouched() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::namespace(&cluster, "webapp-foreign").await?;
    let foreign: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "sandy-app", "labels": {"team": "payments"}},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "payments"}},
                 "template": {"metadata": {"labels": {"app": "payments"}},
                              "spec": {"containers": [{"name": "payments", "image": "payments:7"}]}}}}))?;
    let deployments = ns.api::<Deployment>();
    let before = deployments.create(&PostParams::default(), &foreign).await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    ns.api::<WebApp>().create(&PostParams::default(), &tutorial_app(3)).await?;
    let refusal = "Deployment sandy-app exists and is not Keelson's";
    wait_for(&ns.api::<WebApp>(), "sandy-app", "a condition naming the foreign Deployment", DEFAULT_TIMEOUT, |app| {
        app.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.message.contains(refusal)))
    })
    .await?;
    wait_for_event(&ns, "NotOurs", refusal).await?;
    // Its controller writes its status; nobody else wrote to it: no field of Keelson's manager,
    // its spec and labels as they were.
    let after = deployments.get("sandy-app").await?;
    let managers: Vec<String> =
        after.metadata.managed_fields.iter().flatten().filter_map(|f| f.manager.clone()).collect();
    assert!(!managers.iter().any(|m| m.starts_with("keelson")), "written by {managers:?}");
    assert_eq!(after.spec, before.spec, "the foreign Deployment's spec changed");
    assert_eq!(after.metadata.labels, before.metadata.labels);
    assert!(after.metadata.owner_references.is_none());
    // The Service, which was free, is the WebApp's.
    let service = ns.api::<Service>().get("sandy-app-service").await?;
    assert!(service.owner_references().iter().any(|o| o.kind == "WebApp" && o.controller == Some(true)));
    Ok(())
}
