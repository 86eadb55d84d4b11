//! Durability on real PostgreSQL pods, with a long-lived session writing
//! through `-rw` and recording every commit it saw acknowledged:
//! - two instances are synchronous (the replica confirms each commit), so a
//!   failover loses nothing;
//! - two instances with `replication: Preferred` write on when their replica
//!   stops streaming, after recording it; the primary lost meanwhile keeps
//!   its role (no replica without its commits is promoted), and once the
//!   replica caught up a failover loses nothing;
//! - with three, a failover waits for every named synchronous standby: one
//!   that does not answer (its postmaster frozen) blocks the promotion, with
//!   a condition and an Event, until it answers again;
//! - every pod deleted at once, with the primary at the highest ordinal: its
//!   pod is recreated beside the others (no `OrderedReady` deadlock) and it
//!   is the primary again;
//! - the operator killed mid-failover (the replicas asked, maybe held) and
//!   mid-switchover (the primary stepped down): the next one finishes the job;
//! - a database deleted (its volumes retained) while a replica lagged, then
//!   created again: the most advanced instance is elected, never the lagging one;
//! - a scale-down that removes the primary's pod switches over first.
//!
//! Proven with SQL: nothing acknowledged is lost, no old primary acknowledged
//! after the new one, the old primary is back as a streaming replica.

mod common;

use anyhow::Context as _;
use common::TestOperator;
use common::clients::{
    CLIENT_NODE, SESSION_WRITER, acknowledged, acknowledging_servers, client, ended, now_ms, sql_in,
};
use common::faults::{postmaster_pid, signal, walreceiver_pid};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::core::v1::ServiceAccount;
use keelson::api::MyDatabase;
use keelson::api::instance::{HOLD_STREAMING, LEASE, POSITION_REQUEST, UPSTREAM};
use keelson::api::mydatabase::{DatabasePhase, ReplicationMode, SWITCHOVER_ANNOTATION};
use keelson::mydatabase::names;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::{DEFAULT_TIMEOUT, TestNamespace, cluster_or_skip, eventually, kubectl};

async fn primary_of(dbs: &Api<MyDatabase>, db: &str) -> Option<String> {
    dbs.get(db).await.ok()?.status?.current_primary
}

/// Running with every instance ready, and the primary's replicas all streaming as synchronous candidates.
async fn settled(ns: &TestNamespace, db: &str, instances: i32) -> anyhow::Result<String> {
    let dbs = ns.api::<MyDatabase>();
    testkit::wait_for(&dbs, db, "every instance ready", DEFAULT_TIMEOUT, |d| {
        d.status.as_ref().is_some_and(|s| s.phase == Some(DatabasePhase::Running) && s.ready_replicas == instances)
    })
    .await?;
    let streaming = (instances - 1).to_string();
    eventually(DEFAULT_TIMEOUT, "every replica streaming synchronously", || async {
        let Some(primary) = primary_of(&dbs, db).await else { return false };
        sql_in(
            ns,
            &primary,
            "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = 'quorum'",
        )
        .is_ok_and(|n| n == streaming)
    })
    .await?;
    primary_of(&dbs, db).await.context("no primary in status")
}

/// A MyDatabase of `instances` PostgreSQL 15.2 instances.
fn database(db: &str, instances: i32) -> anyhow::Result<MyDatabase> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "db.keelson.dev/v1", "kind": "MyDatabase", "metadata": {"name": db},
        "spec": {"replicas": instances, "version": "15.2", "storage": "1Gi"}
    }))?)
}

async fn create(ns: &TestNamespace, db: &str, instances: i32) -> anyhow::Result<String> {
    create_from(ns, database(db, instances)?).await
}

/// Creates `object`, waits for it to settle, and starts the session writing to it.
async fn create_from(ns: &TestNamespace, object: MyDatabase) -> anyhow::Result<String> {
    let (db, instances) = (object.name_any(), object.spec.replicas);
    let db = db.as_str();
    ns.api::<MyDatabase>().create(&PostParams::default(), &object).await?;
    let primary = settled(ns, db, instances).await?;
    sql_in(ns, &primary, "CREATE TABLE acked_session (id int PRIMARY KEY); GRANT ALL ON acked_session TO app")?;
    let session: Pod = serde_json::from_value(client(db, "session", SESSION_WRITER))?;
    ns.api::<Pod>().create(&PostParams::default(), &session).await?;
    Ok(primary)
}

