//! Which standbys confirm a commit, and, with `replication: Preferred`, when
//! the primary may stop waiting for them.
//!
//! A primary names its standbys (`ANY 1` of the others): a commit is
//! acknowledged once one of them has it, so the most advanced replica holds
//! every acknowledged commit. Preferred gives that up only while no standby
//! streams, and only after saying so where a failover reads it: Keelson
//! writes `status.asynchronous` first, then tells the primary to stop
//! waiting. While it is set the primary alone may hold the newest commits,
//! so a lost primary is not failed over automatically. It is removed once a
//! named standby has received everything the primary wrote after it waited
//! again. Pure: the reconcile does the I/O.

use std::time::{Duration, Instant};

use crate::api::instance::{InstanceReport, Role};
use crate::api::mydatabase::{AsynchronousPeriod, MyDatabase, ReplicationMode};

use super::failover::parse_lsn;
use crate::mydatabase::names;

/// With `Preferred`, how long no standby may stream before the primary stops waiting.
pub const PREFERRED_WAIT: Duration = Duration::from_secs(5);
/// How long after the primary applies its standbys again its position is taken as
/// the mark a standby must reach: a reload reaches the process that makes commits
/// wait a moment after the session that reports it.
const SETTLE: Duration = Duration::from_secs(2);
/// A primary's report unchanged for this long means no WAL was written since its
/// look: its manager sends changed positions at least this often (`POSITIONS_EVERY`
/// in `instance`, 5 s, with room for the API server).
const UNCHANGED: Duration = Duration::from_secs(8);

/// The standbys `primary` names: every other instance, by name. Empty when
/// the spec asks for asynchronous replication, or for one instance. Two
/// instances are synchronous too: the replica must confirm each commit.
pub fn standbys(db: &MyDatabase, primary: &str) -> Vec<String> {
    if db.spec.replication == ReplicationMode::Asynchronous || db.spec.replicas < 2 {
        return Vec::new();
    }
    let statefulset = names::statefulset(db);
    (0..db.spec.replicas).map(|ordinal| format!("{statefulset}-{ordinal}")).filter(|name| name != primary).collect()
}

/// `synchronous_standby_names` for `pod` when it is the primary: `ANY 1` of
/// [`standbys`], by name (not `*`: a pg_basebackup or backup stream must never
/// count as the standby that confirmed a commit). Empty while `asynchronous`
/// is recorded for this pod and none of them streams (`streaming`, as the
/// primary reports it).
pub fn standby_names(
    db: &MyDatabase,
    pod: &str,
    asynchronous: Option<&AsynchronousPeriod>,
    streaming: &[String],
) -> String {
    let standbys = standbys(db, pod);
    let stopped_waiting = db.spec.replication == ReplicationMode::Preferred
        && asynchronous.is_some_and(|period| period.primary == pod)
        && !standbys.iter().any(|name| streaming.contains(name));
    if standbys.is_empty() || stopped_waiting {
        return String::new();
    }
    let quoted: Vec<String> = standbys.iter().map(|name| format!("\"{name}\"")).collect();
    format!("ANY 1 ({})", quoted.join(", "))
}

/// The standbys a primary's report shows streaming from it.
pub fn streaming(report: Option<&InstanceReport>) -> Vec<String> {
    report
        .map(|r| r.replicas.iter().filter(|r| r.state == "streaming").map(|r| r.name.clone()).collect())
        .unwrap_or_default()
}

/// What this operator process saw of one database's primary, between reconciles.
#[derive(Clone, Debug, Default)]
pub struct Watch {
    /// Since when no named standby has streamed.
    alone_since: Option<Instant>,
    /// When the primary was first seen waiting for its standbys again, and that
    /// report's position (the mark must come from a later look).
    waiting_since: Option<(Instant, u64)>,
    /// The primary's position once it waited again (after `SETTLE`): a standby
    /// past it holds every commit acknowledged without one.
    mark: Option<u64>,
}

#[cfg(test)]
impl Watch {
    /// No standby seen streaming since `at`.
    pub fn alone_since(at: Instant) -> Self {
        Watch { alone_since: Some(at), ..Default::default() }
    }
}

