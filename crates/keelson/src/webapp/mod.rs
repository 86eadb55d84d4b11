//! The WebApp controller: a Deployment and a Service per WebApp, kept as the
//! spec says, with drift set back as soon as the owned watches see it.

pub mod deployment;
pub mod reconcile;
pub mod service;
pub mod status;

use std::future::Future;
use std::sync::Arc;

use futures::FutureExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};

use crate::api::WebApp;
use crate::manifests::rbac::Permission;
use crate::runtime::controller::drive;
use crate::runtime::{Context, Current, MANAGED_BY_SELECTOR, scoped_api};

/// What the WebApp controller does with the API, and nothing more.
pub const RBAC: &[Permission] = &[
    Permission { group: "apps.keelson.dev", resources: &["webapps"], verbs: &["get", "list", "watch"] },
    Permission { group: "apps.keelson.dev", resources: &["webapps/status"], verbs: &["get", "patch", "update"] },
    Permission { group: "apps", resources: &["deployments"], verbs: &["get", "list", "watch", "create", "patch"] },
    Permission { group: "", resources: &["services"], verbs: &["get", "list", "watch", "create", "patch"] },
];

/// The WebApp controller's context: the shared one, plus caches of the
/// children filled by the owned watches, so a reconcile reads them without
/// a request to the API server.
pub struct WebAppContext {
    pub shared: Arc<Context>,
    pub deployments: Store<Deployment>,
    pub services: Store<Service>,
}

impl std::ops::Deref for WebAppContext {
    type Target = Context;
    fn deref(&self) -> &Context {
        &self.shared
    }
}

impl AsRef<Context> for WebAppContext {
    fn as_ref(&self) -> &Context {
        &self.shared
    }
}

/// The cache once it holds its first full list; until then the API server is asked.
pub fn cached<K>(store: &Store<K>) -> Current<'_, K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    match store.wait_until_ready().now_or_never() {
        Some(Ok(())) => Current::Cached(store),
        _ => Current::Unknown,
    }
}

/// Runs the WebApp controller until `shutdown` resolves; calls `on_synced`
/// once the WebApp cache is filled.
pub async fn run(
    ctx: Arc<Context>,
    namespace: Option<&str>,
    concurrency: u16,
    on_synced: impl FnOnce() + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let (apps, deployments, services) = (
        scoped_api::<WebApp>(&client, namespace),
        scoped_api::<Deployment>(&client, namespace),
        scoped_api::<Service>(&client, namespace),
    );
    let owned = watcher::Config::default().labels(MANAGED_BY_SELECTOR);
    // One watch per child kind feeds both the cache and the controller's
    // triggers (deletions included); managedFields are dropped to save memory.
    let (deployment_cache, deployment_writer) = reflector::store::<Deployment>();
    let (service_cache, service_writer) = reflector::store::<Service>();
    let deployment_events = watcher(deployments, owned.clone())
        .default_backoff()
        .modify(|d| d.managed_fields_mut().clear())
        .reflect(deployment_writer)
        .touched_objects();
    let service_events = watcher(services, owned)
        .default_backoff()
        .modify(|s| s.managed_fields_mut().clear())
        .reflect(service_writer)
        .touched_objects();
    let ctx = Arc::new(WebAppContext { shared: ctx, deployments: deployment_cache, services: service_cache });
    let controller = Controller::new(apps, watcher::Config::default())
        .owns_stream(deployment_events)
        .owns_stream(service_events)
        .with_config(controller::Config::default().concurrency(concurrency))
        .graceful_shutdown_on(shutdown);
    drive(controller, reconcile::CONTROLLER, reconcile::reconcile, ctx, on_synced).await;
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
