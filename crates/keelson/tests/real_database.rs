//! MyDatabase on real PostgreSQL in pods on the local cluster's real node,
//! proven with SQL: replication, the connection Secret, the Services.

mod common;

use anyhow::Context as _;
use common::{TestOperator, running};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use keelson::api::MyDatabase;
use keelson::api::instance::Role;
use keelson::api::mydatabase::{DatabasePhase, SWITCHOVER_ANNOTATION};
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::pods::{run, shell_pod};
use testkit::{DEFAULT_TIMEOUT, TestNamespace, cluster_or_skip, eventually, kubectl};

/// The tutorial's manifest, unchanged.
fn tutorial() -> anyhow::Result<MyDatabase> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "db.keelson.dev/v1", "kind": "MyDatabase", "metadata": {"name": "production-db"},
        "spec": {"replicas": 3, "version": "15.2", "storage": "100Gi",
                 "backup": {"schedule": "0 2 * * *", "retention": "7d"},
                 // The test restores its backups into another database, which it must allow.
                 "restoreTo": ["restored-db"]}
    }))?)
}

/// SQL as the local superuser inside an instance's container (Unix socket, trust).
fn sql_in(ns: &TestNamespace, pod: &str, sql: &str) -> anyhow::Result<String> {
    Ok(kubectl(&["-n", &ns.name, "exec", pod, "-c", "postgres", "--", "psql", "-X", "-At", "-d", "app", "-c", sql])?
        .trim()
        .to_string())
}

/// A client pod that runs `psql` with a key of the connection Secret as its URI, trusting the
/// Secret's CA (the URI asks for `sslmode=verify-full`).
fn client(name: &str, uri_key: &str, script: &str) -> serde_json::Value {
    database_client("production-db", name, uri_key, script)
}

fn database_client(db: &str, name: &str, uri_key: &str, script: &str) -> serde_json::Value {
    let mut pod = shell_pod(name, "postgres:15.2", script);
    pod["spec"]["containers"][0]["env"] = json!([{"name": "URI",
        "valueFrom": {"secretKeyRef": {"name": format!("{db}-credentials"), "key": uri_key}}}]);
    common::clients::trust_database_ca(&mut pod, db);
    common::clients::await_network(&mut pod);
    pod
}

#[tokio::test]
async fn tutorial_database_streams_to_two_replicas_and_serves_its_connection_secret() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::real_namespace(&cluster, "real-db-replication").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    let dbs = ns.api::<MyDatabase>();
    dbs.create(&PostParams::default(), &tutorial()?).await?;
    testkit::wait_for(&dbs, "production-db", "Running 3/3 on real PostgreSQL", DEFAULT_TIMEOUT, |db| {
        db.status.as_ref().is_some_and(|s| s.phase == Some(DatabasePhase::Running) && s.ready_replicas == 3)
    })
    .await?;

    // Three usable nodes for three instances: one per node, required.
    let db = dbs.get("production-db").await?;
    let spread = db.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "InstancesSpread")).cloned();
    assert_eq!(spread.map(|c| (c.status, c.reason)), Some(("True".into(), "OneInstancePerNode".into())));
    let pods = ns.api::<k8s_openapi::api::core::v1::Pod>();
    let mut nodes = Vec::new();
    for pod in ["production-db-0", "production-db-1", "production-db-2"] {
        nodes.push(pods.get(pod).await?.spec.and_then(|s| s.node_name).unwrap_or_default());
    }
    nodes.sort();
    nodes.dedup();
    assert_eq!(nodes.len(), 3, "instances share a node: {nodes:?}");

    assert_eq!(sql_in(&ns, "production-db-0", "SELECT pg_is_in_recovery()")?, "f", "ordinal 0 is the primary");
    for replica in ["production-db-1", "production-db-2"] {
        assert_eq!(sql_in(&ns, replica, "SELECT pg_is_in_recovery()")?, "t", "{replica} is a replica");
    }
    eventually(DEFAULT_TIMEOUT, "both replicas streaming from the primary", || async {
        sql_in(&ns, "production-db-0", "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")
            .is_ok_and(|n| n == "2")
    })
    .await?;
    // Each through a replication slot of its own, which keeps the WAL it has not received, up to a
    // tenth of the volume.
    let slots = "SELECT string_agg(slot_name, ',' ORDER BY slot_name) FROM pg_replication_slots WHERE active";
    eventually(DEFAULT_TIMEOUT, "both replicas streaming through their slots", || async {
        sql_in(&ns, "production-db-0", slots).is_ok_and(|s| s == "keelson_1,keelson_2")
    })
    .await?;
    let cap = sql_in(
        &ns,
        "production-db-0",
        "SELECT setting::bigint FROM pg_settings WHERE name = 'max_slot_wal_keep_size'",
    )?;
    assert!(
        cap.parse::<i64>().is_ok_and(|mb| mb >= 64),
        "max_slot_wal_keep_size {cap}MB: the slots' WAL is not capped"
    );

    // Through the Secret's URI (the -rw Service, cluster DNS, the app role's password).
    // With TLS, the server's certificate verified against the Secret's CA (`sslmode=verify-full`).
    let write = "psql \"$URI\" -v ON_ERROR_STOP=1 -At -c 'CREATE TABLE orders (id int PRIMARY KEY, item text)' \
                 -c \"INSERT INTO orders VALUES (1, 'written through -rw')\" \
                 -c 'SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()' -c 'SELECT pg_is_in_recovery()'";
    let written = run(&ns, client("writer", "uri", write)).await?;
    assert!(written.succeeded && written.logs.trim_end().ends_with("t\nf"), "psql \"$uri\" failed: {}", written.logs);
    assert!(run(&ns, client("uri-check", "uri", "echo \"$URI\"")).await?.logs.contains("sslmode=verify-full"));
    // Replication is encrypted too.
    let encrypted = "SELECT count(*) FROM pg_stat_replication r JOIN pg_stat_ssl s USING (pid) WHERE s.ssl";
    eventually(DEFAULT_TIMEOUT, "both replicas streaming over TLS", || async {
        sql_in(&ns, "production-db-0", encrypted).is_ok_and(|n| n == "2")
    })
    .await?;
    // ... and each replica checks its primary's certificate against the database's CA.
    for replica in ["production-db-1", "production-db-2"] {
        // (pg_basebackup -R quotes the values; the password is left out of any message.)
        let ssl = sql_in(
            &ns,
            replica,
            "SELECT substring(c from 'sslmode=''?([^'' ]+)') || ' ' || substring(c from 'sslrootcert=''?([^'' ]+)') \
             FROM current_setting('primary_conninfo') c",
        )?;
        assert!(ssl.starts_with("verify-ca /"), "{replica}: sslmode and sslrootcert {ssl}");
    }

    // The application's password is the app role's only: not the superuser's over the network,
    // no shell through COPY ... TO PROGRAM, no replication stream of the whole cluster.
    let escapes = r#"host="${URI#*@}"; host="${host%%:*}"; password="${URI#postgresql://app:}"; password="${password%%@*}"
