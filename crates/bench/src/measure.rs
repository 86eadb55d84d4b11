//! Measuring instruments: the operator process, its RSS and CPU from /proc,
//! latency summaries, and write requests counted in the API server's audit log.

use std::io::BufRead;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};
use testkit::postgres::free_port;
use testkit::process::http_get;

/// The operator under test, started from a command template.
pub struct Operator {
    child: Child,
    metrics_port: Option<u16>,
    health_port: Option<u16>,
}

impl Operator {
    pub fn start(template: &str, kubeconfig: &Path, log: &Path) -> anyhow::Result<Self> {
        let metrics_port = free_port()?;
        let health_port = free_port()?;
        let command =
            template.replace("{metrics}", &metrics_port.to_string()).replace("{health}", &health_port.to_string());
        let mut words = command.split_whitespace();
        let program = words.next().context("empty --operator-cmd")?;
        let file = std::fs::File::create(log)?;
        // Its own process group: a wrapper (heaptrack, time) and the operator under it stop together.
        let child = Command::new(program)
            .process_group(0)
            .args(words)
            .env("KUBECONFIG", kubeconfig)
            .env("POD_NAME", "keelson-bench")
            .stdout(Stdio::from(file.try_clone()?))
            .stderr(Stdio::from(file))
            .spawn()
            .with_context(|| format!("cannot start {program}"))?;
        Ok(Self {
            child,
            metrics_port: template.contains("{metrics}").then_some(metrics_port),
            health_port: template.contains("{health}").then_some(health_port),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub async fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let Some(port) = self.health_port else {
            tokio::time::sleep(Duration::from_secs(5)).await;
            return Ok(());
        };
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if http_get(port, "/readyz").await.is_ok_and(|(code, _)| code == 200) {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("the operator exited: {status}");
            }
            if tokio::time::Instant::now() > deadline {
                bail!("the operator was not ready within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Its `/metrics` page, if it serves one.
    pub async fn metrics_text(&self) -> Option<String> {
        let (_, body) = http_get(self.metrics_port?, "/metrics").await.ok()?;
        Some(body)
    }

    async fn metric(&self, name: &str) -> Option<f64> {
        Some(testkit::process::metric_sum(&self.metrics_text().await?, name))
    }

    /// Waits until no reconcile has started for 5 s (or 10 s without metrics).
    pub async fn wait_idle(&self, timeout: Duration) -> anyhow::Result<()> {
        if self.metrics_port.is_none() {
            tokio::time::sleep(Duration::from_secs(10)).await;
            return Ok(());
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last = self.metric("keelson_reconcile_total").await;
        let mut quiet_since = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let now = self.metric("keelson_reconcile_total").await;
            if now != last {
                last = now;
                quiet_since = tokio::time::Instant::now();
            } else if quiet_since.elapsed() >= Duration::from_secs(5) {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                bail!("the operator kept reconciling for {timeout:?}");
            }
        }
    }

    /// SIGTERM to its process group, then the exit status.
    pub async fn stop(mut self) -> anyhow::Result<ExitStatus> {
        Command::new("kill").arg("-TERM").arg("--").arg(format!("-{}", self.pid())).status()?;
        for _ in 0..300 {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Command::new("kill").arg("-KILL").arg("--").arg(format!("-{}", self.pid())).status()?;
        Ok(self.child.wait()?)
    }
}

/// A bench that fails half-way leaves no operator behind (it would act on the next run's cluster).
impl Drop for Operator {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = Command::new("kill").arg("-KILL").arg("--").arg(format!("-{}", self.pid())).status();
        }
    }
}

/// Samples a process's RSS every 50 ms on its own thread; CPU time on demand.
pub struct ProcessSampler {
    pid: u32,
    peak_kb: Arc<AtomicU64>,
    running: Arc<AtomicBool>,
}

fn rss_kb(pid: u32) -> Option<u64> {
    status_kb(pid, "VmRSS:")
}

/// A `kB` field of `/proc/<pid>/status`.
fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?.parse().ok()
}

fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
        .unwrap_or(100.0)
}

impl ProcessSampler {
    pub fn start(pid: u32) -> Self {
        let peak_kb = Arc::new(AtomicU64::new(0));
        let running = Arc::new(AtomicBool::new(true));
        let (peak, alive) = (peak_kb.clone(), running.clone());
        std::thread::spawn(move || {
            while alive.load(Ordering::Relaxed) {
                if let Some(kb) = rss_kb(pid) {
                    peak.fetch_max(kb, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Self { pid, peak_kb, running }
    }

    pub fn peak_rss_mb(&self) -> f64 {
        self.peak_kb.load(Ordering::Relaxed) as f64 / 1024.0
    }

    pub fn current_rss_mb(&self) -> f64 {
        rss_kb(self.pid).unwrap_or(0) as f64 / 1024.0
    }

    /// The resident memory now, split into anonymous (heap, stacks) and file-backed (the binary's pages).
    pub fn current_rss_split_mb(&self) -> (f64, f64) {
        let mb = |field| status_kb(self.pid, field).unwrap_or(0) as f64 / 1024.0;
        (mb("RssAnon:"), mb("RssFile:"))
    }

    /// User + system CPU seconds so far.
    pub fn cpu_seconds(&self) -> f64 {
        cpu_seconds(self.pid)
    }
}

/// User + system CPU seconds of process `pid` so far (0 once it is gone).
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0.0 };
    // Fields after the parenthesised command name; utime and stime are 14 and 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / clock_ticks()
}

/// The local control plane's processes, as `hack/cluster.sh` records their pids.
const CONTROL_PLANE: [&str; 5] = ["kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler", "kwok"];

/// Where a phase's CPU went: each control-plane process and the operator,
/// and how busy the whole machine was, from the account's start. On a machine
/// whose cores are all busy a phase lasts as long as the CPU it needs, so this
/// says what a convergence time is made of.
pub struct CpuAccount {
    processes: Vec<(String, u32)>,
    start: CpuReading,
}

struct CpuReading {
    at: std::time::Instant,
    by_process: Vec<f64>,
    machine: (f64, f64),
}

impl CpuAccount {
    /// Starts counting for the control plane of the cluster in `dir` (pids it
    /// cannot read are left out) and, if given, the operator.
    pub fn start(dir: &Path, operator: Option<u32>) -> Self {
        let mut processes: Vec<(String, u32)> = CONTROL_PLANE
            .iter()
            .filter_map(|name| {
                let pid = std::fs::read_to_string(dir.join(format!("{name}.pid"))).ok()?.trim().parse().ok()?;
                Some((name.to_string(), pid))
            })
            .collect();
        processes.extend(operator.map(|pid| ("keelson".to_string(), pid)));
        let start = read(&processes);
        Self { processes, start }
    }

    /// CPU seconds by process since the start, their total, the seconds since
    /// and the machine's busy cores over that time, as JSON.
    pub fn so_far(&self) -> Value {
        let (before, after) = (&self.start, read(&self.processes));
        let by_process: serde_json::Map<String, Value> = self
            .processes
            .iter()
            .zip(before.by_process.iter().zip(&after.by_process))
            .map(|((name, _), (b, a))| (name.clone(), json!(round(a - b))))
            .collect();
        let total: f64 = before.by_process.iter().zip(&after.by_process).map(|(b, a)| a - b).sum();
        let ((busy_before, all_before), (busy_after, all_after)) = (before.machine, after.machine);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let busy_cores = if all_after > all_before {
            cores as f64 * (busy_after - busy_before) / (all_after - all_before)
        } else {
            0.0
        };
        json!({
            "by_process": by_process,
            "total_s": round(total),
            "seconds": round(after.at.duration_since(before.at).as_secs_f64()),
            "machine_busy_cores": round(busy_cores),
            "machine_cores": cores,
        })
    }
}

fn read(processes: &[(String, u32)]) -> CpuReading {
    CpuReading {
        at: std::time::Instant::now(),
        by_process: processes.iter().map(|(_, pid)| cpu_seconds(*pid)).collect(),
        machine: machine_ticks(),
    }
}

/// The machine's busy and total CPU ticks so far (`/proc/stat`; idle and iowait are not busy).
fn machine_ticks() -> (f64, f64) {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else { return (0.0, 0.0) };
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else { return (0.0, 0.0) };
    let ticks: Vec<f64> = line.split_whitespace().skip(1).filter_map(|t| t.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest time is already in user).
    let all: f64 = ticks.iter().take(8).sum();
    let idle = ticks.get(3).copied().unwrap_or(0.0) + ticks.get(4).copied().unwrap_or(0.0);
    (all - idle, all)
}

/// Two decimals, as results.json keeps figures.
pub fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

impl Drop for ProcessSampler {
    fn drop(&mut self) {
        self.running.store(false, Ordering::Relaxed);
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Summary {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Summary {
    /// Nearest-rank percentiles.
    pub fn of(samples: &[f64]) -> Self {
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let rank = |p: f64| -> f64 {
            if sorted.is_empty() {
                return 0.0;
            }
            let index = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
            sorted[index.clamp(1, sorted.len()) - 1]
        };
        Self { p50: rank(50.0), p90: rank(90.0), p99: rank(99.0), max: sorted.last().copied().unwrap_or(0.0) }
    }
}

/// Waits until the API server has written nothing for `quiet`: its audit log
/// (writes only) has not grown for that long. True if it went quiet within
/// `timeout`, false if writes never stopped for that long.
pub async fn wait_quiet(log: &Path, quiet: Duration, timeout: Duration) -> anyhow::Result<bool> {
    let started = std::time::Instant::now();
    let size = || std::fs::metadata(log).map(|m| m.len()).with_context(|| format!("reading {}", log.display()));
    let (mut last_size, mut since) = (size()?, std::time::Instant::now());
    loop {
        if since.elapsed() >= quiet {
            return Ok(true);
        }
        if started.elapsed() >= timeout {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        let now = size()?;
        if now != last_size {
            (last_size, since) = (now, std::time::Instant::now());
        }
    }
}

/// Write requests (create, update, patch, delete) the API server completed
/// for `user` (directly or impersonated) between `from` and `to`.
pub fn audited_writes(
    log: &Path,
    user: &str,
    from: chrono::DateTime<chrono::Utc>,
    to: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<u64> {
    Ok(audited_writes_by_kind(log, user, from, to)?.values().sum())
}

/// The same writes, counted by `verb resource[/subresource]` (e.g. `patch webapps/status`).
pub fn audited_writes_by_kind(
    log: &Path,
    user: &str,
    from: chrono::DateTime<chrono::Utc>,
    to: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<std::collections::BTreeMap<String, u64>> {
    let mut counts = std::collections::BTreeMap::new();
    for_each_write(log, user, from, to, |entry| {
        if requester(entry) == Some(user) {
            *counts.entry(write_kind(entry)).or_insert(0) += 1;
        }
    })?;
    Ok(counts)
}

/// Writes the cluster's components completed in `namespace` between `from` and
/// `to`, by the program that sent them (its user agent's first word:
/// `kube-controller-manager`, `kube-scheduler`, `kwok`, …) and `verb
/// resource[/subresource]`, answered or refused. Not counted: `operator`'s writes,
/// and writes without a user agent (the harness's: kube-rs sends none).
pub fn audited_writes_by_component(
    log: &Path,
    namespace: &str,
    operator: &str,
    from: chrono::DateTime<chrono::Utc>,
    to: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<std::collections::BTreeMap<String, u64>> {
    let mut counts = std::collections::BTreeMap::new();
    for_each_write(log, &format!("\"{namespace}\""), from, to, |entry| {
        let agent = entry["userAgent"].as_str().and_then(|a| a.split('/').next()).filter(|a| !a.is_empty());
        if let Some(agent) = agent
            && entry["objectRef"]["namespace"] == namespace
            && requester(entry) != Some(operator)
        {
            *counts.entry(format!("{agent} {}", write_kind(entry))).or_insert(0) += 1;
        }
    })?;
    Ok(counts)
}

/// Calls `each` with every write request (create, update, patch, delete) the
/// audit log shows completed between `from` and `to`, reading only lines that
/// contain `mentions` (a cheap filter before the JSON is parsed).
fn for_each_write(
    log: &Path,
    mentions: &str,
    from: chrono::DateTime<chrono::Utc>,
    to: chrono::DateTime<chrono::Utc>,
    mut each: impl FnMut(&Value),
) -> anyhow::Result<()> {
    for line in audit_lines(log)? {
        let line = line?;
        if !line.contains(mentions) {
            continue;
        }
        let Ok(entry) = serde_json::from_str::<Value>(&line) else { continue };
        if entry["stage"] == "ResponseComplete"
            && matches!(entry["verb"].as_str(), Some("create" | "update" | "patch" | "delete" | "deletecollection"))
            && completed_between(&entry, from, to)
        {
            each(&entry);
        }
    }
    Ok(())
}

/// Who a request was made as: the impersonated user if any, else the user.
fn requester(entry: &Value) -> Option<&str> {
    entry["impersonatedUser"]["username"].as_str().or(entry["user"]["username"].as_str())
}

/// Whether an audit entry's request completed within `from..=to`.
fn completed_between(entry: &Value, from: chrono::DateTime<chrono::Utc>, to: chrono::DateTime<chrono::Utc>) -> bool {
    let at = entry["stageTimestamp"].as_str().and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
    at.is_some_and(|at| at >= from && at <= to)
}

/// `verb resource[/subresource]` of an audit entry, e.g. `patch webapps/status`.
fn write_kind(entry: &Value) -> String {
    let object = &entry["objectRef"];
    let kind = format!("{} {}", entry["verb"].as_str().unwrap_or("?"), object["resource"].as_str().unwrap_or("?"));
    match object["subresource"].as_str() {
        Some(sub) => format!("{kind}/{sub}"),
        None => kind,
    }
}

/// The lines of the audit log `log` and of its rotated files beside it
/// (`audit-<time>.log`, oldest first): a long run fills more than one.
fn audit_lines(log: &Path) -> anyhow::Result<impl Iterator<Item = std::io::Result<String>>> {
    let stem = log.file_stem().and_then(|s| s.to_str()).unwrap_or("audit").to_string();
    let dir = log.parent().unwrap_or(Path::new("."));
    let mut rotated: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{stem}-")) && n.ends_with(".log"))
        })
        .collect();
    rotated.sort();
    rotated.push(log.to_path_buf());
    let mut files = Vec::new();
    for path in rotated {
        files.push(std::fs::File::open(&path).with_context(|| format!("cannot open audit log {}", path.display()))?);
    }
    Ok(files.into_iter().flat_map(|file| std::io::BufReader::new(file).lines()))
}

/// What the API server's audit log shows of drift reverts, in ms, one entry per revert.
#[derive(Debug, Default, PartialEq)]
pub struct RevertTimings {
    /// The outsider's write itself (arrival to completion).
    pub outsider_writes: Vec<f64>,
    /// From the outsider's write completing (when its watch event leaves) to the operator's arriving.
    pub reactions: Vec<f64>,
    /// The operator's write itself.
    pub writes: Vec<f64>,
}

impl RevertTimings {
    /// Each revert's whole span in the API server: the outsider's write arriving
    /// to the operator's write done (the drift less the harness's own way in and
    /// its watch's way out).
    pub fn spans(&self) -> Vec<f64> {
        self.outsider_writes.iter().zip(&self.reactions).zip(&self.writes).map(|((o, r), w)| o + r + w).collect()
    }
}

/// The reverts in the audit log: every Deployment patch by someone else
/// followed by one of `user`'s.
pub fn revert_timings(
    log: &Path,
    user: &str,
    from: chrono::DateTime<chrono::Utc>,
    to: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<RevertTimings> {
    let time = |entry: &Value, field: &str| {
        entry[field]
            .as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&chrono::Utc))
    };
    type Time = chrono::DateTime<chrono::Utc>;
    // Per Deployment: (received, completed, by the operator?), in the order received.
    let mut patches: std::collections::BTreeMap<String, Vec<(Time, Time, bool)>> = Default::default();
    for line in audit_lines(log)? {
        let line = line?;
        if !line.contains("\"deployments\"") {
            continue;
        }
        let Ok(entry) = serde_json::from_str::<Value>(&line) else { continue };
        let object = &entry["objectRef"];
        if entry["stage"] != "ResponseComplete"
            || entry["verb"] != "patch"
            || object["resource"] != "deployments"
            || !object["subresource"].is_null()
        {
            continue;
        }
        let (Some(received), Some(completed)) =
            (time(&entry, "requestReceivedTimestamp"), time(&entry, "stageTimestamp"))
        else {
            continue;
        };
        if received < from || completed > to {
            continue;
        }
        let who = requester(&entry);
        let name = format!("{}/{}", object["namespace"].as_str().unwrap_or(""), object["name"].as_str().unwrap_or(""));
        patches.entry(name).or_default().push((received, completed, who == Some(user)));
    }
    let ms = |d: chrono::TimeDelta| d.num_microseconds().unwrap_or(i64::MAX) as f64 / 1000.0;
    let mut timings = RevertTimings::default();
    for mut list in patches.into_values() {
        list.sort_by_key(|(received, _, _)| *received);
        for pair in list.windows(2) {
            let ((outsider_received, outsider_done, false), (received, completed, true)) = (pair[0], pair[1]) else {
                continue;
            };
            timings.outsider_writes.push(ms(outsider_done - outsider_received));
            timings.reactions.push(ms(received - outsider_done));
            timings.writes.push(ms(completed - received));
        }
    }
    Ok(timings)
}

/// A Prometheus histogram read from two scrapes of `/metrics`: the
/// observations made between them.
#[derive(Debug, PartialEq)]
pub struct HistogramDelta {
    /// (upper bound, cumulative count), by bound.
    pub buckets: Vec<(f64, f64)>,
    pub sum: f64,
    pub count: f64,
}

impl HistogramDelta {
    /// `name`'s series whose labels contain `labels`, `after` minus `before`.
    pub fn between(before: &str, after: &str, name: &str, labels: &str) -> Self {
        let read = |text: &str| {
            let mut buckets = Vec::new();
            let (mut sum, mut count) = (0.0, 0.0);
            for line in text.lines().filter(|l| l.contains(labels)) {
                let Some((series, value)) = line.rsplit_once(' ') else { continue };
                let Ok(value) = value.parse::<f64>() else { continue };
                if series.starts_with(&format!("{name}_bucket{{")) {
                    let bound = series.split("le=\"").nth(1).and_then(|b| b.split('"').next());
                    let bound = match bound {
                        Some("+Inf") => f64::INFINITY,
                        Some(b) => b.parse().unwrap_or(f64::NAN),
                        None => continue,
                    };
                    buckets.push((bound, value));
                } else if series.starts_with(&format!("{name}_sum{{")) {
                    sum = value;
                } else if series.starts_with(&format!("{name}_count{{")) {
                    count = value;
                }
            }
            (buckets, sum, count)
        };
        let (old, old_sum, old_count) = read(before);
        let (new, sum, count) = read(after);
        let buckets = new
            .into_iter()
            .map(|(bound, n)| (bound, n - old.iter().find(|(b, _)| *b == bound).map_or(0.0, |(_, n)| *n)))
            .collect();
        Self { buckets, sum: sum - old_sum, count: count - old_count }
    }

    /// The upper bound of the bucket holding quantile `q` (the most the histogram can tell).
    pub fn quantile_at_most(&self, q: f64) -> Option<f64> {
        let rank = (q * self.count).ceil().max(1.0);
        self.buckets.iter().find(|(_, n)| *n >= rank).map(|(bound, _)| *bound).filter(|_| self.count > 0.0)
    }

    pub fn mean(&self) -> Option<f64> {
        (self.count > 0.0).then(|| self.sum / self.count)
    }
}

pub fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let memory_kb: u64 = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().next()?.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0);
    json!({"cpu": cpu, "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0), "memory_gib": (memory_kb as f64 / 1048576.0).round()})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let samples: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Summary::of(&samples);
        assert_eq!((s.p50, s.p90, s.p99, s.max), (50.0, 90.0, 99.0, 100.0));
        assert_eq!(Summary::of(&[7.0]).p99, 7.0);
    }

    #[test]
    fn audit_counting_filters_user_verb_stage_and_window() -> anyhow::Result<()> {
        let dir = std::env::temp_dir().join(format!("keelson-audit-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let log = dir.join("audit.log");
        let line = |user: &str, imp: Option<&str>, verb: &str, stage: &str, ts: &str| {
            let mut e = json!({"stage": stage, "verb": verb, "user": {"username": user}, "stageTimestamp": ts});
            if let Some(imp) = imp {
                e["impersonatedUser"] = json!({"username": imp});
            }
            e.to_string()
        };
        let sa = "system:serviceaccount:b:keelson";
        let lines = [
            line("admin", Some(sa), "patch", "ResponseComplete", "2026-01-01T00:00:30Z"),
            line(sa, None, "create", "ResponseComplete", "2026-01-01T00:00:31Z"),
            line("admin", Some(sa), "get", "ResponseComplete", "2026-01-01T00:00:32Z"),
            line("admin", None, "patch", "ResponseComplete", "2026-01-01T00:00:33Z"),
            line("admin", Some(sa), "patch", "ResponseStarted", "2026-01-01T00:00:34Z"),
            line("admin", Some(sa), "patch", "ResponseComplete", "2026-01-01T00:02:00Z"),
        ];
        std::fs::write(&log, lines.join("\n"))?;
        let from = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")?.with_timezone(&chrono::Utc);
        let to = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:01:00Z")?.with_timezone(&chrono::Utc);
        assert_eq!(audited_writes(&log, sa, from, to)?, 2);
        std::fs::remove_dir_all(dir)?;
        Ok(())
    }

    #[test]
    fn writes_in_a_namespace_are_counted_by_program_and_kind() -> anyhow::Result<()> {
        let dir = std::env::temp_dir().join(format!("keelson-components-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let log = dir.join("audit.log");
        let line = |agent: &str, verb: &str, namespace: &str, sub: Option<&str>, ts: &str| {
            let mut e = json!({"stage": "ResponseComplete", "verb": verb, "stageTimestamp": ts,
                   "user": {"username": "components"},
                   "objectRef": {"namespace": namespace, "resource": "deployments", "subresource": sub}});
            match agent {
                "" => {}
                "operator" => e["user"]["username"] = json!("system:serviceaccount:b:keelson"),
                agent => e["userAgent"] = json!(agent),
            }
            e.to_string()
        };
        let kcm = "kube-controller-manager/v1.36.3 (linux/amd64) kubernetes/abc/deployment-controller";
        let lines = [
            line(kcm, "update", "apps", Some("status"), "2026-01-01T00:00:30Z"),
            line(kcm, "update", "apps", Some("status"), "2026-01-01T00:00:31Z"),
            line("kwok/v0.8.0", "patch", "apps", None, "2026-01-01T00:00:32Z"),
            line(kcm, "get", "apps", None, "2026-01-01T00:00:33Z"),
            line(kcm, "update", "apps-other", Some("status"), "2026-01-01T00:00:34Z"),
            line(kcm, "update", "apps", Some("status"), "2026-01-01T00:02:00Z"),
            line("", "patch", "apps", None, "2026-01-01T00:00:35Z"),
            line("operator", "patch", "apps", None, "2026-01-01T00:00:36Z"),
        ];
        std::fs::write(&log, lines.join("\n"))?;
        let from = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")?.with_timezone(&chrono::Utc);
        let to = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:01:00Z")?.with_timezone(&chrono::Utc);
        let counts = audited_writes_by_component(&log, "apps", "system:serviceaccount:b:keelson", from, to)?;
        let expected: std::collections::BTreeMap<String, u64> = [
            ("kube-controller-manager update deployments/status".to_string(), 2),
            ("kwok patch deployments".into(), 1),
        ]
        .into();
        assert_eq!(counts, expected);
        std::fs::remove_dir_all(dir)?;
        Ok(())
    }

    #[test]
    fn a_revert_is_timed_from_the_outsiders_write_to_ours() -> anyhow::Result<()> {
        let dir = std::env::temp_dir().join(format!("keelson-revert-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let log = dir.join("audit.log");
        let sa = "system:serviceaccount:b:keelson";
        let patch = |user: &str, name: &str, received: &str, done: &str| {
            json!({"stage": "ResponseComplete", "verb": "patch", "user": {"username": user},
                   "objectRef": {"resource": "deployments", "namespace": "n", "name": name},
                   "requestReceivedTimestamp": received, "stageTimestamp": done})
            .to_string()
        };
        let lines = [
            patch("admin", "a", "2026-01-01T00:00:01.000000Z", "2026-01-01T00:00:01.004000Z"),
            patch(sa, "a", "2026-01-01T00:00:01.007500Z", "2026-01-01T00:00:01.013500Z"),
            // Another object's patch in between does not pair with these.
            patch(sa, "b", "2026-01-01T00:00:01.005000Z", "2026-01-01T00:00:01.006000Z"),
            // The operator's write first: no outsider before it.
            patch(sa, "c", "2026-01-01T00:00:02.000000Z", "2026-01-01T00:00:02.001000Z"),
        ];
        std::fs::write(&log, lines.join("\n"))?;
        let from = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")?.with_timezone(&chrono::Utc);
        let to = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:01:00Z")?.with_timezone(&chrono::Utc);
        let timings = revert_timings(&log, sa, from, to)?;
        assert_eq!(timings, RevertTimings { outsider_writes: vec![4.0], reactions: vec![3.5], writes: vec![6.0] });
        assert_eq!(timings.spans(), [13.5]);
        std::fs::remove_dir_all(dir)?;
        Ok(())
    }

    #[test]
    fn a_histogram_is_read_as_the_observations_between_two_scrapes() {
        let scrape = |b1: u32, b2: u32, inf: u32, sum: f64| {
            format!(
                "# TYPE keelson_delay_seconds histogram\n\
                 keelson_delay_seconds_sum{{kind=\"Deployment\"}} {sum}\n\
                 keelson_delay_seconds_count{{kind=\"Deployment\"}} {inf}\n\
                 keelson_delay_seconds_bucket{{le=\"0.001\",kind=\"Deployment\"}} {b1}\n\
                 keelson_delay_seconds_bucket{{le=\"0.002\",kind=\"Deployment\"}} {b2}\n\
                 keelson_delay_seconds_bucket{{le=\"+Inf\",kind=\"Deployment\"}} {inf}\n\
                 keelson_delay_seconds_count{{kind=\"Service\"}} 7\n"
            )
        };
        let delta = HistogramDelta::between(
            &scrape(1, 1, 1, 0.0005),
            &scrape(91, 100, 101, 0.1005),
            "keelson_delay_seconds",
            "kind=\"Deployment\"",
        );
        assert_eq!(delta.count, 100.0);
        assert_eq!(delta.buckets, vec![(0.001, 90.0), (0.002, 99.0), (f64::INFINITY, 100.0)]);
        assert_eq!(delta.quantile_at_most(0.5), Some(0.001));
        assert_eq!(delta.quantile_at_most(0.99), Some(0.002));
        assert_eq!(delta.quantile_at_most(1.0), Some(f64::INFINITY));
        assert!((delta.mean().unwrap_or_default() - 0.001).abs() < 1e-9);
        let nothing = HistogramDelta::between("", "", "keelson_delay_seconds", "kind=\"Deployment\"");
        assert_eq!((nothing.quantile_at_most(0.5), nothing.mean()), (None, None));
    }
}
