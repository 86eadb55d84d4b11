//! Stage 1, read: a WebApp's children as the owned watches' caches hold them,
//! and, only for a Deployment stuck without available pods, its pods (from
//! the API server: a cache of every WebApp pod would cost more memory than
//! the rare look is worth).

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, ListParams};
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};

use super::{deployment, service};
use crate::api::WebApp;
use crate::runtime::cache::{self, Packed};
use crate::runtime::meta;
use crate::{Error, Result};

/// How long a Deployment may lack available pods before its pods are asked why.
pub const STUCK_AFTER: Duration = Duration::from_secs(30);

/// The caches of the children, filled by the owned watches.
pub struct Caches {
    pub deployments: Store<Packed<Deployment>>,
    pub services: Store<Packed<Service>>,
}

/// What the cluster holds for one WebApp.
#[derive(Debug, Default)]
pub struct Observed {
    pub deployment: Option<Deployment>,
    pub service: Option<Service>,
    /// The pods, only while the Deployment is stuck.
    pub pods: Vec<Pod>,
}

pub async fn read(app: &WebApp, caches: &Caches, client: &Client) -> Result<Observed> {
    // An unsynced cache's emptiness is not the cluster's (after a restart, a child
    // missing from it would be "created" again, and called drift).
    cache::synced(&caches.deployments, "Deployments").await?;
    cache::synced(&caches.services, "Services").await?;
    let namespace = app.namespace().unwrap_or_default();
    let deployment = cache::get(&caches.deployments, &namespace, &app.name_any());
    let pods = match deployment.as_ref().and_then(unavailable_for) {
        Some(unavailable) if unavailable >= STUCK_AFTER => {
            let selector = meta::selector(&deployment::selector_labels(app));
            Api::<Pod>::namespaced(client.clone(), &namespace)
                .list(&ListParams::default().labels(&selector))
                .await
                .map_err(Error::kube(format!("list the pods of WebApp {namespace}/{}", app.name_any())))?
                .items
        }
        _ => Vec::new(),
    };
    Ok(Observed { deployment, service: cache::get(&caches.services, &namespace, &service::name(app)), pods })
}

/// How long the Deployment has reported `Available=False`, if it does.
pub fn unavailable_for(deployment: &Deployment) -> Option<Duration> {
    let conditions = deployment.status.as_ref()?.conditions.as_ref()?;
    let available = conditions.iter().find(|c| c.type_ == "Available" && c.status == "False")?;
    let since = available.last_transition_time.as_ref()?.0;
    let elapsed = k8s_openapi::jiff::Timestamp::now().duration_since(since);
    Some(Duration::try_from(elapsed).unwrap_or_default())
}