/// Waits for the session to commit more after `since`.
async fn writes_flow(ns: &TestNamespace, since: u128) -> anyhow::Result<()> {
    let pods = ns.api::<Pod>();
    eventually(DEFAULT_TIMEOUT, "the session to commit", || async {
        let logs = pods.logs("session", &LogParams::default()).await.unwrap_or_default();
        acknowledged(&logs).iter().filter(|(_, at)| *at > since).count() >= 20
    })
    .await
}

/// Stops the session, then checks the property: every commit it saw acknowledged is on `primary`,
/// and, for each move of the primary (its old address, and when it began), no acknowledgement
/// came from the old address after one came from another server.
async fn nothing_lost(ns: &TestNamespace, db: &str, moves: &[(&str, u128)]) -> anyhow::Result<()> {
    let logs = stopped_session(ns).await?;
    // Read where the primary is now: a later failover (a loaded node's stall) may have moved
    // it since the test last looked, and a lagging replica would show commits as missing.
    let dbs = ns.api::<MyDatabase>();
    let primary = std::cell::RefCell::new(String::new());
    eventually(DEFAULT_TIMEOUT, "the recorded primary to serve writes", || async {
        let Some(current) = primary_of(&dbs, db).await else { return false };
        let serving = sql_in(ns, &current, "SELECT pg_is_in_recovery()").is_ok_and(|r| r == "f");
        *primary.borrow_mut() = current;
        serving
    })
    .await?;
    kept(ns, &primary.into_inner(), &logs, moves)
}

/// Stops the session; its logs.
async fn stopped_session(ns: &TestNamespace) -> anyhow::Result<String> {
    eventually(DEFAULT_TIMEOUT, "the session to be told to stop", || async {
        kubectl(&["-n", &ns.name, "exec", "session", "--", "touch", "/tmp/stop"]).is_ok()
    })
    .await?;
    ended(ns, "session").await
}

/// The property, on the logs of a stopped session (see `nothing_lost`).
fn kept(ns: &TestNamespace, primary: &str, logs: &str, moves: &[(&str, u128)]) -> anyhow::Result<()> {
    let acked = acknowledged(logs);
    assert!(acked.len() >= 40, "too few writes to prove anything: {}", acked.len());
    let stored: std::collections::BTreeSet<u64> =
        sql_in(ns, primary, "SELECT id FROM acked_session")?.lines().filter_map(|l| l.parse().ok()).collect();
    let lost: Vec<u64> = acked.iter().map(|(id, _)| *id).filter(|id| !stored.contains(id)).collect();
    let when: Vec<(u64, u128)> = acked.iter().filter(|(id, _)| lost.contains(id)).copied().collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged commits missing on {primary}: (id, acknowledged at ms) {when:?}",
        lost.len()
    );
    let servers = acknowledging_servers(logs);
    // Each move until the next one: a later move may bring the primary back to a former pod.
    for (i, (old_ip, since)) in moves.iter().enumerate() {
        let until = moves.get(i + 1).map_or(u128::MAX, |(_, next)| *next);
        let after: Vec<&(u128, String)> = servers.iter().filter(|(t, _)| t > since && *t < until).collect();
        if let Some(first_new) = after.iter().find(|(_, server)| server != old_ip).map(|(t, _)| *t) {
            let late: Vec<_> = after.iter().filter(|(t, server)| *t > first_new && server == old_ip).collect();
            assert!(late.is_empty(), "the old primary {old_ip} acknowledged after the new one: {late:?}");
        }
    }
    Ok(())
}

fn pod_ip(pod: Pod) -> String {
    pod.status.and_then(|s| s.pod_ip).unwrap_or_default()
}

