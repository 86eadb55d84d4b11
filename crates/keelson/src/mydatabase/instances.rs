//! What the instances say about themselves: each pod's instance manager
//! report (`api::instance`), read from the pod cache, made into the status's
//! view of roles, replication lag and the running version. Which pod is the
//! primary is Keelson's decision (`failover`), not read from here.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::api::instance::{ANNOTATION, InstanceReport, Role};
use crate::api::mydatabase::{InstanceStatus, ReplicaRebuild};
use crate::runtime::pods;

/// The report on `pod`, if its manager sent one that reads.
pub fn report(pod: &Pod) -> Option<InstanceReport> {
    serde_json::from_str(pod.annotations().get(ANNOTATION)?).ok()
}

/// The instances as status shows them.
#[derive(Debug, Default, PartialEq)]
pub struct Topology {
    pub instances: Vec<InstanceStatus>,
    pub server_version: Option<String>,
}

/// The newest rebuild any instance reports, if newer than `since` (the last
/// recorded, else the database's creation: retained volumes bring older ones).
pub fn newest_rebuild(pods: &[Pod], since: Option<&Time>) -> Option<ReplicaRebuild> {
    pods.iter()
        .filter_map(|pod| {
            let said = report(pod)?.rebuilt?;
            let (at, reason) = said.split_once(' ')?;
            let at = Timestamp::from_second(at.parse().ok()?).ok()?;
            Some(ReplicaRebuild { instance: pod.name_any(), at: Time(at), reason: reason.trim().to_string() })
        })
        .filter(|rebuild| since.is_none_or(|since| rebuild.at.0 > since.0))
        .max_by_key(|rebuild| rebuild.at.0)
}

pub fn observe(pods: &[Pod]) -> Topology {
    let reports: Vec<(&Pod, Option<InstanceReport>)> = pods.iter().map(|pod| (pod, report(pod))).collect();
    // A pod on its way out no longer serves, whatever it last said.
    let primary = reports
        .iter()
        .filter(|(pod, _)| pod.metadata.deletion_timestamp.is_none())
        .filter_map(|(pod, report)| Some((*pod, report.as_ref().filter(|r| r.role == Role::Primary)?)))
        .max_by_key(|(_, report)| report.timeline);
    let replica_of = |name: &str| primary.and_then(|(_, report)| report.replicas.iter().find(|r| r.name == name));
    let lag_of = |name: &str| replica_of(name).and_then(|r| r.lag_bytes);
    // Seconds with a millisecond's precision, as a string: status holds no floats.
    let lag_seconds_of =
        |name: &str| replica_of(name).map(|r| format!("{:.3}", r.lag_ms.unwrap_or(0).max(0) as f64 / 1000.0));
    let mut instances: Vec<InstanceStatus> = reports
        .iter()
        .map(|(pod, report)| InstanceStatus {
            name: pod.name_any(),
            role: report.as_ref().map(|r| r.role),
            ready: pods::is_ready(pod),
            lag_bytes: match report {
                Some(r) if r.role == Role::Replica => lag_of(&pod.name_any()),
                _ => None,
            },
            lag_seconds: match report {
                Some(r) if r.role == Role::Replica => lag_seconds_of(&pod.name_any()),
                _ => None,
            },
            timeline: report.as_ref().map(|r| r.timeline),
        })
        .collect();
    instances.sort_by(|a, b| a.name.cmp(&b.name));
    Topology {
        instances,
        server_version: primary
            .map(|(_, r)| r.server_version.clone())
            .or_else(|| reports.iter().find_map(|(_, r)| r.as_ref().map(|r| r.server_version.clone()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::instance::ReplicaReport;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};

    fn pod(name: &str, ready: bool, report: Option<&InstanceReport>) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        if let Some(report) = report {
            pod.metadata.annotations =
                Some([(ANNOTATION.to_string(), serde_json::to_string(report).expect("serializes"))].into());
        }
        pod.status = Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        pod
    }

    #[test]
    fn the_newest_rebuild_since_the_last_recorded_is_new() {
        let rebuilt = |at: &str| InstanceReport { rebuilt: Some(format!("{at} its WAL was gone")), ..primary() };
        let pods = [
            pod("db-1", true, Some(&rebuilt("1800000000"))),
            pod("db-2", true, Some(&rebuilt("1800000100"))),
            pod("db-3", true, Some(&InstanceReport { rebuilt: Some("garbage".into()), ..primary() })),
            pod("db-0", true, Some(&primary())),
        ];
        let newest = newest_rebuild(&pods, None).expect("a rebuild");
        assert_eq!((newest.instance.as_str(), newest.reason.as_str()), ("db-2", "its WAL was gone"));
        assert_eq!(newest.at.0.as_second(), 1_800_000_100);
        assert_eq!(newest_rebuild(&pods, Some(&newest.at)), None, "recorded: not new");
        let before = Time(Timestamp::from_second(1_800_000_050).expect("time"));
        assert_eq!(newest_rebuild(&pods, Some(&before)).map(|r| r.instance), Some("db-2".to_string()));
    }

    fn primary() -> InstanceReport {
        InstanceReport {
            role: Role::Primary,
            server_version: "15.18".into(),
            timeline: 1,
            lsn: "0/3000000".into(),
            received_lsn: None,
            streaming: false,
            answering: None,
            replicas: vec![ReplicaReport {
                name: "db-1".into(),
                state: "streaming".into(),
                lag_bytes: Some(4096),
                lag_ms: Some(1500),
            }],
            unresponsive: false,
            fenced: false,
            synchronous_standby_names: None,
            rebuilt: None,
            held: false,
        }
    }

    fn replica() -> InstanceReport {
        InstanceReport { role: Role::Replica, streaming: true, replicas: vec![], ..primary() }
    }

    #[test]
    fn roles_lag_and_version_come_from_the_reports() {
        let pods = [
            pod("db-0", true, Some(&primary())),
            pod("db-1", true, Some(&replica())),
            pod("db-2", false, Some(&replica())),
        ];
        let topology = observe(&pods);
        assert_eq!(topology.server_version.as_deref(), Some("15.18"));
        let lags: Vec<_> = topology.instances.iter().map(|i| (i.name.as_str(), i.role, i.lag_bytes)).collect();
        assert_eq!(
            lags,
            [
                ("db-0", Some(Role::Primary), None),
                ("db-1", Some(Role::Replica), Some(4096)),
                ("db-2", Some(Role::Replica), None)
            ]
        );
        let seconds: Vec<_> = topology.instances.iter().map(|i| i.lag_seconds.as_deref()).collect();
        assert_eq!(seconds, [None, Some("1.500"), None], "seconds from the primary's replay_lag");
        assert!(!topology.instances[2].ready);
    }

    #[test]
    fn no_report_no_role_and_a_leaving_primary_counts_no_lag() {
        let mut leaving = pod("db-0", true, Some(&primary()));
        leaving.metadata.deletion_timestamp = Some(crate::runtime::status::now());
        let topology = observe(&[leaving, pod("db-1", true, None)]);
        assert_eq!(topology.instances[1].role, None);
        assert_eq!(topology.instances[0].lag_bytes, None);
        assert_eq!(topology.server_version.as_deref(), Some("15.18"), "the version still reads from a report");
    }
}
