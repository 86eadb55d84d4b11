//! Keelson's PostgreSQL script (backup, prune, restore, replication), run
//! against real PostgreSQL servers on 127.0.0.1.

use anyhow::Context as _;
use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use testkit::postgres::{self, Scratch, Server, as_postgres, chown_postgres};

const APP_PASSWORD: &str = "app-secret-1";
const REPLICATION_PASSWORD: &str = "repl-secret-2";

fn script() -> anyhow::Result<PathBuf> {
    // Copied to a world-readable place (the postgres user cannot read /work or
    // /root), once per test: tests run in parallel.
    static COPIES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let copy = COPIES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/mydatabase/scripts/keelson-postgres.sh");
    let target = std::env::temp_dir().join(format!("keelson-postgres-{}-{copy}.sh", std::process::id()));
    std::fs::copy(&source, &target)?;
    Ok(target)
}

fn base_env(data: &std::path::Path) -> Vec<(&'static str, String)> {
    vec![
        ("PGBIN", postgres::bindir().to_string_lossy().into_owned()),
        ("PGDATA", data.to_string_lossy().into_owned()),
        ("APP_PASSWORD", APP_PASSWORD.into()),
        ("REPLICATION_PASSWORD", REPLICATION_PASSWORD.into()),
    ]
}

fn run(
    script: &std::path::Path,
    args: &[&str],
    env: &[(&'static str, String)],
) -> anyhow::Result<std::process::Output> {
    as_postgres(script, args, env)
}

/// Polls `done` until it holds (a minute at most).
fn until(what: &str, done: &dyn Fn() -> anyhow::Result<bool>) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done()? {
        anyhow::ensure!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

fn check(output: std::process::Output, what: &str) -> anyhow::Result<()> {
    anyhow::ensure!(output.status.success(), "{what} failed: {}", String::from_utf8_lossy(&output.stderr));
    Ok(())
}

/// Initialises and starts a primary through the script, the way pod 0 does.
fn primary(scratch: &Scratch, script: &std::path::Path) -> anyhow::Result<Server> {
    let data = scratch.path.join("primary");
    check(run(script, &["init-primary"], &base_env(&data))?, "init-primary")?;
    Server::start(&data, &scratch.path)
}

/// A seeded primary and a replica the script cloned from it, started with `replica_options`.
fn primary_and_replica(
    scratch: &Scratch,
    script: &std::path::Path,
    replica_options: &str,
) -> anyhow::Result<(Server, Server)> {
    let primary = primary(scratch, script)?;
    seed(&primary)?;
    let replica_data = scratch.path.join("replica");
    let mut env = base_env(&replica_data);
    env.extend([("PRIMARY_HOST", "127.0.0.1".to_string()), ("PRIMARY_PORT", primary.port.to_string())]);
    check(run(script, &["init-replica"], &env)?, "init-replica")?;
    let replica = Server::start_with(&replica_data, &scratch.path, replica_options)?;
    Ok((primary, replica))
}

fn seed(server: &Server) -> anyhow::Result<String> {
    server.psql("app", APP_PASSWORD, "app", "CREATE TABLE orders (id int PRIMARY KEY, item text, qty int)")?;
    server.psql(
        "app",
        APP_PASSWORD,
        "app",
        "INSERT INTO orders SELECT g, 'item-' || g, g % 7 FROM generate_series(1, 500) g",
    )?;
    fingerprint(server)
}

fn fingerprint(server: &Server) -> anyhow::Result<String> {
    server.psql(
        "app",
        APP_PASSWORD,
        "app",
        "SELECT count(*) || ':' || md5(string_agg(id || item || qty, ',' ORDER BY id)) FROM orders",
    )
}

fn dumps(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn backup_restores_to_identical_data_and_a_failed_backup_exits_non_zero() -> anyhow::Result<()> {
    if !postgres::available() {
        return Ok(());
    }
    let scratch = Scratch::new("backup")?;
    let script = script()?;
    let server = primary(&scratch, &script)?;
    let seeded = seed(&server)?;
    assert!(seeded.starts_with("500:"), "{seeded}");

    let backups = scratch.path.join("backups");
    let mut env = base_env(&server.data);
    env.extend([
        ("PRIMARY_HOST", "127.0.0.1".to_string()),
        ("PRIMARY_PORT", server.port.to_string()),
        ("BACKUP_DIR", backups.to_string_lossy().into_owned()),
        ("RETENTION", "7d".to_string()),
    ]);
    // A table the app role did not create is backed up too.
    server.psql_superuser("app", "CREATE TABLE audit (entry text); INSERT INTO audit VALUES ('by the superuser')")?;
    let report = scratch.path.join("termination-log");
    postgres::chown_postgres(&scratch.path)?;
    let mut reporting = env.clone();
    reporting.push(("TERMINATION_LOG", report.to_string_lossy().into_owned()));
    // An unreachable replica host falls back to the primary.
    reporting.push(("BACKUP_SOURCE_HOST", "127.0.0.2".to_string()));
    check(run(&script, &["backup"], &reporting)?, "backup")?;
    let files = dumps(&backups);
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].starts_with("app-") && files[0].ends_with(".dump"), "{files:?}");
    // The pod's termination message names the backup and its size, for the operator.
    let reported: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report)?)?;
    let size = std::fs::metadata(backups.join(&files[0]))?.len();
    // ... and lists every backup kept, newest first (here: the one).
    let kept = serde_json::json!([{"name": files[0], "sizeBytes": size}]);
    assert_eq!(reported, serde_json::json!({"name": files[0], "sizeBytes": size, "kept": kept}));

    // A new database from that backup: the backed-up rows, with the new database's own password.
    let restored_root = scratch.path.join("restored");
    std::fs::create_dir_all(&restored_root)?;
    postgres::chown_postgres(&restored_root)?;
    let restored_data = restored_root.join("pgdata");
    let mut restore_env = base_env(&restored_data);
    restore_env.retain(|(k, _)| *k != "APP_PASSWORD");
    restore_env.extend([
        ("APP_PASSWORD", "its-own-password".to_string()),
        ("BACKUP_DIR", backups.to_string_lossy().into_owned()),
        ("PGPORT", postgres::free_port()?.to_string()),
    ]);
    check(run(&script, &["restore-new"], &restore_env)?, "restore-new")?;
    let restored = Server::start(&restored_data, &scratch.path)?;
    let sql = "SELECT count(*) || ':' || md5(string_agg(id || item || qty, ',' ORDER BY id)) FROM orders";
    assert_eq!(restored.psql("app", "its-own-password", "app", sql)?, seeded, "the restore differs from the backup");
    assert!(restored.psql("app", APP_PASSWORD, "app", "SELECT 1").is_err(), "the source's password still works");
    drop(restored);
    // A backup that is not there fails with a message naming the field and what there is.
    let mut missing = restore_env.clone();
    let report = restored_root.join("termination-log");
    missing.extend([
        ("RESTORE_BACKUP", "app-19700101T000000Z.dump".to_string()),
        ("TERMINATION_LOG", report.to_string_lossy().into_owned()),
    ]);
    std::fs::remove_file(restored_root.join("keelson-restored-from"))?;
    assert!(!run(&script, &["restore-new"], &missing)?.status.success(), "a missing backup was restored");
    let message = std::fs::read_to_string(&report)?;
    assert!(
        message.starts_with("spec.restoreFrom.backup app-19700101T000000Z.dump: no such backup")
            && message.contains(&files[0]),
        "{message}"
    );

    // Lose data, then restore it.
    server.psql("app", APP_PASSWORD, "app", "DELETE FROM orders WHERE id > 100; UPDATE orders SET qty = -1")?;
    assert_ne!(fingerprint(&server)?, seeded);
    check(run(&script, &["restore", &backups.join(&files[0]).to_string_lossy()], &env)?, "restore")?;
    assert_eq!(fingerprint(&server)?, seeded, "restored data differs from the backup");

    // A backup that cannot log in fails loudly and leaves no backup behind; expired backups
    // are pruned all the same (a full volume must not stop the next backup for good).
    let expired = backups.join("app-20200101T000000Z.dump");
    std::fs::write(&expired, "an old dump")?;
    postgres::chown_postgres(&expired)?;
    let mut bad = env.clone();
    bad.retain(|(k, _)| *k != "APP_PASSWORD");
    bad.push(("APP_PASSWORD", "wrong".into()));
    let failed = run(&script, &["backup"], &bad)?;
    assert!(!failed.status.success(), "a backup with a wrong password succeeded");
    assert!(String::from_utf8_lossy(&failed.stderr).contains("backup FAILED"));
    assert_eq!(dumps(&backups), files, "a failed backup left a file, or kept an expired one");
    Ok(())
}

