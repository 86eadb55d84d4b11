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
//! instance: none ever streamed, no synchronous standby is named, and the
//! operator says the database has no other instance) is never fenced either:
//! nobody could take over.
//!
//! The fence is looked at on a timer of its own (`instance::run`), every
//! `FENCE_LOOK_EVERY`, whatever the manager's API calls and looks at the
//! server are waiting for.

use std::time::Instant;

use crate::api::instance::{FENCE_AFTER, LEASE_RENEW_EVERY};

/// How often the fence is looked at (and the manager's heartbeat written).
pub const FENCE_LOOK_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

#[derive(Debug)]
pub struct Lease {
    /// The pod is labelled primary: a term runs.
    primary: bool,
    /// A replica streamed from this server at the last look.
    streaming: bool,
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
        Lease { primary: false, streaming: false, count: 0, since: now, renewed: None, tried: None, had_replica: false }
    }

    /// What the pod and the last look said: whether the pod is labelled
    /// primary (a new term begins when it becomes so; none runs while it is
    /// not), whether a replica streams from the server now, and whether it
    /// has others (the operator named synchronous standbys for it, or says the
    /// database has two or more instances), even if none has connected yet.
    pub fn observe(&mut self, primary: bool, streaming: bool, standbys_named: bool, now: Instant) {
        if primary && !self.primary {
            *self = Lease { primary: true, ..Lease::new(now) };
        }
        self.primary = primary;
        self.streaming = streaming;
        if primary {
            self.had_replica |= streaming || standbys_named;
        }
    }

    pub fn primary(&self) -> bool {
        self.primary
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

    /// Why the server must be fenced now, if it must.
    pub fn fence(&self, now: Instant) -> Option<String> {
        if !self.primary || !self.had_replica || self.streaming {
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
        lease.observe(true, false, false, start);
        let first = lease.due(start).expect("due at once");
        assert_eq!(lease.due(start + Duration::from_millis(500)), None, "too soon");
        let second = lease.due(start + LEASE_RENEW_EVERY).expect("due again");
        assert!(second > first);
    }

    #[test]
    fn a_cut_off_primary_without_streaming_replicas_is_fenced_before_the_operator_gives_up_on_it() {
        let start = Instant::now();
        let mut lease = Lease::new(start);
        lease.observe(true, true, false, start);
        let sent = start + Duration::from_secs(1);
        lease.renewed(sent);
        // Renewals fail from here on.
        assert_eq!(lease.fence(sent + FENCE_AFTER), None, "a replica still streams from it");
        lease.observe(true, false, false, sent);
        assert_eq!(lease.fence(sent + FENCE_AFTER - Duration::from_millis(1)), None, "too soon");
        let why = lease.fence(sent + FENCE_AFTER).expect("fenced");
        assert!(why.contains("not renewed for 5s"), "{why}");
        assert!(FENCE_AFTER < crate::api::instance::LEASE_EXPIRES_AFTER, "the fence must come first");
        // Renewed again: no longer fenced.
        lease.renewed(sent + FENCE_AFTER * 2);
        assert_eq!(lease.fence(sent + FENCE_AFTER * 2), None);
        // No longer labelled primary (seen in the renewal's answer): never fenced, and a new term when it is again.
        lease.observe(false, false, false, sent + FENCE_AFTER * 9);
        assert_eq!(lease.fence(sent + FENCE_AFTER * 10), None);
        lease.observe(true, false, true, sent + FENCE_AFTER * 10);
        assert_eq!(lease.fence(sent + FENCE_AFTER * 10 + Duration::from_secs(1)), None, "a new term");
    }

    #[test]
    fn a_primary_that_never_had_a_replica_is_never_fenced() {
        let start = Instant::now();
        let mut lease = Lease::new(start);
        lease.observe(true, false, false, start);
        assert_eq!(lease.fence(start + FENCE_AFTER * 10), None);
    }

    #[test]
    fn a_new_primary_with_standbys_named_is_fenced_before_any_replica_connected() {
        // Cut off right after a switchover: no replica streamed from it yet.
        let start = Instant::now();
        let mut lease = Lease::new(start);
        lease.observe(true, false, true, start);
        assert!(lease.fence(start + FENCE_AFTER).is_some());
    }
}
