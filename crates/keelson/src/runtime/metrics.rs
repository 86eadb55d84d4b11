//! Prometheus metrics shared by both controllers, served at `/metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    pub controller: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub controller: &'static str,
    pub error: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub controller: &'static str,
    /// `success`, `requeue` (it asked to look again later) or `error`.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DriftLabels {
    pub kind: String,
    pub field: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub verb: &'static str,
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ChildWriteLabels {
    pub kind: String,
    pub action: &'static str,
}

/// One MyDatabase, for the figures read from its status. Not `namespace`: a
/// ServiceMonitor sets that to the operator's own.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DatabaseLabels {
    pub database_namespace: String,
    pub database: String,
}

/// Every metric Keelson exports.
pub struct Metrics {
    pub registry: Registry,
    pub reconciles: Family<ControllerLabels, Counter>,
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    pub reconcile_results: Family<ResultLabels, Counter>,
    pub queue_depth: Family<ControllerLabels, Gauge>,
    pub queue_wait: Family<ControllerLabels, Histogram>,
    pub reconcile_duration: Family<ControllerLabels, Histogram>,
    pub reconciles_in_flight: Family<ControllerLabels, Gauge>,
    pub drift_corrections: Family<DriftLabels, Counter>,
    pub drift_revert_delay: Family<KindLabels, Histogram>,
    pub child_writes: Family<ChildWriteLabels, Counter>,
    pub status_writes: Family<ControllerLabels, Counter>,
    pub http_requests: Family<HttpLabels, Counter>,
    pub leader: Gauge,
    /// From each MyDatabase's status: when its newest backup finished, and its size.
    pub last_backup_timestamp: Family<DatabaseLabels, Gauge>,
    pub last_backup_size: Family<DatabaseLabels, Gauge>,
}

fn duration_histogram() -> Histogram {
    Histogram::new([0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0])
}

/// Fine below a few milliseconds, where a revert's time inside the operator lies.
fn delay_histogram() -> Histogram {
    Histogram::new([0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.025, 0.1, 1.0])
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("keelson");
        let reconciles = Family::<ControllerLabels, Counter>::default();
        let reconcile_errors = Family::<ErrorLabels, Counter>::default();
        let reconcile_duration =
            Family::<ControllerLabels, Histogram>::new_with_constructor(duration_histogram as fn() -> Histogram);
        let reconciles_in_flight = Family::<ControllerLabels, Gauge>::default();
        let drift_corrections = Family::<DriftLabels, Counter>::default();
        let drift_revert_delay =
            Family::<KindLabels, Histogram>::new_with_constructor(delay_histogram as fn() -> Histogram);
        let child_writes = Family::<ChildWriteLabels, Counter>::default();
        let status_writes = Family::<ControllerLabels, Counter>::default();
        let http_requests = Family::<HttpLabels, Counter>::default();
        let leader = Gauge::default();
        registry.register("reconcile", "Reconciles started, per controller", reconciles.clone());
        registry.register(
            "reconcile_errors",
            "Reconciles that ended in an error, per controller and error kind",
            reconcile_errors.clone(),
        );
        registry.register("reconcile_duration_seconds", "Time spent in one reconcile", reconcile_duration.clone());
        registry.register("reconciles_in_flight", "Reconciles running now", reconciles_in_flight.clone());
        registry.register(
            "drift_corrections",
            "Fields of child objects changed by someone else and set back",
            drift_corrections.clone(),
        );
        registry.register(
            "drift_revert_delay_seconds",
            "From a drifted child's watch event arriving to its revert being sent, per kind",
            drift_revert_delay.clone(),
        );
        registry.register(
            "child_writes",
            "Child objects created or updated by server-side apply",
            child_writes.clone(),
        );
        registry.register("status_writes", "Status subresource writes, per controller", status_writes.clone());
        registry.register(
            "kubernetes_http_requests",
            "Every HTTP request to the API server (watches included), by verb and status code",
            http_requests.clone(),
        );
        registry.register(
            "leader",
            "1 while this instance holds the leader lease (or runs without leader election)",
            leader.clone(),
        );
        let reconcile_results = Family::<ResultLabels, Counter>::default();
        registry.register("reconcile_results", "Reconciles ended, by result", reconcile_results.clone());
        let queue_depth = Family::<ControllerLabels, Gauge>::default();
        registry.register(
            "workqueue_depth",
            "Objects ready to reconcile, waiting for a free slot",
            queue_depth.clone(),
        );
        let queue_wait =
            Family::<ControllerLabels, Histogram>::new_with_constructor(duration_histogram as fn() -> Histogram);
        registry.register(
            "workqueue_queue_duration_seconds",
            "How long a triggered object waited before its reconcile started",
            queue_wait.clone(),
        );
        registry.register(
            "build",
            "The running Keelson",
            prometheus_client::metrics::info::Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        registry.register_collector(Box::new(ProcessCollector));
        let last_backup_timestamp = Family::<DatabaseLabels, Gauge>::default();
        let last_backup_size = Family::<DatabaseLabels, Gauge>::default();
        registry.register(
            "mydatabase_last_backup_timestamp_seconds",
            "When a MyDatabase's newest successful backup finished (Unix time)",
            last_backup_timestamp.clone(),
        );
        registry.register(
            "mydatabase_last_backup_size_bytes",
            "Size of a MyDatabase's newest successful backup",
            last_backup_size.clone(),
        );
        Self {
            registry,
            reconciles,
            reconcile_errors,
            reconcile_results,
            queue_depth,
            queue_wait,
            reconcile_duration,
            reconciles_in_flight,
            drift_corrections,
            drift_revert_delay,
            child_writes,
            status_writes,
            http_requests,
            leader,
            last_backup_timestamp,
            last_backup_size,
        }
    }
}

