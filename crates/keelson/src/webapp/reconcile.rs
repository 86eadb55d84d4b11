//! One WebApp reconcile, stage by stage (see `runtime::pipeline`): read the
//! children from the caches → nothing to validate beyond the schema → build
//! the Deployment and the Service → apply both side by side → status.

use std::sync::Arc;

use kube::ResourceExt;

use super::observed::{self, Caches, Observed};
use super::{deployment, service, status};
use crate::Result;
use crate::api::webapp::{WebApp, WebAppStatus};
use crate::runtime::{Applier, Context, Invalid, Outcome, Reconciler};

pub const CONTROLLER: &str = "webapp";

pub struct WebAppReconciler {
    pub ctx: Arc<Context>,
    pub caches: Caches,
}

pub struct Desired {
    deployment: k8s_openapi::api::apps::v1::Deployment,
    service: k8s_openapi::api::core::v1::Service,
}

impl Reconciler for WebAppReconciler {
    type Object = WebApp;
    type Observed = Observed;
    type Desired = Desired;
    type Status = WebAppStatus;
    const CONTROLLER: &'static str = CONTROLLER;

    fn context(&self) -> &Context {
        &self.ctx
    }

    async fn read(&self, app: &WebApp) -> Result<Observed> {
        observed::read(app, &self.caches, &self.ctx.client).await
    }

    /// A Deployment without available pods is looked at again once it counts as stuck.
    fn recheck(_app: &WebApp, observed: &Observed) -> Option<std::time::Duration> {
        let unavailable = observed.deployment.as_ref().and_then(observed::unavailable_for)?;
        observed::STUCK_AFTER.checked_sub(unavailable).map(|left| left + std::time::Duration::from_secs(1))
    }

    /// The schema and its CEL rules check every field of a WebApp.
    fn validate(_app: &WebApp, _observed: &Observed) -> Result<(), Invalid> {
        Ok(())
    }

    fn build(&self, app: &WebApp, _observed: &Observed) -> Result<Desired> {
        Ok(Desired { deployment: deployment::build(app)?, service: service::build(app)? })
    }

    /// The two children are independent: applied side by side.
    async fn apply(&self, _app: &WebApp, observed: Observed, desired: Desired, applier: &Applier<'_>) -> Observed {
        let (deployment, service) = tokio::join!(
            applier.apply(&self.caches.deployments, desired.deployment),
            applier.apply(&self.caches.services, desired.service),
        );
        Observed { deployment, service, ..observed }
    }

    /// Pods on their way up, nothing wrong: news only when they are all up.
    fn progressing(status: &WebAppStatus) -> bool {
        let available = status.conditions.iter().find(|c| c.type_ == "Available");
        status.phase == Some(crate::api::webapp::WebAppPhase::Scaling)
            && available
                .is_some_and(|c| matches!(c.reason.as_str(), "ReplicasUnavailable" | "MinimumReplicasAvailable"))
    }

    fn status(app: &WebApp, observed: &Observed, outcome: &Outcome) -> WebAppStatus {
        status::compute(app, observed, outcome, &crate::runtime::status::now())
    }

    fn current_status(app: &WebApp) -> Option<&WebAppStatus> {
        app.status.as_ref()
    }