#[tokio::test]
async fn two_instances_are_synchronous_and_fail_over_without_loss() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::real_namespace(&cluster, "real-db-two").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    let (db, pods, dbs) = ("two", ns.api::<Pod>(), ns.api::<MyDatabase>());
    let primary = create(&ns, db, 2).await?;
    let replica = if primary == "two-0" { "two-1" } else { "two-0" };
    assert_eq!(
        sql_in(&ns, &primary, "SHOW synchronous_standby_names")?,
        format!("ANY 1 (\"{replica}\")"),
        "two instances: the replica confirms every commit"
    );
    writes_flow(&ns, 0).await?;
    let old_ip = pod_ip(pods.get(&primary).await?);
    let at = now_ms();
    pods.delete(&primary, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await?;
    eventually(DEFAULT_TIMEOUT, "the replica to be promoted", || async {
        primary_of(&dbs, db).await.as_deref() == Some(replica)
    })
    .await?;
    writes_flow(&ns, now_ms()).await?;
    // The old primary is back, a synchronous replica of the new one.
    assert_eq!(settled(&ns, db, 2).await?, replica);
    assert_eq!(sql_in(&ns, &primary, "SELECT pg_is_in_recovery()")?, "t");
    nothing_lost(&ns, db, &[(&old_ip, at)]).await
}

/// The `Synchronous` condition's status and reason.
fn synchronous_condition(db: &MyDatabase) -> Option<(String, String)> {
    let status = serde_json::to_value(&db.status).unwrap_or_default();
    let conditions = status["conditions"].as_array().cloned().unwrap_or_default();
    let condition = conditions.into_iter().find(|c| c["type"] == "Synchronous")?;
    Some((condition["status"].as_str()?.to_string(), condition["reason"].as_str()?.to_string()))
}