/// What to record about the primary's durability.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    Nothing,
    /// No standby has streamed for `PREFERRED_WAIT`: record `status.asynchronous`
    /// (then the primary stops waiting).
    StopWaiting,
    /// A standby has every commit again (or the record no longer applies): remove it.
    Confirmed,
}

/// The next change for `primary` with `report` its latest report, and when to
/// look again if nothing changes before.
pub fn step(
    db: &MyDatabase,
    primary: &str,
    recorded: Option<&AsynchronousPeriod>,
    report: Option<&InstanceReport>,
    watch: &mut Watch,
    now: Instant,
) -> (Change, Option<Duration>) {
    let standbys = standbys(db, primary);
    let preferred = db.spec.replication == ReplicationMode::Preferred && !standbys.is_empty();
    if let Some(period) = recorded
        && (period.primary != primary || db.spec.replication == ReplicationMode::Asynchronous || standbys.is_empty())
    {
        // Another primary (promoted with its standbys named), or nothing is ever confirmed now.
        *watch = Watch::default();
        return (Change::Confirmed, None);
    }
    let Some(report) = report.filter(|r| r.role == Role::Primary && !r.unresponsive) else {
        return (Change::Nothing, None);
    };
    let streaming: Vec<&crate::api::instance::ReplicaReport> =
        report.replicas.iter().filter(|r| r.state == "streaming" && standbys.contains(&r.name)).collect();
    let Some(_) = recorded else {
        watch.waiting_since = None;
        watch.mark = None;
        if !preferred || !streaming.is_empty() {
            watch.alone_since = None;
            return (Change::Nothing, None);
        }
        let alone = now.saturating_duration_since(*watch.alone_since.get_or_insert(now));
        return match PREFERRED_WAIT.checked_sub(alone) {
            Some(left) if !left.is_zero() => (Change::Nothing, Some(left)),
            _ => (Change::StopWaiting, None),
        };
    };
    watch.alone_since = None;
    let names: Vec<String> = streaming.iter().map(|r| r.name.clone()).collect();
    let waiting = !names.is_empty()
        && report.synchronous_standby_names.as_deref() == Some(standby_names(db, primary, recorded, &names).as_str());
    if !waiting {
        watch.waiting_since = None;
        watch.mark = None;
        return (Change::Nothing, None);
    }
    let Some(position) = parse_lsn(&report.lsn) else { return (Change::Nothing, None) };
    let (since, first) = *watch.waiting_since.get_or_insert((now, position));
    let Some(mark) = watch.mark else {
        // A later look of the primary's, taken once the reload settled (another position), or
        // the same look unchanged for so long that nothing was written since.
        let settled = now.saturating_duration_since(since);
        if (settled >= SETTLE && position != first) || settled >= UNCHANGED {
            watch.mark = Some(position);
        }
        // Positions arrive every few seconds; look again then.
        return (Change::Nothing, Some(Duration::from_secs(1)));
    };
    // A standby's replayed position, from the same look: behind what it flushed, so never too far.
    let caught_up = streaming
        .iter()
        .any(|r| r.lag_bytes.is_some_and(|lag| lag >= 0 && position.saturating_sub(lag as u64) >= mark));
    match caught_up {
        true => {
            *watch = Watch::default();
            (Change::Confirmed, None)
        }
        false => (Change::Nothing, Some(Duration::from_secs(1))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::mydatabase::MyDatabaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn database(mode: ReplicationMode, replicas: i32) -> MyDatabase {
        let spec: MyDatabaseSpec = serde_json::from_value(serde_json::json!({
            "replicas": replicas, "version": "15", "storage": "1Gi", "replication": mode,
        }))
        .unwrap();
        let mut db = MyDatabase::new("db", spec);
        db.metadata.namespace = Some("ns".into());
        db
    }

    fn primary_report(lsn: &str, names: &str, replicas: &[(&str, &str, i64)]) -> InstanceReport {
        InstanceReport {
            synchronous_standby_names: Some(names.into()),
            ..InstanceReport::primary_for_tests(lsn, replicas)
        }
    }

    fn period(primary: &str) -> AsynchronousPeriod {
        AsynchronousPeriod { primary: primary.into(), since: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH) }
    }

    #[test]
    fn standbys_are_named_and_dropped_only_while_recorded_and_none_streams() {
        let db = database(ReplicationMode::Preferred, 2);
        assert_eq!(standby_names(&db, "db-0", None, &[]), r#"ANY 1 ("db-1")"#, "not recorded: it waits");
        assert_eq!(standby_names(&db, "db-0", Some(&period("db-0")), &[]), "", "recorded: it stops waiting");
        assert_eq!(
            standby_names(&db, "db-0", Some(&period("db-0")), &["db-1".into()]),
            r#"ANY 1 ("db-1")"#,
            "a standby streams again: it waits again"
        );
        assert_eq!(standby_names(&db, "db-1", Some(&period("db-0")), &[]), r#"ANY 1 ("db-0")"#, "another pod");
        let required = database(ReplicationMode::Synchronous, 2);
        assert_eq!(standby_names(&required, "db-0", Some(&period("db-0")), &[]), r#"ANY 1 ("db-1")"#);
        let three = database(ReplicationMode::Synchronous, 3);
        assert_eq!(standby_names(&three, "db-1", None, &[]), r#"ANY 1 ("db-0", "db-2")"#, "the others, by name");
        assert_eq!(standby_names(&database(ReplicationMode::Asynchronous, 3), "db-0", None, &[]), "");
        assert_eq!(standby_names(&database(ReplicationMode::Preferred, 1), "db-0", None, &[]), "");
    }

    #[test]
    fn preferred_stops_waiting_only_after_no_standby_streamed_for_the_wait() {
        let db = database(ReplicationMode::Preferred, 2);
        let mut watch = Watch::default();
        let start = Instant::now();
        let streaming = primary_report("0/5000000", r#"ANY 1 ("db-1")"#, &[("db-1", "streaming", 0)]);
        assert_eq!(step(&db, "db-0", None, Some(&streaming), &mut watch, start).0, Change::Nothing);
        let alone = primary_report("0/5000000", r#"ANY 1 ("db-1")"#, &[("db-1", "catchup", 4096)]);
        let (change, again) = step(&db, "db-0", None, Some(&alone), &mut watch, start);
        assert_eq!((change, again), (Change::Nothing, Some(PREFERRED_WAIT)));
        let later = start + PREFERRED_WAIT - Duration::from_millis(1);
        assert_eq!(step(&db, "db-0", None, Some(&alone), &mut watch, later).0, Change::Nothing);
        // A stream in between starts the wait again.
        step(&db, "db-0", None, Some(&streaming), &mut watch, later);
        assert_eq!(step(&db, "db-0", None, Some(&alone), &mut watch, start + PREFERRED_WAIT).0, Change::Nothing);
        let end = start + PREFERRED_WAIT * 2;
        assert_eq!(step(&db, "db-0", None, Some(&alone), &mut watch, end).0, Change::StopWaiting);
        // Required durability never stops waiting.
        let required = database(ReplicationMode::Synchronous, 2);
        let mut watch = Watch::default();
        step(&required, "db-0", None, Some(&alone), &mut watch, start);
        assert_eq!(step(&required, "db-0", None, Some(&alone), &mut watch, end).0, Change::Nothing);
    }

    #[test]
    fn the_record_goes_once_a_standby_passed_what_the_primary_wrote_when_it_waited_again() {
        let db = database(ReplicationMode::Preferred, 2);
        let recorded = period("db-0");
        let mut watch = Watch::default();
        let start = Instant::now();
        let names = r#"ANY 1 ("db-1")"#;
        // Streaming, but the primary does not wait for it yet: nothing proves the standby has the commits.
        let not_applied = primary_report("0/6000000", "", &[("db-1", "streaming", 0)]);
        assert_eq!(step(&db, "db-0", Some(&recorded), Some(&not_applied), &mut watch, start).0, Change::Nothing);
        let applied = primary_report("0/6000000", names, &[("db-1", "streaming", 0)]);
        let (change, _) = step(&db, "db-0", Some(&recorded), Some(&applied), &mut watch, start);
        assert_eq!(change, Change::Nothing, "the mark is taken only once the reload settled");
        // The same look again, after the settle time: not a later look, no mark yet.
        let settled = start + SETTLE;
        assert_eq!(step(&db, "db-0", Some(&recorded), Some(&applied), &mut watch, settled).0, Change::Nothing);
        let marked = primary_report("0/7000000", names, &[("db-1", "streaming", 0x200000)]);
        assert_eq!(step(&db, "db-0", Some(&recorded), Some(&marked), &mut watch, settled).0, Change::Nothing);
        // Replayed 0/7400000 - 0/600000 = 0/6E00000: short of the mark 0/7000000.
        let short = primary_report("0/7400000", names, &[("db-1", "streaming", 0x600000)]);
        assert_eq!(step(&db, "db-0", Some(&recorded), Some(&short), &mut watch, settled).0, Change::Nothing);
        let past = primary_report("0/7400000", names, &[("db-1", "streaming", 0x300000)]);
        assert_eq!(step(&db, "db-0", Some(&recorded), Some(&past), &mut watch, settled).0, Change::Confirmed);
    }

    #[test]
    fn a_stream_lost_before_the_mark_is_reached_starts_the_proof_again() {
        let db = database(ReplicationMode::Preferred, 2);
        let recorded = period("db-0");
        let mut watch = Watch::default();
        let start = Instant::now();
        let names = r#"ANY 1 ("db-1")"#;
        let applied = primary_report("0/6000000", names, &[("db-1", "streaming", 0)]);
        step(&db, "db-0", Some(&recorded), Some(&applied), &mut watch, start);
        step(&db, "db-0", Some(&recorded), Some(&applied), &mut watch, start + SETTLE);
        let gone = primary_report("0/6100000", "", &[]);
        step(&db, "db-0", Some(&recorded), Some(&gone), &mut watch, start + SETTLE);
        // Back: a position past the old mark does not count until a new mark settles. Nothing is
        // written (the same look stays): the mark is taken once that has lasted long enough.
        let back = primary_report("0/8000000", names, &[("db-1", "streaming", 0)]);
        let at = start + SETTLE * 2;
        assert_eq!(step(&db, "db-0", Some(&recorded), Some(&back), &mut watch, at).0, Change::Nothing);
        assert_eq!(step(&db, "db-0", Some(&recorded), Some(&back), &mut watch, at + SETTLE).0, Change::Nothing);
        assert_eq!(step(&db, "db-0", Some(&recorded), Some(&back), &mut watch, at + SETTLE).0, Change::Nothing);
        assert_eq!(step(&db, "db-0", Some(&recorded), Some(&back), &mut watch, at + UNCHANGED).0, Change::Nothing);
        assert_eq!(step(&db, "db-0", Some(&recorded), Some(&back), &mut watch, at + UNCHANGED).0, Change::Confirmed);
    }

    #[test]
    fn a_record_for_another_primary_or_mode_goes_at_once() {
        let mut watch = Watch::default();
        let db = database(ReplicationMode::Preferred, 2);
        let change = step(&db, "db-1", Some(&period("db-0")), None, &mut watch, Instant::now()).0;
        assert_eq!(change, Change::Confirmed, "a promoted primary names its standbys");
        let asynchronous = database(ReplicationMode::Asynchronous, 2);
        assert_eq!(
            step(&asynchronous, "db-0", Some(&period("db-0")), None, &mut watch, Instant::now()).0,
            Change::Confirmed
        );
        // Preferred to required: the record stays until a standby caught up.
        let required = database(ReplicationMode::Synchronous, 2);
        let alone = primary_report("0/6000000", r#"ANY 1 ("db-1")"#, &[]);
        let change = step(&required, "db-0", Some(&period("db-0")), Some(&alone), &mut watch, Instant::now()).0;
        assert_eq!(change, Change::Nothing);
    }
}
