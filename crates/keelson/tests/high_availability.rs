//! Failover, switchover and a rolling upgrade on real PostgreSQL in pods
//! across the three real nodes. Two writers inside the cluster record every
//! commit they saw acknowledged and by which server: one connection per
//! insert, and one long-lived session (as a pool holds its connections). The
//! primary's pod is force-deleted (three times) and deleted with its grace
//! period, its postmaster is frozen with SIGSTOP (hung, not dead), its node is
//! partitioned, powered off and drained, a switchover is asked for, and the
//! minor version changes; a sampler asks every instance, all along, whether it
//! takes writes. Proven with SQL: nothing acknowledged is lost, no old primary
//! acknowledged after the new one did, never two primaries, writes resume
//! within the limits, every lost instance comes back as a streaming replica.
//!
//! `cargo test --test high_availability -- --nocapture` prints the write
//! downtime of each failover (docs/high-availability.md has the figures).
//! `make bench-ha` runs it with `KEELSON_HA_ROUNDS=10` (deletions and
//! switchovers each) and `KEELSON_HA_REPORT=docs/bench/ha.md`, the table it writes.

mod common;

use common::clients::{
    CLIENT_NODE, SESSION_WRITER, WRITER, acknowledged, acknowledging_servers, client, ended, now_ms, sampler, sql_in,
};

use std::time::{Duration, Instant};

use anyhow::Context as _;
use common::TestOperator;
use common::faults::{postmaster_pid, signal};
use k8s_openapi::api::core::v1::Pod;
use keelson::api::MyDatabase;
use keelson::api::mydatabase::DatabasePhase;
use keelson::api::mydatabase::SWITCHOVER_ANNOTATION;
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::control_plane::ControlPlane;
use testkit::{DEFAULT_TIMEOUT, TestNamespace, cluster_or_skip, eventually, kubectl};

const DB: &str = "ha-db";
/// Pod deletions, at least; `KEELSON_HA_ROUNDS` asks for more, and for as many switchovers.
const DELETIONS: usize = 3;
/// The acceptance limit of issue 14 for a failover, a switchover and a rolling
/// upgrade (the goals, 5 s, are measured and reported, not asserted: a loaded
/// CI machine must not turn a speed goal into a red build).
const WRITE_DOWNTIME_LIMIT: Duration = Duration::from_secs(10);
/// A hung primary is found by its manager (6 s without an answer), then the
/// replicas' positions become final only after the 3 s wait (they still
/// stream from the hung server's WAL senders): a wider bound.
const HUNG_DOWNTIME_LIMIT: Duration = Duration::from_secs(20);
/// A node cut off or powered off: its primary's lease expires after 8 s (it
/// fenced itself before), then the replicas hold and one is promoted.
const NODE_LOSS_DOWNTIME_LIMIT: Duration = Duration::from_secs(20);

/// What the test does to the database, one after the other.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Disruption {
    /// Force-delete the primary's pod.
    Delete,
    /// `kubectl delete pod` the primary, with its grace period (as a drain or eviction does).
    GracefulDelete,
    /// SIGSTOP the primary's postmaster (from the node: it is a process here), SIGCONT once failed over.
    Hang,
    /// `db.keelson.dev/switchover-to` a replica.
    Switchover,
    /// `spec.version` 15.2 → 15.3.
    Upgrade,
    /// `hack/cluster.sh partition` the primary's node (healed once another primary serves).
    Partition,
    /// `hack/cluster.sh poweroff` the primary's node (powered on once another primary serves).
    PowerOff,
    /// `kubectl drain` the primary's node (evictions, the PodDisruptionBudget respected), then uncordon.
    Drain,
}

impl Disruption {
    fn describe(self) -> &'static str {
        match self {
            Disruption::Delete => "failover: primary's pod force-deleted",
            Disruption::GracefulDelete => "failover: primary's pod deleted (grace period)",
            Disruption::Hang => "failover: primary's postmaster frozen (SIGSTOP)",
            Disruption::Switchover => "switchover (annotation)",
            Disruption::Upgrade => "rolling minor upgrade 15.2 → 15.3 (longest pause)",
            Disruption::Partition => "failover: primary's node partitioned",
            Disruption::PowerOff => "failover: primary's node powered off",
            Disruption::Drain => "switchover: primary's node drained",
        }
    }

    fn limit(self) -> Duration {
        match self {
            Disruption::Hang => HUNG_DOWNTIME_LIMIT,
            Disruption::Partition | Disruption::PowerOff => NODE_LOSS_DOWNTIME_LIMIT,
            Disruption::Delete
            | Disruption::GracefulDelete
            | Disruption::Drain
            | Disruption::Switchover
            | Disruption::Upgrade => WRITE_DOWNTIME_LIMIT,
        }
    }
}