#[tokio::test]
async fn two_preferred_instances_write_on_alone_and_never_promote_a_replica_without_their_commits() -> anyhow::Result<()>
{
    let cluster = cluster_or_skip!();
    let ns = common::real_namespace(&cluster, "real-db-preferred").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    let (db, pods, dbs) = ("preferred", ns.api::<Pod>(), ns.api::<MyDatabase>());
    let mut object = database(db, 2)?;
    object.spec.replication = ReplicationMode::Preferred;
    let primary = create_from(&ns, object).await?;
    let replica = if primary == "preferred-0" { "preferred-1" } else { "preferred-0" };
    let preferred = |d: &MyDatabase| synchronous_condition(d) == Some(("True".into(), "Preferred".into()));
    testkit::wait_for(&dbs, db, "Synchronous=True (Preferred)", DEFAULT_TIMEOUT, preferred).await?;
    assert_eq!(sql_in(&ns, &primary, "SHOW synchronous_standby_names")?, format!("ANY 1 (\"{replica}\")"));
    writes_flow(&ns, 0).await?;
    // The replica stops receiving (its WAL receiver frozen; its server runs and answers): after the
    // primary's sender times out and the wait passes, Keelson records it, then the primary writes alone.
    let receiver = walreceiver_pid(&pods.get(replica).await?)?;
    let frozen_at = now_ms();
    signal(receiver, "-STOP")?;
    let thawed = scopeguard(receiver);
    // The record lands first (a patch of its own), the condition with the next status.
    testkit::wait_for(&dbs, db, "status.asynchronous and Synchronous=False", DEFAULT_TIMEOUT, |d| {
        d.status.as_ref().and_then(|s| s.asynchronous.as_ref()).is_some_and(|a| a.primary == primary)
            && synchronous_condition(d) == Some(("False".into(), "StandbysNotStreaming".into()))
    })
    .await?;
    let events = kubectl(&[
        "-n",
        &ns.name,
        "get",
        "events",
        "--field-selector",
        "reason=ReplicationAsynchronous",
        "-o",
        "name",
    ])?;
    assert!(!events.trim().is_empty(), "no ReplicationAsynchronous Event");
    eventually(DEFAULT_TIMEOUT, "the primary to stop waiting", || async {
        sql_in(&ns, &primary, "SHOW synchronous_standby_names").is_ok_and(|names| names.is_empty())
    })
    .await?;
    writes_flow(&ns, now_ms()).await?;
    // Until then commits waited (the primary's sender noticed, then Keelson's wait passed).
    let logs = pods.logs("session", &LogParams::default()).await?;
    let acked = acknowledged(&logs);
    let waited = acked.windows(2).filter(|w| w[1].1 > frozen_at).map(|w| w[1].1.saturating_sub(w[0].1)).max();
    eprintln!("commits waited {waited:?} ms for the frozen replica before the primary went on alone");
    assert!(waited.is_some_and(|ms| ms >= 5_000), "commits did not wait for the standby: {waited:?} ms");
    // The primary lost now: only it holds the newest commits. Its pod comes back with the role,
    // and the replica (running, answering) is never promoted.
    let first_ip = pod_ip(pods.get(&primary).await?);
    let first_loss = now_ms();
    pods.delete(&primary, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await?;
    eventually(DEFAULT_TIMEOUT, "the primary's new pod to serve writes", || async {
        let Ok(pod) = pods.get(&primary).await else { return false };
        pod_ip(pod) != first_ip && sql_in(&ns, &primary, "SELECT pg_is_in_recovery()").is_ok_and(|r| r == "f")
    })
    .await?;
    assert_eq!(primary_of(&dbs, db).await.as_deref(), Some(primary.as_str()), "the role stayed");
    assert_eq!(sql_in(&ns, replica, "SELECT pg_is_in_recovery()")?, "t", "the replica was not promoted");
    let status = dbs.get(db).await?.status.context("no status")?;
    assert!(status.last_failover.is_none(), "a failover happened: {:?}", status.last_failover);
    writes_flow(&ns, now_ms()).await?;
    // The replica receives again: once it has everything, the record goes and commits wait for it.
    drop(thawed);
    let back = testkit::wait_for(&dbs, db, "synchronous again", DEFAULT_TIMEOUT, |d| {
        preferred(d) && d.status.as_ref().is_some_and(|s| s.asynchronous.is_none())
    })
    .await?;
    assert!(back.status.is_some_and(|s| s.last_failover.is_none()));
    assert_eq!(sql_in(&ns, &primary, "SHOW synchronous_standby_names")?, format!("ANY 1 (\"{replica}\")"));
    let events =
        kubectl(&["-n", &ns.name, "get", "events", "--field-selector", "reason=ReplicationSynchronous", "-o", "name"])?;
    assert!(!events.trim().is_empty(), "no ReplicationSynchronous Event");
    // Now a failover may, and does, promote the replica, losing nothing.
    writes_flow(&ns, now_ms()).await?;
    let second_ip = pod_ip(pods.get(&primary).await?);
    let second_loss = now_ms();
    pods.delete(&primary, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await?;
    eventually(DEFAULT_TIMEOUT, "the replica to be promoted", || async {
        primary_of(&dbs, db).await.as_deref() == Some(replica)
    })
    .await?;
    writes_flow(&ns, now_ms()).await?;
    nothing_lost(&ns, db, &[(&first_ip, first_loss), (&second_ip, second_loss)]).await
}

#[tokio::test]
async fn a_failover_waits_for_a_synchronous_standby_that_does_not_answer() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::real_namespace(&cluster, "real-db-quorum").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    let (db, pods, dbs) = ("quorum", ns.api::<Pod>(), ns.api::<MyDatabase>());
    let primary = create(&ns, db, 3).await?;
    writes_flow(&ns, 0).await?;
    // A replica that is not on this test's clients' node freezes: it can confirm nothing and answer nothing.
    let node_of = |pod: &Pod| pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
    let mut replicas = Vec::new();
    for name in (0..3).map(|n| format!("{db}-{n}")).filter(|name| *name != primary) {
        replicas.push(pods.get(&name).await?);
    }
    let frozen = replicas.iter().find(|p| node_of(p) != CLIENT_NODE).or(replicas.first()).context("no replica")?;
    let frozen_name = frozen.metadata.name.clone().unwrap_or_default();
    let pid = postmaster_pid(frozen)?;
    signal(pid, "-STOP")?;
    let thawed = scopeguard(pid);
    // The primary is lost (briefly frozen: a standby frozen past its liveness probe's patience is restarted).
    let old_ip = pod_ip(pods.get(&primary).await?);
    let at = now_ms();
    pods.delete(&primary, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await?;
    let blocked = testkit::wait_for(&dbs, db, "the failover to be blocked", DEFAULT_TIMEOUT, |d| {
        let status = serde_json::to_value(&d.status).unwrap_or_default();
        status["conditions"].as_array().is_some_and(|conditions| {
            conditions.iter().any(|c| c["type"] == "FailoverBlocked" && c["status"] == "True")
        })
    })
    .await?;
    let status = serde_json::to_value(&blocked.status)?;
    let condition = status["conditions"].as_array().and_then(|c| c.iter().find(|c| c["type"] == "FailoverBlocked"));
    let message = condition.and_then(|c| c["message"].as_str()).unwrap_or_default().to_string();
    assert!(message.contains(&frozen_name), "the condition names the standby it waits for: {message}");
    assert_ne!(primary_of(&dbs, db).await.as_deref(), Some(frozen_name.as_str()));
    let events =
        kubectl(&["-n", &ns.name, "get", "events", "--field-selector", "reason=FailoverBlocked", "-o", "name"])?;
    assert!(!events.trim().is_empty(), "no FailoverBlocked Event");
    // Answering again, it is heard. The most advanced of the two is promoted, or, if the lost
    // primary's own pod came back first while no replica could take over (one frozen, the other
    // slow to answer under load), that pod serves its own data again: either way, no replica
    // was promoted without both standbys' positions, and nothing is lost.
    drop(thawed);
    settled(&ns, db, 3).await?;
    // (A later failover may follow, e.g. of a promoted standby the liveness probe restarted for
    // its freeze: its record then replaces this one, and it is held to the same rule.)
    let record = dbs.get(db).await?.status.and_then(|s| s.last_failover);
    if let Some(record) = record.filter(|r| r.from == primary) {
        assert_eq!(record.positions.len(), 2, "promoted without both standbys' positions: {record:?}");
        assert_eq!(sql_in(&ns, &primary, "SELECT pg_is_in_recovery()")?, "t");
    }
    // Writes go on after: enough commits on both sides of the failover to prove anything.
    writes_flow(&ns, now_ms()).await?;
    nothing_lost(&ns, db, &[(&old_ip, at)]).await
}

#[tokio::test]
async fn a_full_restart_with_the_primary_at_the_highest_ordinal_keeps_it_and_its_data() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::real_namespace(&cluster, "real-db-restart").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    let (db, pods, dbs) = ("restart", ns.api::<Pod>(), ns.api::<MyDatabase>());
    create(&ns, db, 3).await?;
    kubectl(&["-n", &ns.name, "annotate", "mydatabase", db, &format!("{SWITCHOVER_ANNOTATION}=restart-2")])?;
    eventually(DEFAULT_TIMEOUT, "the switchover to restart-2", || async {
        primary_of(&dbs, db).await.as_deref() == Some("restart-2")
    })
    .await?;
    settled(&ns, db, 3).await?;
    writes_flow(&ns, now_ms()).await?;
    let old_ip = pod_ip(pods.get("restart-2").await?);
    let at = now_ms();
    let all =
        ListParams::default().labels(&format!("{}={db},app.kubernetes.io/component=database", names::CLUSTER_LABEL));
    let now = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
    pods.delete_collection(&now, &all).await?;
    // Every pod back (restart-2's not held back behind the others); whichever serves holds every commit.
    let primary = settled(&ns, db, 3).await?;
    eprintln!("after the full restart, {primary} is the primary");
    writes_flow(&ns, now_ms()).await?;
    nothing_lost(&ns, db, &[(&old_ip, at)]).await
}

#[tokio::test]
async fn the_operator_killed_mid_failover_and_mid_switchover_loses_nothing() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::real_namespace(&cluster, "real-db-killed").await?;
    let operator = TestOperator::start(&cluster, &ns).await?;
    let (db, pods, dbs) = ("killed", ns.api::<Pod>(), ns.api::<MyDatabase>());
    let primary = create(&ns, db, 3).await?;
    writes_flow(&ns, 0).await?;
    let replicas: Vec<String> = (0..3).map(|n| format!("{db}-{n}")).filter(|name| *name != primary).collect();
    let asked = |annotation: &'static str| {
        let (pods, replicas) = (pods.clone(), replicas.clone());
        move || {
            let (pods, replicas) = (pods.clone(), replicas.clone());
            async move {
                for name in &replicas {
                    if pods.get(name).await.is_ok_and(|p| p.annotations().contains_key(annotation)) {
                        return true;
                    }
                }
                false
            }
        }
    };
    // Mid-failover: killed once the replicas were asked for their positions.
    let at = now_ms();
    let first_ip = pod_ip(pods.get(&primary).await?);
    pods.delete(&primary, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await?;
    eventually(DEFAULT_TIMEOUT, "the replicas to be asked for their positions", asked(POSITION_REQUEST)).await?;
    operator.kill();
    let operator = TestOperator::start_as_service_account(&cluster, &ns).await?;
    eventually(DEFAULT_TIMEOUT, "a replica to be promoted by the next operator", || async {
        primary_of(&dbs, db).await.is_some_and(|p| p != primary)
    })
    .await?;
    let second = settled(&ns, db, 3).await?;
    writes_flow(&ns, now_ms()).await?;
    // Mid-switchover: killed once the primary was stepped down.
    let target = (0..3).map(|n| format!("{db}-{n}")).find(|name| *name != second).context("no replica")?;
    let second_ip = pod_ip(pods.get(&second).await?);
    let switched_at = now_ms();
    kubectl(&["-n", &ns.name, "annotate", "mydatabase", db, &format!("{SWITCHOVER_ANNOTATION}={target}")])?;
    eventually(DEFAULT_TIMEOUT, "the primary to be stepped down", || async {
        pods.get(&second).await.is_ok_and(|p| p.labels().get(names::ROLE_LABEL).map(String::as_str) == Some("replica"))
    })
    .await?;
    operator.kill();
    let _operator = TestOperator::start_as_service_account(&cluster, &ns).await?;
    // The request still stands: the next operator takes it to its end.
    eventually(DEFAULT_TIMEOUT, "the switchover to be carried out", || async {
        dbs.get(db).await.is_ok_and(|d| {
            !d.annotations().contains_key(SWITCHOVER_ANNOTATION)
                && d.status.and_then(|s| s.current_primary).as_deref() == Some(target.as_str())
        })
    })
    .await?;
    settled(&ns, db, 3).await?;
    assert_eq!(sql_in(&ns, &second, "SELECT pg_is_in_recovery()")?, "t", "the stepped-down primary is a replica");
    writes_flow(&ns, now_ms()).await?;
    nothing_lost(&ns, db, &[(&first_ip, at), (&second_ip, switched_at)]).await
}