export PGPASSWORD="$password" PGCONNECT_TIMEOUT=5
psql -h "$host" -U postgres -d app -X -At -c 'SELECT 1' 2>&1 && echo SUPERUSER-LOGGED-IN
psql "$URI" -X -At -c "COPY (SELECT 1) TO PROGRAM 'id'" 2>&1 && echo PROGRAM-RAN
psql "host=$host user=app dbname=app replication=true" -X -At -c 'IDENTIFY_SYSTEM' 2>&1 && echo REPLICATION-ALLOWED
psql "host=$host user=app dbname=app sslmode=disable" -X -At -c 'SELECT 1' 2>&1 && echo PLAINTEXT-ALLOWED
# A CA that did not sign the server's certificate (another database's): verify-full refuses it.
printf '%s\n' "$OTHER_CA" > /tmp/other-ca.crt
PGSSLROOTCERT=/tmp/other-ca.crt psql "$URI" -X -At -c 'SELECT 1' 2>&1 && echo UNVERIFIED-ACCEPTED
echo checked"#;
    let mut escapes = client("escapes", "uri", escapes);
    let env = &mut escapes["spec"]["containers"][0]["env"];
    env.as_array_mut().expect("env").push(json!({"name": "OTHER_CA", "value": other_ca()?}));
    let tried = run(&ns, escapes).await?;
    // ... and the Secret applications mount holds no replication credential: its own Secret does.
    let app_secret = ns.api::<Secret>().get("production-db-credentials").await?;
    let keys: Vec<String> = app_secret.data.unwrap_or_default().into_keys().collect();
    assert_eq!(keys, ["ca.crt", "database", "host", "jdbc-uri", "password", "pgpass", "port", "uri", "username"]);
    assert!(!secret_value(&ns, "production-db-replication", "replication-password").await?.is_empty());
    assert!(tried.logs.contains("checked"), "{}", tried.logs);
    for escaped in
        ["SUPERUSER-LOGGED-IN", "PROGRAM-RAN", "REPLICATION-ALLOWED", "PLAINTEXT-ALLOWED", "UNVERIFIED-ACCEPTED"]
    {
        assert!(!tried.logs.contains(escaped), "{escaped}: {}", tried.logs);
    }
    assert!(
        tried.logs.contains("pg_hba.conf rejects connection") && tried.logs.contains("\"postgres\""),
        "{}",
        tried.logs
    );
    assert!(tried.logs.contains("pg_execute_server_program"), "{}", tried.logs);
    assert!(tried.logs.contains("no encryption"), "a plaintext connection was not refused by pg_hba: {}", tried.logs);
    assert!(tried.logs.contains("certificate verify failed"), "{}", tried.logs);

    // The NetworkPolicy (the local cluster enforces it with kube-router's firewall): PostgreSQL
    // answers the namespace's pods (every client above) and no other namespace's; metrics answer anyone.
    let policy = ns.api::<NetworkPolicy>().get("production-db").await?;
    let owner = policy.owner_references().iter().find(|o| o.controller == Some(true)).map(|o| o.kind.clone());
    assert_eq!(owner.as_deref(), Some("MyDatabase"), "the NetworkPolicy is the database's own");
    let primary_ip =
        pods.get("production-db-0").await?.status.and_then(|s| s.pod_ip).context("the primary's pod address")?;
    let outsiders = common::real_namespace(&cluster, "real-db-outsider").await?;
    let outsider = probe(&outsiders, "outsider", json!({}), &primary_ip, 5432, "closed").await?;
    assert_eq!(outsider, "closed", "a pod of another namespace reached PostgreSQL");
    assert_eq!(probe(&outsiders, "scraper", json!({}), &primary_ip, 9187, "open").await?, "open", "metrics");

    for replica in ["production-db-1", "production-db-2"] {
        eventually(DEFAULT_TIMEOUT, "the row to reach the replica", || async {
            sql_in(&ns, replica, "SELECT item FROM orders WHERE id = 1").is_ok_and(|item| item == "written through -rw")
        })
        .await?;
    }

    // Status from the instances themselves (their managers' reports): the primary's pod, the
    // version PostgreSQL runs, each role, and the replicas' lag caught up to 0 after the write.
    let running_version = sql_in(&ns, "production-db-0", "SHOW server_version")?;
    let reported = testkit::wait_for(&dbs, "production-db", "roles and lag 0 in status", DEFAULT_TIMEOUT, |db| {
        db.status.as_ref().is_some_and(|s| {
            s.instance_statuses.len() == 3
                && s.instance_statuses.iter().filter(|i| i.role == Some(Role::Replica)).all(|i| i.lag_bytes == Some(0))
                && s.instance_statuses.iter().filter(|i| i.role == Some(Role::Replica)).count() == 2
        })
    })
    .await?
    .status
    .unwrap_or_default();
    assert_eq!(reported.current_primary.as_deref(), Some("production-db-0"));
    assert_eq!(reported.instance_statuses[0].role, Some(Role::Primary), "{:?}", reported.instance_statuses);
    let version = reported.server_version.clone().unwrap_or_default();
    assert!(!version.is_empty() && running_version.starts_with(&version), "{version} vs SHOW {running_version}");
    assert!(reported.instance_statuses.iter().all(|i| i.ready && i.timeline == Some(1)), "{reported:?}");

    // The -ro Service reaches replicas only: every answer is "in recovery".
    let ro = "for i in 1 2 3 4 5 6; do psql \"${URI/-rw./-ro.}\" -At -c 'SELECT pg_is_in_recovery()' || exit 1; done";
    let read = run(&ns, client("reader", "uri", ro)).await?;
    assert!(read.succeeded, "psql through -ro failed: {}", read.logs);
    assert_eq!(read.logs.lines().filter(|l| *l == "t").count(), 6, "-ro reached a primary: {}", read.logs);

    // Named clients: only they and the database's own pods may connect. A pod of the namespace
    // without the label is refused; the replicas connect again (their streams ended here), and the
    // backup below connects from its Job's pod.
    let shop_only =
        json!({"spec": {"networkPolicy": {"clients": [{"podSelector": {"matchLabels": {"app": "shop"}}}]}}});
    dbs.patch("production-db", &PatchParams::default(), &Patch::Merge(shop_only)).await?;
    assert_eq!(probe(&ns, "unnamed", json!({}), &primary_ip, 5432, "closed").await?, "closed", "an unnamed client");
    assert_eq!(probe(&ns, "shop", json!({"app": "shop"}), &primary_ip, 5432, "open").await?, "open", "a named client");
    sql_in(&ns, "production-db-0", "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_replication")?;
    eventually(DEFAULT_TIMEOUT, "both replicas to stream again through the policy", || async {
        sql_in(&ns, "production-db-0", "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")
            .is_ok_and(|n| n == "2")
    })
    .await?;

    // A backup now, from the CronJob's own template: taken from a replica, verified, named in status.
    kubectl(&["-n", &ns.name, "create", "job", "--from=cronjob/production-db-backup", "backup-now"])?;
    let backed_up = testkit::wait_for(&dbs, "production-db", "the backup named in status", DEFAULT_TIMEOUT, |db| {
        db.status.as_ref().is_some_and(|s| s.last_backup_name.is_some() && s.last_backup_size_bytes.is_some())
    })
    .await?;
    let status = backed_up.status.unwrap_or_default();
    let name = status.last_backup_name.unwrap_or_default();
    assert!(name.starts_with("app-") && name.ends_with(".dump"), "{name}");
    assert!(status.last_backup_size_bytes.unwrap_or_default() > 1000, "a dump of a table is more than a header");
    let logs = kubectl(&["-n", &ns.name, "logs", "job/backup-now"])?;
    assert!(logs.contains("from production-db-ro:5432"), "the backup was not taken from a replica: {logs}");
    assert!(logs.contains(&format!("backup complete and verified: {name}")), "{logs}");

    // Opted out: Keelson deletes its NetworkPolicy, and other namespaces reach PostgreSQL again.
    let opt_out = json!({"spec": {"networkPolicy": {"enabled": false}}});
    dbs.patch("production-db", &PatchParams::default(), &Patch::Merge(opt_out)).await?;
    let policies = ns.api::<NetworkPolicy>();
    testkit::wait_for_deletion(&policies, "production-db", "the NetworkPolicy to go", DEFAULT_TIMEOUT).await?;
    let reopened = probe(&outsiders, "outsider-again", json!({}), &primary_ip, 5432, "open").await?;
    assert_eq!(reopened, "open", "without the policy, another namespace's pod connects");

    // Restore: a row written after the backup must not come back; the source is gone (its
    // backups volume stays under the default Retain policy); the new database has its own password.
    sql_in(&ns, "production-db-0", "INSERT INTO orders VALUES (2, 'after the backup')")?;
    let source_password = secret_value(&ns, "production-db-credentials", "password").await?;
    dbs.delete("production-db", &DeleteParams::default()).await?;
    testkit::wait_for_deletion(&dbs, "production-db", "the source to go", DEFAULT_TIMEOUT).await?;
    let restored: MyDatabase = serde_json::from_value(json!({
        "apiVersion": "db.keelson.dev/v1", "kind": "MyDatabase", "metadata": {"name": "restored-db"},
        "spec": {"replicas": 2, "version": "15.2", "storage": "1Gi",
                 "restoreFrom": {"database": "production-db", "backup": name}}
    }))?;
    dbs.create(&PostParams::default(), &restored).await?;
    testkit::wait_for(&dbs, "restored-db", "the restored database Running 2/2", DEFAULT_TIMEOUT, |db| {
        db.status.as_ref().is_some_and(|s| s.phase == Some(DatabasePhase::Running) && s.ready_replicas == 2)
    })
    .await?;
    for pod in ["restored-db-0", "restored-db-1"] {
        eventually(DEFAULT_TIMEOUT, "the restored rows on every instance", || async {
            sql_in(&ns, pod, "SELECT string_agg(id || ':' || item, ',' ORDER BY id) FROM orders")
                .is_ok_and(|rows| rows == "1:written through -rw")
        })
        .await?;
    }
    let own_password = secret_value(&ns, "restored-db-credentials", "password").await?;
    assert_ne!(own_password, source_password, "the restored database took the source's password");
    let login = database_client("restored-db", "login", "uri", "psql \"$URI\" -At -c 'SELECT count(*) FROM orders'");
    let logged_in = run(&ns, login).await?;
    assert!(logged_in.succeeded && logged_in.logs.trim() == "1", "its own credentials: {}", logged_in.logs);
    Ok(())
}

