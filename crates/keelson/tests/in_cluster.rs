//! The operator as a pod on a real node, as `make deploy` runs it: the
//! generated manager Deployment with this build's image, reaching the API
//! server through the `kubernetes` Service. It runs the WebApp tutorial with
//! drift taken back, a MyDatabase with a backup and a restore, and a failover;
//! MyDatabase pods copy the instance manager from the operator's own image.

mod common;

use common::clients::sql_in;
use common::running;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use keelson::api::mydatabase::MyDatabase;
use keelson::api::webapp::{WebApp, WebAppPhase};
use keelson::manifests::deploy;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;
use testkit::{DEFAULT_TIMEOUT, cluster_or_skip, eventually, kubectl, wait_for};

#[tokio::test]
async fn the_operator_in_a_pod_runs_the_tutorials_backups_and_a_failover() -> anyhow::Result<()> {
    let cluster = cluster_or_skip!();
    let ns = common::real_namespace(&cluster, "in-cluster").await?;
    common::grant_operator_rbac(&cluster, &ns).await?;
    // The generated Deployment, as `make deploy IMG=<this build's image>` applies it, scoped to
    // this namespace (other tests' operators watch theirs).
    let image = common::instance_image()?;
    let mut manager = deploy::manager_deployment(&image);
    manager.metadata.namespace = Some(ns.name.clone());
    let pod_spec = manager.spec.as_mut().and_then(|s| s.template.spec.as_mut()).expect("a pod template");
    pod_spec.service_account_name = Some(common::OPERATOR_SA.into());
    pod_spec.containers[0].args.get_or_insert_with(Vec::new).push(format!("--namespace={}", ns.name));
    let name = manager.metadata.name.clone().unwrap_or_default();
    ns.api::<Deployment>().create(&PostParams::default(), &manager).await?;
    wait_for(&ns.api::<Deployment>(), &name, "the operator pod ready (caches synced)", DEFAULT_TIMEOUT, |d| {
        d.status.as_ref().and_then(|s| s.available_replicas) == Some(1)
    })
    .await?;

    // The WebApp tutorial: Running, and a scaled Deployment is taken back.
    let webapps = ns.api::<WebApp>();
    let app = json!({"apiVersion": "apps.keelson.dev/v1", "kind": "WebApp", "metadata": {"name": "sandy-app"},
        "spec": {"replicas": 2, "image": "nginx:1.25-alpine"}});
    webapps.create(&PostParams::default(), &serde_json::from_value(app)?).await?;
    wait_for(&webapps, "sandy-app", "the WebApp Running 2/2", DEFAULT_TIMEOUT, |w| {
        w.status.as_ref().is_some_and(|s| s.phase == Some(WebAppPhase::Running) && s.available_replicas == 2)
    })
    .await?;
    kubectl(&["-n", &ns.name, "scale", "deployment", "sandy-app", "--replicas=5"])?;
    wait_for(&ns.api::<Deployment>(), "sandy-app", "the scale taken back", DEFAULT_TIMEOUT, |d| {
        d.spec.as_ref().and_then(|s| s.replicas) == Some(2)
    })
    .await?;

    // A MyDatabase: its pods' instance manager comes from the operator's own image.
    let dbs = ns.api::<MyDatabase>();
    let db = json!({"apiVersion": "db.keelson.dev/v1", "kind": "MyDatabase", "metadata": {"name": "orders"},
        "spec": {"replicas": 2, "version": "15.2", "storage": "1Gi", "restoreTo": ["orders-copy"],
                 "backup": {"schedule": "0 2 * * *", "retention": "7d"}}});
    dbs.create(&PostParams::default(), &serde_json::from_value(db)?).await?;
    let first = wait_for(&dbs, "orders", "Running 2/2", DEFAULT_TIMEOUT, running(2)).await?;
    let sts = ns.api::<StatefulSet>().get("orders").await?;
    let init = sts.spec.and_then(|s| s.template.spec).and_then(|p| p.init_containers).unwrap_or_default();
    assert_eq!(init.first().and_then(|c| c.image.as_deref()), Some(image.as_str()), "not the operator's image");
    let primary = first.status.and_then(|s| s.current_primary).unwrap_or_default();
    sql_in(
        &ns,
        &primary,
        "CREATE TABLE orders (id int PRIMARY KEY, item text); INSERT INTO orders VALUES (1, 'kept')",
    )?;

    // A backup now, then a restore of it into a new database.
    kubectl(&["-n", &ns.name, "create", "job", "--from=cronjob/orders-backup", "backup-now"])?;
    let backed_up = wait_for(&dbs, "orders", "the backup named in status", DEFAULT_TIMEOUT, |db| {
        db.status.as_ref().is_some_and(|s| s.last_backup_name.is_some())
    })
    .await?;
    let backup = backed_up.status.and_then(|s| s.last_backup_name).unwrap_or_default();
    let copy = json!({"apiVersion": "db.keelson.dev/v1", "kind": "MyDatabase", "metadata": {"name": "orders-copy"},
        "spec": {"replicas": 1, "version": "15.2", "storage": "1Gi",
                 "restoreFrom": {"database": "orders", "backup": backup}}});
    dbs.create(&PostParams::default(), &serde_json::from_value(copy)?).await?;
    wait_for(&dbs, "orders-copy", "the restored database Running", DEFAULT_TIMEOUT, running(1)).await?;
    eventually(DEFAULT_TIMEOUT, "the restored row", || async {
        sql_in(&ns, "orders-copy-0", "SELECT item FROM orders WHERE id = 1").is_ok_and(|item| item == "kept")
    })
    .await?;

    // A failover: the primary's pod deleted; the other instance serves, with the row.
    ns.api::<Pod>().delete(&primary, &DeleteParams::default()).await?;
    let after = wait_for(&dbs, "orders", "a new primary, Running 2/2", DEFAULT_TIMEOUT, |db| {
        running(2)(db) && db.status.as_ref().and_then(|s| s.current_primary.as_deref()).is_some_and(|p| p != primary)
    })
    .await?;
    let record = after.status.as_ref().and_then(|s| s.last_failover.clone());
    assert!(record.as_ref().is_some_and(|r| r.from == primary), "{record:?}");
    let new_primary = after.status.and_then(|s| s.current_primary).unwrap_or_default();
    eventually(DEFAULT_TIMEOUT, "the new primary to take writes", || async {
        sql_in(&ns, &new_primary, "INSERT INTO orders VALUES (2, 'after the failover') ON CONFLICT DO NOTHING").is_ok()
    })
    .await?;
    assert_eq!(
        sql_in(&ns, &new_primary, "SELECT string_agg(item, ',' ORDER BY id) FROM orders")?,
        "kept,after the failover"
    );

    // The operator pod did it all, without a restart.
    let operator_pods = ns.api::<Pod>().list(&ListParams::default().labels("app.kubernetes.io/name=keelson")).await?;
    let restarts: i32 = operator_pods
        .items
        .iter()
        .flat_map(|p| p.status.as_ref().and_then(|s| s.container_statuses.clone()).unwrap_or_default())
        .map(|c| c.restart_count)
        .sum();
    assert_eq!((operator_pods.items.len(), restarts), (1, 0), "the operator pod restarted or multiplied");
    Ok(())
}