/// What RBAC alone cannot hold an instance manager to (its Role names every
/// pod of its database): with a token bound to its pod, it may write its own
/// report and lease, and nothing else (the ValidatingAdmissionPolicy).
#[tokio::test]
async fn an_instance_manager_may_write_only_its_own_report_and_lease() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::real_namespace(&cluster, "real-db-own").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    let (db, pods) = ("own", ns.api::<Pod>());
    let object = database(db, 2)?;
    ns.api::<MyDatabase>().create(&PostParams::default(), &object).await?;
    let primary = settled(&ns, db, 2).await?;
    let replica = if primary == "own-0" { "own-1" } else { "own-0" };
    let bound = TokenRequest {
        spec: Some(TokenRequestSpec {
            bound_object_ref: Some(BoundObjectReference {
                kind: Some("Pod".into()),
                api_version: Some("v1".into()),
                name: Some(replica.into()),
                uid: pods.get(replica).await?.metadata.uid,
            }),
            expiration_seconds: Some(600),
            audiences: None,
        }),
        ..Default::default()
    };
    let accounts = ns.api::<ServiceAccount>();
    let issued = accounts.create_token_request("own-instance", &PostParams::default(), &bound).await?;
    let token = issued.status.and_then(|s| s.token).context("no token issued")?;
    let as_manager: Api<Pod> = Api::namespaced(cluster.client_with_token(&token)?, &ns.name);
    let write = |pod: &'static str, patch: serde_json::Value| {
        let as_manager = as_manager.clone();
        async move { as_manager.patch(pod, &PatchParams::default(), &Patch::Merge(patch)).await }
    };
    let refused = |result: Result<Pod, kube::Error>, why: &str| match result {
        Err(kube::Error::Api(status)) => {
            assert!(status.message.contains(why), "refused for another reason: {}", status.message)
        }
        other => panic!("not refused ({why}): {other:?}"),
    };
    // Its own lease: allowed.
    write(replica, json!({"metadata": {"annotations": {LEASE: "1"}}})).await?;
    let sibling = if replica == "own-0" { "own-1" } else { "own-0" };
    refused(write(sibling, json!({"metadata": {"annotations": {LEASE: "1"}}})).await, "only its own pod");
    refused(
        write(replica, json!({"metadata": {"labels": {names::ROLE_LABEL: "primary"}}})).await,
        "may not change a pod's labels",
    );
    refused(
        write(replica, json!({"metadata": {"annotations": {HOLD_STREAMING: null, UPSTREAM: "10.0.0.1"}}})).await,
        "only its report and its lease",
    );
    refused(write(replica, json!({"metadata": {"finalizers": ["example.com/stuck"]}})).await, "finalizers or owners");
    Ok(())
}

