//! The primary's lease, held by its instance manager: while its pod is
//! labelled primary, the manager counts the pod's `db.keelson.dev/primary-lease`
//! annotation up every `LEASE_RENEW_EVERY`. A primary that is cut off (its
//! node partitioned, its manager unable to reach the API server) stops
//! renewing; the operator takes it for lost once it has not seen the count
//! move for `LEASE_EXPIRES_AFTER`. Before that, `FENCE_AFTER` from sending the
//! last renewal that succeeded, the manager fences its server (stops it), so
//! that a cut-off primary never takes writes beside a new one.
//!
//! A primary that still has a replica streaming from it is not fenced: the
//! API server may be down while the database is fine, and no failover can
//! happen without the replicas letting go of it first (they hold when the
//! operator asks for their positions). A primary that has no replica (one
//! instance; none ever streamed, and no synchronous standby is named) is
//! never fenced either: nobody could take over.

use std::time::Instant;

use crate::api::instance::{FENCE_AFTER, LEASE_RENEW_EVERY};

#[derive(Debug)]
pub struct Lease {
    count: u64,
    /// When this term began (the pod became primary, or the manager started).
    since: Instant,
    /// When the renewal that last succeeded was sent.
    renewed: Option<Instant>,
    /// When the last renewal was sent, successful or not.
    tried: Option<Instant>,
    /// A replica streamed from this primary during this term.
    had_replica: bool,
}

impl Lease {
    pub fn new(now: Instant) -> Self {
        Lease { count: 0, since: now, renewed: None, tried: None, had_replica: false }
    }

    /// The count to send now, if a renewal is due.
    pub fn due(&mut self, now: Instant) -> Option<u64> {
        if self.tried.is_some_and(|tried| now.duration_since(tried) < LEASE_RENEW_EVERY) {
            return None;
        }
        self.tried = Some(now);
        // Unique per term and manager: a restarted manager must not repeat a count the operator saw.
        self.count = self.count.max(wall_millis());
        self.count += 1;
        Some(self.count)
    }

    /// The renewal sent at `sent` was stored.
    pub fn renewed(&mut self, sent: Instant) {
        self.renewed = Some(sent);
    }

    /// What the last look saw: whether a replica streams from this server now;
    /// and whether the operator named synchronous standbys for it (a database
    /// of three or more instances: it has replicas, even if none has connected
    /// yet since this pod became the primary).
    pub fn replicas_streaming(&mut self, streaming: bool, standbys_named: bool) {
        self.had_replica |= streaming || standbys_named;
    }

    /// Why the server must be fenced now, if it must.
    pub fn fence(&self, now: Instant, replica_streaming: bool) -> Option<String> {
        if !self.had_replica || replica_streaming {
            return None;
        }
        let since = self.renewed.unwrap_or(self.since);
        let unrenewed = now.duration_since(since);
        (unrenewed >= FENCE_AFTER).then(|| {
            format!("the primary lease was not renewed for {}s and no replica streams from it", unrenewed.as_secs())
        })
    }
}

fn wall_millis() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn renewals_are_due_every_period_and_count_up() {
        let start = Instant::now();
        let mut lease = Lease::new(start);
        let first = lease.due(start).expect("due at once");
        assert_eq!(lease.due(start + Duration::from_millis(500)), None, "too soon");
        let second = lease.due(start + LEASE_RENEW_EVERY).expect("due again");
        assert!(second > first);
    }

    #[test]
    fn a_cut_off_primary_without_streaming_replicas_is_fenced_before_the_operator_gives_up_on_it() {
        let start = Instant::now();
        let mut lease = Lease::new(start);
        lease.replicas_streaming(true, false);
        let sent = start + Duration::from_secs(1);
        lease.renewed(sent);
        // Renewals fail from here on.
        assert_eq!(lease.fence(sent + FENCE_AFTER - Duration::from_millis(1), false), None, "too soon");
        assert_eq!(lease.fence(sent + FENCE_AFTER, true), None, "a replica still streams from it");
        let why = lease.fence(sent + FENCE_AFTER, false).expect("fenced");
        assert!(why.contains("not renewed for 5s"), "{why}");
        assert!(FENCE_AFTER < crate::api::instance::LEASE_EXPIRES_AFTER, "the fence must come first");
        // Renewed again: no longer fenced.
        lease.renewed(sent + FENCE_AFTER * 2);
        assert_eq!(lease.fence(sent + FENCE_AFTER * 2, false), None);
    }

    #[test]
    fn a_primary_that_never_had_a_replica_is_never_fenced() {
        let start = Instant::now();
        let mut lease = Lease::new(start);
        lease.replicas_streaming(false, false);
        assert_eq!(lease.fence(start + FENCE_AFTER * 10, false), None);
    }

    #[test]
    fn a_new_primary_with_standbys_named_is_fenced_before_any_replica_connected() {
        // Cut off right after a switchover: no replica streamed from it yet.
        let start = Instant::now();
        let mut lease = Lease::new(start);
        lease.replicas_streaming(false, true);
        assert!(lease.fence(start + FENCE_AFTER, false).is_some());
    }
}
