//! The instance manager: `keelson instance run` beside PostgreSQL in each
//! MyDatabase pod. It looks at the local server over the pod's socket and
//! reports what it sees on its own pod (`api::instance`), so that the
//! operator learns roles, positions and versions from its pod cache without
//! ever connecting to a pod. `keelson instance install` copies this binary
//! into the pod (an init container of the operator's image, as CloudNativePG
//! does), so the PostgreSQL image needs nothing of ours.
//!
//! Writes are few: a report goes out when something other than a position
//! changed, positions alone at most every `POSITIONS_EVERY`, and nothing while
//! the server is idle.
//!
//! It also watches its own pod for what the operator decides: the role label
//! the synchronous standbys, a failover's hold and the primary to stream from,
//! which it writes as files into the folder PostgreSQL's container shares
//! (`role`, `synchronous-standbys`, `hold`, `upstream`), where
//! `keelson-postgres.sh` acts on them (promote, step down, reconfigure); and
//! the position request of a failover, which it answers at once.

pub mod lease;
pub mod metrics;
pub mod probe;
pub mod upgrade;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::api::instance::{
    ANNOTATION, FENCE, HOLD_STREAMING, INSTANCES, InstanceReport, LEASE, MANAGER_IMAGE, POSITION_REQUEST, ROLE_LABEL,
    Role, SYNCHRONOUS_STANDBYS, UPSTREAM, UPSTREAM_SSLMODE,
};
use lease::{FENCE_LOOK_EVERY, Lease};
use probe::Server;