    async fn announce(&self, app: &WebApp, new: &WebAppStatus, _outcome: &Outcome) {
        if app.status.as_ref().and_then(|s| s.phase) != new.phase {
            let (namespace, name) = (app.namespace().unwrap_or_default(), app.name_any());
            tracing::info!(namespace, name, phase = ?new.phase, available = new.available_replicas, "WebApp phase changed");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::runtime::Action;
    use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
    use k8s_openapi::api::core::v1::Service;

    use super::*;
    use crate::runtime::drift::stamp_desired_hash;
    use crate::runtime::fake_api::{FakeApi, cache};
    use crate::runtime::metrics::{ChildWriteLabels, DriftLabels};
    use crate::runtime::outcome::RESYNC;
    use crate::runtime::{Metrics, pipeline};
    use crate::webapp::tests::sample;

    /// The children exactly as Keelson last applied them, the Deployment settled.
    fn applied(app: &WebApp) -> (Deployment, Service) {
        let mut deployment = deployment::build(app).expect("builds");
        stamp_desired_hash(&mut deployment).expect("stamps");
        deployment.metadata.generation = Some(1);
        let replicas = Some(app.spec.replicas);
        deployment.status = Some(DeploymentStatus {
            observed_generation: Some(1),
            replicas,
            updated_replicas: replicas,
            available_replicas: replicas,
            ..Default::default()
        });
        let mut service = service::build(app).expect("builds");
        stamp_desired_hash(&mut service).expect("stamps");
        (deployment, service)
    }

    fn reconciler(client: kube::Client, deployments: Vec<Deployment>, services: Vec<Service>) -> Arc<WebAppReconciler> {
        let ctx = Context::new(client, Arc::new(Metrics::default()), crate::runtime::Settings::default());
        Arc::new(WebAppReconciler {
            ctx,
            caches: Caches { deployments: cache(deployments), services: cache(services) },
        })
    }

    #[tokio::test]
    async fn reconcile_creates_deployment_and_service_and_holds_the_progress() {
        let app = sample();
        let (api, client) = FakeApi::new(&app);
        let reconciler = reconciler(client, vec![], vec![]);
        let action = pipeline::reconcile(Arc::new(app.clone()), reconciler.clone()).await;
        assert_eq!(action.ok(), Some(Action::requeue(pipeline::STATUS_SETTLE)), "looked at again when the hold ends");
        let mut applies = api.applies();
        applies.sort();
        assert_eq!(applies, ["deployments/sandy-app", "services/sandy-app-service"]);
        for apply in api.requests().iter().filter(|r| r.is_apply()) {
            assert!(apply.query.contains("fieldManager=keelson") && apply.query.contains("force=true"), "{apply:?}");
        }
        assert!(api.status_writes().is_empty(), "0/3 pods is no news in the first seconds");
        let child_reads = || api.requests().iter().filter(|r| r.method == "GET" && !r.path.contains("webapps")).count();
        // Absent from the cache, which holds Keelson's only: each name is read once, in case a
        // stranger's object has it.
        assert_eq!(child_reads(), 2, "a new WebApp's children are read once before they are created");

        // Again before the cache shows them: read before writing again.
        pipeline::reconcile(Arc::new(app), reconciler).await.expect("reconciles");
        assert_eq!(child_reads(), 4);
    }

    #[tokio::test]
    async fn a_foreign_deployment_of_the_childs_name_is_left_untouched() {
        let app = sample();
        let (api, client) = FakeApi::new(&app);
        // Someone's Deployment already has the name: no controller reference to this WebApp.
        let foreign = serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "sandy-app", "namespace": "default", "uid": "theirs"},
            "spec": {"replicas": 7, "selector": {"matchLabels": {"app": "theirs"}},
                     "template": {"metadata": {"labels": {"app": "theirs"}}, "spec": {"containers": []}}}});
        api.answer("GET", "/deployments/sandy-app", 200, foreign);
        let reconciler = reconciler(client, vec![], vec![]);
        pipeline::reconcile(Arc::new(app), reconciler).await.ok();
        let touched = api.writes().into_iter().filter(|r| r.path.contains("/deployments/")).count();
        assert_eq!(touched, 0, "the foreign Deployment was written to");
        assert_eq!(api.applies(), ["services/sandy-app-service"], "the rest still converges");
        let status = api.status_writes();
        let ready = status.last().map(|w| w.body.to_string()).unwrap_or_default();
        assert!(
            ready.contains("Deployment sandy-app exists and is not Keelson's") && ready.contains("NotOurs"),
            "{ready}"
        );
    }

    /// A WebApp first found on its way a settle time ago (its creation time does not count: it
    /// may have waited in the queue, and then converge at once), reconciled once.
    async fn reconciled_on_its_way_for_a_while() -> (WebApp, FakeApi, Arc<WebAppReconciler>) {
        let app = sample();
        let (api, client) = FakeApi::new(&app);
        let reconciler = reconciler(client, vec![], vec![]);
        let long_ago = std::time::Instant::now() - pipeline::STATUS_SETTLE;
        reconciler.ctx.status_writes.note_converging_at("webapp/default/sandy-app", true, long_ago);
        pipeline::reconcile(Arc::new(app.clone()), reconciler.clone()).await.expect("reconciles");
        (app, api, reconciler)
    }

    #[tokio::test]
    async fn a_webapp_on_its_way_for_a_while_gets_its_progress_written_once() {
        let (app, api, reconciler) = reconciled_on_its_way_for_a_while().await;
        let statuses = api.status_writes();
        assert_eq!(statuses.len(), 1);
        assert_eq!(statuses[0].body["status"]["phase"], "Scaling");
        // Again at once: held, our last write was just now.
        pipeline::reconcile(Arc::new(app), reconciler).await.expect("reconciles");
        assert_eq!(api.status_writes().len(), 1);
    }

    #[tokio::test]
    async fn a_webapp_that_is_gone_is_forgotten() {
        let (app, api, reconciler) = reconciled_on_its_way_for_a_while().await;
        assert_eq!((api.status_writes().len(), api.applies().len()), (1, 2));
        let ctx = &reconciler.ctx;
        ctx.backoff.next_delay(&crate::runtime::meta::object_key(&app));
        let kept = || (ctx.status_writes.recorded(), ctx.own_writes.owners(), ctx.backoff.failing());
        assert_eq!(kept(), (1, 1, 1));
        // What the queue does when the WebApp's key names nothing in the cache any more.
        ctx.forget_object(CONTROLLER, "WebApp", app.metadata.namespace.as_deref(), "sandy-app");
        assert_eq!(kept(), (0, 0, 0));
    }

    #[tokio::test]
    async fn no_progress_is_written_while_a_crowd_of_objects_is_on_its_way() {
        let app = sample();
        let (api, client) = FakeApi::new(&app);
        let reconciler = reconciler(client, vec![], vec![]);
        // On its way for a while (alone, its progress would be due) among ten others.
        let long_ago = std::time::Instant::now() - 2 * pipeline::STATUS_SETTLE;
        reconciler.ctx.status_writes.note_converging_at("webapp/default/sandy-app", true, long_ago);
        for i in 0..crate::runtime::status_writes::CROWD {
            reconciler.ctx.status_writes.note_converging(&format!("webapp/other/{i}"), true);
        }
        let action = pipeline::reconcile(Arc::new(app), reconciler).await.expect("reconciles");
        assert_eq!(api.applies().len(), 2, "the children are applied all the same");
        assert!(api.status_writes().is_empty(), "the eleventh on its way: no progress report");
        assert_eq!(action, Action::requeue(pipeline::STATUS_SETTLE), "looked at again when the hold ends");
    }

    #[tokio::test]
    async fn reconcile_in_steady_state_sends_no_request() {
        let mut app = sample();
        let (deployment, service) = applied(&app);
        let outcome = Outcome::default();
        let observed = Observed { deployment: Some(deployment.clone()), ..Default::default() };
        app.status = Some(status::compute(&app, &observed, &outcome, &crate::runtime::status::now()));
        let (api, client) = FakeApi::new(&app);
        let action = pipeline::reconcile(Arc::new(app), reconciler(client, vec![deployment], vec![service])).await;
        assert_eq!(action.ok(), Some(Action::requeue(RESYNC)));
        assert!(api.requests().is_empty(), "{:?}", api.requests());
    }

    #[tokio::test]
    async fn reconcile_takes_outside_scaling_back() {
        let app = sample();
        let (mut drifted, service) = applied(&app);
        drifted.spec.as_mut().expect("spec").replicas = Some(10);
        let (api, client) = FakeApi::new(&app);
        api.answer("GET", "/deployments/sandy-app", 200, serde_json::to_value(&drifted).expect("json"));
        let reconciler = reconciler(client, vec![drifted], vec![service]);
        pipeline::reconcile(Arc::new(app), reconciler.clone()).await.expect("reconciles");
        // The one field goes back by a merge patch under Keelson's field manager.
        let writes = api.writes();
        assert_eq!(writes.len(), 1, "{writes:?}");
        assert!(writes[0].path.ends_with("/deployments/sandy-app"), "{writes:?}");
        assert!(writes[0].query.contains("fieldManager=keelson"), "{writes:?}");
        assert!(writes[0].content_type.starts_with("application/merge-patch"), "{writes:?}");
        assert_eq!(writes[0].body, serde_json::json!({"spec": {"replicas": 3}}));
        let drift = DriftLabels { kind: "Deployment".into(), field: "spec.replicas".into() };
        assert_eq!(reconciler.ctx.metrics.drift_corrections.get_or_create(&drift).get(), 1);
    }

    #[tokio::test]
    async fn drift_in_a_cached_copy_showing_our_last_write_is_reverted_without_a_read() {
        let app = sample();
        let (mut drifted, service) = applied(&app);
        drifted.spec.as_mut().expect("spec").replicas = Some(10);
        drifted.metadata.resource_version = Some("12".into());
        let (api, client) = FakeApi::new(&app);
        let reconciler = reconciler(client, vec![drifted], vec![service]);
        reconciler.ctx.own_writes.record(
            "WebApp/default/sandy-app",
            "Deployment/default/sandy-app".into(),
            Some("11".into()),
        );
        pipeline::reconcile(Arc::new(app), reconciler.clone()).await.expect("reconciles");
        assert!(!api.requests().iter().any(|r| r.method == "GET"), "{:?}", api.requests());
        let writes = api.writes();
        assert_eq!(writes.len(), 1, "{writes:?}");
        assert!(writes[0].path.ends_with("/deployments/sandy-app"), "{writes:?}");
        // How long the drifted copy waited in the cache before the revert went out.
        let text = reconciler.ctx.metrics.render();
        assert!(text.contains("keelson_drift_revert_delay_seconds_count{kind=\"Deployment\"} 1"), "{text}");
    }

    #[tokio::test]
    async fn scaling_with_another_drifted_field_goes_back_by_apply() {
        let app = sample();
        let (mut drifted, service) = applied(&app);
        let spec = drifted.spec.as_mut().expect("spec");
        spec.replicas = Some(10);
        spec.selector.match_labels = Some([("app".to_string(), "other".to_string())].into());
        let (api, client) = FakeApi::new(&app);
        api.answer("GET", "/deployments/sandy-app", 200, serde_json::to_value(&drifted).expect("json"));
        pipeline::reconcile(Arc::new(app), reconciler(client, vec![drifted], vec![service])).await.expect("reconciles");
        assert_eq!(api.applies(), ["deployments/sandy-app"]);
        let sent = api.requests().into_iter().find(|r| r.is_apply()).expect("apply");
        assert_eq!(sent.body["spec"]["replicas"], 3);
    }

    #[tokio::test]
    async fn reconcile_replaces_a_list_whose_entry_an_outsider_edited() {
        let app = sample();
        let (deployment, mut edited) = applied(&app);
        if let Some(port) = edited.spec.as_mut().and_then(|s| s.ports.as_mut()).and_then(|p| p.first_mut()) {
            port.port = 8080;
        }
        let (api, client) = FakeApi::new(&app);
        api.answer("GET", "/services/sandy-app-service", 200, serde_json::to_value(&edited).expect("json"));
        pipeline::reconcile(Arc::new(app), reconciler(client, vec![deployment], vec![edited]))
            .await
            .expect("reconciles");
        // A merge patch replaces the list whole: no foreign entry survives beside Keelson's.
        let writes = api.writes();
        let sent = writes.iter().find(|r| r.path.ends_with("/services/sandy-app-service")).expect("a write");
        assert!(sent.content_type.starts_with("application/merge-patch"), "{sent:?}");
        assert_eq!(
            sent.body["spec"]["ports"],
            serde_json::json!([{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 80}])
        );
    }

    #[tokio::test]
    async fn reconcile_follows_a_spec_change_as_an_update_not_drift() {
        let mut app = sample();
        let (deployment, service) = applied(&app);
        app.spec.image = "nginx:1.27".into();
        let (api, client) = FakeApi::new(&app);
        api.answer("GET", "/deployments/sandy-app", 200, serde_json::to_value(&deployment).expect("json"));
        let reconciler = reconciler(client, vec![deployment], vec![service]);
        pipeline::reconcile(Arc::new(app), reconciler.clone()).await.expect("reconciles");
        let sent = api.requests().into_iter().find(|r| r.is_apply()).expect("apply");
        assert_eq!(sent.body["spec"]["template"]["spec"]["containers"][0]["image"], "nginx:1.27");
        let metrics = &reconciler.ctx.metrics;
        assert_eq!(
            metrics.child_writes.get_or_create(&ChildWriteLabels { kind: "Deployment".into(), action: "update" }).get(),
            1
        );
        assert!(!metrics.render().contains("keelson_drift_corrections_total{"), "a spec change is not drift");
    }

    #[tokio::test]
    async fn reconcile_records_a_refused_child_and_still_applies_the_other() {
        let app = sample();
        let (api, client) = FakeApi::new(&app);
        api.refuse("PATCH", "/services/sandy-app-service", 422, "Invalid", "spec.ports[0].nodePort: Invalid value");
        let result = pipeline::reconcile(Arc::new(app), reconciler(client, vec![], vec![])).await;
        assert!(matches!(result, Err(crate::Error::ChildrenFailed { conflict: false, .. })), "{result:?}");
        assert!(api.applies().contains(&"deployments/sandy-app".to_string()));
        let statuses = api.status_writes();
        assert_eq!(statuses.len(), 1, "status is written even when a child fails");
        let conditions = statuses[0].body["status"]["conditions"].as_array().cloned().unwrap_or_default();
        let degraded = conditions.iter().find(|c| c["type"] == "Degraded").expect("Degraded");
        assert_eq!(degraded["status"], "True");
        let message = degraded["message"].as_str().unwrap_or_default();
        assert!(message.contains("Service sandy-app-service") && message.contains("Invalid"), "{message}");
    }

    #[tokio::test]
    async fn reconcile_leaves_a_deleted_webapp_to_the_garbage_collector() {
        let mut app = sample();
        app.metadata.deletion_timestamp = Some(crate::runtime::status::now());
        let (api, client) = FakeApi::new(&app);
        let action = pipeline::reconcile(Arc::new(app), reconciler(client, vec![], vec![])).await;
        assert_eq!(action.ok(), Some(Action::await_change()));
        assert!(api.requests().is_empty());
    }
}
