//! The WebApp controller: a Deployment and a Service per WebApp, kept as the
//! spec says, with drift set back as soon as the owned watches see it.
//!
//! `observed` reads, `deployment` and `service` build, `reconcile` runs the
//! pipeline, `status` derives the status.

pub mod deployment;
pub mod observed;
pub mod reconcile;
pub mod service;
pub mod status;

use std::sync::Arc;

use futures::{StreamExt, stream};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;

use crate::api::WebApp;
use crate::runtime::cache::{self, Packed};
use crate::runtime::controller::{ControllerDef, RunParams, drive};
use crate::runtime::permissions::Permission;
use crate::runtime::{meta, queue, scoped_api};

/// The WebApp controller, for the operator's table.
pub const CONTROLLER: ControllerDef =
    ControllerDef { name: reconcile::CONTROLLER, rbac: RBAC, run: |params| Box::pin(run(params)) };

/// What the WebApp controller does with the API, and nothing more.
pub const RBAC: &[Permission] = &[
    Permission { group: "apps.keelson.dev", resources: &["webapps"], verbs: &["list", "watch"] },
    Permission { group: "apps.keelson.dev", resources: &["webapps/status"], verbs: &["patch"] },
    // Children's owner references block the owner's deletion: admission asks for this.
    Permission { group: "apps.keelson.dev", resources: &["webapps/finalizers"], verbs: &["update"] },
    Permission { group: "apps", resources: &["deployments"], verbs: &["get", "list", "watch", "create", "patch"] },
    Permission { group: "", resources: &["services"], verbs: &["get", "list", "watch", "create", "patch"] },
    // Only for a Deployment stuck without available pods: why they do not start.
    Permission { group: "", resources: &["pods"], verbs: &["list"] },
];

/// Runs the WebApp controller until shutdown.
pub async fn run(params: RunParams) {
    let RunParams { ctx, readiness, namespace, concurrency, on_synced, shutdown } = params;
    let namespace = namespace.as_deref();
    let managed = meta::managed_selector(deployment::APP_NAME);
    let watch = |kind: &str| cache::Watching {
        health: readiness.watch(format!("{}/{kind}", reconcile::CONTROLLER)),
        streaming_lists: ctx.settings.streaming_lists,
    };
    let (apps, app_events) = cache::watch(scoped_api::<WebApp>(&ctx.client, namespace), "", watch("WebApp"));
    let (deployments, deployment_events) =
        cache::watch(scoped_api::<Packed<Deployment>>(&ctx.client, namespace), &managed, watch("Deployment"));
    let (services, service_events) =
        cache::watch(scoped_api::<Packed<Service>>(&ctx.client, namespace), &managed, watch("Service"));
    let triggers = stream::select_all([
        queue::trigger_self(app_events).boxed(),
        queue::trigger_owners(deployment_events).boxed(),
        queue::trigger_owners(service_events).boxed(),
    ]);
    let reconciler = Arc::new(reconcile::WebAppReconciler { ctx, caches: observed::Caches { deployments, services } });
    drive(apps, triggers, reconciler, concurrency, on_synced, shutdown).await;
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::api::webapp::{ServiceType, WebApp, WebAppSpec};
    use kube::api::ObjectMeta;

    /// The tutorial's WebApp, as the API server would hand it over.
    pub fn sample() -> WebApp {
        let mut app = WebApp::new(
            "sandy-app",
            WebAppSpec {
                replicas: 3,
                image: "nginx:1.25-alpine".into(),
                port: 80,
                service_type: ServiceType::NodePort,
                ..Default::default()
            },
        );
        app.metadata = ObjectMeta {
            name: Some("sandy-app".into()),
            namespace: Some("default".into()),
            uid: Some("2f1b1a34-0000-4000-8000-000000000001".into()),
            generation: Some(1),
            ..Default::default()
        };
        app
    }
}
