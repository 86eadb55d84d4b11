//! The restricted Pod Security profile, for every pod Keelson defines (its
//! own manager and the databases it runs).

use k8s_openapi::api::core::v1::{Capabilities, PodSecurityContext, SeccompProfile, SecurityContext};

/// Pod-level settings of the `restricted` profile, running as `uid`.
pub fn restricted_pod(uid: i64, fs_group: Option<i64>) -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(uid),
        run_as_group: Some(uid),
        fs_group,
        // Ownership is set once, not on every mount: a recursive pass on each
        // start would also open up PostgreSQL's data folder, which it refuses.
        fs_group_change_policy: fs_group.map(|_| "OnRootMismatch".to_string()),
        seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), ..Default::default() }),
        ..Default::default()
    }
}

/// Container-level settings of the `restricted` profile, with a read-only root.
pub fn restricted_container() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), ..Default::default() }),
        ..Default::default()
    }
}
