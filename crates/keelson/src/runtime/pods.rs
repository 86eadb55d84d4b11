//! Why pods do not start, in the kubelet's and scheduler's own words: the
//! reason a custom resource's conditions name instead of a bare "not ready".

use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod};
use kube::ResourceExt;

/// Container waiting reasons that mean the pod will not start by itself.
const STUCK: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

/// Whether a start failure means the image cannot be had.
pub fn is_image_failure(reason: &str) -> bool {
    matches!(reason, "ErrImagePull" | "ImagePullBackOff" | "InvalidImageName")
}

/// The pod's Ready condition is True.
pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// How the containers of `pods` ended, for those that did: a Job's pod reports
/// its outcome in the termination message.
pub fn terminations<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> impl Iterator<Item = &'a ContainerStateTerminated> {
    pods.into_iter()
        .filter_map(|pod| pod.status.as_ref()?.container_statuses.as_ref())
        .flatten()
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref())
}

/// A reason a pod cannot start, e.g. `ImagePullBackOff`, with the kubelet's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartFailure {
    pub reason: String,
    pub message: String,
}

/// The first pod (by name) that cannot start, and why.
pub fn start_failure(pods: &[Pod]) -> Option<StartFailure> {
    let mut pods: Vec<&Pod> = pods.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
    pods.sort_by_key(|p| p.name_any());
    pods.into_iter().find_map(|pod| {
        let status = pod.status.as_ref()?;
        let unschedulable =
            status.conditions.iter().flatten().find(|c| {
                c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable")
            });
        if let Some(condition) = unschedulable {
            return Some(StartFailure {
                reason: "Unschedulable".into(),
                message: format!("pod {}: {}", pod.name_any(), condition.message.clone().unwrap_or_default()),
            });
        }
        let containers =
            status.init_container_statuses.iter().flatten().chain(status.container_statuses.iter().flatten());
        containers.into_iter().find_map(|container| {
            let waiting = container.state.as_ref()?.waiting.as_ref()?;
            let reason = waiting.reason.clone().filter(|r| STUCK.contains(&r.as_str()))?;
            // A crash loop's own message is only "back-off"; the last exit says why.
            let last_exit = container.last_state.as_ref().and_then(|s| s.terminated.as_ref()).map(|t| {
                let why = t.message.clone().filter(|m| !m.trim().is_empty()).or_else(|| t.reason.clone());
                format!(
                    "; last exit code {}{}",
                    t.exit_code,
                    why.map(|w| format!(": {}", w.trim())).unwrap_or_default()
                )
            });
            Some(StartFailure {
                message: format!(
                    "pod {} container {}: {}{}",
                    pod.name_any(),
                    container.name,
                    waiting.message.clone().unwrap_or_else(|| reason.clone()),
                    last_exit.unwrap_or_default()
                ),
                reason,
            })
        })
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateWaiting, ContainerStatus, PodCondition, PodStatus};

    /// A pod whose container waits for `reason`.
    pub fn waiting(name: &str, reason: &str) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.status = Some(PodStatus {
            container_statuses: Some(vec![ContainerStatus {
                name: "c".into(),
                state: Some(ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some(reason.into()),
                        message: Some(format!("{reason} for a reason")),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        });
        pod
    }

    #[test]
    fn names_image_pulls_crash_loops_and_unschedulable_pods() {
        assert_eq!(start_failure(&[waiting("a", "ContainerCreating")]), None, "a normal start is no failure");
        let failure = start_failure(&[waiting("b", "CrashLoopBackOff"), waiting("a", "ImagePullBackOff")]);
        assert_eq!(failure.as_ref().map(|f| f.reason.as_str()), Some("ImagePullBackOff"));
        assert!(failure.is_some_and(|f| f.message.starts_with("pod a container c:")));
        let mut pending = Pod::default();
        pending.metadata.name = Some("p".into());
        pending.status = Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "PodScheduled".into(),
                status: "False".into(),
                reason: Some("Unschedulable".into()),
                message: Some("0/3 nodes are available".into()),
                ..Default::default()
            }]),
            ..Default::default()
        });
        assert_eq!(start_failure(&[pending]).map(|f| f.reason), Some("Unschedulable".into()));
    }

    #[test]
    fn a_crash_loop_says_how_the_container_last_ended() {
        let mut pod = waiting("db-0", "CrashLoopBackOff");
        let status = pod.status.as_mut().and_then(|s| s.container_statuses.as_mut()).expect("statuses");
        status[0].last_state = Some(ContainerState {
            terminated: Some(k8s_openapi::api::core::v1::ContainerStateTerminated {
                exit_code: 1,
                message: Some("data directory has invalid permissions\n".into()),
                ..Default::default()
            }),
            ..Default::default()
        });
        let failure = start_failure(&[pod]).expect("a failure");
        assert!(
            failure.message.ends_with("; last exit code 1: data directory has invalid permissions"),
            "{}",
            failure.message
        );
    }
}
