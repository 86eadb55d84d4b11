//! One WebApp reconcile, as a pipeline: build the desired children → apply
//! those that differ → compute status → write it if it changed.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};

use super::{WebAppContext, deployment, service, status};
use crate::api::WebApp;
use crate::runtime::controller::report_child_change;
use crate::runtime::{Context, apply_child};
use crate::{Error, Result};

pub const CONTROLLER: &str = "webapp";

/// Without events, look again this often anyway (like controller-runtime's resync).
const RESYNC: Duration = Duration::from_secs(3600);

pub async fn reconcile(app: Arc<WebApp>, ctx: Arc<WebAppContext>) -> Result<Action> {
    let namespace =
        app.namespace().ok_or_else(|| Error::MissingMetadata(format!("WebApp {} has no namespace", app.name_any())))?;
    if app.meta().deletion_timestamp.is_some() {
        // Owner references hand the children to the garbage collector.
        return Ok(Action::await_change());
    }
    let owner = app.object_ref(&());
    let reconciled_before = app.status.as_ref().and_then(|s| s.observed_generation).is_some();

    let desired_deployment = deployment::build(&app)?;
    let desired_service = service::build(&app)?;

    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &namespace);
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut failure: Option<Error> = None;

    // The two children are independent: apply them side by side.
    let deployment_name = app.name_any();
    let service_name = service::name(&app);
    let (deployment_result, service_result) = tokio::join!(
        apply_child(&deployments, desired_deployment, super::cached(&ctx.deployments), &ctx.metrics),
        apply_child(&services, desired_service, super::cached(&ctx.services), &ctx.metrics),
    );
    let observed_deployment = match deployment_result {
        Ok((applied, change)) => {
            report_child_change::<Deployment>(&ctx, &owner, &deployment_name, &change, reconciled_before).await;
            Some(applied)
        }
        Err(error) => {
            failure = Some(error);
            None
        }
    };
    match service_result {
        Ok((_, change)) => {
            report_child_change::<Service>(&ctx, &owner, &service_name, &change, reconciled_before).await
        }
        Err(error) => failure = failure.or(Some(error)),
    }

    let failure_message = failure.as_ref().map(ToString::to_string);
    let new_status =
        status::compute(&app, observed_deployment.as_ref(), failure_message.as_deref(), &crate::runtime::status::now());
    write_status_if_changed(&app, new_status, &ctx).await?;

    match failure {
        Some(error) => Err(error),
        None => Ok(Action::requeue(RESYNC)),
    }
}

async fn write_status_if_changed(
    app: &WebApp,
    new_status: crate::api::webapp::WebAppStatus,
    ctx: &Context,
) -> Result<()> {
    if crate::runtime::status::write_if_changed(ctx, CONTROLLER, app, app.status.as_ref(), &new_status).await?
        && app.status.as_ref().and_then(|s| s.phase) != new_status.phase
    {
        let (namespace, name) = (app.namespace().unwrap_or_default(), app.name_any());
        tracing::info!(namespace, name, phase = ?new_status.phase, available = new_status.available_replicas, "WebApp phase changed");
    }
    Ok(())
}
