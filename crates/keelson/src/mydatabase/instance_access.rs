//! What the instance managers may do with the API: watch their own pods
//! (the operator's decisions) and patch them (the report annotation), and
//! nothing else. A ServiceAccount of their own,
//! a Role naming the database's pods, and the binding between them.

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};

use kube::ResourceExt;

use super::names;
use crate::Result;
use crate::api::MyDatabase;

pub struct InstanceAccess {
    pub service_account: ServiceAccount,
    pub role: Role,
    pub role_binding: RoleBinding,
}

pub fn build(db: &MyDatabase) -> Result<InstanceAccess> {
    let name = names::instance_access(db);
    let meta = || names::owned_meta(db, name.clone(), "database");
    Ok(InstanceAccess {
        service_account: ServiceAccount {
            metadata: meta()?,
            // Only the instance manager's container mounts a token (statefulset.rs).
            automount_service_account_token: Some(false),
            ..Default::default()
        },
        role: Role {
            metadata: meta()?,
            rules: Some(vec![PolicyRule {
                api_groups: Some(vec![String::new()]),
                resources: Some(vec!["pods".into()]),
                resource_names: Some(names::instance_pods(db)),
                // list and watch by name: a field selector on metadata.name.
                verbs: vec!["list".into(), "watch".into(), "patch".into()],
                ..Default::default()
            }]),
        },
        role_binding: RoleBinding {
            metadata: meta()?,
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "Role".into(),
                name: name.clone(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: name.clone(),
                namespace: db.namespace(),
                ..Default::default()
            }]),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mydatabase::tests::sample;

    #[test]
    fn instance_managers_may_patch_their_own_pods_only() {
        let access = build(&sample()).expect("builds");
        let rules = access.role.rules.expect("rules");
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].verbs, ["list", "watch", "patch"]);
        assert_eq!(
            rules[0].resource_names.as_deref(),
            Some(&["production-db-0".to_string(), "production-db-1".into(), "production-db-2".into()][..])
        );
        let subject = &access.role_binding.subjects.expect("subjects")[0];
        assert_eq!(subject.name, "production-db-instance");
        assert_eq!(access.service_account.automount_service_account_token, Some(false));
    }
}
