//! High availability, in one wing: who is primary and how it changes hands.
//!
//! - `failover`: the decision (keep, wait, ask the replicas, promote, blocked), pure;
//! - `synchronous`: which standbys confirm a commit, and when a primary with
//!   `replication: Preferred` may go on alone, pure;
//! - `drain`: handing the primary over before a drain or scale-down takes its pod;
//! - `primary`: the I/O that carries those decisions out, run by the reconcile.

pub mod drain;
pub mod failover;
pub mod primary;
pub mod synchronous;
