//! Operator upgrades that restart no PostgreSQL.
//!
//! The operator's image reaches the pods' template only through the init
//! container that installs the instance manager. A new operator keeps the
//! image the template already names when nothing else in it would change,
//! so no pod is rolled, and upgrades each running manager in place: an
//! ephemeral container of the new image installs its binary beside the
//! running one, which takes it up in its own process (`instance::upgrade`).
//! One pod at a time, replicas first, and never during a failover.
//!
//! A new operator whose template differs in more than that (a probe, a
//! mount: pods would restart) holds the template back while the spec is
//! unchanged, says so in the `RestartPending` condition, and applies it at
//! the next change of spec, or at once when the MyDatabase carries
//! `ALLOW_RESTART` (pods are then replaced one at a time, with a switchover).

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{EphemeralContainer, Pod};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;

use super::statefulset::{INSTALL_CONTAINER, INSTALL_DIR, MANAGER_CONTAINER, MANAGER_VOLUME, install_command, mount};
use crate::Result;
use crate::api::MyDatabase;
use crate::api::instance::{ANNOTATION, MANAGER_IMAGE, ROLE_LABEL};
use crate::instance::upgrade::NEXT;
use crate::runtime::{drift, security};

/// On a MyDatabase, `"true"`: a new operator's template may restart its pods now.
pub const ALLOW_RESTART: &str = "db.keelson.dev/allow-upgrade-restart";
/// On the StatefulSet: the hash of the pod template Keelson last applied ...
pub const TEMPLATE_HASH: &str = "db.keelson.dev/template-hash";
/// ... and the MyDatabase generation it was built from.
pub const SPEC_GENERATION: &str = "db.keelson.dev/spec-generation";
/// An in-place upgrade's container whose binary the manager has not taken up
/// within this long, from its end, failed.
const TAKE_UP_WITHIN: Duration = Duration::from_secs(60);

/// The StatefulSet to apply, or why its new template waits.
#[derive(Debug)]
pub enum Template {
    Apply(Box<StatefulSet>),
    /// The fields in which the held template differs.
    Held(Vec<String>),
}

/// The operator image the template's install container names.
pub fn template_manager_image(statefulset: &StatefulSet) -> Option<&str> {
    let pod = statefulset.spec.as_ref()?.template.spec.as_ref()?;
    let install = pod.init_containers.as_ref()?.iter().find(|c| c.name == INSTALL_CONTAINER)?;
    install.image.as_deref()
}

/// The StatefulSet for `db`: `build(image)` builds it with the manager from
/// `image`; `image` is this operator's. See the module's comment.
pub fn template(
    db: &MyDatabase,
    image: &str,
    existing: Option<&StatefulSet>,
    build: impl Fn(&str) -> Result<StatefulSet>,
) -> Result<Template> {
    let Some(existing) = existing else { return stamped(db, build(image)?) };
    let recorded = existing.annotations().get(TEMPLATE_HASH);
    let kept = build(template_manager_image(existing).unwrap_or(image))?;
    if recorded == Some(&template_hash(&kept)?) {
        // Only the operator's image is new (or nothing is): the pods keep running.
        return stamped(db, kept);
    }
    let spec_unchanged =
        existing.annotations().get(SPEC_GENERATION) == db.metadata.generation.map(|g| g.to_string()).as_ref();
    let allowed = db.annotations().get(ALLOW_RESTART).is_some_and(|v| v == "true");
    if recorded.is_some() && spec_unchanged && !allowed {
        let want = serde_json::to_value(kept.spec.as_ref().map(|s| &s.template)).unwrap_or_default();
        let have = serde_json::to_value(existing.spec.as_ref().map(|s| &s.template)).unwrap_or_default();
        let mut fields: Vec<String> = drift::diff(&want, &have).into_iter().map(|d| d.path).collect();
        fields.truncate(3);
        return Ok(Template::Held(fields));
    }
    stamped(db, build(image)?)
}

fn template_hash(statefulset: &StatefulSet) -> Result<String> {
    drift::content_hash(&statefulset.spec.as_ref().map(|s| &s.template), "pod template")
}

fn stamped(db: &MyDatabase, mut statefulset: StatefulSet) -> Result<Template> {
    let hash = template_hash(&statefulset)?;
    let annotations = statefulset.metadata.annotations.get_or_insert_with(Default::default);
    annotations.insert(TEMPLATE_HASH.into(), hash);
    annotations.insert(SPEC_GENERATION.into(), db.metadata.generation.unwrap_or_default().to_string());
    Ok(Template::Apply(Box::new(statefulset)))
}