#[tokio::test]
async fn a_database_re_created_over_its_volumes_elects_the_most_advanced_instance() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::real_namespace(&cluster, "real-db-again").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    let (db, pods, dbs) = ("again", ns.api::<Pod>(), ns.api::<MyDatabase>());
    create(&ns, db, 3).await?;
    writes_flow(&ns, now_ms()).await?;
    // A replica falls behind: its WAL receiver frozen, it confirms and receives nothing more.
    // (Asked again until it holds: under load a primary may move meanwhile.)
    let deadline = std::time::Instant::now() + DEFAULT_TIMEOUT;
    let (behind, pid) = loop {
        let primary = primary_of(&dbs, db).await.unwrap_or_default();
        let mut frozen = None;
        for name in (0..3).map(|n| format!("{db}-{n}")).filter(|name| *name != primary) {
            if let Ok(pid) = walreceiver_pid(&pods.get(&name).await?) {
                frozen = Some((name, pid));
                break;
            }
        }
        if let Some(frozen) = frozen {
            break frozen;
        }
        anyhow::ensure!(std::time::Instant::now() < deadline, "no replica with a WAL receiver");
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    };
    signal(pid, "-STOP")?;
    let thawed = scopeguard(pid);
    writes_flow(&ns, now_ms()).await?;
    // Behind: its stream gone (timed out), or its flushed position short of the primary's.
    let primary = primary_of(&dbs, db).await.context("no primary")?;
    let behind_query = format!(
        "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_replication \
         WHERE application_name = '{behind}' AND flush_lsn >= pg_current_wal_lsn())"
    );
    assert_eq!(sql_in(&ns, &primary, &behind_query)?, "t", "{behind} did not fall behind");
    // The session stops first: the `-rw` address it holds goes with the Service.
    let logs = stopped_session(&ns).await?;
    // Deleted (volumes and credentials retained), then created again.
    dbs.delete(db, &DeleteParams::default()).await?;
    testkit::wait_for_deletion(&dbs, db, "the MyDatabase to be deleted", DEFAULT_TIMEOUT).await?;
    for n in 0..3 {
        testkit::wait_for_deletion(&pods, &format!("{db}-{n}"), "its pods to be gone", DEFAULT_TIMEOUT).await?;
    }
    drop(thawed);
    let object = database(db, 3)?;
    dbs.create(&PostParams::default(), &object).await?;
    let elected = settled(&ns, db, 3).await?;
    assert_ne!(elected, behind, "the lagging instance was made the primary");
    let record = dbs.get(db).await?.status.and_then(|s| s.last_failover).context("no election record")?;
    assert_eq!((record.kind.as_str(), record.positions.len()), ("Election", 3), "{record:?}");
    kept(&ns, &elected, &logs, &[])
}