/// Whether a pod in `ns` with `labels` can open a TCP connection to `ip:port`, tried once a second
/// until the answer is `until` ("open" or "closed"), for at most a minute (a change of policy, or
/// a new pod's address, reaches the NetworkPolicy engine a moment later); returns the last answer.
async fn probe(
    ns: &TestNamespace,
    name: &str,
    labels: serde_json::Value,
    ip: &str,
    port: u16,
    until: &str,
) -> anyhow::Result<String> {
    let script = format!(
        "for i in $(seq 60); do \
           if timeout 3 bash -c 'echo > /dev/tcp/{ip}/{port}' 2>/dev/null; then state=open; else state=closed; fi; \
           [ \"$state\" = {until} ] && break; sleep 1; done; echo \"$state\""
    );
    let mut pod = shell_pod(name, "postgres:15.2", &script);
    pod["metadata"]["labels"] = labels;
    let ended = run(ns, pod).await?;
    Ok(ended.logs.lines().last().unwrap_or_default().to_string())
}

/// The CA of another database, which never signed this one's certificate.
fn other_ca() -> anyhow::Result<String> {
    let other: MyDatabase = serde_json::from_value(json!({
        "apiVersion": "db.keelson.dev/v1", "kind": "MyDatabase",
        "metadata": {"name": "other-db", "namespace": "elsewhere", "uid": "00000000-0000-4000-8000-000000000001"},
        "spec": {"replicas": 1, "version": "15.2", "storage": "1Gi"}
    }))?;
    Ok(keelson::mydatabase::tls::certificates(&other, None, None, chrono::Utc::now())?.ca_cert)
}

async fn secret_value(ns: &TestNamespace, secret: &str, key: &str) -> anyhow::Result<String> {
    let secret = ns.api::<Secret>().get(secret).await?;
    let bytes = secret.data.and_then(|mut d| d.remove(key)).map(|b| b.0).unwrap_or_default();
    Ok(String::from_utf8(bytes)?)
}

#[tokio::test]
async fn restoring_from_a_database_that_never_existed_is_named_in_ready() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::real_namespace(&cluster, "real-db-restore-missing").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    let db: MyDatabase = serde_json::from_value(json!({
        "apiVersion": "db.keelson.dev/v1", "kind": "MyDatabase", "metadata": {"name": "orphan-db"},
        "spec": {"replicas": 1, "version": "15.2", "storage": "1Gi", "restoreFrom": {"database": "never-was"}}
    }))?;
    let dbs = ns.api::<MyDatabase>();
    dbs.create(&PostParams::default(), &db).await?;
    let named = testkit::wait_for(&dbs, "orphan-db", "Ready=False RestoreSourceMissing", DEFAULT_TIMEOUT, |db| {
        db.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.reason == "RestoreSourceMissing"))
    })
    .await?;
    let ready = named.status.unwrap_or_default().conditions.into_iter().find(|c| c.type_ == "Ready").expect("Ready");
    assert_eq!(
        ready.message,
        "spec.restoreFrom.database \"never-was\": no backups volume never-was-backups in this namespace"
    );
    // Nothing started on data that is not there.
    assert!(ns.api::<k8s_openapi::api::apps::v1::StatefulSet>().get_opt("orphan-db").await?.is_none());
    // restoreFrom is set at creation only.
    let edit = json!({"spec": {"restoreFrom": null}});
    let refused = dbs.patch("orphan-db", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(edit)).await;
    let message = refused.expect_err("removing restoreFrom was accepted").to_string();
    assert!(message.contains("spec.restoreFrom can be set only when the MyDatabase is created"), "{message}");
    Ok(())
}