#[test]
fn prune_removes_exactly_the_expired_backups_and_never_the_newest() -> anyhow::Result<()> {
    if !postgres::available() {
        return Ok(());
    }
    let scratch = Scratch::new("prune")?;
    let dir = scratch.path.join("backups");
    std::fs::create_dir_all(&dir)?;
    let stamp = |age: Duration| {
        let t = chrono::Utc::now() - chrono::Duration::from_std(age).unwrap_or_default();
        format!("app-{}.dump", t.format("%Y%m%dT%H%M%SZ"))
    };
    let day = Duration::from_secs(86_400);
    let fresh = [stamp(Duration::from_secs(60)), stamp(day * 3), stamp(day * 7 - Duration::from_secs(3600))];
    let expired = [stamp(day * 7 + Duration::from_secs(3600)), stamp(day * 30)];
    for name in fresh.iter().chain(&expired) {
        std::fs::write(dir.join(name), b"dump")?;
    }
    std::fs::write(dir.join("notes.txt"), b"not a backup")?;
    chown_postgres(&dir)?;
    let script = script()?;
    let env = [("BACKUP_DIR", dir.to_string_lossy().into_owned()), ("RETENTION", "7d".to_string())];
    check(run(&script, &["prune"], &env)?, "prune")?;
    let mut kept = dumps(&dir);
    kept.retain(|n| n.ends_with(".dump"));
    let mut want: Vec<String> = fresh.to_vec();
    want.sort();
    assert_eq!(kept, want);
    assert!(dir.join("notes.txt").exists());

    // When every backup is expired, the newest one stays.
    let old_dir = scratch.path.join("old");
    std::fs::create_dir_all(&old_dir)?;
    let old = [stamp(day * 40), stamp(day * 20)];
    for name in &old {
        std::fs::write(old_dir.join(name), b"dump")?;
    }
    chown_postgres(&old_dir)?;
    let env = [("BACKUP_DIR", old_dir.to_string_lossy().into_owned()), ("RETENTION", "12h".to_string())];
    check(run(&script, &["prune"], &env)?, "prune")?;
    assert_eq!(dumps(&old_dir), vec![old[1].clone()], "the newest backup must survive");

    // A malformed retention is refused.
    let env = [("BACKUP_DIR", old_dir.to_string_lossy().into_owned()), ("RETENTION", "7days".to_string())];
    assert!(!run(&script, &["prune"], &env)?.status.success());
    Ok(())
}

