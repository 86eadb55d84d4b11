//! Whose an object is. Children are found by derived names, which anyone who
//! may create objects in the namespace can take first: before Keelson writes
//! over or deletes an object of a child's name, it must be this owner's.
//!
//! - A child with an owner reference (most) is this owner's when its
//!   controller reference names the owner's uid, as controller-runtime
//!   decides adoption.
//! - A child without one (a Secret or a volume that outlives its MyDatabase
//!   by design) is this owner's when it carries Keelson's labels naming the
//!   owner (`app.kubernetes.io/managed-by=keelson`,
//!   `app.kubernetes.io/instance=<name>`): so a MyDatabase re-created under
//!   the name of one deleted under `Retain` takes its credentials and volumes
//!   back. That is the documented rule (docs/security.md).

use kube::Resource;

use super::meta::MANAGED_BY;

const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";

/// Why `actual`, the cluster's object of the child `desired`'s name, is not
/// the owner's (whose uid is `owner_uid`); None when it is.
pub fn not_ours<K: Resource>(actual: &K, desired: &K, owner_uid: Option<&str>) -> Option<String> {
    let controls = |object: &K| {
        object.meta().owner_references.iter().flatten().find(|reference| reference.controller == Some(true)).cloned()
    };
    if controls(desired).is_some() {
        return match controls(actual) {
            Some(controller) if Some(controller.uid.as_str()) == owner_uid => None,
            Some(controller) => Some(format!("it is controlled by {} {}", controller.kind, controller.name)),
            None => Some("it was not created by Keelson (it has no controller reference)".into()),
        };
    }
    let label = |object: &K, key: &str| object.meta().labels.as_ref().and_then(|l| l.get(key)).cloned();
    let keys = [MANAGED_BY.0, INSTANCE_LABEL];
    let missing: Vec<&str> = keys
        .into_iter()
        .filter(|key| label(desired, key).is_some() && label(actual, key) != label(desired, key))
        .collect();
    (!missing.is_empty()).then(|| {
        format!("it was not created by Keelson for this object (labels {} do not name it)", missing.join(", "))
    })
}

/// Whether `object` is controlled by the owner whose uid is `owner_uid`:
/// what an owned child must be before Keelson deletes it.
pub fn controlled_by<K: Resource>(object: &K, owner_uid: Option<&str>) -> bool {
    object
        .meta()
        .owner_references
        .iter()
        .flatten()
        .any(|reference| reference.controller == Some(true) && Some(reference.uid.as_str()) == owner_uid)
}

/// Whether `object` carries Keelson's labels naming `owner`: what an unowned
/// child (a Secret, a volume) must carry before Keelson deletes it.
pub fn labelled_for<K: Resource>(object: &K, owner: &str) -> bool {
    let labels = object.meta().labels.as_ref();
    let label = |key: &str| labels.and_then(|l| l.get(key)).map(String::as_str);
    label(MANAGED_BY.0) == Some(MANAGED_BY.1) && label(INSTANCE_LABEL) == Some(owner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Secret;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::api::ObjectMeta;

    fn object(controller_uid: Option<&str>, labels: &[(&str, &str)]) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some("x".into()),
                owner_references: controller_uid.map(|uid| {
                    vec![OwnerReference {
                        kind: "WebApp".into(),
                        name: "api".into(),
                        uid: uid.into(),
                        controller: Some(true),
                        ..Default::default()
                    }]
                }),
                labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn an_owned_child_is_ours_only_with_our_controller_reference() {
        let desired = object(Some("ours"), &[]);
        assert_eq!(not_ours(&object(Some("ours"), &[]), &desired, Some("ours")), None);
        let foreign = not_ours(&object(Some("theirs"), &[]), &desired, Some("ours")).expect("refused");
        assert!(foreign.contains("controlled by WebApp api"), "{foreign}");
        // Labels alone (anyone can set them) do not make it ours.
        let labelled = object(None, &[(MANAGED_BY.0, MANAGED_BY.1), (INSTANCE_LABEL, "api")]);
        assert!(not_ours(&labelled, &desired, Some("ours")).is_some());
    }

    #[test]
    fn an_unowned_child_is_ours_when_its_labels_name_the_owner() {
        let desired = object(None, &[(MANAGED_BY.0, MANAGED_BY.1), (INSTANCE_LABEL, "victim")]);
        assert_eq!(not_ours(&desired.clone(), &desired, Some("uid")), None, "retained from a former owner of the name");
        let stranger = object(None, &[("app", "something-else")]);
        let why = not_ours(&stranger, &desired, Some("uid")).expect("refused");
        assert!(why.contains(MANAGED_BY.0) && why.contains(INSTANCE_LABEL), "{why}");
        let another = object(None, &[(MANAGED_BY.0, MANAGED_BY.1), (INSTANCE_LABEL, "other")]);
        assert!(not_ours(&another, &desired, Some("uid")).is_some(), "another database's");
        assert!(
            labelled_for(&desired, "victim") && !labelled_for(&another, "victim") && !labelled_for(&stranger, "victim")
        );
    }

    #[test]
    fn only_a_child_we_control_is_ours_to_delete() {
        assert!(controlled_by(&object(Some("ours"), &[]), Some("ours")));
        assert!(!controlled_by(&object(Some("theirs"), &[]), Some("ours")));
        assert!(!controlled_by(&object(None, &[(MANAGED_BY.0, MANAGED_BY.1)]), Some("ours")));
    }
}