#[tokio::test]
async fn password_rotation_reaches_the_role_and_a_returning_replica_catches_up() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::real_namespace(&cluster, "real-db-rotation-scale").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    let db: MyDatabase = serde_json::from_value(json!({
        "apiVersion": "db.keelson.dev/v1", "kind": "MyDatabase", "metadata": {"name": "small-db"},
        "spec": {"replicas": 2, "version": "15.2", "storage": "1Gi"}
    }))?;
    let dbs = ns.api::<MyDatabase>();
    dbs.create(&PostParams::default(), &db).await?;
    testkit::wait_for(&dbs, "small-db", "Running 2/2", DEFAULT_TIMEOUT, running(2)).await?;
    let pods = ns.api::<k8s_openapi::api::core::v1::Pod>();
    let uid_before = pods.get("small-db-0").await?.metadata.uid;

    // Every statement the primary runs is logged while the password changes: what reaches the
    // server must be a SCRAM verifier Keelson computed, never the password.
    sql_in(&ns, "small-db-0", "ALTER SYSTEM SET log_statement = 'all'")?;
    sql_in(&ns, "small-db-0", "SELECT pg_reload_conf()")?;
    // Rotation: a new password in the Secret logs in through -rw; the old one no longer does.
    let old_password = secret_value(&ns, "small-db-credentials", "password").await?;
    let patch = json!({"stringData": {"password": "rotated-by-the-test"}});
    ns.api::<Secret>()
        .patch("small-db-credentials", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(patch))
        .await?;
    let login = |password: &str| {
        let (ns, password) = (&ns, password.to_string());
        async move {
            let command = format!("PGPASSWORD={password} psql -h small-db-rw -U app -d app -At -c 'SELECT 1'");
            kubectl(&["-n", &ns.name, "exec", "small-db-1", "-c", "postgres", "--", "bash", "-c", &command])
                .is_ok_and(|out| out.trim() == "1")
        }
    };
    eventually(DEFAULT_TIMEOUT, "the rotated password to log in", || login("rotated-by-the-test")).await?;
    assert!(!login(&old_password).await, "the old password still logs in");
    eventually(DEFAULT_TIMEOUT, "the Secret's uri to carry the new password", || async {
        secret_value(&ns, "small-db-credentials", "uri").await.is_ok_and(|uri| uri.contains(":rotated-by-the-test@"))
    })
    .await?;
    assert_eq!(pods.get("small-db-0").await?.metadata.uid, uid_before, "rotation restarted the primary");
    // Neither password is in a process's command line or environment, in a log, or in the pod spec.
    let list = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; tr '\\0' '\\n' < $p/environ; done 2>/dev/null; exit 0";
    for pod in ["small-db-0", "small-db-1"] {
        let processes = kubectl(&["-n", &ns.name, "exec", pod, "-c", "postgres", "--", "bash", "-c", list])?;
        assert!(processes.contains("postgres"), "no process listed: {processes}");
        for container in ["postgres", "instance-manager"] {
            let logs = kubectl(&["-n", &ns.name, "logs", pod, "-c", container])?;
            for password in ["rotated-by-the-test", old_password.as_str()] {
                assert!(!processes.contains(password), "a password in {pod}'s processes");
                assert!(!logs.contains(password), "a password in {pod}/{container}'s log");
            }
        }
        let spec = serde_json::to_string(&pods.get(pod).await?.spec)?;
        assert!(!spec.contains("APP_PASSWORD") && !spec.contains("REPLICATION_PASSWORD"), "passwords in {pod}'s env");
    }
    let primary_log = kubectl(&["-n", &ns.name, "logs", "small-db-0", "-c", "postgres"])?;
    assert!(
        primary_log.contains("ALTER ROLE \"app\" PASSWORD 'SCRAM-SHA-256$4096:"),
        "the rotation's statement is not in the log, or carries no verifier: {primary_log}"
    );
    sql_in(&ns, "small-db-0", "ALTER SYSTEM RESET log_statement")?;
    sql_in(&ns, "small-db-0", "SELECT pg_reload_conf()")?;

    // The replication password too, and a switchover right after (there and back), before the
    // kubelet has brought the new Secret to every pod: each former primary is rewound, not cloned
    // afresh, and streaming ends up on the new password.
    let created = |pod: &'static str| {
        let ns = &ns;
        move || {
            kubectl(&[
                "-n",
                &ns.name,
                "exec",
                pod,
                "-c",
                "postgres",
                "--",
                "bash",
                "-c",
                "stat -c %Z \"$PGDATA/PG_VERSION\"",
            ])
            .map(|out| out.trim().to_string())
        }
    };
    let (created_0, created_1) = (created("small-db-0")()?, created("small-db-1")()?);
    let patch = json!({"stringData": {"replication-password": "rotated-replication"}});
    ns.api::<Secret>()
        .patch("small-db-replication", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(patch))
        .await?;
    let streaming = |pod: &'static str| {
        let ns = &ns;
        move || async move { sql_in(ns, pod, "SELECT status FROM pg_stat_wal_receiver").is_ok_and(|s| s == "streaming") }
    };
    let streaming_with_new_password = |pod: &'static str| {
        let ns = &ns;
        move || async move {
            sql_in(ns, pod, "SELECT status FROM pg_stat_wal_receiver").is_ok_and(|s| s == "streaming")
                && kubectl(&[
                    "-n",
                    &ns.name,
                    "exec",
                    pod,
                    "-c",
                    "postgres",
                    "--",
                    "cat",
                    "/var/lib/postgresql/data/keelson-replication.pgpass",
                ])
                .is_ok_and(|c| c.contains("rotated-replication"))
        }
    };
    for (target, former) in [("small-db-1", "small-db-0"), ("small-db-0", "small-db-1")] {
        // A target whose readiness flickers after its own restart is refused (the request is
        // removed, with an Event): ask again, as a person would, until it is taken.
        eventually(DEFAULT_TIMEOUT, "the switchover", || async {
            let Ok(db) = dbs.get("small-db").await else { return false };
            if db.status.as_ref().and_then(|s| s.current_primary.as_deref()) == Some(target) {
                return true;
            }
            if !db.annotations().contains_key(SWITCHOVER_ANNOTATION) {
                let request = format!("{SWITCHOVER_ANNOTATION}={target}");
                let _ = kubectl(&["-n", &ns.name, "annotate", "--overwrite", "mydatabase", "small-db", &request]);
            }
            false
        })
        .await?;
        eventually(DEFAULT_TIMEOUT, "the former primary to stream again", streaming(former)).await?;
        testkit::wait_for(&dbs, "small-db", "Running 2/2 after the switchover", DEFAULT_TIMEOUT, running(2)).await?;
    }
    eventually(DEFAULT_TIMEOUT, "the replication role to take the new password", || async {
        let command = "PGPASSWORD=rotated-replication psql -h small-db-rw -U replicator -d postgres -At -c 'SELECT 1'";
        kubectl(&["-n", &ns.name, "exec", "small-db-1", "-c", "postgres", "--", "bash", "-c", command])
            .is_ok_and(|out| out.trim() == "1")
    })
    .await?;
    eventually(
        DEFAULT_TIMEOUT,
        "the replica to stream with the new password",
        streaming_with_new_password("small-db-1"),
    )
    .await?;
    assert_eq!(
        (created("small-db-0")()?, created("small-db-1")()?),
        (created_0, created_1),
        "an instance was cloned afresh after the rotation"
    );

    // Scale down, write, scale up: the returning replica (its old volume) catches up. While it is
    // away the primary writes more WAL than it keeps without a slot (wal_keep_size 256 MB); its
    // slot keeps it, up to a tenth of the volume, more than a test writes. The slot is dropped
    // here as that cap would lose it: the primary recycles the WAL, the returning replica cannot
    // stream from where it stopped, so it must be cloned afresh.
    let data_written = || created("small-db-1")().map(|at| at.parse::<u64>().unwrap_or_default());
    let cloned_at = data_written()?;
    dbs.patch(
        "small-db",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"spec": {"replicas": 1}})),
    )
    .await?;
    // The replica goes only once the primary no longer waits for it (it may hold a commit
    // nobody else confirmed): when its pod is deleted, the primary reports it unnamed.
    let deadline = std::time::Instant::now() + DEFAULT_TIMEOUT;
    let named_when_removed = loop {
        let replica = pods.get_opt("small-db-1").await?;
        if replica.is_none_or(|p| p.metadata.deletion_timestamp.is_some()) {
            // The report that let the scale-down go on came first, and the list only shrinks.
            let primary = pods.get_opt("small-db-0").await?;
            let named = primary.as_ref().and_then(keelson::mydatabase::instances::report);
            break named.and_then(|r| r.synchronous_standby_names);
        }
        anyhow::ensure!(std::time::Instant::now() < deadline, "small-db-1 was never removed");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert!(
        named_when_removed.as_deref().is_some_and(|named| !named.contains("small-db-1")),
        "small-db-1 removed while the primary still waited for it: {named_when_removed:?}"
    );
    testkit::wait_for(&dbs, "small-db", "Running 1/1", DEFAULT_TIMEOUT, running(1)).await?;
    testkit::wait_for_deletion(&pods, "small-db-1", "the replica to stop", DEFAULT_TIMEOUT).await?;
    sql_in(&ns, "small-db-0", "CREATE TABLE t (v text); INSERT INTO t VALUES ('written while scaled down')")?;
    sql_in(&ns, "small-db-0", "CREATE TABLE filler (i int)")?;
    for round in 0..24 {
        sql_in(&ns, "small-db-0", &format!("INSERT INTO filler VALUES ({round})"))?;
        sql_in(&ns, "small-db-0", "SELECT pg_switch_wal()")?;
    }
    let slot = "SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'keelson_1' AND NOT active";
    let retained = sql_in(&ns, "small-db-0", slot)?;
    assert!(matches!(retained.as_str(), "reserved" | "extended"), "the slot kept no WAL for the replica: {retained:?}");
    sql_in(&ns, "small-db-0", "SELECT pg_drop_replication_slot('keelson_1')")?;
    sql_in(&ns, "small-db-0", "CHECKPOINT")?;
    let kept = sql_in(&ns, "small-db-0", "SELECT count(*) FROM pg_ls_waldir() WHERE name ~ '^[0-9A-F]{24}$'")?;
    eprintln!("WAL segments kept on the primary after 24 switches: {kept}");
    dbs.patch(
        "small-db",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"spec": {"replicas": 2}})),
    )
    .await?;
    testkit::wait_for(&dbs, "small-db", "Running 2/2 again", DEFAULT_TIMEOUT, running(2)).await?;
    eventually(DEFAULT_TIMEOUT, "the row on the returning replica", || async {
        sql_in(&ns, "small-db-1", "SELECT v FROM t").is_ok_and(|v| v == "written while scaled down")
    })
    .await?;
    assert_eq!(sql_in(&ns, "small-db-1", "SELECT pg_is_in_recovery()")?, "t");
    assert_eq!(sql_in(&ns, "small-db-1", "SELECT count(*) FROM filler")?, "24");
    let recloned_at = data_written()?;
    assert!(recloned_at > cloned_at, "the stale replica was not cloned afresh ({cloned_at} → {recloned_at})");
    // ... which status records, with an Event, saying why.
    let rebuilt = testkit::wait_for(&dbs, "small-db", "the rebuild in status", DEFAULT_TIMEOUT, |db| {
        db.status.as_ref().and_then(|s| s.last_replica_rebuild.as_ref()).is_some_and(|r| r.instance == "small-db-1")
    })
    .await?;
    let record = rebuilt.status.and_then(|s| s.last_replica_rebuild).expect("lastReplicaRebuild");
    assert!(record.reason.contains("WAL") || record.reason.contains("rejoin"), "{record:?}");
    let events = testkit::kubectl(&[
        "-n",
        &ns.name,
        "get",
        "events",
        "--field-selector",
        "reason=ReplicaRebuilt",
        "-o",
        "jsonpath={.items[*].message}",
    ])?;
    assert!(events.contains("small-db-1 was cloned afresh"), "{events}");
    Ok(())
}