#[test]
fn streaming_replica_set_up_by_the_script_replicates_rows() -> anyhow::Result<()> {
    if !postgres::available() {
        return Ok(());
    }
    let scratch = Scratch::new("replication")?;
    let script = script()?;
    let primary = primary(&scratch, &script)?;
    let seeded = seed(&primary)?;

    // Slots only where what they keep is capped, as the script's servers are (max_slot_wal_keep_size).
    primary.psql_superuser("postgres", "ALTER SYSTEM SET max_slot_wal_keep_size = '1GB'")?;
    primary.psql_superuser("postgres", "SELECT pg_reload_conf()")?;
    until("the cap to be read", &|| Ok(primary.psql_superuser("postgres", "SHOW max_slot_wal_keep_size")? == "1GB"))?;
    let replica_data = scratch.path.join("replica");
    let mut env = base_env(&replica_data);
    env.extend([
        ("PRIMARY_HOST", "127.0.0.1".to_string()),
        ("PRIMARY_PORT", primary.port.to_string()),
        ("POD_NAME", "db-1".to_string()),
    ]);
    check(run(&script, &["init-replica"], &env)?, "init-replica")?;
    let replica = Server::start(&replica_data, &scratch.path)?;
    // It streams through a slot of its own on the primary, named by its ordinal.
    assert_eq!(replica.psql_superuser("postgres", "SHOW primary_slot_name")?, "keelson_1");

    assert_eq!(replica.psql("app", APP_PASSWORD, "app", "SELECT pg_is_in_recovery()")?, "t");
    assert_eq!(fingerprint(&replica)?, seeded, "the base backup lacks the seeded rows");
    primary.psql("app", APP_PASSWORD, "app", "INSERT INTO orders VALUES (9001, 'after-clone', 3)")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let found = replica.psql("app", APP_PASSWORD, "app", "SELECT count(*) FROM orders WHERE id = 9001")?;
        if found == "1" {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "the row written on the primary never reached the replica");
        std::thread::sleep(Duration::from_millis(100));
    }
    let state = primary.psql_superuser("postgres", "SELECT state FROM pg_stat_replication")?;
    assert_eq!(state, "streaming");
    let slot = "SELECT slot_type || ' ' || active FROM pg_replication_slots WHERE slot_name = 'keelson_1'";
    until("the replica to stream through its slot", &|| {
        Ok(primary.psql_superuser("postgres", slot)? == "physical true")
    })?;
    // The replica is read-only.
    assert!(replica.psql("app", APP_PASSWORD, "app", "INSERT INTO orders VALUES (9002, 'x', 1)").is_err());

    // The clone streams with the password from its passfile: primary_conninfo (which the server
    // logs whenever it changes) names the file, never the password.
    let cloned = replica.psql_superuser("postgres", "SELECT current_setting('primary_conninfo')")?;
    assert!(cloned.contains("passfile=") && !cloned.contains(REPLICATION_PASSWORD), "{cloned}");

    // Rotation: new passwords in the credentials folder reach the roles (primary) and the
    // streaming connection (replica), with no restart.
    let credentials = scratch.path.join("credentials");
    std::fs::create_dir_all(&credentials)?;
    std::fs::write(credentials.join("password"), "rotated-app")?;
    std::fs::write(credentials.join("replication-password"), "rotated-repl")?;
    postgres::chown_postgres(&credentials)?;
    let apply = |server: &Server| -> anyhow::Result<()> {
        let env = [
            ("PGBIN", postgres::bindir().to_string_lossy().into_owned()),
            ("PGDATA", server.data.to_string_lossy().into_owned()),
            ("PGHOST", server.socket_dir().to_string_lossy().into_owned()),
            ("PGPORT", server.port.to_string()),
            ("CREDENTIALS_DIR", credentials.to_string_lossy().into_owned()),
            ("PRIMARY_HOST", "127.0.0.1".to_string()),
            ("PRIMARY_PORT", primary.port.to_string()),
        ];
        check(run(&script, &["apply-credentials"], &env)?, "apply-credentials")
    };
    apply(&primary)?;
    assert_eq!(primary.psql("app", "rotated-app", "app", "SELECT 1")?, "1", "the new password does not log in");
    // Superuser access (spec.superuserAccess mounts its password): on, the superuser logs in over
    // TCP with it; off again (the file gone), pg_hba.conf rejects it before any password.
    assert!(primary.psql("postgres", "su-secret", "postgres", "SELECT 1").is_err(), "superuser in by default");
    std::fs::write(credentials.join("superuser-password"), "su-secret")?;
    postgres::chown_postgres(&credentials)?;
    apply(&primary)?;
    assert_eq!(primary.psql("postgres", "su-secret", "postgres", "SELECT 1")?, "1", "superuser access on");
    std::fs::remove_file(credentials.join("superuser-password"))?;
    apply(&primary)?;
    let refused = primary.psql("postgres", "su-secret", "postgres", "SELECT 1").expect_err("superuser access off");
    assert!(refused.to_string().contains("pg_hba.conf rejects connection"), "{refused}");
    assert!(primary.psql("app", APP_PASSWORD, "app", "SELECT 1").is_err(), "the old password still logs in");
    apply(&replica)?;
    // The replica reads the password from its passfile (never from primary_conninfo, which the
    // server logs whenever it changes), and that file holds the new one.
    let conninfo = replica.psql_superuser("postgres", "SELECT current_setting('primary_conninfo')")?;
    assert!(conninfo.contains("passfile=") && !conninfo.contains("password"), "{conninfo}");
    let passfile = replica.data.parent().map(|p| p.join("keelson-replication.pgpass")).unwrap_or_default();
    assert_eq!(std::fs::read_to_string(&passfile)?, "*:*:*:replicator:rotated-repl\n");
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(std::fs::metadata(&passfile)?.permissions().mode() & 0o777, 0o600);

    // Readiness: both are ready while the replica streams; the replica is not once its primary is gone.
    let ready = |server: &Server| -> anyhow::Result<bool> {
        let env = [
            ("PGBIN", postgres::bindir().to_string_lossy().into_owned()),
            ("PGHOST", server.socket_dir().to_string_lossy().into_owned()),
            ("PGPORT", server.port.to_string()),
        ];
        Ok(run(&script, &["ready"], &env)?.status.success())
    };
    assert!(ready(&primary)?, "the primary is not ready");
    assert!(ready(&replica)?, "a streaming replica is not ready");
    drop(primary);
    let deadline = Instant::now() + Duration::from_secs(60);
    while ready(&replica)? {
        anyhow::ensure!(Instant::now() < deadline, "a replica without its primary stays ready");
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// A failover's hold, through the script's `follow-orders`: a replica told to
/// hold stops streaming, and then a synchronous primary that still runs cannot
/// acknowledge a commit (it waits for a standby that is gone); lifted, the
/// replica streams again under its pod's name and the commit completes.
#[test]
fn a_holding_replica_stops_streaming_and_a_synchronous_primary_then_acknowledges_nothing() -> anyhow::Result<()> {
    if !postgres::available() {
        return Ok(());
    }
    let scratch = Scratch::new("hold")?;
    let script = script()?;
    let (primary, replica) = primary_and_replica(&scratch, &script, "")?;

    let orders = |name: &str, role: &str, synchronous: &str, hold: &str| -> anyhow::Result<PathBuf> {
        let dir = scratch.path.join(format!("orders-{name}"));
        std::fs::create_dir_all(&dir)?;
        for (file, value) in [("role", role), ("synchronous-standbys", synchronous), ("hold", hold)] {
            std::fs::write(dir.join(file), value)?;
        }
        chown_postgres(&dir)?;
        Ok(dir)
    };
    let follow_orders = |server: &Server, pod: &str, dir: &std::path::Path| -> anyhow::Result<()> {
        let env = [
            ("PGBIN", postgres::bindir().to_string_lossy().into_owned()),
            ("PGHOST", server.socket_dir().to_string_lossy().into_owned()),
            ("PGPORT", server.port.to_string()),
            ("ORDERS_DIR", dir.to_string_lossy().into_owned()),
            ("PGDATA", server.data.to_string_lossy().into_owned()),
            ("POD_NAME", pod.to_string()),
            ("PRIMARY_HOST", "127.0.0.1".to_string()),
            ("PRIMARY_PORT", primary.port.to_string()),
            ("REPLICATION_PASSWORD", REPLICATION_PASSWORD.to_string()),
        ];
        check(run(&script, &["follow-orders"], &env)?, "follow-orders")
    };
    let receiving = || replica.psql_superuser("postgres", "SELECT count(*) FROM pg_stat_wal_receiver");

    // The replica holds first; the primary's commits then wait for the standby it names.
    follow_orders(&replica, "db-1", &orders("db-1", "replica", "", "db-0@1")?)?;
    until("the holding replica to stop streaming", &|| Ok(receiving()? == "0"))?;
    follow_orders(&primary, "db-0", &orders("db-0", "primary", "ANY 1 (\"db-1\")", "")?)?;
    assert_eq!(primary.psql_superuser("postgres", "SHOW synchronous_standby_names")?, "ANY 1 (\"db-1\")");
    // A replica holding longer than a stall must not be rewound or restarted: the hold is kept on every look.
    follow_orders(&replica, "db-1", &scratch.path.join("orders-db-1"))?;
    assert_eq!(receiving()?, "0", "a second look lifted the hold");

    let (sender, commits) = std::sync::mpsc::channel();
    let port = primary.port;
    std::thread::spawn(move || {
        let committed = std::process::Command::new(postgres::bindir().join("psql"))
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "app", "-d", "app", "-v", "ON_ERROR_STOP=1"])
            .args(["-c", "INSERT INTO orders VALUES (7001, 'during-hold', 1)"])
            .env("PGPASSWORD", APP_PASSWORD)
            .output()
            .map(|out| out.status.success());
        let _ = sender.send(committed);
    });
    // The commit is in, waiting for a synchronous standby: not acknowledged.
    until("the commit to wait for a synchronous standby", &|| {
        Ok(primary.psql_superuser("postgres", "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")?
            == "1")
    })?;
    assert!(commits.try_recv().is_err(), "a commit was acknowledged while its only standby held");

    // Lifted: the replica streams as db-1, the standby the primary names, and the commit returns.
    follow_orders(&replica, "db-1", &orders("db-1", "replica", "", "")?)?;
    assert!(commits.recv_timeout(Duration::from_secs(60))?.unwrap_or(false), "the commit failed after the hold");
    until("the replica to stream again", &|| Ok(receiving()? == "1"))?;
    let standby = primary.psql_superuser("postgres", "SELECT application_name, sync_state FROM pg_stat_replication")?;
    assert_eq!(standby, "db-1|quorum");
    until("the row to reach the replica", &|| {
        Ok(replica.psql("app", APP_PASSWORD, "app", "SELECT count(*) FROM orders WHERE id = 7001")? == "1")
    })?;
    Ok(())
}