/// A node partitioned, powered off or cordoned (a drain), undone when the
/// test is done with it, or when it fails (the next tests need the node).
struct NodeFault<'a> {
    plane: &'a ControlPlane,
    node: String,
    kind: Disruption,
    ended: bool,
}

impl<'a> NodeFault<'a> {
    fn begin(plane: &'a ControlPlane, node: String, kind: Disruption) -> anyhow::Result<Self> {
        match kind {
            Disruption::Partition => plane.partition(&node)?,
            Disruption::PowerOff => plane.power_off(&node)?,
            _ => {}
        }
        Ok(NodeFault { plane, node, kind, ended: false })
    }

    fn undo(&self) -> anyhow::Result<()> {
        match self.kind {
            Disruption::Partition => self.plane.heal(&self.node),
            Disruption::PowerOff => self.plane.power_on(&self.node),
            _ => kubectl(&["uncordon", &self.node]).map(|_| ()),
        }
    }

    fn end(mut self) -> anyhow::Result<()> {
        self.ended = true;
        self.undo()
    }
}

impl Drop for NodeFault<'_> {
    fn drop(&mut self) {
        if !self.ended {
            let _ = self.undo();
        }
    }
}

/// The longest pause between two acknowledgements (ms since the epoch) that ends after `from` and
/// begins before `until`. The window never reaches into the next disruption: when a replica
/// rejoins fast, the next one can begin within the margin, and its pause is not this one's.
fn longest_pause(acked: &[(u64, u128)], from: u128, until: u128, next: Option<u128>) -> Duration {
    let until = next.map_or(until, |next| until.min(next));
    let gap = acked
        .windows(2)
        .filter(|pair| pair[1].1 > from && pair[0].1 < until)
        .map(|pair| pair[1].1 - pair[0].1)
        .max()
        .unwrap_or(u128::MAX);
    Duration::from_millis(gap as u64)
}

#[test]
fn a_pause_that_begins_after_the_next_disruption_is_not_counted_for_this_one() {
    // A CI run's figures: a deletion at 9638 ms whose writes resumed 5031 ms later (pause of
    // 4702 ms from 9786), then a hang at 15481 ms (pause of 13636 ms from 15511).
    let acked = [(1, 9000), (2, 9786), (3, 14488), (4, 14600), (5, 15511), (6, 29147), (7, 29200)];
    let deletion = longest_pause(&acked, 9638, 9638 + 5031 + 1000, Some(15481));
    assert_eq!(deletion, Duration::from_millis(4702));
    let hang = longest_pause(&acked, 15481, 15481 + 13795 + 1000, None);
    assert_eq!(hang, Duration::from_millis(13636));
    // Without a next disruption the margin after resumption still applies.
    assert_eq!(longest_pause(&acked, 9638, 9638 + 5031 + 1000, None), Duration::from_millis(13636));
}

async fn current_primary(ns: &TestNamespace) -> anyhow::Result<Option<String>> {
    Ok(ns.api::<MyDatabase>().get(DB).await?.status.and_then(|s| s.current_primary))
}

/// All instances ready and every replica streaming from the primary.
/// How often the kubelet restarted `pod`'s postgres container.
fn postgres_restarts(pod: &Pod) -> Option<i32> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    statuses.iter().find(|c| c.name == "postgres").map(|c| c.restart_count)
}

/// How many rounds of each disruption `KEELSON_HA_ROUNDS` asks for (1 unless set; at least 3 force deletions).
fn rounds() -> usize {
    std::env::var("KEELSON_HA_ROUNDS").ok().and_then(|n| n.parse().ok()).unwrap_or(1).max(1)
}