/// What `RestartPending` says about a held template.
pub fn held_message(fields: &[String]) -> String {
    format!(
        "this Keelson version changes the pods' template ({}); the pods keep the old one, and restart (one at a \
         time, with a switchover) at the next change of spec, or now with the annotation {ALLOW_RESTART}=true",
        fields.join(", ")
    )
}

/// The ephemeral container that installs `image`'s instance manager beside the running one.
pub fn upgrade_container(image: &str) -> Result<EphemeralContainer> {
    Ok(EphemeralContainer {
        name: upgrade_container_name(image)?,
        image: Some(image.to_string()),
        command: Some(install_command(image, &format!("{INSTALL_DIR}/{NEXT}"))),
        security_context: Some(security::restricted_container()),
        volume_mounts: Some(vec![mount(MANAGER_VOLUME, INSTALL_DIR)]),
        ..Default::default()
    })
}

fn upgrade_container_name(image: &str) -> Result<String> {
    Ok(format!("upgrade-manager-{}", &drift::content_hash(&image, "image")?[..10]))
}

/// Where the in-place upgrade of the managers to `image` stands.
#[derive(Debug, Default, PartialEq)]
pub struct Managers {
    /// This operator's image.
    pub image: String,
    /// Pods whose manager reports `image`, of the pods whose manager reports.
    pub current: usize,
    pub reporting: usize,
    /// The pod to upgrade now, if none is being upgraded.
    pub next: Option<String>,
    /// A pod being upgraded now.
    pub upgrading: Option<String>,
    /// Pods whose upgrade failed (not retried), with why.
    pub failed: Vec<String>,
}