fn database(name: &str, spec: serde_json::Value) -> anyhow::Result<MyDatabase> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "db.keelson.dev/v1", "kind": "MyDatabase", "metadata": {"name": name}, "spec": spec
    }))?)
}

#[tokio::test]
async fn storage_grows_in_place_with_the_instances_and_their_data() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::real_namespace(&cluster, "real-db-storage").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    let dbs = ns.api::<MyDatabase>();
    dbs.create(
        &PostParams::default(),
        &database("grow-db", json!({"replicas": 2, "version": "15.2", "storage": "1Gi"}))?,
    )
    .await?;
    testkit::wait_for(&dbs, "grow-db", "Running 2/2", DEFAULT_TIMEOUT, running(2)).await?;
    sql_in(&ns, "grow-db-0", "CREATE TABLE t (v text); INSERT INTO t VALUES ('before growing')")?;
    let pods = ns.api::<k8s_openapi::api::core::v1::Pod>();
    let uids = [pods.get("grow-db-0").await?.metadata.uid, pods.get("grow-db-1").await?.metadata.uid];

    dbs.patch(
        "grow-db",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"spec": {"storage": "2Gi"}})),
    )
    .await?;
    let claims = ns.api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>();
    for claim in ["data-grow-db-0", "data-grow-db-1"] {
        testkit::wait_for(&claims, claim, "the volume grown to 2Gi", DEFAULT_TIMEOUT, |c| {
            c.status
                .as_ref()
                .and_then(|s| s.capacity.as_ref())
                .and_then(|c| c.get("storage"))
                .is_some_and(|q| q.0 == "2Gi")
        })
        .await?;
    }
    let sets = ns.api::<k8s_openapi::api::apps::v1::StatefulSet>();
    testkit::wait_for(&sets, "grow-db", "the StatefulSet recreated with the 2Gi template", DEFAULT_TIMEOUT, |s| {
        keelson::mydatabase::statefulset::template_storage(s).as_deref() == Some("2Gi")
    })
    .await?;
    testkit::wait_for(&dbs, "grow-db", "Running 2/2, done growing", DEFAULT_TIMEOUT, |db| {
        running(2)(db) && db.status.as_ref().is_some_and(|s| s.conditions.iter().all(|c| c.type_ != "StorageGrowing"))
    })
    .await?;
    let after = [pods.get("grow-db-0").await?.metadata.uid, pods.get("grow-db-1").await?.metadata.uid];
    assert_eq!(after, uids, "growing the storage restarted an instance");
    assert_eq!(sql_in(&ns, "grow-db-1", "SELECT v FROM t")?, "before growing");
    Ok(())
}

#[tokio::test]
async fn deletion_policies_act_on_real_data() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::real_namespace(&cluster, "real-db-deletion").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    let dbs = ns.api::<MyDatabase>();
    let backup = json!({"schedule": "0 2 * * *", "retention": "7d", "storage": "1Gi"});
    for (name, policy) in [("snap-db", "Snapshot"), ("gone-db", "Delete")] {
        // snap-db's final backup is restored into after-snap below: it says so.
        let spec = json!({"replicas": 1, "version": "15.2", "storage": "1Gi", "deletionPolicy": policy,
                          "backup": backup, "restoreTo": ["after-snap"]});
        dbs.create(&PostParams::default(), &database(name, spec)?).await?;
    }
    for name in ["snap-db", "gone-db"] {
        testkit::wait_for(&dbs, name, "Running 1/1", DEFAULT_TIMEOUT, running(1)).await?;
        sql_in(&ns, &format!("{name}-0"), "CREATE TABLE t (v text); INSERT INTO t VALUES ('the last row')")?;
    }
    let claims = ns.api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>();
    let volumes = kube::Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(cluster.client.clone());
    let gone_volume = claims.get("data-gone-db-0").await?.spec.and_then(|s| s.volume_name).expect("bound");
    for name in ["snap-db", "gone-db"] {
        dbs.delete(name, &DeleteParams::default()).await?;
    }
    for name in ["snap-db", "gone-db"] {
        testkit::wait_for_deletion(&dbs, name, "the MyDatabase to go", DEFAULT_TIMEOUT).await?;
    }
    // Delete: the data volumes (and their folders, with the PersistentVolume), the backups and the Secret go.
    testkit::wait_for_deletion(&volumes, &gone_volume, "gone-db's data volume to be deleted", DEFAULT_TIMEOUT).await?;
    for claim in ["data-gone-db-0", "gone-db-backups"] {
        testkit::wait_for_deletion(&claims, claim, "gone-db's claims to go", DEFAULT_TIMEOUT).await?;
    }
    assert!(ns.api::<Secret>().get_opt("gone-db-credentials").await?.is_none());
    // Snapshot: the data volume goes, the backups volume and the Secret stay, and the final
    // backup is real: a new database restored from it has the last row.
    testkit::wait_for_deletion(&claims, "data-snap-db-0", "snap-db's data volume to go", DEFAULT_TIMEOUT).await?;
    assert!(claims.get_opt("snap-db-backups").await?.is_some(), "Snapshot deleted the backups");
    assert!(ns.api::<Secret>().get_opt("snap-db-credentials").await?.is_some(), "Snapshot deleted the Secret");
    let restored = json!({"replicas": 1, "version": "15.2", "storage": "1Gi", "restoreFrom": {"database": "snap-db"}});
    dbs.create(&PostParams::default(), &database("after-snap", restored)?).await?;
    testkit::wait_for(&dbs, "after-snap", "the database restored from the final backup", DEFAULT_TIMEOUT, running(1))
        .await?;
    assert_eq!(sql_in(&ns, "after-snap-0", "SELECT v FROM t")?, "the last row");
    Ok(())
}