/// The figures of one run as Markdown: per kind of disruption, p50 and max of
/// the writes down as the writer saw them and as Keelson measured them.
fn report_table(ready_in: Duration, report: &[(Disruption, Duration, Option<i64>)]) -> String {
    let percentiles = |mut values: Vec<u128>| {
        values.sort();
        match values.len() {
            0 => "–".to_string(),
            n => format!("{} / {}", values[(n - 1) / 2], values[n - 1]),
        }
    };
    let mut out = String::from(
        "# High availability, measured\n\n\
         Written by `make bench-ha` (`crates/keelson/tests/high_availability.rs` with \
         `KEELSON_HA_REPORT`): one MyDatabase of 3 instances on the three real nodes of the local \
         cluster, two writers on another node committing through `-rw` all along (one connection per \
         commit, and one long-lived session), every disruption repeated `KEELSON_HA_ROUNDS` times; no \
         acknowledged commit lost and never two primaries in these runs (see docs/high-availability.md).\n\n",
    );
    out += &format!(
        "- `kubectl apply` of the MyDatabase → 3 instances Running, streaming: {:.1} s\n\n",
        ready_in.as_secs_f64()
    );
    out += "| disruption | runs | writes down, writer's view: p50 / max (ms) | Keelson's `writesDownMs`: p50 / max |\n|---|---|---|---|\n";
    for kind in [
        Disruption::Delete,
        Disruption::GracefulDelete,
        Disruption::Hang,
        Disruption::Partition,
        Disruption::PowerOff,
        Disruption::Drain,
        Disruption::Switchover,
        Disruption::Upgrade,
    ] {
        let runs: Vec<_> = report.iter().filter(|(d, _, _)| *d == kind).collect();
        let seen = percentiles(runs.iter().map(|(_, gap, _)| gap.as_millis()).collect());
        let keelson = percentiles(runs.iter().filter_map(|(_, _, ms)| ms.map(|ms| ms.max(0) as u128)).collect());
        out += &format!("| {} | {} | {seen} | {keelson} |\n", kind.describe(), runs.len());
    }
    out
}

async fn settled(ns: &TestNamespace) -> anyhow::Result<String> {
    let dbs = ns.api::<MyDatabase>();
    testkit::wait_for(&dbs, DB, "Running 3/3", DEFAULT_TIMEOUT, |db| {
        db.status.as_ref().is_some_and(|s| s.phase == Some(DatabasePhase::Running) && s.ready_replicas == 3)
    })
    .await?;
    // The primary is read again on every try: a status read just after a deletion can be stale.
    eventually(DEFAULT_TIMEOUT, "two replicas streaming synchronously (quorum)", || async {
        let Ok(Some(primary)) = current_primary(ns).await else { return false };
        sql_in(
            ns,
            &primary,
            "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = 'quorum'",
        )
        .is_ok_and(|n| n == "2")
    })
    .await?;
    Ok(current_primary(ns).await?.unwrap_or_default())
}

