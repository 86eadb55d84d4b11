//! What RBAC cannot say: an instance manager may change only its own pod,
//! and on it only its report, its lease and the image it runs. Its Role names every pod of its
//! database (RBAC has no "the pod this token belongs to"), so a
//! ValidatingAdmissionPolicy checks each of its writes against the pod its
//! token is bound to (`authentication.kubernetes.io/pod-name`, which the API
//! server adds for a pod's projected token). A manager, or anything that
//! steals its token, can then never relabel a pod (the role is the
//! operator's), lift a hold, or speak for a sibling.

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, NamedRuleWithOperations, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingAdmissionPolicyBindingSpec, ValidatingAdmissionPolicySpec, Validation,
    Variable,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::api::instance::{ANNOTATION, LEASE, MANAGER_IMAGE};
use crate::mydatabase::names::CLUSTER_LABEL;

pub const POLICY_NAME: &str = "keelson-instance-writes";

/// The pod-name claim of a token bound to a pod.
const POD_NAME_CLAIM: &str = "authentication.kubernetes.io/pod-name";

fn validation(expression: String, message: &str) -> Validation {
    Validation { expression, message: Some(message.into()), reason: Some("Forbidden".into()), ..Default::default() }
}

pub fn instance_policy() -> ValidatingAdmissionPolicy {
    let own = format!("[{:?}, {:?}, {:?}]", ANNOTATION, LEASE, MANAGER_IMAGE);
    ValidatingAdmissionPolicy {
        metadata: ObjectMeta { name: Some(POLICY_NAME.into()), ..Default::default() },
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".into()),
            match_constraints: Some(MatchResources {
                resource_rules: Some(vec![NamedRuleWithOperations {
                    api_groups: Some(vec![String::new()]),
                    api_versions: Some(vec!["v1".into()]),
                    operations: Some(vec!["UPDATE".into()]),
                    resources: Some(vec!["pods".into()]),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            // Only the writes of a database's instance ServiceAccount to that database's pods.
            match_conditions: Some(vec![MatchCondition {
                name: "by-an-instance-manager".into(),
                expression: format!(
                    "has(oldObject.metadata.labels) && {CLUSTER_LABEL:?} in oldObject.metadata.labels && \
                     request.userInfo.username == 'system:serviceaccount:' + request.namespace + ':' + \
                     oldObject.metadata.labels[{CLUSTER_LABEL:?}] + '-instance'"
                ),
            }]),
            variables: Some(vec![
                Variable { name: "old".into(), expression: "oldObject.metadata.?annotations.orValue({})".into() },
                Variable { name: "new".into(), expression: "object.metadata.?annotations.orValue({})".into() },
            ]),
            validations: Some(vec![
                validation(
                    format!(
                        "{POD_NAME_CLAIM:?} in request.userInfo.extra && \
                         request.userInfo.extra[{POD_NAME_CLAIM:?}].exists(pod, pod == object.metadata.name)"
                    ),
                    "an instance manager may change only its own pod",
                ),
                validation(
                    "object.metadata.?labels.orValue({}) == oldObject.metadata.?labels.orValue({})".into(),
                    "an instance manager may not change a pod's labels: its role is the operator's to give",
                ),
                validation(
                    format!(
                        "variables.new.all(k, k in {own} || (k in variables.old && variables.old[k] == variables.new[k])) \
                         && variables.old.all(k, k in {own} || k in variables.new)"
                    ),
                    "an instance manager may change only its report and its lease annotations (and the image it runs)",
                ),
                validation(
                    "object.metadata.?finalizers.orValue([]) == oldObject.metadata.?finalizers.orValue([]) && \
                     object.metadata.?ownerReferences.orValue([]) == oldObject.metadata.?ownerReferences.orValue([])"
                        .into(),
                    "an instance manager may not change a pod's finalizers or owners",
                ),
                validation("object.spec == oldObject.spec".into(), "an instance manager may not change a pod's spec"),
            ]),
            ..Default::default()
        }),
        status: None,
    }
}

pub fn instance_policy_binding() -> ValidatingAdmissionPolicyBinding {
    ValidatingAdmissionPolicyBinding {
        metadata: ObjectMeta { name: Some(POLICY_NAME.into()), ..Default::default() },
        spec: ValidatingAdmissionPolicyBindingSpec {
            policy_name: POLICY_NAME.into(),
            validation_actions: vec!["Deny".into()],
            ..Default::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_binds_instance_writes_to_their_own_pod_report_and_lease() {
        let spec = instance_policy().spec.expect("spec");
        let condition = &spec.match_conditions.expect("conditions")[0].expression;
        assert!(condition.contains("'-instance'") && condition.contains("\"keelson.dev/cluster\""), "{condition}");
        let validations = spec.validations.expect("validations");
        assert!(validations[0].expression.contains("\"authentication.kubernetes.io/pod-name\""));
        assert!(validations[2].expression.contains(
            "[\"db.keelson.dev/instance\", \"db.keelson.dev/primary-lease\", \"db.keelson.dev/manager-image\"]"
        ));
        assert_eq!(instance_policy_binding().spec.validation_actions, ["Deny"]);
    }
}