/// SIGCONT for the frozen postmaster when dropped, whatever the test's outcome
/// (the liveness probe may have restarted its container by then: no error).
fn scopeguard(pid: u32) -> impl Drop {
    struct Thaw(u32);
    impl Drop for Thaw {
        fn drop(&mut self) {
            let mut resume = std::process::Command::new("kill");
            let _ = resume.args(["-CONT", &self.0.to_string()]).stderr(std::process::Stdio::null()).status();
        }
    }
    Thaw(pid)
}

/// A scale-down that would remove the primary's pod switches over to a
/// remaining instance first: the StatefulSet keeps the pod until then.
#[tokio::test]
async fn a_scale_down_that_removes_the_primary_switches_over_first() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::real_namespace(&cluster, "real-db-shrink").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    let (db, pods, dbs) = ("shrink", ns.api::<Pod>(), ns.api::<MyDatabase>());
    let first = create(&ns, db, 3).await?;
    let mut moves = Vec::new();
    let highest = format!("{db}-2");
    if first != highest {
        moves.push((pod_ip(pods.get(&first).await?), now_ms()));
        // Asked again if refused (a replica may be catching up for a moment).
        let request = format!("{SWITCHOVER_ANNOTATION}={highest}");
        eventually(DEFAULT_TIMEOUT, "the primary to move to the highest ordinal", || async {
            let Ok(current) = dbs.get(db).await else { return false };
            if current.status.and_then(|s| s.current_primary).as_deref() == Some(highest.as_str()) {
                return true;
            }
            if !current.metadata.annotations.is_some_and(|a| a.contains_key(SWITCHOVER_ANNOTATION)) {
                let _ = kubectl(&["-n", &ns.name, "annotate", "mydatabase", db, &request]);
            }
            false
        })
        .await?;
        settled(&ns, db, 3).await?;
    }
    writes_flow(&ns, now_ms()).await?;
    // Every pod's address before the scale-down: the writer names servers by address.
    let ips: std::collections::BTreeMap<String, String> =
        pods.list(&ListParams::default()).await?.items.into_iter().map(|p| (p.name_any(), pod_ip(p))).collect();
    moves.push((ips.get(&highest).cloned().unwrap_or_default(), now_ms()));
    dbs.patch(db, &PatchParams::default(), &Patch::Merge(&json!({"spec": {"replicas": 2}}))).await?;
    // The record as the primary moves: a later failover (a loaded node can stall the new
    // primary long enough to be fenced) must not hide how the scale-down handed over.
    // (The chosen primary is recorded before the move's record.)
    let moved = testkit::wait_for(&dbs, db, "the primary to move off the removed ordinal", DEFAULT_TIMEOUT, |d| {
        let status = d.status.as_ref();
        status.and_then(|s| s.current_primary.as_deref()).is_some_and(|p| p != highest)
            && status.and_then(|s| s.last_failover.as_ref()).is_some_and(|r| r.from == highest)
    })
    .await?;
    let record = moved.status.and_then(|s| s.last_failover).context("no record")?;
    assert_eq!((record.kind.as_str(), record.from.as_str()), ("Switchover", highest.as_str()), "{record:?}");
    assert!(record.reason.contains("scaling down to 2"), "{record:?}");
    eventually(DEFAULT_TIMEOUT, "the removed ordinal's pod to be gone", || async {
        matches!(pods.get_opt(&highest).await, Ok(None))
    })
    .await?;
    let primary = settled(&ns, db, 2).await?;
    let last = dbs.get(db).await?.status.and_then(|s| s.last_failover).context("no record")?;
    if last.lost_at != record.lost_at {
        // Safe but not asked for: checked like any other move.
        eprintln!("a later {} after the switchover: {last:?}", last.kind);
        let at = last.lost_at.as_ref().map_or(0, |t| t.0.as_millisecond() as u128);
        moves.push((ips.get(&last.from).cloned().unwrap_or_default(), at));
    }
    // The new primary waits for the remaining replica only.
    let replica = if primary == format!("{db}-0") { format!("{db}-1") } else { format!("{db}-0") };
    assert_eq!(sql_in(&ns, &primary, "SHOW synchronous_standby_names")?, format!("ANY 1 (\"{replica}\")"));
    writes_flow(&ns, now_ms()).await?;
    let moves: Vec<(&str, u128)> = moves.iter().map(|(ip, at)| (ip.as_str(), *at)).collect();
    nothing_lost(&ns, db, &moves).await
}