/// The serial of the certificate the server in `pod` presents in a TLS handshake (openssl in
/// the pod, on its own loopback).
fn served_serial(ns: &TestNamespace, pod: &str) -> anyhow::Result<String> {
    let handshake = "openssl s_client -starttls postgres -connect 127.0.0.1:5432 </dev/null 2>/dev/null \
                     | openssl x509 -noout -serial";
    Ok(kubectl(&["-n", &ns.name, "exec", pod, "-c", "postgres", "--", "bash", "-c", handshake])?.trim().to_string())
}

/// The serial of the certificate in the Secret `secret`.
async fn secret_serial(ns: &TestNamespace, secret: &str) -> anyhow::Result<String> {
    use std::io::Write as _;
    let pem = secret_value(ns, secret, "tls.crt").await?;
    let mut openssl = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-serial"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    openssl.stdin.take().context("stdin")?.write_all(pem.as_bytes())?;
    let out = openssl.wait_with_output()?;
    anyhow::ensure!(out.status.success(), "not a certificate: {pem}");
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

#[tokio::test]
async fn a_renewed_certificate_is_served_without_ending_a_session() -> anyhow::Result<()> {
    use common::clients::{SESSION_WRITER, acknowledged, ended, now_ms};
    let cluster = cluster_or_skip!();
    let ns = common::real_namespace(&cluster, "real-db-tls-renewal").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    let dbs = ns.api::<MyDatabase>();
    dbs.create(
        &PostParams::default(),
        &database("tls-db", json!({"replicas": 2, "version": "15.2", "storage": "1Gi"}))?,
    )
    .await?;
    testkit::wait_for(&dbs, "tls-db", "Running 2/2", DEFAULT_TIMEOUT, running(2)).await?;
    let primary = dbs.get("tls-db").await?.status.and_then(|s| s.current_primary).context("a primary")?;
    sql_in(&ns, &primary, "CREATE TABLE acked_session (id int PRIMARY KEY); GRANT ALL ON acked_session TO app")?;
    // A session held open through -rw with verify-full, as a pool holds it.
    let pods = ns.api::<k8s_openapi::api::core::v1::Pod>();
    let session = common::clients::client("tls-db", "session", SESSION_WRITER);
    pods.create(&PostParams::default(), &serde_json::from_value(session)?).await?;
    let commits_after = |since: u128| {
        let pods = &pods;
        move || async move {
            let logs = pods.logs("session", &Default::default()).await.unwrap_or_default();
            acknowledged(&logs).iter().filter(|(_, at)| *at > since).count() >= 20
        }
    };
    eventually(DEFAULT_TIMEOUT, "the session to commit", commits_after(0)).await?;

    let first = secret_serial(&ns, "tls-db-server").await?;
    for pod in ["tls-db-0", "tls-db-1"] {
        assert_eq!(served_serial(&ns, pod)?, first, "{pod} presents another certificate than its Secret's");
    }
    // Renewal on demand: the certificate's Secret deleted, Keelson issues a new one from the same CA.
    ns.api::<Secret>().delete("tls-db-server", &DeleteParams::default()).await?;
    eventually(DEFAULT_TIMEOUT, "a new certificate in tls-db-server", || async {
        secret_serial(&ns, "tls-db-server").await.is_ok_and(|serial| serial != first)
    })
    .await?;
    let renewed = secret_serial(&ns, "tls-db-server").await?;
    // The kubelet brings the Secret to the pods within its sync period; the servers reload it.
    eventually(DEFAULT_TIMEOUT, "both servers to present the new certificate", || async {
        ["tls-db-0", "tls-db-1"].iter().all(|pod| served_serial(&ns, pod).is_ok_and(|serial| serial == renewed))
    })
    .await?;
    let renewed_at = now_ms();
    eventually(DEFAULT_TIMEOUT, "the session to go on committing", commits_after(renewed_at)).await?;
    eventually(DEFAULT_TIMEOUT, "the session to be told to stop", || async {
        kubectl(&["-n", &ns.name, "exec", "session", "--", "touch", "/tmp/stop"]).is_ok()
    })
    .await?;
    let logs = ended(&ns, "session").await?;
    let failures: Vec<&str> = logs.lines().filter(|l| l.starts_with("failed")).collect();
    assert!(failures.is_empty(), "the session broke during the renewal: {failures:?}");
    let acked = acknowledged(&logs);
    let stored = sql_in(&ns, &primary, "SELECT count(*) FROM acked_session")?;
    assert_eq!(stored, acked.len().to_string(), "every acknowledged commit is stored");
    // A new connection verifies the renewed certificate against the CA the application already has.
    let login = database_client("tls-db", "after-renewal", "uri", "psql \"$URI\" -At -c 'SELECT 1'");
    let logged_in = run(&ns, login).await?;
    assert!(logged_in.succeeded && logged_in.logs.trim() == "1", "{}", logged_in.logs);

    // spec.superuserAccess: the superuser logs in over TLS with the password of its own Secret;
    // turned off, the Secret goes and the same password is refused.
    let access = |on: bool| json!({"spec": {"superuserAccess": on}});
    let params = kube::api::PatchParams::default();
    dbs.patch("tls-db", &params, &kube::api::Patch::Merge(access(true))).await?;
    eventually(DEFAULT_TIMEOUT, "the superuser Secret", || async {
        secret_value(&ns, "tls-db-superuser", "password").await.is_ok_and(|p| !p.is_empty())
    })
    .await?;
    let password = secret_value(&ns, "tls-db-superuser", "password").await?;
    let attempts = std::sync::atomic::AtomicUsize::new(0);
    eventually(DEFAULT_TIMEOUT, "the superuser to log in with its Secret's URI", || async {
        let n = attempts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let script = "psql \"$URI\" -X -At -c 'SELECT rolsuper FROM pg_roles WHERE rolname = current_user'";
        let mut pod = shell_pod(&format!("superuser-{n}"), "postgres:15.2", script);
        pod["spec"]["containers"][0]["env"] =
            json!([{"name": "URI", "valueFrom": {"secretKeyRef": {"name": "tls-db-superuser", "key": "uri"}}}]);
        common::clients::trust_database_ca(&mut pod, "tls-db");
        run(&ns, pod).await.is_ok_and(|done| done.succeeded && done.logs.trim() == "t")
    })
    .await?;
    dbs.patch("tls-db", &params, &kube::api::Patch::Merge(access(false))).await?;
    testkit::wait_for_deletion(&ns.api::<Secret>(), "tls-db-superuser", "the superuser Secret to go", DEFAULT_TIMEOUT)
        .await?;
    let as_superuser = format!(
        "PGPASSWORD='{password}' psql 'host=tls-db-rw user=postgres dbname=postgres sslmode=require' -X -At -c 'SELECT 1' 2>&1 || true"
    );
    eventually(DEFAULT_TIMEOUT, "the superuser to be refused again", || async {
        let out = kubectl(&["-n", &ns.name, "exec", "tls-db-1", "-c", "postgres", "--", "bash", "-c", &as_superuser]);
        out.is_ok_and(|said| said.contains("pg_hba.conf rejects connection"))
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_certificate_from_elsewhere_is_presented_once_its_secret_names_the_database() -> anyhow::Result<()> {
    use keelson::api::mydatabase::SERVER_CERTIFICATE_FOR_LABEL;
    use keelson::mydatabase::tls;
    let cluster = cluster_or_skip!();
    let ns = common::real_namespace(&cluster, "real-db-own-cert").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    let dbs = ns.api::<MyDatabase>();
    let spec = json!({"replicas": 1, "version": "15.2", "storage": "1Gi", "tls": {"serverSecret": "company-cert"}});
    dbs.create(&PostParams::default(), &database("own-cert-db", spec.clone())?).await?;
    let reason = |wanted: &'static str| {
        move |db: &MyDatabase| {
            db.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.reason == wanted))
        }
    };
    testkit::wait_for(&dbs, "own-cert-db", "Ready ServerSecretMissing", DEFAULT_TIMEOUT, reason("ServerSecretMissing"))
        .await?;
    // A certificate for the database's names from a CA that is not this database's (as another
    // issuer's would be), in the layout cert-manager writes; not yet labelled for the database.
    let issuer_view: MyDatabase = serde_json::from_value(json!({
        "apiVersion": "db.keelson.dev/v1", "kind": "MyDatabase",
        "metadata": {"name": "own-cert-db", "namespace": ns.name, "uid": "00000000-0000-4000-8000-000000000002"},
        "spec": spec
    }))?;
    let certificates = tls::certificates(&issuer_view, None, None, chrono::Utc::now())?;
    let issued = tls::build_server(&issuer_view, &certificates)?;
    let company_cert = Secret {
        metadata: kube::api::ObjectMeta { name: Some("company-cert".into()), ..Default::default() },
        type_: Some("kubernetes.io/tls".into()),
        data: issued.data,
        ..Default::default()
    };
    ns.api::<Secret>().create(&PostParams::default(), &company_cert).await?;
    testkit::wait_for(&dbs, "own-cert-db", "ServerSecretNotAllowed", DEFAULT_TIMEOUT, reason("ServerSecretNotAllowed"))
        .await?;
    assert!(ns.api::<k8s_openapi::api::apps::v1::StatefulSet>().get_opt("own-cert-db").await?.is_none());
    let label = json!({"metadata": {"labels": {SERVER_CERTIFICATE_FOR_LABEL: "own-cert-db"}}});
    let params = kube::api::PatchParams::default();
    ns.api::<Secret>().patch("company-cert", &params, &kube::api::Patch::Merge(label)).await?;
    testkit::wait_for(&dbs, "own-cert-db", "Running 1/1", DEFAULT_TIMEOUT, running(1)).await?;
    // Clients are handed its CA; the server presents its certificate; verify-full succeeds.
    assert_eq!(secret_value(&ns, "own-cert-db-credentials", "ca.crt").await?, certificates.ca_cert);
    let company_serial = secret_serial(&ns, "company-cert").await?;
    eventually(DEFAULT_TIMEOUT, "the server to present the company's certificate", || async {
        served_serial(&ns, "own-cert-db-0").is_ok_and(|serial| serial == company_serial)
    })
    .await?;
    let login = database_client("own-cert-db", "own-cert-login", "uri", "psql \"$URI\" -At -c 'SELECT 1'");
    let logged_in = run(&ns, login).await?;
    assert!(logged_in.succeeded && logged_in.logs.trim() == "1", "{}", logged_in.logs);
    // Keelson issued nothing of its own.
    for own in ["own-cert-db-ca", "own-cert-db-server"] {
        assert!(ns.api::<Secret>().get_opt(own).await?.is_none(), "{own} was created");
    }
    Ok(())
}

/// The production knobs reach the pods: QoS class, storage class, priority,
/// node affinity, tolerations and a PostgreSQL parameter served by `SHOW`; a
/// parameter change rolls the instances, and a bad value rolls nothing.
#[tokio::test]
async fn resources_storage_class_parameters_and_placement_reach_the_pods() -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
    use k8s_openapi::api::scheduling::v1::PriorityClass;
    let cluster = cluster_or_skip!();
    let ns = common::real_namespace(&cluster, "real-db-knobs").await?;
    let _operator = TestOperator::start(&cluster, &ns).await?;
    // Cluster-scoped: named after the test's namespace, removed at the end.
    let priority = format!("{}-databases", ns.name);
    let classes = kube::Api::<PriorityClass>::all(cluster.client.clone());
    let class = json!({"metadata": {"name": priority}, "value": 1000});
    classes.create(&PostParams::default(), &serde_json::from_value(class)?).await?;
    let allowed_nodes = ["keelson-node-1", "keelson-node-2"];
    let dbs = ns.api::<MyDatabase>();
    let spec = json!({"replicas": 2, "version": "15.2", "storage": "1Gi", "storageClassName": "keelson-local",
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"cpu": "250m", "memory": "256Mi"}},
        "postgresql": {"parameters": {"work_mem": "12MB", "max_connections": "150"}},
        "priorityClassName": priority,
        "tolerations": [{"key": "keelson.dev/databases", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": allowed_nodes}]}]}}}});
    dbs.create(&PostParams::default(), &database("tuned", spec)?).await?;
    testkit::wait_for(&dbs, "tuned", "Running 2/2", DEFAULT_TIMEOUT, running(2)).await?;

    let pods = ns.api::<Pod>();
    for name in ["tuned-0", "tuned-1"] {
        let pod = pods.get(name).await?;
        let (spec, status) = (pod.spec.unwrap_or_default(), pod.status.unwrap_or_default());
        assert_eq!(status.qos_class.as_deref(), Some("Guaranteed"), "{name}");
        assert_eq!((spec.priority_class_name.as_deref(), spec.priority), (Some(priority.as_str()), Some(1000)));
        assert!(allowed_nodes.contains(&spec.node_name.as_deref().unwrap_or_default()), "{name} off its nodes");
        let tolerated = spec.tolerations.unwrap_or_default();
        assert!(tolerated.iter().any(|t| t.key.as_deref() == Some("keelson.dev/databases")), "{tolerated:?}");
        assert_eq!(sql_in(&ns, name, "SHOW work_mem")?, "12MB");
        assert_eq!(sql_in(&ns, name, "SHOW max_connections")?, "150");
        let claim = ns.api::<PersistentVolumeClaim>().get(&format!("data-{name}")).await?;
        assert_eq!(claim.spec.and_then(|s| s.storage_class_name).as_deref(), Some("keelson-local"));
    }

    // A change rolls the instances (replicas first, then a switchover) and is served.
    let patch = |work_mem: &str| json!({"spec": {"postgresql": {"parameters": {"work_mem": work_mem}}}});
    dbs.patch("tuned", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(patch("16MB"))).await?;
    eventually(DEFAULT_TIMEOUT, "every instance to serve work_mem 16MB", || async {
        ["tuned-0", "tuned-1"].iter().all(|pod| sql_in(&ns, pod, "SHOW work_mem").is_ok_and(|v| v == "16MB"))
    })
    .await?;
    testkit::wait_for(&dbs, "tuned", "Running 2/2 after the roll", DEFAULT_TIMEOUT, running(2)).await?;

    // A value PostgreSQL would refuse is refused by field first; nothing rolls.
    dbs.patch("tuned", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(patch("lots"))).await?;
    let refused = testkit::wait_for(&dbs, "tuned", "SpecValid False", DEFAULT_TIMEOUT, |db| {
        db.status.as_ref().is_some_and(|s| {
            s.conditions.iter().any(|c| c.type_ == "SpecValid" && c.status == "False" && c.reason == "InvalidParameter")
        })
    })
    .await?;
    let message = refused.status.map(|s| s.conditions).unwrap_or_default();
    assert!(format!("{message:?}").contains("spec.postgresql.parameters.work_mem"), "{message:?}");
    for name in ["tuned-0", "tuned-1"] {
        assert_eq!(sql_in(&ns, name, "SHOW work_mem")?, "16MB", "{name} changed on a refused value");
    }
    classes.delete(&priority, &Default::default()).await?;
    Ok(())
}

/// What must not change on an instance when the operator is upgraded.
#[derive(Debug, PartialEq)]
struct Instance {
    pod: String,
    uid: Option<String>,
    role: Option<String>,
    /// Restarts of PostgreSQL's container and of the manager's.
    restarts: Vec<(String, i32)>,
    postmaster_started: String,
    timeline: String,
}

async fn instances_of(ns: &TestNamespace, db: &str) -> anyhow::Result<Vec<Instance>> {
    let pods = ns.api::<k8s_openapi::api::core::v1::Pod>();
    let selector = format!("{}={db}", keelson::mydatabase::names::CLUSTER_LABEL);
    let mut instances = Vec::new();
    for pod in pods.list(&kube::api::ListParams::default().labels(&selector)).await?.items {
        let name = pod.name_any();
        let statuses = pod.status.as_ref().and_then(|s| s.container_statuses.clone()).unwrap_or_default();
        instances.push(Instance {
            uid: pod.metadata.uid.clone(),
            role: pod.labels().get(keelson::api::instance::ROLE_LABEL).cloned(),
            restarts: statuses.iter().map(|c| (c.name.clone(), c.restart_count)).collect(),
            postmaster_started: sql_in(ns, &name, "SELECT pg_postmaster_start_time()")?,
            timeline: sql_in(ns, &name, "SELECT timeline_id FROM pg_control_checkpoint()")?,
            pod: name,
        });
    }
    instances.sort_by(|a, b| a.pod.cmp(&b.pod));
    Ok(instances)
}

/// Issue 30: an operator upgrade (a new image) with two databases running
/// replaces every instance manager in place: no PostgreSQL restarts, no
/// switchover, no pod is replaced, and the new managers report.
#[tokio::test]
async fn an_operator_upgrade_replaces_instance_managers_without_restarting_postgresql() -> anyhow::Result<()> {
    use keelson::api::instance::MANAGER_IMAGE;
    let cluster = cluster_or_skip!();
    let ns = common::real_namespace(&cluster, "real-db-upgrade").await?;
    let old_image = common::instance_image()?;
    let new_image = common::instance_image_named(&format!("{old_image}-next"))?;
    anyhow::ensure!(new_image != old_image, "the second version needs its own image name");
    let operator = TestOperator::start(&cluster, &ns).await?;
    let dbs = ns.api::<MyDatabase>();
    let databases = [("ledger", 2), ("catalog", 1)];
    for (name, replicas) in databases {
        let spec = json!({"replicas": replicas, "version": "15.2", "storage": "1Gi"});
        dbs.create(&PostParams::default(), &database(name, spec)?).await?;
    }
    let pods = ns.api::<k8s_openapi::api::core::v1::Pod>();
    let managers_on = |image: String| {
        let pods = pods.clone();
        move || {
            let (pods, image) = (pods.clone(), image.clone());
            async move {
                let list = pods.list(&kube::api::ListParams::default()).await.map(|l| l.items).unwrap_or_default();
                let instances: Vec<_> =
                    list.iter().filter(|p| p.annotations().contains_key(keelson::api::instance::ANNOTATION)).collect();
                instances.len() == 3
                    && instances.iter().all(|p| p.annotations().get(MANAGER_IMAGE).map(String::as_str) == Some(&image))
            }
        }
    };
    for (name, replicas) in databases {
        testkit::wait_for(&dbs, name, "Running", DEFAULT_TIMEOUT, running(replicas)).await?;
    }
    eventually(DEFAULT_TIMEOUT, "every instance manager reports the first image", managers_on(old_image.clone()))
        .await?;
    sql_in(&ns, "ledger-0", "CREATE TABLE t (v text); INSERT INTO t VALUES ('before the upgrade')")?;
    let before = [instances_of(&ns, "ledger").await?, instances_of(&ns, "catalog").await?];
    let primaries = [dbs.get("ledger").await?.status, dbs.get("catalog").await?.status]
        .map(|s| s.map(|s| (s.current_primary, s.last_failover)));

    operator.stop().await?;
    let operator = TestOperator::start_with_instance_image(&cluster, &ns, &new_image).await?;
    eventually(DEFAULT_TIMEOUT, "every instance manager upgraded in place", managers_on(new_image.clone())).await?;
    for (name, replicas) in databases {
        testkit::wait_for(&dbs, name, "Running, every manager current", DEFAULT_TIMEOUT, |db| {
            running(replicas)(db)
                && db.status.as_ref().is_some_and(|s| {
                    s.conditions.iter().any(|c| c.type_ == "InstanceManagersCurrent" && c.status == "True")
                })
        })
        .await?;
    }

    let after = [instances_of(&ns, "ledger").await?, instances_of(&ns, "catalog").await?];
    assert_eq!(after, before, "an instance restarted, was replaced or changed role");
    let primaries_after = [dbs.get("ledger").await?.status, dbs.get("catalog").await?.status]
        .map(|s| s.map(|s| (s.current_primary, s.last_failover)));
    assert_eq!(primaries_after, primaries, "a switchover or failover happened");
    let sets = ns.api::<k8s_openapi::api::apps::v1::StatefulSet>();
    for (name, _) in databases {
        let set = sets.get(name).await?;
        assert_eq!(
            keelson::mydatabase::upgrade::template_manager_image(&set),
            Some(old_image.as_str()),
            "{name}: the pods' template changed (a rollout)"
        );
    }
    // The upgraded managers still do their work: a replica streams what the primary writes.
    sql_in(&ns, "ledger-0", "INSERT INTO t VALUES ('after the upgrade')")?;
    eventually(DEFAULT_TIMEOUT, "the replica streams after the upgrade", || async {
        sql_in(&ns, "ledger-1", "SELECT count(*) FROM t").is_ok_and(|n| n == "2")
    })
    .await?;
    operator.stop().await
}
