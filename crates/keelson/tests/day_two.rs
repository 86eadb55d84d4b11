//! `kubectl keelson` against a live three-instance database on real
//! PostgreSQL: every command, run as the plugin binary a DBA would run, with
//! its output checked against the database itself.

mod common;

use tokio::process::Command;

use common::{TestOperator, running};
use k8s_openapi::api::core::v1::{Secret, Service};
use keelson::api::MyDatabase;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;
use testkit::{DEFAULT_TIMEOUT, TestNamespace, cluster_or_skip, eventually};

/// Runs `kubectl keelson ARGS` in `ns` (the binary under its plugin name), returning stdout.
/// Awaited, not blocking: the operator runs on this test's runtime and must act meanwhile.
async fn plugin(ns: &TestNamespace, args: &[&str]) -> anyhow::Result<String> {
    let dir = std::env::temp_dir().join(format!("kubectl-keelson-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let link = dir.join("kubectl-keelson");
    if !link.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_keelson"), &link)?;
    }
    let output = Command::new(&link).args(["-n", &ns.name]).args(args).output().await?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    anyhow::ensure!(
        output.status.success(),
        "kubectl keelson {args:?} failed: {}{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(stdout)
}

async fn json_of(ns: &TestNamespace, args: &[&str]) -> anyhow::Result<serde_json::Value> {
    let mut with_output = args.to_vec();
    with_output.extend(["-o", "json"]);
    Ok(serde_json::from_str(&plugin(ns, &with_output).await?)?)
}

#[tokio::test]
async fn every_plugin_command_works_on_a_live_three_instance_database() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::real_namespace(&cluster, "day-two").await?;
    let operator = TestOperator::start(&cluster, &ns).await?;
    let dbs = ns.api::<MyDatabase>();
    let db: MyDatabase = serde_json::from_value(json!({
        "apiVersion": "db.keelson.dev/v1", "kind": "MyDatabase", "metadata": {"name": "ledger"},
        "spec": {"replicas": 3, "version": "15.2", "storage": "1Gi", "restoreTo": ["ledger-copy"],
                 "backup": {"schedule": "0 2 * * *", "retention": "7d"}}
    }))?;
    dbs.create(&PostParams::default(), &db).await?;
    testkit::wait_for(&dbs, "ledger", "Running 3/3", DEFAULT_TIMEOUT, running(3)).await?;

    // status: the true primary, three instances on their nodes, lag, nothing wrong.
    let table = plugin(&ns, &["status", "ledger"]).await?;
    assert!(table.contains("Running, primary ledger-0") && table.contains("LAG SECONDS"), "{table}");
    // Once every replica has reported that it caught up with the clone, and the primary its lag.
    eventually(DEFAULT_TIMEOUT, "status to find nothing wrong, with every replica's lag", || async {
        let settled = plugin(&ns, &["status", "ledger"]).await.is_ok_and(|t| t.contains("Nothing is wrong."));
        let lags = json_of(&ns, &["status", "ledger"]).await.is_ok_and(|s| {
            let instances = s["instances"].as_array().cloned().unwrap_or_default();
            instances.iter().filter(|i| i["role"] == "replica").count() == 2
                && instances.iter().filter(|i| i["role"] == "replica").all(|i| i["lagBytes"].is_i64())
        });
        settled && lags
    })
    .await?;
    let status = json_of(&ns, &["status", "ledger"]).await?;
    assert_eq!(status["primary"], "ledger-0");
    let instances = status["instances"].as_array().cloned().unwrap_or_default();
    assert_eq!(instances.len(), 3, "{status}");
    for instance in &instances {
        assert!(instance["node"].as_str().is_some_and(|n| n.starts_with("keelson-node-")), "{instance}");
        assert_eq!(instance["timeline"], 1, "{instance}");
    }
    assert!(instances.iter().filter(|i| i["role"] == "replica").all(|i| i["lagBytes"].is_i64()), "{status}");

    // Every instance's PostgreSQL metrics, scraped as Prometheus would reach them (here through the
    // API server's pod proxy); a replica whose replay is paused shows as behind on the primary.
    let scrape = |pod: &str| {
        let path = format!("/api/v1/namespaces/{}/pods/{pod}:9187/proxy/metrics", ns.name);
        testkit::kubectl(&["get", "--raw", &path])
    };
    let value = |text: &str, series: &str| {
        text.lines().find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok()).unwrap_or(-1.0)
    };
    let primary = scrape("ledger-0")?;
    assert_eq!((value(&primary, "keelson_pg_up"), value(&primary, "keelson_pg_in_recovery")), (1.0, 0.0), "{primary}");
    assert_eq!(value(&primary, "keelson_pg_standby_streaming{standby=\"ledger-1\"}"), 1.0, "{primary}");
    assert!(value(&primary, "keelson_pg_database_size_bytes{datname=\"app\"}") > 0.0, "{primary}");
    for replica in ["ledger-1", "ledger-2"] {
        let text = scrape(replica)?;
        assert_eq!(value(&text, "keelson_pg_in_recovery"), 1.0, "{replica}: {text}");
        assert!(value(&text, "keelson_pg_replication_lag_seconds") >= 0.0, "{replica}: {text}");
    }
    let lag_of_ledger_1 =
        || value(&scrape("ledger-0").unwrap_or_default(), "keelson_pg_standby_lag_bytes{standby=\"ledger-1\"}");
    common::clients::sql_in(&ns, "ledger-1", "SELECT pg_wal_replay_pause()")?;
    common::clients::sql_in(&ns, "ledger-0", "CREATE TABLE filler AS SELECT g FROM generate_series(1, 200000) g")?;
    eventually(DEFAULT_TIMEOUT, "ledger-1's lag to rise on the primary's metrics", || async {
        lag_of_ledger_1() > 1_000_000.0
    })
    .await?;
    common::clients::sql_in(&ns, "ledger-1", "SELECT pg_wal_replay_resume()")?;
    eventually(DEFAULT_TIMEOUT, "ledger-1's lag back to 0", || async { lag_of_ledger_1() == 0.0 }).await?;

    // psql: on the primary, and on a replica (which has the row, streamed).
    let wrote =
        plugin(&ns, &["psql", "ledger", "--", "-c", "CREATE TABLE t (v int); INSERT INTO t VALUES (1)"]).await?;
    assert!(wrote.contains("INSERT 0 1"), "{wrote}");
    eventually(DEFAULT_TIMEOUT, "the row on a replica, through psql --replica", || async {
        plugin(&ns, &["psql", "ledger", "--replica", "--", "-At", "-c", "SELECT pg_is_in_recovery(), count(*) FROM t"])
            .await
            .is_ok_and(|out| out.trim() == "t|1")
    })
    .await?;

    // promote: a switchover that moves the primary, as status and PostgreSQL then say.
    let promoted = plugin(&ns, &["promote", "ledger", "ledger-2"]).await?;
    assert!(promoted.contains("ledger-0 → ledger-2"), "{promoted}");
    assert_eq!(json_of(&ns, &["status", "ledger"]).await?["primary"], "ledger-2");
    eventually(DEFAULT_TIMEOUT, "ledger-2 takes writes", || async {
        common::clients::sql_in(&ns, "ledger-2", "SELECT pg_is_in_recovery()").is_ok_and(|r| r == "f")
    })
    .await?;
    let refused = plugin(&ns, &["promote", "ledger", "ledger-9"]).await;
    assert!(refused.is_err_and(|e| e.to_string().contains("refused")), "promoting a pod that is not an instance");

    // backup, then backups: the new backup, verified.
    let backup = plugin(&ns, &["backup", "ledger", "--wait"]).await?;
    assert!(backup.contains("backup taken and verified"), "{backup}");
    let taken = backup.split("verified: ").nth(1).and_then(|s| s.split(' ').next()).unwrap_or_default().to_string();
    let listed = json_of(&ns, &["backups", "ledger"]).await?;
    let newest = listed.as_array().and_then(|b| b.first()).cloned().unwrap_or_default();
    assert_eq!(newest["name"], taken.as_str(), "{listed}");
    assert_eq!(newest["verified"], true);
    assert!(plugin(&ns, &["backups", "ledger"]).await?.contains(&taken));

    // restore: a new database from that backup, by name, with its data; a name not kept is refused.
    let missing = plugin(&ns, &["restore", "ledger-copy", "--from", "ledger", "--backup", "app-nope.dump"]).await;
    assert!(missing.is_err_and(|e| e.to_string().contains("keeps no backup app-nope.dump")), "an unknown backup");
    let restored = plugin(&ns, &["restore", "ledger-copy", "--from", "ledger", "--backup", &taken]).await?;
    assert!(restored.contains(&format!("ledger's backup {taken}")), "{restored}");
    testkit::wait_for(&dbs, "ledger-copy", "the copy Running 1/1", DEFAULT_TIMEOUT, running(1)).await?;
    eventually(DEFAULT_TIMEOUT, "the backed-up row in the copy", || async {
        common::clients::sql_in(&ns, "ledger-copy-0", "SELECT count(*) FROM t").is_ok_and(|n| n == "1")
    })
    .await?;

    // pause: a deleted child stays deleted through reconciles; resume brings it back.
    plugin(&ns, &["pause", "ledger"]).await?;
    let services = ns.api::<Service>();
    services.delete("ledger-ro", &DeleteParams::default()).await?;
    let reconciles = operator.counter("keelson_reconcile_total");
    eventually(DEFAULT_TIMEOUT, "two reconciles after the deletion", || async {
        operator.counter("keelson_reconcile_total") >= reconciles + 2
    })
    .await?;
    let paused = json_of(&ns, &["status", "ledger"]).await?;
    let problems = paused["problems"].to_string();
    assert!(problems.contains("Paused (Annotated)"), "{paused}");
    assert!(services.get_opt("ledger-ro").await?.is_none(), "a paused database's Service was recreated");
    plugin(&ns, &["resume", "ledger"]).await?;
    eventually(DEFAULT_TIMEOUT, "the Service back once resumed", || async {
        services.get_opt("ledger-ro").await.is_ok_and(|s| s.is_some())
    })
    .await?;

    // fence a replica: its PostgreSQL stops, status says so, the primary writes on; unfence: it streams again.
    let fenced = plugin(&ns, &["fence", "ledger", "ledger-1"]).await?;
    assert!(fenced.contains("ledger-1 fenced"), "{fenced}");
    assert!(common::clients::sql_in(&ns, "ledger-1", "SELECT 1").is_err(), "a fenced instance answers");
    let shown = json_of(&ns, &["status", "ledger"]).await?;
    assert!(shown["problems"].to_string().contains("Fenced (FencedForMaintenance)"), "{shown}");
    let row = shown["instances"].as_array().and_then(|i| i.iter().find(|i| i["name"] == "ledger-1")).cloned();
    assert_eq!(row.map(|r| r["role"].clone()), Some(json!("replica (fenced)")), "{shown}");
    common::clients::sql_in(&ns, "ledger-2", "INSERT INTO t VALUES (2)")?;
    let unfenced = plugin(&ns, &["unfence", "ledger", "ledger-1"]).await?;
    assert!(unfenced.contains("ledger-1 unfenced"), "{unfenced}");
    eventually(DEFAULT_TIMEOUT, "ledger-1 to stream the row written while it was fenced", || async {
        common::clients::sql_in(&ns, "ledger-1", "SELECT count(*) FROM t").is_ok_and(|n| n == "2")
    })
    .await?;

    // fence the primary: no writes, and no failover however long it lasts (a hung primary is
    // failed over after 6 s without an answer); unfenced, the same primary takes writes again.
    let before = dbs.get("ledger").await?.status.and_then(|s| s.last_failover);
    plugin(&ns, &["fence", "ledger", "ledger-2"]).await?;
    let pods = ns.api::<k8s_openapi::api::core::v1::Pod>();
    eventually(DEFAULT_TIMEOUT, "the fenced primary to be unready for 15 s", || async {
        let Ok(pod) = pods.get("ledger-2").await else { return false };
        let ready = pod.status.and_then(|s| s.conditions).and_then(|c| c.into_iter().find(|c| c.type_ == "Ready"));
        ready.is_some_and(|r| {
            r.status == "False"
                && r.last_transition_time
                    .is_some_and(|t| k8s_openapi::jiff::Timestamp::now().duration_since(t.0).as_secs() >= 15)
        })
    })
    .await?;
    let during = dbs.get("ledger").await?.status.unwrap_or_default();
    assert_eq!(during.current_primary.as_deref(), Some("ledger-2"), "the primary moved while fenced");
    assert_eq!(during.last_failover, before, "a failover while the primary was fenced");
    plugin(&ns, &["unfence", "ledger", "ledger-2"]).await?;
    eventually(DEFAULT_TIMEOUT, "ledger-2 takes writes again", || async {
        common::clients::sql_in(&ns, "ledger-2", "INSERT INTO t VALUES (3)").is_ok()
    })
    .await?;

    // report: the objects and logs, and none of the database's secret values.
    let file = std::env::temp_dir().join(format!("keelson-report-{}.txt", ns.name));
    plugin(&ns, &["report", "ledger", "--file", &file.to_string_lossy()]).await?;
    let report = std::fs::read_to_string(&file)?;
    let _ = std::fs::remove_file(&file);
    for section in ["=== MyDatabase ===", "=== Pods ===", "=== Secrets (keys only) ===", "=== Log of ledger-0/postgres"]
    {
        assert!(report.contains(section), "the report has no {section}");
    }
    let secrets = ns.api::<Secret>();
    for (secret, key) in [("ledger-credentials", "password"), ("ledger-replication", "replication-password")] {
        let value = secrets.get(secret).await?.data.and_then(|d| d.get(key).cloned()).map(|v| v.0).unwrap_or_default();
        assert!(value.len() >= 16, "{secret} has no {key}");
        let value = String::from_utf8_lossy(&value).into_owned();
        assert!(!report.contains(&value), "the report holds {secret}'s {key}");
        // Nor do the logs it was made from (the switchover above re-pointed every replica).
        for pod in ["ledger-0", "ledger-1", "ledger-2"] {
            for container in ["postgres", "instance-manager"] {
                let log = testkit::kubectl(&["-n", &ns.name, "logs", pod, "-c", container])?;
                assert!(!log.contains(&value), "{pod}/{container} logged {secret}'s {key}");
            }
        }
    }

    // Clear errors: a database that does not exist.
    let missing = plugin(&ns, &["status", "nope"]).await.expect_err("a missing database");
    assert!(missing.to_string().contains("MyDatabase \"nope\" not found"), "{missing}");
    operator.stop().await
}
