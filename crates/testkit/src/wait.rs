//! Waiting on conditions, with a timeout and a useful report when it runs out.

use std::fmt::Debug;
use std::time::Duration;

use anyhow::bail;
use kube::Resource;
use kube::api::Api;
use kube::runtime::wait::await_condition;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::diagnostics::dump_namespace;

/// Generous: the cluster is shared by tests running in parallel on 2 cores.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// Waits until `condition` holds for the object `name` (absent counts as not holding).
pub async fn wait_for<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    timeout: Duration,
    condition: impl Fn(&K) -> bool,
) -> anyhow::Result<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned + Send + Sync + 'static,
{
    let waiting = await_condition(api.clone(), name, move |object: Option<&K>| object.is_some_and(&condition));
    match tokio::time::timeout(timeout, waiting).await {
        Ok(Ok(Some(object))) => Ok(object),
        Ok(Ok(None)) => bail!("{name} vanished while waiting for {what}"),
        Ok(Err(error)) => bail!("watch failed while waiting for {what}: {error}"),
        Err(_) => {
            let current = api.get_opt(name).await.ok().flatten();
            let report = report(api, current.as_ref()).await;
            bail!("timed out after {timeout:?} waiting for {what} on {} {name}\n{report}", K::kind(&()))
        }
    }
}

/// Waits until the object `name` no longer exists.
pub async fn wait_for_deletion<K>(api: &Api<K>, name: &str, what: &str, timeout: Duration) -> anyhow::Result<()>
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned + Send + Sync + 'static,
{
    let gone = await_condition(api.clone(), name, |object: Option<&K>| object.is_none());
    match tokio::time::timeout(timeout, gone).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => bail!("watch failed while waiting for {what}: {error}"),
        Err(_) => {
            let current = api.get_opt(name).await.ok().flatten();
            let report = report(api, current.as_ref()).await;
            bail!("timed out after {timeout:?} waiting for {what}\n{report}")
        }
    }
}

async fn report<K>(api: &Api<K>, current: Option<&K>) -> String
where
    K: Resource + Clone + Serialize,
{
    let object = match current {
        Some(object) => serde_yaml::to_string(object).unwrap_or_default(),
        None => "(absent)".to_string(),
    };
    let namespace = current.and_then(|o| o.meta().namespace.clone());
    let namespace_report = match namespace {
        Some(ns) => dump_namespace(Api::<K>::clone(api).into_client(), &ns).await,
        None => String::new(),
    };
    format!("--- object ---\n{object}{namespace_report}")
}

/// Polls `check` every 100 ms until it returns true, failing after `timeout`.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