/// A former primary rejoins a promoted replica whose control file does not name
/// its new timeline yet (its checkpointer held, and the replication role may not
/// ask for a checkpoint): `rejoin` does not take pg_rewind's "same timeline" for
/// "nothing to rewind" (which would keep WAL the new primary never had), but
/// waits, then clones afresh; the rejoined data is the new primary's.
#[test]
fn a_former_primary_never_rejoins_on_a_control_file_that_predates_the_promotion() -> anyhow::Result<()> {
    if !postgres::available() {
        return Ok(());
    }
    let scratch = Scratch::new("rejoin")?;
    let script = script()?;
    let (old, new) = primary_and_replica(&scratch, &script, "")?;
    // Databases initialised before Keelson granted it cannot ask for a checkpoint either.
    old.psql_superuser("postgres", "REVOKE pg_checkpoint FROM replicator")?;
    let revoked = "SELECT NOT pg_has_role('replicator', 'pg_checkpoint', 'MEMBER')";
    until("the revoke to reach the replica", &|| Ok(new.psql_superuser("postgres", revoked)? == "t"))?;
    // The replica stops receiving; the old primary then commits what the new one never gets.
    new.psql_superuser("postgres", "ALTER SYSTEM SET primary_conninfo = ''")?;
    new.psql_superuser("postgres", "SELECT pg_reload_conf()")?;
    until("the replica to stop receiving", &|| {
        Ok(new.psql_superuser("postgres", "SELECT count(*) FROM pg_stat_wal_receiver")? == "0")
    })?;
    old.psql("app", APP_PASSWORD, "app", "INSERT INTO orders VALUES (7777, 'only-on-the-old-primary', 1)")?;
    let old_data = old.data.clone();
    drop(old);
    // Promoted with its checkpointer held: its control file keeps naming the old timeline.
    let checkpointer = child_process(&new, "checkpointer")?;
    signal(checkpointer, "-STOP")?;
    let resumed = Resume(checkpointer);
    assert_eq!(new.psql_superuser("postgres", "SELECT pg_promote(true, 30)")?, "t");
    new.psql("app", APP_PASSWORD, "app", "INSERT INTO orders VALUES (8888, 'new-timeline', 1)")?;

    let mut env = base_env(&old_data);
    env.extend([("PRIMARY_HOST", "127.0.0.1".to_string()), ("PRIMARY_PORT", new.port.to_string())]);
    let rejoin = std::thread::spawn(move || run(&script, &["rejoin"], &env));
    // Unable to judge, it clones afresh; a base backup needs the checkpointer.
    let cloning =
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender' AND query LIKE 'BASE_BACKUP%'";
    let deadline = Instant::now() + Duration::from_secs(120);
    while new.psql_superuser("postgres", cloning)? == "0" {
        anyhow::ensure!(!rejoin.is_finished(), "rejoin ended without cloning (it trusted the stale control file)");
        anyhow::ensure!(Instant::now() < deadline, "rejoin never cloned");
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(resumed);
    let output = rejoin.join().map_err(|_| anyhow::anyhow!("rejoin panicked"))??;
    let said = String::from_utf8_lossy(&output.stderr).into_owned();
    check(output, "rejoin")?;
    assert!(said.contains("waiting for its checkpoint") && said.contains("cloning afresh"), "{said}");
    let rejoined = Server::start(&old_data, &scratch.path)?;
    until("the rejoined instance to have the new timeline's row", &|| {
        Ok(rejoined.psql("app", APP_PASSWORD, "app", "SELECT count(*) FROM orders WHERE id = 8888")? == "1")
    })?;
    let diverged = rejoined.psql("app", APP_PASSWORD, "app", "SELECT count(*) FROM orders WHERE id = 7777")?;
    assert_eq!(diverged, "0", "the rejoined instance kept a commit the new primary never had");
    assert_eq!(fingerprint(&rejoined)?, fingerprint(&new)?);
    Ok(())
}

/// The pid of `server`'s child process whose title names `what` (e.g. `checkpointer`).
fn child_process(server: &Server, what: &str) -> anyhow::Result<u32> {
    let pid_file = std::fs::read_to_string(server.data.join("postmaster.pid"))?;
    let postmaster = pid_file.lines().next().unwrap_or_default().trim().to_string();
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let pid = entry.file_name().to_string_lossy().to_string();
        let Ok(number) = pid.parse::<u32>() else { continue };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let parent = stat.rsplit(')').next().and_then(|rest| rest.split_whitespace().nth(1)).unwrap_or_default();
        let title = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if parent == postmaster && String::from_utf8_lossy(&title).contains(what) {
            return Ok(number);
        }
    }
    anyhow::bail!("no {what} under postmaster {postmaster}")
}

