//! Stage 1, read: a WebApp's children as the owned watches' caches hold them.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::runtime::reflector::Store;

use super::service;
use crate::api::WebApp;
use crate::runtime::cache;

/// The caches of the children, filled by the owned watches.
pub struct Caches {
    pub deployments: Store<Deployment>,
    pub services: Store<Service>,
}

/// What the cluster holds for one WebApp.
#[derive(Debug, Default)]
pub struct Observed {
    pub deployment: Option<Deployment>,
    pub service: Option<Service>,
}

pub fn read(app: &WebApp, caches: &Caches) -> Observed {
    let namespace = app.namespace().unwrap_or_default();
    Observed {
        deployment: cache::get(&caches.deployments, &namespace, &app.name_any()),
        service: cache::get(&caches.services, &namespace, &service::name(app)),
    }
}
