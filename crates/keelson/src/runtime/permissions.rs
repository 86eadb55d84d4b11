//! The RBAC each controller declares it needs; `manifests::rbac` turns the
//! declarations into the ClusterRole and Role, so nothing is granted twice
//! or written by hand.

/// One RBAC rule as a controller declares it.
#[derive(Clone, Copy, Debug)]
pub struct Permission {
    pub group: &'static str,
    pub resources: &'static [&'static str],
    pub verbs: &'static [&'static str],
}

/// Events for every controller (kube's Recorder creates and patches series).
pub const EVENTS: &[Permission] =
    &[Permission { group: "events.k8s.io", resources: &["events"], verbs: &["create", "patch"] }];

/// The leader-election Lease, in the operator's own namespace only.
pub const LEADER_ELECTION: &[Permission] =
    &[Permission { group: "coordination.k8s.io", resources: &["leases"], verbs: &["get", "create", "update"] }];

/// Which nodes are cordoned (a drain has begun), for the MyDatabase
/// controller. Nodes are cluster-scoped: this lives in a ClusterRole of its
/// own, bound cluster-wide also when the manager watches one namespace.
pub const NODES: &[Permission] = &[Permission { group: "", resources: &["nodes"], verbs: &["list", "watch"] }];
/// `--metrics-secure`: who is asking for `/metrics`, and may they.
pub const METRICS_AUTH: &[Permission] = &[
    Permission { group: "authentication.k8s.io", resources: &["tokenreviews"], verbs: &["create"] },
    Permission { group: "authorization.k8s.io", resources: &["subjectaccessreviews"], verbs: &["create"] },
];