/// The process's CPU time and memory, read from `/proc` at each scrape (as
/// the Go client's process collector does for controller-runtime).
#[derive(Debug)]
struct ProcessCollector;

impl ProcessCollector {
    /// CPU seconds (user and system) and resident bytes; None off Linux.
    fn read() -> Option<(f64, i64)> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // After the command's closing parenthesis: state is field 3, utime 14, stime 15.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let rss_kib: i64 =
            status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.trim().split(' ').next()?.parse().ok()?;
        // /proc counts CPU time in USER_HZ, 100 on Linux.
        Some((ticks / 100.0, rss_kib * 1024))
    }
}

impl prometheus_client::collector::Collector for ProcessCollector {
    fn encode(&self, mut encoder: prometheus_client::encoding::DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric as _;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        let Some((cpu_seconds, resident_bytes)) = Self::read() else { return Ok(()) };
        let cpu = ConstCounter::new(cpu_seconds);
        cpu.encode(encoder.encode_descriptor("process_cpu_seconds", "CPU time used", None, cpu.metric_type())?)?;
        let memory = ConstGauge::new(resident_bytes);
        memory.encode(encoder.encode_descriptor(
            "process_resident_memory_bytes",
            "Resident memory",
            None,
            memory.metric_type(),
        )?)?;
        Ok(())
    }
}

impl Metrics {
    /// A MyDatabase's newest backup, from its status (none yet: no series).
    pub fn record_backup(&self, namespace: &str, name: &str, finished_at: Option<i64>, size_bytes: Option<i64>) {
        let labels = DatabaseLabels { database_namespace: namespace.into(), database: name.into() };
        if let Some(at) = finished_at {
            self.last_backup_timestamp.get_or_create(&labels).set(at);
        }
        if let Some(size) = size_bytes {
            self.last_backup_size.get_or_create(&labels).set(size);
        }
    }

    /// A MyDatabase that is gone: its series go too.
    pub fn forget_database(&self, namespace: &str, name: &str) {
        let labels = DatabaseLabels { database_namespace: namespace.into(), database: name.into() };
        self.last_backup_timestamp.remove(&labels);
        self.last_backup_size.remove(&labels);
    }

    /// Renders the registry in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_names_follow_prometheus_conventions() {
        let metrics = Metrics::default();
        metrics.reconciles.get_or_create(&ControllerLabels { controller: "webapp" }).inc();
        metrics
            .drift_corrections
            .get_or_create(&DriftLabels { kind: "Deployment".into(), field: "spec.replicas".into() })
            .inc();
        metrics.reconcile_duration.get_or_create(&ControllerLabels { controller: "webapp" }).observe(0.01);
        let text = metrics.render();
        assert!(text.contains("keelson_reconcile_total{controller=\"webapp\"} 1"), "{text}");
        assert!(
            text.contains("keelson_drift_corrections_total{kind=\"Deployment\",field=\"spec.replicas\"} 1"),
            "{text}"
        );
        assert!(text.contains("# TYPE keelson_reconcile_duration_seconds histogram"), "{text}");
        assert!(text.contains(&format!("keelson_build_info{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"))), "{text}");
        assert!(text.contains("keelson_process_cpu_seconds_total "), "{text}");
        assert!(text.lines().any(|l| l.starts_with("keelson_process_resident_memory_bytes ")), "{text}");
    }
}
