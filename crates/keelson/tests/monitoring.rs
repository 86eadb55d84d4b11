//! The alert rules and the Grafana dashboard, checked with promtool (Debian's,
//! `hack/promtool.sh`): the rules load, each alert fires on the series that
//! mean trouble (`tests/monitoring/alerts_test.yaml`), every dashboard query
//! parses, and every Keelson series they name is one Keelson exports.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

fn promtool() -> anyhow::Result<PathBuf> {
    let script = format!("{ROOT}/hack/promtool.sh");
    let output = Command::new(&script).arg("path").output().with_context(|| format!("cannot run {script}"))?;
    anyhow::ensure!(output.status.success(), "{script} path: {}", String::from_utf8_lossy(&output.stderr));
    Ok(PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()))
}

fn run_promtool(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(promtool()?).args(args).current_dir(dir).output()?;
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    anyhow::ensure!(output.status.success(), "promtool {args:?} failed:\n{text}");
    Ok(text)
}

fn scratch(name: &str) -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("keelson-monitoring-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// The rule groups of the shipped PrometheusRule, as a plain rules file.
fn rule_groups() -> anyhow::Result<serde_yaml::Value> {
    let rule: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(format!("{ROOT}/config/prometheus/prometheusrule.yaml"))?)?;
    let groups = rule["spec"]["groups"].clone();
    anyhow::ensure!(groups.as_sequence().is_some_and(|g| !g.is_empty()), "no rule groups");
    Ok(serde_yaml::Value::Mapping([("groups".into(), groups)].into_iter().collect()))
}

/// Every `keelson_…` series name in `expr`.
fn keelson_series(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find("keelson_") {
        let tail = &rest[at..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        // `keelson_dev_cluster` is a label (the pod label keelson.dev/cluster), not a series.
        if &tail[..end] != "keelson_dev_cluster" {
            names.insert(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    names
}

/// The series Keelson exports: an instance's, from a scrape of everything, and the operator's.
fn exported() -> anyhow::Result<BTreeSet<String>> {
    let everything = r#"{"inRecovery": true, "timeline": 1, "walLsnBytes": 1, "walSizeBytes": 1,
        "replicationLagSeconds": 0, "standbys": [{"name": "db-1", "streaming": true, "lagBytes": 0, "lagSeconds": 0}],
        "slots": [{"name": "s", "active": true, "retainedBytes": 0}], "backends": {"idle": 1}, "maxConnections": 100,
        "databases": [{"name": "app", "sizeBytes": 1, "xidAge": 1}]}"#;
    let sample: keelson::instance::metrics::Sample = serde_json::from_str(everything)?;
    let operator = keelson::runtime::Metrics::default();
    operator.record_backup("shop", "orders", Some(1), Some(1));
    let text = keelson::instance::metrics::render(Some(&sample)) + &operator.render();
    Ok(text
        .lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .filter_map(|line| line.split(['{', ' ']).next().map(str::to_string))
        .collect())
}

#[test]
fn the_alert_rules_load_and_fire_on_trouble() -> anyhow::Result<()> {
    let dir = scratch("rules")?;
    std::fs::write(dir.join("rules.yaml"), serde_yaml::to_string(&rule_groups()?)?)?;
    run_promtool(&dir, &["check", "rules", "rules.yaml"])?;
    std::fs::copy(format!("{ROOT}/crates/keelson/tests/monitoring/alerts_test.yaml"), dir.join("alerts_test.yaml"))?;
    let tested = run_promtool(&dir, &["test", "rules", "alerts_test.yaml"])?;
    assert!(tested.contains("SUCCESS"), "{tested}");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[test]
fn every_dashboard_query_parses() -> anyhow::Result<()> {
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{ROOT}/config/grafana/keelson-mydatabase.json"))?)?;
    let mut rules = Vec::new();
    for panel in dashboard["panels"].as_array().cloned().unwrap_or_default() {
        for target in panel["targets"].as_array().cloned().unwrap_or_default() {
            let expr = target["expr"].as_str().unwrap_or_default();
            // Grafana's variables, as Grafana would substitute them.
            let expr = expr.replace("$namespace", "shop").replace("$database", "orders");
            let record = format!("keelson_dashboard:panel_{}_{}", panel["id"], target["refId"].as_str().unwrap_or(""));
            rules.push(serde_json::json!({"record": record, "expr": expr}));
        }
    }
    assert!(rules.len() >= 10, "the dashboard has {} queries", rules.len());
    let dir = scratch("dashboard")?;
    let file = serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]});
    std::fs::write(dir.join("dashboard.yaml"), serde_yaml::to_string(&file)?)?;
    run_promtool(&dir, &["check", "rules", "dashboard.yaml"])?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[test]
fn the_rules_and_the_dashboard_name_only_series_keelson_exports() -> anyhow::Result<()> {
    let exported = exported()?;
    let rules = serde_yaml::to_string(&rule_groups()?)?;
    let dashboard = std::fs::read_to_string(format!("{ROOT}/config/grafana/keelson-mydatabase.json"))?;
    let named: BTreeSet<String> = keelson_series(&rules).into_iter().chain(keelson_series(&dashboard)).collect();
    let unknown: Vec<&String> = named.iter().filter(|name| !exported.contains(*name)).collect();
    assert!(unknown.is_empty(), "not exported: {unknown:?} (exported: {exported:?})");
    for must in
        ["keelson_pg_in_recovery", "keelson_pg_standby_lag_seconds", "keelson_mydatabase_last_backup_timestamp_seconds"]
    {
        assert!(named.contains(must), "nothing uses {must}");
    }
    Ok(())
}
