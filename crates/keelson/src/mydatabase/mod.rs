//! The MyDatabase controller: PostgreSQL with streaming replicas, backups and
//! a deletion policy.

use crate::manifests::rbac::Permission;

/// What the MyDatabase controller does with the API, and nothing more.
pub const RBAC: &[Permission] = &[
    Permission {
        group: "db.keelson.dev",
        resources: &["mydatabases"],
        verbs: &["get", "list", "watch", "patch", "update"],
    },
    Permission { group: "db.keelson.dev", resources: &["mydatabases/status"], verbs: &["get", "patch", "update"] },
    Permission { group: "db.keelson.dev", resources: &["mydatabases/finalizers"], verbs: &["update"] },
];