#[tokio::test]
async fn deleting_the_primary_promotes_a_replica_without_losing_an_acknowledged_write() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::real_namespace(&cluster, "real-db-failover").await?;
    let plane = ControlPlane::of_kubeconfig().context("node faults need the cluster `make cluster-up` starts")?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    let dbs = ns.api::<MyDatabase>();
    let db: MyDatabase = serde_json::from_value(json!({
        "apiVersion": "db.keelson.dev/v1", "kind": "MyDatabase", "metadata": {"name": DB},
        "spec": {"replicas": 3, "version": "15.2", "storage": "1Gi"}
    }))?;
    let created = Instant::now();
    dbs.create(&PostParams::default(), &db).await?;
    let first = settled(&ns).await?;
    let ready_in = created.elapsed();
    eprintln!("3 instances Running (streaming, synchronous) {ready_in:?} after the create");
    // Synchronous by default, to the other instances by name (a backup's stream never counts).
    let others: Vec<String> =
        (0..3).map(|n| format!("{DB}-{n}")).filter(|pod| *pod != first).map(|pod| format!("\"{pod}\"")).collect();
    assert_eq!(
        sql_in(&ns, &first, "SHOW synchronous_standby_names")?,
        format!("ANY 1 ({})", others.join(", ")),
        "synchronous by default"
    );
    sql_in(
        &ns,
        &first,
        "CREATE TABLE acked (id int PRIMARY KEY); GRANT ALL ON acked TO app; \
         CREATE TABLE acked_session (id int PRIMARY KEY); GRANT ALL ON acked_session TO app",
    )?;

    let pods = ns.api::<Pod>();
    for pod in
        [client(DB, "writer", WRITER), client(DB, "session", SESSION_WRITER), client(DB, "sampler", &sampler(DB, 3))]
    {
        pods.create(&PostParams::default(), &serde_json::from_value(pod)?).await?;
    }
    let disrupt = async {
        let mut downs = Vec::new();
        let writes_after = |since: u128| {
            let pods = pods.clone();
            async move {
                let logs = pods.logs("writer", &LogParams::default()).await.unwrap_or_default();
                acknowledged(&logs).iter().filter(|(_, at)| *at > since).count()
            }
        };
        eventually(DEFAULT_TIMEOUT, "the writer to commit", || async { writes_after(0).await >= 20 }).await?;
        let mut plan = vec![Disruption::Delete; DELETIONS.max(rounds())];
        plan.extend(vec![Disruption::GracefulDelete; rounds()]);
        for kind in [Disruption::Hang, Disruption::Partition, Disruption::PowerOff, Disruption::Drain] {
            plan.extend(vec![kind; rounds()]);
        }
        plan.extend(vec![Disruption::Switchover; rounds()]);
        plan.push(Disruption::Upgrade);
        // KEELSON_HA_ONLY=Partition,PowerOff runs only those kinds (when working on one).
        if let Ok(only) = std::env::var("KEELSON_HA_ONLY") {
            plan.retain(|d| only.split(',').any(|kind| kind.trim() == format!("{d:?}")));
        }
        for disruption in plan {
            let mut primary = settled(&ns).await?;
            let node_of = |pod: Pod| pod.spec.and_then(|s| s.node_name).unwrap_or_default();
            if matches!(disruption, Disruption::Partition | Disruption::PowerOff | Disruption::Drain)
                && node_of(pods.get(&primary).await?) == CLIENT_NODE
            {
                // Not measured: the node fault must not hit the clients.
                let mut target = None;
                for candidate in (0..3).map(|n| format!("{DB}-{n}")).filter(|p| *p != primary) {
                    if node_of(pods.get(&candidate).await?) != CLIENT_NODE {
                        target = Some(candidate);
                    }
                }
                let target = target.context("every instance runs on the clients' node")?;
                let request = format!("{SWITCHOVER_ANNOTATION}={target}");
                kubectl(&["-n", &ns.name, "annotate", "mydatabase", DB, &request])?;
                eventually(DEFAULT_TIMEOUT, "the clients' node to hold no primary", || async {
                    if current_primary(&ns).await.ok().flatten().is_some_and(|p| p != primary) {
                        return true;
                    }
                    // Refused: the target was not a healthy replica yet (a former primary that
                    // has just rejoined may restart once more). Asked again.
                    if dbs.get(DB).await.is_ok_and(|db| !db.annotations().contains_key(SWITCHOVER_ANNOTATION)) {
                        let _ = kubectl(&["-n", &ns.name, "annotate", "--overwrite", "mydatabase", DB, &request]);
                    }
                    false
                })
                .await?;
                primary = settled(&ns).await?;
            }
            // Writes flow before each disruption: a pause is then this disruption's alone.
            let flowing = now_ms();
            eventually(DEFAULT_TIMEOUT, "writes to flow", || async { writes_after(flowing).await >= 3 }).await?;
            // A stepped-down primary restarts PostgreSQL inside its container: a container
            // restart would add the kubelet's back-off, which grows with each one.
            let primary_pod = pods.get(&primary).await?;
            let restarts_before = postgres_restarts(&primary_pod);
            let primary_ip = primary_pod.status.and_then(|s| s.pod_ip).unwrap_or_default();
            let before = now_ms();
            let started = Instant::now();
            let mut frozen = None;
            let mut faulted = None;
            let mut draining = None;
            match disruption {
                Disruption::Partition | Disruption::PowerOff | Disruption::Drain => {
                    let node = node_of(pods.get(&primary).await?);
                    if disruption == Disruption::Drain {
                        // Blocks until the node's pods are gone: beside the in-process operator.
                        let node = node.clone();
                        draining = Some(tokio::task::spawn_blocking(move || {
                            kubectl(&[
                                "drain",
                                &node,
                                "--ignore-daemonsets",
                                "--delete-emptydir-data",
                                "--timeout=300s",
                            ])
                        }));
                    }
                    faulted = Some(NodeFault::begin(&plane, node, disruption)?);
                }
                Disruption::Delete => {
                    pods.delete(&primary, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() })
                        .await?;
                }
                Disruption::GracefulDelete => {
                    pods.delete(&primary, &DeleteParams::default()).await?;
                }
                Disruption::Hang => {
                    let pid = postmaster_pid(&pods.get(&primary).await?)?;
                    signal(pid, "-STOP")?;
                    let title = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                    eprintln!("stopped {primary}'s postmaster, pid {pid}: {}", String::from_utf8_lossy(&title));
                    frozen = Some(pid);
                }
                Disruption::Switchover => {
                    // A target that is no replica is refused, with an Event, and the request removed.
                    kubectl(&[
                        "-n",
                        &ns.name,
                        "annotate",
                        "mydatabase",
                        DB,
                        &format!("{SWITCHOVER_ANNOTATION}={DB}-7"),
                    ])?;
                    eventually(DEFAULT_TIMEOUT, "the refused request to be removed", || async {
                        dbs.get(DB).await.is_ok_and(|db| !db.annotations().contains_key(SWITCHOVER_ANNOTATION))
                    })
                    .await?;
                    let refused = kubectl(&[
                        "-n",
                        &ns.name,
                        "get",
                        "events",
                        "--field-selector",
                        "reason=SwitchoverRefused",
                        "-o",
                        "jsonpath={.items[*].message}",
                    ])?;
                    assert!(refused.contains(&format!("{DB}-7 is not a pod of this database")), "{refused}");
                    let target = (0..3).map(|n| format!("{DB}-{n}")).find(|p| *p != primary).unwrap_or_default();
                    kubectl(&[
                        "-n",
                        &ns.name,
                        "annotate",
                        "mydatabase",
                        DB,
                        &format!("{SWITCHOVER_ANNOTATION}={target}"),
                    ])?;
                }
                Disruption::Upgrade => {
                    let patch = json!({"spec": {"version": "15.3"}});
                    dbs.patch(DB, &PatchParams::default(), &Patch::Merge(&patch)).await?;
                }
            }
            let moved = eventually(DEFAULT_TIMEOUT, "another pod chosen as primary", || async {
                current_primary(&ns).await.ok().flatten().is_some_and(|p| p != primary)
            })
            .await;
            if let Err(error) = moved {
                // What the primary's container (PostgreSQL and its manager) and Keelson said.
                let said = ["postgres", "instance-manager"]
                    .map(|c| {
                        kubectl(&["-n", &ns.name, "logs", &primary, "-c", c, "--tail=40"])
                            .unwrap_or_else(|e| e.to_string())
                    })
                    .join("\n");
                let status = kubectl(&["-n", &ns.name, "get", "mydatabase", DB, "-o", "jsonpath={.status}"])
                    .unwrap_or_else(|e| e.to_string());
                let report = kubectl(&[
                    "-n",
                    &ns.name,
                    "get",
                    "pods",
                    "-o",
                    "jsonpath={range .items[*]}{.metadata.name} {.metadata.annotations.db\\.keelson\\.dev/instance}{\"\\n\"}{end}",
                ])
                .unwrap_or_else(|e| e.to_string());
                return Err(error.context(format!(
                    "{disruption:?} of {primary}: nothing moved.\n{primary} said:\n{said}\nstatus: {status}\nreports:\n{report}"
                )));
            }
            // Resumed: commits after the new primary was chosen (the old one may acknowledge a few
            // more until the kubelet has killed it).
            let chosen = now_ms();
            eventually(DEFAULT_TIMEOUT, "writes to resume", || async { writes_after(chosen).await >= 3 }).await?;
            let resumed = started.elapsed();
            eprintln!("{disruption:?} of {primary}: writes resumed (seen {resumed:?} after it began)");
            // Keelson fenced the frozen primary by deleting its pod: the kubelet killed it. Were it
            // still there, it would wake up now, and the sampler would see it take writes.
            if let Some(pid) = frozen {
                let _ = signal(pid, "-CONT");
            }
            if let Some(drain) = draining.take() {
                drain.await??;
            }
            // The lost node back: its former primary (fenced) rejoins as a replica.
            if let Some(fault) = faulted.take() {
                fault.end()?;
            }
            if disruption == Disruption::Upgrade {
                eventually(DEFAULT_TIMEOUT, "every pod on postgres:15.3", || async {
                    let selector = format!("keelson.dev/cluster={DB},app.kubernetes.io/component=database");
                    let Ok(list) = pods.list(&ListParams::default().labels(&selector)).await else { return false };
                    let images: Vec<String> = list
                        .items
                        .iter()
                        .filter_map(|p| {
                            p.spec.as_ref()?.containers.iter().find(|c| c.name == "postgres")?.image.clone()
                        })
                        .collect();
                    images.len() == 3 && images.iter().all(|i| i.ends_with("postgres:15.3"))
                })
                .await?;
            }
            settled(&ns).await?;
            if disruption == Disruption::Switchover {
                let restarts = postgres_restarts(&pods.get(&primary).await?);
                if restarts != restarts_before {
                    // What the container said before it ended, and why the kubelet says it did.
                    let said = kubectl(&["-n", &ns.name, "logs", "-p", &primary, "-c", "postgres", "--tail=40"])
                        .unwrap_or_else(|e| e.to_string());
                    let why = kubectl(&[
                        "-n",
                        &ns.name,
                        "get",
                        "pod",
                        &primary,
                        "-o",
                        "jsonpath={.status.containerStatuses[?(@.name=='postgres')].lastState}",
                    ])
                    .unwrap_or_else(|e| e.to_string());
                    panic!(
                        "{primary}'s postgres container restarted on a switchover ({restarts_before:?} → {restarts:?}): {why}\n{said}"
                    );
                }
            }
            // Keelson completes the record once it saw the new primary serve, which may come after
            // the database settled (a former primary now rejoins within seconds, in its container).
            let complete = testkit::wait_for(&dbs, DB, "this move's record to be complete", DEFAULT_TIMEOUT, |db| {
                let record = db.status.as_ref().and_then(|s| s.last_failover.as_ref());
                record.is_some_and(|r| r.from == primary && r.serving_at.is_some())
            })
            .await?;
            let record = complete.status.and_then(|s| s.last_failover).expect("status.lastFailover");
            eprintln!(
                "  {} {} → {}: {} (Keelson: writes down {:?} ms)",
                record.kind, record.from, record.to, record.reason, record.writes_down_ms
            );
            // An upgrade's window spans its whole rollout.
            let window = if disruption == Disruption::Upgrade { started.elapsed() } else { resumed };
            // From here on the old primary may be chosen again (a later switchover).
            let old_primary = (primary_ip, now_ms());
            downs.push((disruption, primary, before, window, record, old_primary));
        }
        settled(&ns).await?;
        for pod in ["writer", "session", "sampler"] {
            // An exec can fail on a loaded node (the kubelet's stream): asking again is harmless.
            // An exec whose stream broke may still have run: a client that finished was told.
            eventually(DEFAULT_TIMEOUT, "the client to be told to stop", || async {
                kubectl(&["-n", &ns.name, "exec", pod, "--", "touch", "/tmp/stop"]).is_ok()
                    || pods.get(pod).await.is_ok_and(|p| {
                        matches!(p.status.and_then(|s| s.phase).as_deref(), Some("Succeeded" | "Failed"))
                    })
            })
            .await?;
        }
        anyhow::Ok(downs)
    };
    let downs = disrupt.await?;
    let (written, sampled) = (ended(&ns, "writer").await?, ended(&ns, "sampler").await?);
    let in_session = ended(&ns, "session").await?;

    // Writes down: the longest pause between two acknowledgements around each disruption (the old
    // primary may still acknowledge a few writes until the kubelet has killed it). An upgrade's
    // window spans its whole rollout: its longest pause must be no more than a switchover's.
    let acked = acknowledged(&written);
    let mut report = Vec::new();
    for (n, (disruption, primary, at, resumed, record, _)) in downs.iter().enumerate() {
        let next_at = downs.get(n + 1).map(|(_, _, next_at, _, _, _)| *next_at);
        let gap = longest_pause(&acked, *at, at + resumed.as_millis() + 1000, next_at);
        eprintln!("{disruption:?} of {primary}: writes down {gap:?}");
        report.push((*disruption, gap, record.writes_down_ms));
    }
    // Every pause of more than a second, by when it began (for the record and for diagnosis).
    let first = downs.first().map(|(_, _, at, _, _, _)| *at).unwrap_or_default();
    for (disruption, primary, at, _, _, _) in &downs {
        eprintln!("  t={:>7} ms: {disruption:?} of {primary}", at.saturating_sub(first));
    }
    for pair in acked.windows(2).filter(|pair| pair[1].1 - pair[0].1 > 1000) {
        eprintln!("  t={:>7} ms: writes paused {} ms", pair[0].1.saturating_sub(first), pair[1].1 - pair[0].1);
        // What the writer was told meanwhile, for diagnosis.
        let told = written.lines().filter(|line| line.starts_with("failed ")).filter(|line| {
            line.split(' ').nth(2).and_then(|t| t.parse::<u128>().ok()).is_some_and(|t| t > pair[0].1 && t < pair[1].1)
        });
        for line in told.take(5) {
            eprintln!("      {line}");
        }
    }
    let mut deletions: Vec<Duration> =
        report.iter().filter(|(d, _, _)| *d == Disruption::Delete).map(|(_, gap, _)| *gap).collect();
    deletions.sort();
    if let (Some(p50), Some(max)) = (deletions.get(deletions.len() / 2), deletions.last()) {
        eprintln!("write downtime over {} pod deletions: p50 {p50:?}, max {max:?}", deletions.len());
    }
    if let Ok(path) = std::env::var("KEELSON_HA_REPORT") {
        std::fs::write(&path, report_table(ready_in, &report))?;
        eprintln!("report: {path}");
    }
    let over: Vec<_> = report.iter().filter(|(d, gap, _)| *gap > d.limit()).collect();
    assert!(over.is_empty(), "writes were down longer than allowed: {over:?} (all: {report:?})");

    // Nothing acknowledged is lost: every id the writer saw committed is on the primary now.
    let primary = settled(&ns).await?;
    let stored: std::collections::BTreeSet<u64> =
        sql_in(&ns, &primary, "SELECT id FROM acked")?.lines().filter_map(|l| l.parse().ok()).collect();
    let lost: Vec<u64> = acked.iter().map(|(id, _)| *id).filter(|id| !stored.contains(id)).collect();
    assert!(acked.len() >= 40, "too few writes to prove anything: {}", acked.len());
    assert!(lost.is_empty(), "{} acknowledged writes lost: {lost:?}", lost.len());
    // ... nor anything the long-lived session saw acknowledged.
    let session_acked = acknowledged(&in_session);
    let stored: std::collections::BTreeSet<u64> =
        sql_in(&ns, &primary, "SELECT id FROM acked_session")?.lines().filter_map(|l| l.parse().ok()).collect();
    let lost: Vec<u64> = session_acked.iter().map(|(id, _)| *id).filter(|id| !stored.contains(id)).collect();
    assert!(session_acked.len() >= 40, "too few writes in the session to prove anything: {}", session_acked.len());
    for line in in_session.lines().filter(|line| {
        line.strip_prefix("ok ")
            .and_then(|rest| rest.split(' ').next()?.parse::<u64>().ok())
            .is_some_and(|id| lost.contains(&id))
    }) {
        eprintln!(
            "  lost in the session: {line} (t={} ms)",
            line.split(' ').nth(2).and_then(|t| t.parse::<u128>().ok()).unwrap_or_default().saturating_sub(first)
        );
    }
    assert!(lost.is_empty(), "{} writes acknowledged in the long-lived session lost: {lost:?}", lost.len());
    // No old primary acknowledged after another server did, within each disruption's window.
    let servers = acknowledging_servers(&in_session);
    for (disruption, old, at, _, _, (old_ip, until)) in &downs {
        let window: Vec<&(u128, String)> = servers.iter().filter(|(t, _)| *t > *at && *t < *until).collect();
        let Some(first_new) = window.iter().find(|(_, server)| server != old_ip).map(|(t, _)| *t) else { continue };
        let late: Vec<_> = window.iter().filter(|(t, server)| *t > first_new && server == old_ip).collect();
        assert!(late.is_empty(), "{disruption:?}: the old primary {old} acknowledged after the new one: {late:?}");
    }

    // Never two primaries: no sample found two instances taking writes.
    let samples: Vec<&str> = sampled.lines().filter(|l| l.split(' ').count() == 4).collect();
    assert!(samples.len() >= 20, "too few samples: {}", samples.len());
    let doubled: Vec<&&str> =
        samples.iter().filter(|l| l.split(' ').skip(1).filter(|r| *r == "t").count() > 1).collect();
    assert!(doubled.is_empty(), "two primaries at once: {doubled:?}");
    // ... and the sampler did see the primary: it could tell one when there was one.
    let one_primary = samples.iter().filter(|l| l.split(' ').skip(1).filter(|r| *r == "t").count() == 1).count();
    assert!(one_primary * 2 >= samples.len(), "the sampler rarely saw a primary: {one_primary} of {}", samples.len());

    // Every lost instance is back, as a streaming replica of the current primary.
    for (_, lost_primary, _, _, _, _) in &downs {
        if *lost_primary != primary {
            assert_eq!(sql_in(&ns, lost_primary, "SELECT pg_is_in_recovery()")?, "t", "{lost_primary}");
        }
    }
    let streaming = sql_in(
        &ns,
        &primary,
        "SELECT string_agg(application_name, ',' ORDER BY application_name) FROM pg_stat_replication WHERE state = 'streaming'",
    )?;
    assert_eq!(streaming.split(',').count(), 2, "{streaming}");
    // ... from the primary's pod itself, not through `-rw`, whose kube-proxy rules lag a failover.
    let primary_ip = pods.get(&primary).await?.status.and_then(|s| s.pod_ip).unwrap_or_default();
    for replica in streaming.split(',') {
        let sender = sql_in(&ns, replica, "SELECT sender_host FROM pg_stat_wal_receiver")?;
        assert_eq!(sender, primary_ip, "{replica} streams from {sender}, not from the primary {primary}'s pod");
    }
    // ... each through its replication slot there; no replica keeps a slot of its own (a former
    // primary's would hold its WAL back).
    let mut wanted: Vec<String> =
        streaming.split(',').filter_map(|r| r.rsplit('-').next()).map(|n| format!("keelson_{n}")).collect();
    wanted.sort();
    let active_slots =
        "SELECT coalesce(string_agg(slot_name, ',' ORDER BY slot_name), '') FROM pg_replication_slots WHERE active";
    eventually(DEFAULT_TIMEOUT, "the replicas to stream through their slots", || async {
        sql_in(&ns, &primary, active_slots).is_ok_and(|slots| slots == wanted.join(","))
    })
    .await?;
    for replica in streaming.split(',') {
        assert_eq!(sql_in(&ns, replica, "SELECT count(*) FROM pg_replication_slots")?, "0", "{replica} keeps slots");
    }
    let upgraded = downs.iter().any(|(d, ..)| *d == Disruption::Upgrade);
    for reason in ["Failover", "Switchover", "RollingUpdate"].into_iter().filter(|r| upgraded || *r != "RollingUpdate")
    {
        let selector = format!("reason={reason}");
        let events = kubectl(&["-n", &ns.name, "get", "events", "--field-selector", &selector, "-o", "name"])?;
        assert!(!events.trim().is_empty(), "no {reason} Event");
    }
    // Each record says what happened, as Keelson saw it.
    for (disruption, lost, _, _, record, _) in &downs {
        let (kind, reason) = match disruption {
            Disruption::Delete | Disruption::GracefulDelete => ("Failover", "its pod"),
            Disruption::Hang => ("Failover", "its PostgreSQL stopped answering"),
            Disruption::Partition | Disruption::PowerOff => ("Failover", "its lease was not renewed"),
            // The primary's budget holds its eviction back until Keelson has switched over.
            Disruption::Drain => ("Switchover", "is cordoned"),
            Disruption::Switchover => ("Switchover", "switchover to"),
            Disruption::Upgrade => ("Switchover", "rolling update"),
        };
        assert_eq!((record.kind.as_str(), &record.from), (kind, lost), "{disruption:?}: {record:?}");
        assert!(record.reason.contains(reason), "{disruption:?}: {record:?}");
        assert!(record.writes_down_ms.is_some_and(|ms| ms >= 0), "{disruption:?}: no downtime measured: {record:?}");
        // This record's own times, in order (not a field left over from the record before).
        let at = |t: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| t.as_ref().map(|t| t.0);
        assert!(
            at(&record.lost_at) <= at(&record.promoted_at) && at(&record.promoted_at) <= at(&record.serving_at),
            "{disruption:?}: times out of order: {record:?}"
        );
        // The replicas that answered in time (one that has just rejoined may not: the failover
        // then goes on without it after 3 s), the promoted one among them, the lost one not.
        assert!(record.positions.iter().any(|p| p.starts_with(&format!("{} at ", record.to))), "{record:?}");
        assert!(!record.positions.iter().any(|p| p.starts_with(&format!("{} at ", record.from))), "{record:?}");
        // A planned move hears from both replicas: none was left out to be waited for, which is
        // what keeps an upgrade's pause to one switchover's (a rollout waits for each replaced
        // replica to stream again before it goes on).
        if matches!(disruption, Disruption::Switchover | Disruption::Upgrade | Disruption::Drain) {
            assert_eq!(record.positions.len(), 2, "{disruption:?}: a replica did not answer: {record:?}");
        }
    }
    Ok(())
}