pub const FIELD_MANAGER: &str = "keelson-instance";
const LOOK_EVERY: Duration = Duration::from_secs(1);
const POSITIONS_EVERY: Duration = Duration::from_secs(5);
/// How long a lease renewal may take before it counts as failed.
const RENEW_TIMEOUT: Duration = Duration::from_secs(1);
/// Where PostgreSQL's container says it (re)started (in the socket folder both share).
const BOOT_FILE: &str = ".keelson-boot";
/// How often a replica told to hold is looked at until it holds.
const HOLD_LOOK_EVERY: Duration = Duration::from_millis(200);
/// One call to the API server may take this long.
const LOOK_TIMEOUT: Duration = Duration::from_secs(2);
/// One look at the server may take this long: a server that takes longer does not answer.
/// Its second half asks whether the server responds at all (see `probe::Server::look`).
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// A server that answered before and has not for this long, and does not
/// respond to a connection attempt either, is reported unresponsive (a hung
/// primary is failed over on it). With 3 s, a just-promoted primary on a loaded
/// node (its checkpoint's I/O, 20 servers starting beside it) was fenced seconds
/// after its promotion, and the failover that followed cascaded.
const UNRESPONSIVE_AFTER: Duration = Duration::from_secs(6);
/// ... and one that still responds to a connection attempt but gives no
/// answer (busy: a checkpoint's I/O on a loaded node; or a stalled disk),
/// after this long. Under CI load, 3 s without an answer fenced healthy
/// primaries right after their promotion's checkpoint.
const BUSY_UNRESPONSIVE_AFTER: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    #[error("{0} is not set (the pod's downward API gives it)")]
    MissingEnv(&'static str),
    #[error("cannot reach the API server: {0}")]
    Client(#[source] kube::Error),
    #[error("cannot write {path}: {source}")]
    Orders {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the password from stdin: {0}")]
    ReadPassword(#[source] std::io::Error),
    #[error("cannot copy {from} to {to}: {source}")]
    Install {
        from: String,
        to: String,
        #[source]
        source: std::io::Error,
    },
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// This pod's name.
    #[arg(long, env = "POD_NAME")]
    pub pod: Option<String>,
    /// This pod's namespace.
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,
    /// The local server's socket folder.
    #[arg(long, env = "PGHOST", default_value = "/var/run/postgresql")]
    pub socket_dir: String,
    #[arg(long, env = "PGPORT", default_value_t = 5432)]
    pub port: u16,
    /// The folder of psql; empty: from PATH.
    #[arg(long, env = "PGBIN", default_value = "")]
    pub bin_dir: String,
    /// Where the operator's decisions are written for PostgreSQL's container.
    #[arg(long, env = "ORDERS_DIR", default_value = "/keelson")]
    pub orders_dir: std::path::PathBuf,
}

/// Writes what the operator decided for this pod as files, when it changed.
/// The hold and the upstream are written empty when the operator removed them.
fn write_orders(dir: &Path, pod: &Pod) -> Result<(), InstanceError> {
    let none = String::new();
    let fence = pod.annotations().get(FENCE);
    // The upstream before the hold (a lifted hold is never read with the old primary's address),
    // and the hold before the role (a held replica never starts as an unheld one).
    let orders = [
        ("upstream-sslmode", Some(pod.annotations().get(UPSTREAM_SSLMODE).unwrap_or(&none))),
        ("upstream", Some(pod.annotations().get(UPSTREAM).unwrap_or(&none))),
        ("hold", Some(pod.annotations().get(HOLD_STREAMING).unwrap_or(&none))),
        // A fence before the role (a fenced instance never starts in a new role first); its
        // removal after it (an unfenced one starts in the role of this same look).
        ("maintenance-fence", fence.filter(|why| !why.is_empty())),
        ("role", pod.labels().get(ROLE_LABEL)),
        ("maintenance-fence", Some(fence.unwrap_or(&none))),
        ("synchronous-standbys", pod.annotations().get(SYNCHRONOUS_STANDBYS)),
    ];
    for (file, value) in orders {
        let Some(value) = value else { continue };
        write_order(dir, file, value)?;
    }
    Ok(())
}

/// Writes one order file (atomically), when it changed.
fn write_order(dir: &Path, file: &str, value: &str) -> Result<(), InstanceError> {
    let path = dir.join(file);
    if std::fs::read_to_string(&path).ok().as_deref() == Some(value) {
        return Ok(());
    }
    let error = |source| InstanceError::Orders { path: path.display().to_string(), source };
    let partial = dir.join(format!(".{file}.partial"));
    std::fs::write(&partial, value).map_err(error)?;
    std::fs::rename(&partial, &path).map_err(error)?;
    tracing::info!(file, value, "new order");
    Ok(())
}

/// What the manager itself needs of the operator's decisions for this pod.
#[derive(Clone, Copy, Debug, Default)]
struct Orders {
    /// Labelled primary.
    primary: bool,
    /// Told to hold for a failover.
    holding: bool,
    /// It has others that could take over: synchronous standbys named for it, or
    /// more than one instance (`INSTANCES`), whether or not any streamed yet.
    standbys_named: bool,
    /// Fenced for maintenance: its server is stopped on purpose.
    fenced: bool,
}

/// Writes the orders `pod` carries (see `write_orders`) and returns what the manager needs of them.
fn take_orders(dir: &Path, pod: &Pod) -> Result<Orders, InstanceError> {
    write_orders(dir, pod)?;
    Ok(Orders {
        primary: pod.labels().get(ROLE_LABEL).map(String::as_str) == Some("primary"),
        holding: pod.annotations().contains_key(HOLD_STREAMING),
        standbys_named: pod.annotations().get(SYNCHRONOUS_STANDBYS).is_some_and(|names| !names.is_empty())
            || pod.annotations().get(INSTANCES).and_then(|n| n.parse::<u32>().ok()).is_some_and(|n| n > 1),
        fenced: pod.annotations().get(FENCE).is_some_and(|why| !why.is_empty()),
    })
}

fn lock(lease: &Mutex<Lease>) -> MutexGuard<'_, Lease> {
    lease.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The fence order and the manager's heartbeat, on a timer of their own: a
/// look at a hung server or a slow API call never puts them off. PostgreSQL's
/// container stops a primary whose manager's heartbeat goes stale (the
/// manager is down or stuck), as it stops a fenced one.
async fn watch_fence(lease: Arc<Mutex<Lease>>, dir: PathBuf) {
    let mut ticks = tokio::time::interval(FENCE_LOOK_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let heartbeat = dir.join("heartbeat");
    for beat in 0u64.. {
        ticks.tick().await;
        let fence = lock(&lease).fence(Instant::now());
        if let Err(error) = write_order(&dir, "fence", fence.as_deref().unwrap_or_default()) {
            tracing::warn!(%error, "cannot write the fence order");
        }
        // Its age is what counts (the file's modification time), once a second.
        if beat % 5 == 0
            && let Err(error) = std::fs::write(&heartbeat, beat.to_string())
        {
            tracing::warn!(%error, path = %heartbeat.display(), "cannot write the heartbeat");
        }
    }
}

/// Decides which looks become reports.
#[derive(Default)]
pub struct Reporter {
    last: Option<(InstanceReport, Instant)>,
    /// The last report did not reach the API server.
    unsent: bool,
}

impl Reporter {
    /// The report to send for what was just seen, if any.
    pub fn consider(&mut self, seen: &InstanceReport, now: Instant) -> bool {
        let send = match &self.last {
            _ if self.unsent => true,
            None => true,
            Some((last, _)) if !last.same_shape(seen) => true,
            Some((last, at)) => last != seen && now.duration_since(*at) >= POSITIONS_EVERY,
        };
        if send {
            self.last = Some((seen.clone(), now));
            self.unsent = false;
        }
        send
    }

    /// The last report, marked fenced, when it is not yet (the server was
    /// stopped for maintenance) or has not reached the API server.
    pub fn fenced(&self) -> Option<InstanceReport> {
        let (last, _) = self.last.as_ref()?;
        match last.fenced {
            true => self.unsent.then(|| last.clone()),
            false => Some(InstanceReport { fenced: true, unresponsive: false, ..last.clone() }),
        }
    }

    /// The API server refused the report, or did not answer: send it again next time.
    pub fn forget(&mut self) {
        self.unsent = true;
    }

    /// The server has not answered since `answered_last`: the last report,
    /// marked unresponsive, once that has lasted `UNRESPONSIVE_AFTER` (never
    /// before the server first answered: one starting up is not hung); again
    /// while that report has not reached the API server (a hung primary is
    /// failed over on it, so it must not be lost to one failed call).
    pub fn silence(&self, answered_last: Option<Instant>, now: Instant, after: Duration) -> Option<InstanceReport> {
        let (last, _) = self.last.as_ref()?;
        if last.fenced {
            // Stopped on purpose: said once; the operator fails nothing over for it.
            return self.unsent.then(|| last.clone());
        }
        if last.unresponsive {
            return self.unsent.then(|| last.clone());
        }
        if now.duration_since(answered_last?) < after {
            return None;
        }
        Some(InstanceReport { unresponsive: true, ..last.clone() })
    }
}

/// Runs until SIGTERM: look, report what changed, wait.
pub async fn run(args: RunArgs) -> Result<(), InstanceError> {
    let pod = args.pod.ok_or(InstanceError::MissingEnv("POD_NAME"))?;
    let namespace = args.namespace.ok_or(InstanceError::MissingEnv("POD_NAMESPACE"))?;
    let client = Client::try_default().await.map_err(InstanceError::Client)?;
    let pods: Api<Pod> = Api::namespaced(client, &namespace);
    let server = Server { socket_dir: args.socket_dir, port: args.port, bin_dir: args.bin_dir };
    let mut reporter = Reporter::default();
    let mut failing_since: Option<Instant> = None;
    let mut answered_last: Option<Instant> = None;
    // The position request answered last (sticky in every later report).
    let mut answering: Option<String> = None;
    // Where this binary lives: a new one installed beside it is taken up in place (`upgrade`).
    let exe = std::env::current_exe().ok();
    let manager_image = exe.as_deref().and_then(upgrade::installed_image);
    tracing::info!(namespace, pod, image = manager_image.as_deref().unwrap_or("unknown"), "instance manager started");
    let own_pod = watcher::Config::default().fields(&format!("metadata.name={pod}"));
    let mut orders = watcher(pods.clone(), own_pod).default_backoff().applied_objects().boxed();
    let stop = crate::operator::termination_signal();
    tokio::pin!(stop);
    // Told to hold, the server lets go of its upstream within a moment: look
    // often until it has, so that the final position reaches the operator at once.
    let mut final_position = false;
    let mut seen_orders = Orders::default();
    let mut was_fenced = false;
    // PostgreSQL's metrics for Prometheus, beside the reports (`metrics`).
    let _metrics = AbortOnDrop(tokio::spawn(metrics::serve(server.clone())));
    let lease = Arc::new(Mutex::new(Lease::new(Instant::now())));
    let fence = tokio::spawn(watch_fence(lease.clone(), args.orders_dir.clone()));
    let _fence = AbortOnDrop(fence);
    let mut renew_failed_at: Option<Instant> = None;
    let params = PatchParams::apply(FIELD_MANAGER);
    let mut looked = tokio::time::Instant::now();
    loop {
        // Events on the pod do not put the next look off.
        let look_in = if seen_orders.holding && !final_position { HOLD_LOOK_EVERY } else { LOOK_EVERY };
        tokio::select! {
            _ = &mut stop => return Ok(()),
            _ = tokio::time::sleep_until(looked + look_in) => {}
            event = orders.next() => match event {
                Some(Ok(own)) => {
                    seen_orders = take_orders(&args.orders_dir, &own)?;
                    let request = own.annotations().get(POSITION_REQUEST).cloned();
                    if request.is_none() || request == answering {
                        continue;
                    }
                    answering = request;
                    tracing::info!(namespace, pod, request = ?answering, "position requested");
                }
                Some(Err(error)) => {
                    tracing::warn!(namespace, pod, %error, "watching this pod failed; retrying");
                    continue;
                }
                None => return Ok(()),
            },
        }
        looked = tokio::time::Instant::now();
        if was_fenced && !seen_orders.fenced {
            // Unfenced: the server starts again, and is not hung until it has answered once.
            answered_last = None;
        }
        was_fenced = seen_orders.fenced;
        if let Some(exe) = &exe
            && let Some(next) = upgrade::waiting(exe)
        {
            tracing::info!(namespace, pod, image = ?upgrade::installed_image(&next), "taking up a new instance manager in place");
            let error = upgrade::take_up(exe, &next).await;
            tracing::error!(namespace, pod, %error, "cannot take up the new instance manager; this one carries on");
        }
        let probed = server.look(PROBE_TIMEOUT).await;
        // The lease first: a look at a hung server must not hold it up.
        let replica_streaming = probed
            .as_ref()
            .is_ok_and(|seen| seen.role == Role::Primary && seen.replicas.iter().any(|r| r.state == "streaming"));
        lock(&lease).observe(seen_orders.primary, replica_streaming, seen_orders.standbys_named, Instant::now());
        let due = if seen_orders.primary { lock(&lease).due(Instant::now()) } else { None };
        if let Some(count) = due {
            let sent = Instant::now();
            let patch = Patch::Merge(json!({"metadata": {"annotations": {LEASE: count.to_string()}}}));
            let renewal = pods.patch(&pod, &params, &patch);
            // Short: while renewals fail, reports wait (see below), and looks go on.
            match tokio::time::timeout(RENEW_TIMEOUT, renewal).await {
                Ok(Ok(own)) => {
                    renew_failed_at = None;
                    // The pod as it is now, before the fence may lift: a cut-off primary
                    // learns it was replaced before it unfences.
                    seen_orders = take_orders(&args.orders_dir, &own)?;
                    let mut lease = lock(&lease);
                    let now = Instant::now();
                    lease.observe(seen_orders.primary, replica_streaming, seen_orders.standbys_named, now);
                    lease.renewed(sent);
                }
                failed => {
                    let error = match failed {
                        Ok(Err(error)) => error.to_string(),
                        _ => format!("no answer within {RENEW_TIMEOUT:?}"),
                    };
                    if renew_failed_at.is_none_or(|at| at.elapsed() >= Duration::from_secs(30)) {
                        tracing::warn!(namespace, pod, error, "could not renew the primary lease");
                        renew_failed_at = Some(Instant::now());
                    }
                }
            }
        }
        // A new start of PostgreSQL's container (or of its server, after a fence: the script
        // removes the acknowledgement) waits for its orders to be read anew.
        let boot = std::fs::read_to_string(Path::new(&server.socket_dir).join(BOOT_FILE)).unwrap_or_default();
        let acknowledged = std::fs::read_to_string(args.orders_dir.join("ack")).unwrap_or_default();
        if !boot.is_empty() && boot != acknowledged {
            // A list by name: the Role grants list and watch, not get.
            let by_name = kube::api::ListParams::default().fields(&format!("metadata.name={pod}"));
            match tokio::time::timeout(LOOK_TIMEOUT, pods.list(&by_name)).await {
                Ok(Ok(list)) => {
                    let Some(own) = list.items.first() else {
                        return Err(InstanceError::MissingEnv("POD_NAME (naming a pod that exists)"));
                    };
                    seen_orders = take_orders(&args.orders_dir, own)?;
                    write_order(&args.orders_dir, "ack", &boot)?;
                }
                Ok(Err(error)) => tracing::warn!(namespace, pod, %error, "cannot read this pod"),
                Err(_) => tracing::warn!(namespace, pod, "cannot read this pod: no answer within {LOOK_TIMEOUT:?}"),
            }
        }
        let seen = match probed {
            Ok(mut seen) => {
                final_position = seen.held && !seen.streaming;
                failing_since = None;
                answered_last = Some(Instant::now());
                seen.answering = answering.clone();
                reporter.consider(&seen, Instant::now()).then_some(seen)
            }
            // Starting, restarting or recovering (the pod's readiness says so), or hung.
            Err(probe::Unanswered { error, responds }) => {
                let since = *failing_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= Duration::from_secs(30) {
                    tracing::warn!(namespace, pod, %error, responds, "PostgreSQL does not answer");
                    failing_since = Some(Instant::now());
                }
                let after = if responds { BUSY_UNRESPONSIVE_AFTER } else { UNRESPONSIVE_AFTER };
                let silent = match seen_orders.fenced {
                    true => reporter.fenced(),
                    false => reporter.silence(answered_last, Instant::now(), after),
                };
                if let Some(silent) = &silent {
                    match silent.fenced {
                        true => tracing::info!(namespace, pod, "PostgreSQL stopped: fenced for maintenance"),
                        false => {
                            tracing::warn!(namespace, pod, %error, responds, "PostgreSQL stopped answering: reporting it unresponsive")
                        }
                    }
                    reporter.consider(silent, Instant::now());
                }
                silent
            }
        };
        let Some(seen) = seen else { continue };
        // A primary that cannot renew cannot report either: no 2 s wait that would hold up its fence.
        if seen_orders.primary && renew_failed_at.is_some() {
            reporter.forget();
            continue;
        }
        let patch = Patch::Merge(json!({"metadata": {"annotations": {
            ANNOTATION: serde_json::to_string(&seen).unwrap_or_default(),
            MANAGER_IMAGE: manager_image,
        }}}));
        let report = pods.patch(&pod, &params, &patch);
        match tokio::time::timeout(LOOK_TIMEOUT, report).await {
            Ok(Ok(_)) => tracing::debug!(namespace, pod, role = ?seen.role, lsn = seen.lsn, "reported"),
            Ok(Err(error)) => {
                tracing::warn!(namespace, pod, %error, "could not report");
                reporter.forget();
            }
            Err(_) => {
                tracing::warn!(namespace, pod, "could not report: no answer within {LOOK_TIMEOUT:?}");
                reporter.forget();
            }
        }
    }
}

/// Stops the fence's timer when the manager ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The SCRAM-SHA-256 verifier of `password`, as PostgreSQL stores it (random salt, 4096 iterations).
pub fn scram_verifier(password: &[u8]) -> String {
    postgres_protocol::password::scram_sha_256(password)
}

/// Reads a password from stdin (all of it, as the mounted Secret's file holds it) and prints its verifier.
pub fn print_scram_verifier() -> Result<(), InstanceError> {
    use std::io::Read as _;
    let mut password = Vec::new();
    std::io::stdin().read_to_end(&mut password).map_err(InstanceError::ReadPassword)?;
    println!("{}", scram_verifier(&password));
    Ok(())
}

/// Copies the running binary to `to` (an emptyDir the PostgreSQL container
/// mounts), and records `image` beside it (`upgrade::image_file`) first: a
/// running manager takes up a binary as soon as it sees it.
pub fn install(to: &Path, image: Option<&str>) -> Result<(), InstanceError> {
    let from = std::env::current_exe().map_err(|source| InstanceError::Install {
        from: "the running binary".into(),
        to: to.display().to_string(),
        source,
    })?;
    let error =
        |source| InstanceError::Install { from: from.display().to_string(), to: to.display().to_string(), source };
    if let Some(image) = image {
        let file = upgrade::image_file(to);
        let partial = PathBuf::from(format!("{}.partial", file.display()));
        std::fs::write(&partial, image).map_err(error)?;
        std::fs::rename(&partial, &file).map_err(error)?;
    }
    let partial = to.with_extension("partial");
    std::fs::copy(&from, &partial).map_err(error)?;
    std::fs::rename(&partial, to).map_err(error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scram_verifiers_are_salted_and_never_hold_the_password() {
        let first = scram_verifier(b"s3cret-password");
        assert!(first.starts_with("SCRAM-SHA-256$4096:"), "{first}");
        assert!(!first.contains("s3cret-password"));
        assert_ne!(first, scram_verifier(b"s3cret-password"), "a new salt each time");
    }
    use crate::api::instance::Role;

    fn primary(lsn: &str, lag: i64) -> InstanceReport {
        InstanceReport::primary_for_tests(lsn, &[("db-1", "streaming", lag)])
    }

    #[test]
    fn a_primary_of_several_instances_counts_as_having_others_with_no_standby_named() {
        let dir = std::env::temp_dir().join(format!("keelson-orders-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("orders dir");
        let pod = |annotations: &[(&str, &str)]| {
            let mut pod = Pod::default();
            pod.metadata.labels = Some([(ROLE_LABEL.to_string(), "primary".to_string())].into());
            pod.metadata.annotations = Some(annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
            pod
        };
        // Going on alone (no standby named): with others, its lease fences it when cut off.
        let alone = take_orders(&dir, &pod(&[(SYNCHRONOUS_STANDBYS, ""), (INSTANCES, "2")])).expect("orders");
        assert!(alone.primary && alone.standbys_named);
        let single = take_orders(&dir, &pod(&[(SYNCHRONOUS_STANDBYS, ""), (INSTANCES, "1")])).expect("orders");
        assert!(!single.standbys_named, "one instance: nobody could take over");
        let named = take_orders(&dir, &pod(&[(SYNCHRONOUS_STANDBYS, r#"ANY 1 ("db-1")"#)])).expect("orders");
        assert!(named.standbys_named, "an operator from before the count names its standbys");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn positions_alone_are_reported_at_most_every_few_seconds() {
        let mut reporter = Reporter::default();
        let start = Instant::now();
        assert!(reporter.consider(&primary("0/100", 0), start), "the first look is reported");
        assert!(!reporter.consider(&primary("0/100", 0), start + Duration::from_secs(60)), "nothing changed");
        assert!(!reporter.consider(&primary("0/200", 64), start + Duration::from_secs(1)), "too soon");
        assert!(reporter.consider(&primary("0/200", 64), start + POSITIONS_EVERY), "positions moved");
    }

    #[test]
    fn a_new_role_or_a_lost_replica_is_reported_at_once() {
        let mut reporter = Reporter::default();
        let start = Instant::now();
        assert!(reporter.consider(&primary("0/100", 0), start));
        let mut alone = primary("0/100", 0);
        alone.replicas.clear();
        assert!(reporter.consider(&alone, start + Duration::from_millis(10)));
        let replica = InstanceReport { role: Role::Replica, streaming: true, replicas: vec![], ..primary("0/100", 0) };
        assert!(reporter.consider(&replica, start + Duration::from_millis(20)));
        reporter.forget();
        assert!(reporter.consider(&replica, start + Duration::from_millis(30)), "a refused report is sent again");
    }

    #[test]
    fn a_server_fenced_for_maintenance_is_reported_fenced_never_unresponsive() {
        let mut reporter = Reporter::default();
        let start = Instant::now();
        assert!(reporter.consider(&primary("0/100", 0), start));
        let fenced = reporter.fenced().expect("said at once");
        assert!(fenced.fenced && !fenced.unresponsive, "{fenced:?}");
        assert!(reporter.consider(&fenced, start), "a change of shape: sent at once");
        assert_eq!(reporter.fenced(), None, "once it arrived, once");
        // Long silent, it is still not taken for hung (and failed over).
        assert_eq!(reporter.silence(Some(start), start + UNRESPONSIVE_AFTER * 10, UNRESPONSIVE_AFTER), None);
        reporter.forget();
        assert!(reporter.fenced().is_some_and(|r| r.fenced), "a report that did not arrive is sent again");
        // Unfenced and answering again: an ordinary report.
        assert!(reporter.consider(&primary("0/200", 0), start + Duration::from_secs(1)));
    }

    #[test]
    fn an_unresponsive_report_that_did_not_arrive_is_sent_again() {
        let mut reporter = Reporter::default();
        let start = Instant::now();
        assert!(reporter.consider(&primary("0/100", 0), start));
        let later = start + UNRESPONSIVE_AFTER;
        let silent = reporter.silence(Some(start), later, UNRESPONSIVE_AFTER).expect("unresponsive");
        assert!(reporter.consider(&silent, later));
        reporter.forget(); // the API server did not answer
        let again = reporter.silence(Some(start), later, UNRESPONSIVE_AFTER).expect("sent again");
        assert!(again.unresponsive && reporter.consider(&again, later));
        assert_eq!(reporter.silence(Some(start), later, UNRESPONSIVE_AFTER), None, "once it arrived, once");
    }

    #[test]
    fn a_server_that_stops_answering_is_reported_unresponsive_once() {
        let mut reporter = Reporter::default();
        let start = Instant::now();
        assert_eq!(
            reporter.silence(None, start + Duration::from_secs(60), UNRESPONSIVE_AFTER),
            None,
            "nothing reported yet"
        );
        assert!(reporter.consider(&primary("0/100", 0), start));
        assert_eq!(
            reporter.silence(None, start + Duration::from_secs(60), UNRESPONSIVE_AFTER),
            None,
            "never answered: starting"
        );
        assert_eq!(reporter.silence(Some(start), start + Duration::from_secs(1), UNRESPONSIVE_AFTER), None, "too soon");
        let silent =
            reporter.silence(Some(start), start + UNRESPONSIVE_AFTER, UNRESPONSIVE_AFTER).expect("unresponsive");
        assert!(silent.unresponsive && silent.lsn == "0/100", "{silent:?}");
        assert!(reporter.consider(&silent, start + UNRESPONSIVE_AFTER), "a change of shape: sent at once");
        assert_eq!(
            reporter.silence(Some(start), start + UNRESPONSIVE_AFTER * 2, UNRESPONSIVE_AFTER),
            None,
            "said once"
        );
        assert!(reporter.consider(&primary("0/100", 0), start + UNRESPONSIVE_AFTER * 3), "answering again");
    }
}