fn signal(pid: u32, signal: &str) -> anyhow::Result<()> {
    let status = std::process::Command::new("kill").args([signal, &pid.to_string()]).status()?;
    anyhow::ensure!(status.success(), "kill {signal} {pid}: {status}");
    Ok(())
}

/// Lets a stopped process go on when dropped (also when the test fails).
struct Resume(u32);
impl Drop for Resume {
    fn drop(&mut self) {
        let _ = signal(self.0, "-CONT");
    }
}

/// The instance manager's one query (`keelson::instance::probe`) on a real
/// primary and replica: roles, the version actually running, timeline, and
/// the replica's lag as its primary counts it, by pod name.
#[tokio::test]
async fn instance_probe_reads_roles_version_and_lag_from_real_servers() -> anyhow::Result<()> {
    use keelson::api::instance::Role;
    use keelson::instance::probe;
    if !postgres::available() {
        return Ok(());
    }
    let scratch = Scratch::new("probe")?;
    let script = script()?;
    // As the pod's start does: the replica's cluster_name is its pod.
    let (primary, replica) = primary_and_replica(&scratch, &script, "-c cluster_name=db-1")?;
    let probe_of = |server: &Server| probe::Server {
        socket_dir: server.socket_dir().to_string_lossy().into_owned(),
        port: server.port,
        bin_dir: postgres::bindir().to_string_lossy().into_owned(),
    };
    // In the pod the manager runs as the OS user postgres (peer authentication); here, as this
    // test's user: let it in as the superuser over the local socket.
    for server in [&primary, &replica] {
        let hba = server.data.join("pg_hba.conf");
        let rules = std::fs::read_to_string(&hba)?;
        std::fs::write(&hba, format!("local all postgres trust\n{rules}"))?;
        server.psql_superuser("postgres", "SELECT pg_reload_conf()")?;
    }
    let version = primary.psql_superuser("postgres", "SHOW server_version")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let seen = loop {
        let seen = probe_of(&primary).probe(Duration::from_secs(10)).await?;
        if seen.replicas.iter().any(|r| r.name == "db-1" && r.state == "streaming") {
            break seen;
        }
        anyhow::ensure!(Instant::now() < deadline, "the primary never reported db-1 streaming: {seen:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(seen.role, Role::Primary);
    assert_eq!(seen.timeline, 1);
    // The standbys it waits for, as applied (a scale-down goes by them).
    let applied = primary.psql_superuser("postgres", "SHOW synchronous_standby_names")?;
    assert_eq!(seen.synchronous_standby_names.as_deref(), Some(applied.as_str()));
    primary.psql_superuser("postgres", "ALTER SYSTEM SET synchronous_standby_names = 'ANY 1 (\"db-1\")'")?;
    primary.psql_superuser("postgres", "SELECT pg_reload_conf()")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let named = probe_of(&primary).probe(Duration::from_secs(10)).await?.synchronous_standby_names;
        if named.as_deref() == Some(r#"ANY 1 ("db-1")"#) {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "the primary never reported its new standbys: {named:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    primary.psql_superuser("postgres", "ALTER SYSTEM RESET synchronous_standby_names")?;
    primary.psql_superuser("postgres", "SELECT pg_reload_conf()")?;
    let replica_seen = probe_of(&replica).probe(Duration::from_secs(10)).await?;
    assert_eq!(replica_seen.synchronous_standby_names, None, "a replica names none");
    // A rebuild record beside the data is reported; one that is damaged is left out, and no
    // content of that file makes the look fail (a primary would then look hung).
    let record = primary.data.parent().context("the volume")?.join(".keelson-rebuilt");
    assert_eq!(probe_of(&primary).probe(Duration::from_secs(10)).await?.rebuilt, None, "no record");
    std::fs::write(&record, "1800000000 its WAL was gone\n")?;
    let said = probe_of(&primary).probe(Duration::from_secs(10)).await?.rebuilt;
    assert_eq!(said.as_deref(), Some("1800000000 its WAL was gone"));
    std::fs::write(&record, b"18000\0\xff\n'; drop table x; --")?;
    assert_eq!(probe_of(&primary).probe(Duration::from_secs(10)).await?.rebuilt, None, "damaged: left out");
    std::fs::remove_file(&record)?;
    assert!(version.starts_with(&seen.server_version), "{version} vs {}", seen.server_version);
    assert!(seen.server_version.chars().all(|c| c.is_ascii_digit() || c == '.'), "{}", seen.server_version);

    // Lag: with the replica's replay paused, WAL the primary writes is counted against it.
    replica.psql_superuser("postgres", "SELECT pg_wal_replay_pause()")?;
    primary.psql(
        "app",
        APP_PASSWORD,
        "app",
        "INSERT INTO orders SELECT g, 'more', 1 FROM generate_series(1001, 3000) g",
    )?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let seen = probe_of(&primary).probe(Duration::from_secs(10)).await?;
        let lag = seen.replicas.iter().find(|r| r.name == "db-1").and_then(|r| r.lag_bytes).unwrap_or_default();
        if lag > 100_000 {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "no lag counted against a paused replica: {seen:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    replica.psql_superuser("postgres", "SELECT pg_wal_replay_resume()")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let seen = probe_of(&primary).probe(Duration::from_secs(10)).await?;
        if seen.replicas.iter().any(|r| r.name == "db-1" && r.lag_bytes == Some(0)) {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "the resumed replica never caught up: {seen:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let seen = probe_of(&replica).probe(Duration::from_secs(10)).await?;
    assert_eq!(seen.role, Role::Replica);
    assert!(seen.streaming, "{seen:?}");
    assert!(seen.replicas.is_empty());
    // A server that is down is an error, not a report, and does not respond.
    let stopped = probe::Server { port: postgres::free_port()?, ..probe_of(&replica) };
    assert!(stopped.probe(Duration::from_secs(10)).await.is_err());
    assert!(!stopped.look(Duration::from_secs(2)).await.expect_err("no report").responds);
    // A frozen postmaster (SIGSTOP) answers no connection attempt: hung, not busy.
    assert!(probe_of(&replica).look(Duration::from_secs(2)).await.is_ok());
    let pid =
        std::fs::read_to_string(replica.data.join("postmaster.pid"))?.lines().next().unwrap_or_default().to_string();
    let signal = |name: &str| std::process::Command::new("kill").args([name, &pid]).status();
    // The liveness probe's verdict, on the same server (the socket folder is PGHOST).
    let live = || -> anyhow::Result<bool> {
        let mut env = base_env(&replica.data);
        env.extend([
            ("PGHOST", replica.socket_dir().to_string_lossy().into_owned()),
            ("PGPORT", replica.port.to_string()),
        ]);
        Ok(run(&script, &["live"], &env)?.status.success())
    };
    assert!(live()?, "a running server is alive");
    anyhow::ensure!(signal("-STOP")?.success(), "cannot stop the replica's postmaster {pid}");
    let frozen = probe_of(&replica).look(Duration::from_secs(2)).await;
    let frozen_live = live();
    signal("-CONT")?;
    assert!(!frozen_live?, "a frozen postmaster passed the liveness probe");
    let unanswered = frozen.expect_err("a frozen postmaster gives no report");
    assert!(!unanswered.responds, "a frozen postmaster responded: {}", unanswered.error);
    Ok(())
}

/// `start` never runs a server on a data folder that a former container's
/// server still uses (a forced deletion lets the kubelet start the successor
/// while the old processes live): it waits on a lock on the volume, and the
/// lock is held by the server itself, not only by the script that started it.
#[test]
fn start_waits_for_a_former_server_on_the_same_data_folder_to_exit() -> anyhow::Result<()> {
    if !postgres::available() {
        return Ok(());
    }
    let scratch = Scratch::new("data-lock")?;
    let script = script()?;
    let data = scratch.path.join("volume").join("pgdata");
    check(run(&script, &["init-primary"], &base_env(&data))?, "init-primary")?;
    let (sockets, orders) = (scratch.path.join("sockets"), scratch.path.join("orders"));
    for dir in [&sockets, &orders] {
        std::fs::create_dir_all(dir)?;
    }
    // Loopback only, and the test's own socket folder.
    let conf = format!("listen_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n", sockets.display());
    std::fs::OpenOptions::new().append(true).open(data.join("postgresql.conf"))?.write_all(conf.as_bytes())?;
    std::fs::write(orders.join("role"), "primary")?;
    chown_postgres(&scratch.path)?;
    let lock = scratch.path.join("volume/.keelson-data-lock");
    // Whether anyone holds the data lock now.
    let held = || -> anyhow::Result<bool> {
        let free = run(std::path::Path::new("/usr/bin/flock"), &["-n", &lock.to_string_lossy(), "true"], &[])?;
        Ok(!free.status.success())
    };
    // The former container's server, as far as the lock goes: it holds it until it exits.
    std::fs::write(&lock, "")?;
    chown_postgres(&lock)?;
    // `-o`: the lock is flock's own, not its command's, and goes when flock is killed.
    let mut former =
        std::process::Command::new("flock").arg("-o").arg(&lock).args(["sleep", "600"]).process_group(0).spawn()?;
    until("the former server's lock", &held)?;
    let port = postgres::free_port()?;
    let log = scratch.path.join("start.log");
    let mut start = std::process::Command::new("runuser")
        .args(["-u", "postgres", "--", "env"])
        .args(base_env(&data).iter().map(|(k, v)| format!("{k}={v}")))
        .arg(format!("PGHOST={}", sockets.display()))
        .arg(format!("PGPORT={port}"))
        .arg(format!("ORDERS_DIR={}", orders.display()))
        .args(["POD_NAME=db-0", "PRIMARY_HOST=127.0.0.1"])
        .arg(&script)
        .arg("start")
        .stderr(std::fs::File::create(&log)?)
        .process_group(0)
        .spawn()?;
    // Whatever happens, nothing this test started outlives it (the script's loops are in its group).
    let _groups = KillGroups(vec![former.id(), start.id()]);
    let logged = |text: &str| std::fs::read_to_string(&log).is_ok_and(|l| l.contains(text));
    until("start to wait for the former server", &|| Ok(logged("another PostgreSQL still runs on this data folder")))?;
    // The manager's acknowledgement of this start, as it would give it.
    until("the boot token", &|| Ok(sockets.join(".keelson-boot").exists()))?;
    std::fs::write(orders.join("ack"), std::fs::read_to_string(sockets.join(".keelson-boot"))?)?;
    let answers = || {
        let ready = std::process::Command::new(postgres::bindir().join("pg_isready"))
            .args(["-q", "-h", "127.0.0.1", "-p", &port.to_string()])
            .status();
        Ok(ready.is_ok_and(|s| s.success()))
    };
    std::thread::sleep(Duration::from_secs(2));
    assert!(!answers()?, "a server started while the former one held the data folder");
    let released = std::process::Command::new("kill").args(["-KILL", "--", &format!("-{}", former.id())]).status()?;
    anyhow::ensure!(released.success(), "cannot end the former server");
    former.wait()?;
    until("the server to start once the former one exited", &answers)
        .with_context(|| std::fs::read_to_string(&log).unwrap_or_default())?;
    // The server holds the lock itself: the script gone, it is still taken.
    let killed = std::process::Command::new("kill").args(["-KILL", &start.id().to_string()]).status()?;
    anyhow::ensure!(killed.success(), "cannot kill the script");
    start.wait()?;
    assert!(answers()?, "the server stopped with its script");
    assert!(held()?, "the lock went with the script while its server runs");
    let stopped =
        run(&postgres::bindir().join("pg_ctl"), &["-D", &data.to_string_lossy(), "-m", "fast", "-w", "stop"], &[])?;
    check(stopped, "pg_ctl stop")?;
    until("the lock to be free once the server exited", &|| Ok(!held()?))?;
    Ok(())
}

/// SIGKILL for these process groups when dropped.
struct KillGroups(Vec<u32>);

impl Drop for KillGroups {
    fn drop(&mut self) {
        for group in &self.0 {
            let mut kill = std::process::Command::new("kill");
            let _ = kill.args(["-KILL", "--", &format!("-{group}")]).stderr(std::process::Stdio::null()).status();
        }
    }
}

/// A primary that names a synchronous standby and whose manager was just
/// heard from, with its orders folder; `follow_orders` runs the script's
/// `follow-orders` on it once, `answers` says whether it serves.
struct OrderedPrimary {
    script: PathBuf,
    primary: Server,
    orders: PathBuf,
    // Last: the server stops before its folder goes.
    _scratch: Scratch,
}

impl OrderedPrimary {
    fn new(name: &str) -> anyhow::Result<Self> {
        let scratch = Scratch::new(name)?;
        let script = script()?;
        let primary = primary(&scratch, &script)?;
        let orders = scratch.path.join("orders");
        std::fs::create_dir_all(&orders)?;
        std::fs::write(orders.join("role"), "primary")?;
        std::fs::write(orders.join("synchronous-standbys"), "ANY 1 (\"db-1\")")?;
        std::fs::write(orders.join("heartbeat"), "1")?;
        chown_postgres(&orders)?;
        Ok(OrderedPrimary { script, primary, orders, _scratch: scratch })
    }

    fn follow_orders(&self) -> anyhow::Result<std::process::Output> {
        let env = [
            ("PGBIN", postgres::bindir().to_string_lossy().into_owned()),
            ("PGDATA", self.primary.data.to_string_lossy().into_owned()),
            ("PGHOST", self.primary.socket_dir().to_string_lossy().into_owned()),
            ("PGPORT", self.primary.port.to_string()),
            ("ORDERS_DIR", self.orders.to_string_lossy().into_owned()),
            ("POD_NAME", "db-0".to_string()),
        ];
        run(&self.script, &["follow-orders"], &env)
    }

    fn answers(&self) -> bool {
        self.primary.psql_superuser("postgres", "SELECT 1").is_ok_and(|one| one == "1")
    }
}

/// A primary whose instance manager went silent (down or stuck: no fence
/// could come from it), with no replica streaming from it, stops; one whose
/// manager is heard from keeps serving.
#[test]
fn a_primary_stops_when_its_manager_is_silent_and_no_standby_streams() -> anyhow::Result<()> {
    if !postgres::available() {
        return Ok(());
    }
    let ordered = OrderedPrimary::new("silent")?;
    let (orders, follow_orders, answers) = (&ordered.orders, || ordered.follow_orders(), || ordered.answers());
    let out = follow_orders()?;
    anyhow::ensure!(out.status.success(), "follow-orders: {}", String::from_utf8_lossy(&out.stderr));
    assert!(answers(), "stopped though its manager is heard from");
    // Not heard from for 10 s.
    let mut touched = std::process::Command::new("touch");
    touched.args(["-d", "10 seconds ago"]).arg(orders.join("heartbeat"));
    anyhow::ensure!(touched.status()?.success(), "cannot age the heartbeat");
    let out = follow_orders()?;
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("the instance manager has not been heard from"), "{log}");
    assert!(!answers(), "still serving with its manager silent");
    Ok(())
}

/// A server fenced for maintenance (`kubectl keelson fence`) stops at the
/// orders' next look, its manager heard from and a standby named.
#[test]
fn a_server_fenced_for_maintenance_stops() -> anyhow::Result<()> {
    if !postgres::available() {
        return Ok(());
    }
    let ordered = OrderedPrimary::new("maintenance-fence")?;
    let (orders, follow_orders, answers) = (&ordered.orders, || ordered.follow_orders(), || ordered.answers());
    let out = follow_orders()?;
    anyhow::ensure!(out.status.success(), "follow-orders: {}", String::from_utf8_lossy(&out.stderr));
    assert!(answers(), "stopped though not fenced");
    std::fs::write(orders.join("maintenance-fence"), keelson::api::instance::FENCE_REASON)?;
    let out = follow_orders()?;
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("fenced for maintenance"), "{log}");
    assert!(!answers(), "still serving while fenced");
    Ok(())
}
