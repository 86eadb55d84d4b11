//! One-shot pods: a shell command in a real container on the real node,
//! waited for until it ends, with what it printed.

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{LogParams, PostParams};
use serde_json::{Value, json};

use crate::{DEFAULT_TIMEOUT, TestNamespace, wait_for};

/// How a one-shot pod ended.
#[derive(Debug)]
pub struct Finished {
    pub succeeded: bool,
    pub logs: String,
}

/// A pod that runs `script` with bash in `image` once; edit the JSON to add
/// volumes or a security context before passing it to [`run`].
pub fn shell_pod(name: &str, image: &str, script: &str) -> Value {
    json!({
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": image, "command": ["bash", "-c", script]}],
        }
    })
}

/// Creates the pod, waits until it has ended and returns its output.
pub async fn run(ns: &TestNamespace, pod: Value) -> anyhow::Result<Finished> {
    let pod: Pod = serde_json::from_value(pod).context("not a pod")?;
    let name = pod.metadata.name.clone().context("the pod has no name")?;
    let pods = ns.api::<Pod>();
    pods.create(&PostParams::default(), &pod).await.with_context(|| format!("cannot create pod {name}"))?;
    let ended = wait_for(&pods, &name, "the pod to end", DEFAULT_TIMEOUT, |p| {
        matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
    })
    .await?;
    let logs =
        pods.logs(&name, &LogParams::default()).await.with_context(|| format!("cannot read the logs of {name}"))?;
    let succeeded = ended.status.and_then(|s| s.phase).as_deref() == Some("Succeeded");
    Ok(Finished { succeeded, logs })
}