/// Looks at the pods' managers against `image`: replicas first, the primary last.
pub fn managers(pods: &[Pod], image: &str, now: Timestamp) -> Result<Managers> {
    let name = upgrade_container_name(image)?;
    let mut managers = Managers { image: image.to_string(), ..Default::default() };
    let mut candidates = Vec::new();
    for pod in pods.iter().filter(|pod| pod.annotations().contains_key(ANNOTATION)) {
        managers.reporting += 1;
        if pod.annotations().get(MANAGER_IMAGE).map(String::as_str) == Some(image) {
            managers.current += 1;
            continue;
        }
        let status = pod.status.as_ref();
        let upgrade = status
            .and_then(|s| s.ephemeral_container_statuses.as_ref())
            .and_then(|statuses| statuses.iter().find(|s| s.name == name));
        let added = pod
            .spec
            .as_ref()
            .and_then(|s| s.ephemeral_containers.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.name == name));
        let ended = upgrade.and_then(|s| s.state.as_ref()).and_then(|s| s.terminated.as_ref());
        match ended {
            Some(ended) if ended.exit_code != 0 => managers.failed.push(format!(
                "{}: installing {image} ended with {} {}",
                pod.name_any(),
                ended.exit_code,
                ended.message.as_deref().or(ended.reason.as_deref()).unwrap_or_default()
            )),
            Some(ended) => match &ended.finished_at {
                Some(at) if now.duration_since(at.0) > SignedDuration::try_from(TAKE_UP_WITHIN).unwrap_or_default() => {
                    managers
                        .failed
                        .push(format!("{}: the instance manager did not take up {image} (see its log)", pod.name_any()))
                }
                _ => managers.upgrading = Some(pod.name_any()),
            },
            None if added => managers.upgrading = Some(pod.name_any()),
            None => candidates.push(pod),
        }
    }
    let deleting_or_stopped = |pod: &Pod| {
        let running = pod.status.as_ref().and_then(|s| s.container_statuses.as_ref()).is_some_and(|statuses| {
            statuses
                .iter()
                .any(|c| c.name == MANAGER_CONTAINER && c.state.as_ref().is_some_and(|s| s.running.is_some()))
        });
        pod.metadata.deletion_timestamp.is_some() || !running
    };
    let is_primary = |pod: &&Pod| pod.labels().get(ROLE_LABEL).is_some_and(|role| role == "primary");
    candidates.retain(|pod| !deleting_or_stopped(pod));
    candidates.sort_by_key(|pod| (is_primary(pod), pod.name_any()));
    // One failed upgrade stops the others (the primary's above all): the condition says which.
    if managers.upgrading.is_none() && managers.failed.is_empty() {
        managers.next = candidates.first().map(|pod| pod.name_any());
    }
    Ok(managers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mydatabase::tests::sample;
    use crate::runtime::Settings;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus, PodSpec, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn build(db: &MyDatabase) -> impl Fn(&str) -> Result<StatefulSet> + '_ {
        |image| super::super::statefulset::build(db, &Settings { instance_image: image.into(), ..Default::default() })
    }

    fn applied(template: Template) -> StatefulSet {
        match template {
            Template::Apply(statefulset) => *statefulset,
            Template::Held(fields) => panic!("held: {fields:?}"),
        }
    }

    #[test]
    fn a_new_operator_image_alone_keeps_the_pods_template() {
        let db =
            MyDatabase { metadata: kube::api::ObjectMeta { generation: Some(4), ..sample().metadata }, ..sample() };
        let first = applied(template(&db, "keelson:1", None, build(&db)).expect("builds"));
        assert_eq!(template_manager_image(&first), Some("keelson:1"));
        let again = applied(template(&db, "keelson:2", Some(&first), build(&db)).expect("builds"));
        assert_eq!(template_manager_image(&again), Some("keelson:1"), "pinned: no pod restarts");
        assert_eq!(again.annotations(), first.annotations());

        // A change of spec that changes the template takes the new image with it.
        let mut changed = db.clone();
        changed.metadata.generation = Some(5);
        changed.spec.version = "16.4".into();
        let rolled = applied(template(&changed, "keelson:2", Some(&first), build(&changed)).expect("builds"));
        assert_eq!(template_manager_image(&rolled), Some("keelson:2"));
    }

    #[test]
    fn a_new_operator_template_waits_for_a_spec_change_or_the_annotation() {
        let db =
            MyDatabase { metadata: kube::api::ObjectMeta { generation: Some(4), ..sample().metadata }, ..sample() };
        let mut first = applied(template(&db, "keelson:1", None, build(&db)).expect("builds"));
        // As an older Keelson built it: a probe differs.
        let pod = first.spec.as_mut().and_then(|s| s.template.spec.as_mut()).expect("pod");
        pod.termination_grace_period_seconds = Some(10);
        let stamp = template_hash(&first).expect("hash");
        first.annotations_mut().insert(TEMPLATE_HASH.into(), stamp);
        let Template::Held(fields) = template(&db, "keelson:2", Some(&first), build(&db)).expect("builds") else {
            panic!("a restart was not held")
        };
        assert_eq!(fields, ["spec.terminationGracePeriodSeconds"]);
        assert!(held_message(&fields).contains(ALLOW_RESTART));

        let mut allowed = db.clone();
        allowed.annotations_mut().insert(ALLOW_RESTART.into(), "true".into());
        let applied_now = applied(template(&allowed, "keelson:2", Some(&first), build(&allowed)).expect("builds"));
        assert_eq!(template_manager_image(&applied_now), Some("keelson:2"));
        let mut changed = db.clone();
        changed.metadata.generation = Some(5);
        assert!(matches!(template(&changed, "keelson:2", Some(&first), build(&changed)), Ok(Template::Apply(_))));
    }

    fn pod(name: &str, role: &str, manager_image: Option<&str>) -> Pod {
        let mut annotations = std::collections::BTreeMap::from([(ANNOTATION.to_string(), "{}".to_string())]);
        if let Some(image) = manager_image {
            annotations.insert(MANAGER_IMAGE.into(), image.into());
        }
        Pod {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                labels: Some([(ROLE_LABEL.to_string(), role.to_string())].into()),
                annotations: Some(annotations),
                ..Default::default()
            },
            spec: Some(PodSpec::default()),
            status: Some(PodStatus {
                container_statuses: Some(vec![ContainerStatus {
                    name: MANAGER_CONTAINER.into(),
                    state: Some(ContainerState {
                        running: Some(ContainerStateRunning::default()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn managers_are_upgraded_one_at_a_time_replicas_first() {
        let now = Timestamp::now();
        let mut pods = vec![
            pod("db-0", "primary", Some("k:1")),
            pod("db-1", "replica", None),
            pod("db-2", "replica", Some("k:2")),
        ];
        let seen = managers(&pods, "k:2", now).expect("looks");
        assert_eq!((seen.current, seen.reporting), (1, 3));
        assert_eq!(seen.next.as_deref(), Some("db-1"), "a replica before the primary");

        // db-1's upgrade runs: nothing else starts.
        let name = upgrade_container_name("k:2").expect("name");
        let container = upgrade_container("k:2").expect("builds");
        assert_eq!(container.name, name);
        pods[1].spec.as_mut().expect("spec").ephemeral_containers = Some(vec![container]);
        let seen = managers(&pods, "k:2", now).expect("looks");
        assert_eq!((seen.upgrading.as_deref(), seen.next), (Some("db-1"), None));

        // Its install failed: not retried, said, and no other pod is upgraded.
        let status = pods[1].status.as_mut().expect("status");
        status.ephemeral_container_statuses = Some(vec![ContainerStatus {
            name,
            state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 1,
                    finished_at: Some(Time(now)),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]);
        let seen = managers(&pods, "k:2", now).expect("looks");
        assert_eq!(seen.failed.len(), 1, "{seen:?}");
        assert_eq!(seen.next, None, "the primary is not upgraded after a failure");
    }
}
