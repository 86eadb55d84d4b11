//! What one reconcile found and did, and the single rule that turns it into
//! the next step: a failure is retried with backoff, a wait is polled, an
//! invalid spec waits for the spec to change, anything else is resynced.

use std::time::Duration;

use super::queue::Action;

use crate::{Error, Result};

/// Without events, look again this often anyway (like controller-runtime's resync).
pub const RESYNC: Duration = Duration::from_secs(3600);
/// How often a normal wait (a Job running, an object going away) is checked.
pub const WAIT_POLL: Duration = Duration::from_secs(5);

/// A spec problem only the reconciler can find, naming the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub field: &'static str,
    pub reason: &'static str,
    pub message: String,
}

/// One child the API server refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildFailure {
    /// `<Kind> <name>`.
    pub child: String,
    /// apply, delete, patch.
    pub action: &'static str,
    /// The API's reason (e.g. `Invalid`, `Forbidden`), or `Unreachable`.
    pub reason: String,
    pub message: String,
    pub conflict: bool,
}

impl ChildFailure {
    pub fn new(child: String, action: &'static str, error: &Error) -> Self {
        let (reason, message, conflict) = match error {
            Error::Kube { source: kube::Error::Api(status), .. } => {
                (status.reason.clone(), status.message.clone(), status.code == 409)
            }
            Error::Kube { source, .. } => ("Unreachable".to_string(), source.to_string(), false),
            Error::NotOurs { .. } => ("NotOurs".to_string(), error.to_string(), false),
            other => ("Internal".to_string(), other.to_string(), false),
        };
        Self { child, action, reason, message, conflict }
    }

    /// True when the namespace is being deleted: nothing new can be created in it.
    pub fn namespace_terminating(&self) -> bool {
        self.reason == "Forbidden" && self.message.contains("being terminated")
    }
}

impl std::fmt::Display for ChildFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {} ({})", self.action, self.child, self.message, self.reason)
    }
}

#[derive(Debug, Default, Clone, PartialEq)]
pub struct Outcome {
    pub invalid: Option<Invalid>,
    pub failures: Vec<ChildFailure>,
    /// Normal waits, e.g. "final backup Job to finish".
    pub waiting: Vec<String>,
    /// Look again after this, though nothing may change meanwhile.
    pub recheck: Option<Duration>,
    /// The object is paused (`api::conditions::PAUSED_ANNOTATION`): nothing was applied.
    pub paused: bool,
}

impl Outcome {
    /// The failures in one line, for a condition message.
    pub fn failure_message(&self) -> Option<String> {
        (!self.failures.is_empty())
            .then(|| self.failures.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))
    }

    /// Nothing failed and nothing is pending.
    pub fn is_complete(&self) -> bool {
        self.failures.is_empty() && self.waiting.is_empty()
    }

    /// What the controller does next.
    pub fn into_action(self) -> Result<Action> {
        // A namespace being deleted refuses new objects until it is gone, and
        // takes this object with it: retrying would only add noise.
        if !self.failures.is_empty() && self.failures.iter().all(ChildFailure::namespace_terminating) {
            return Ok(Action::await_change());
        }
        if let Some(summary) = self.failure_message() {
            let conflict = self.failures.iter().all(|f| f.conflict);
            return Err(Error::ChildrenFailed { summary, conflict });
        }
        if !self.waiting.is_empty() {
            return Ok(Action::requeue(WAIT_POLL));
        }
        // An invalid spec waits for a change to it, unless what made it invalid is outside the
        // spec and unwatched (a Secret it names), which the reconciler asks to look at again.
        if self.invalid.is_some() {
            return Ok(self.recheck.map_or_else(Action::await_change, |recheck| Action::requeue(recheck.min(RESYNC))));
        }
        Ok(Action::requeue(self.recheck.map_or(RESYNC, |recheck| recheck.min(RESYNC))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(conflict: bool) -> ChildFailure {
        ChildFailure {
            child: "Service s".into(),
            action: "apply",
            reason: if conflict { "Conflict" } else { "Invalid" }.into(),
            message: "no".into(),
            conflict,
        }
    }

    #[test]
    fn failures_beat_waits_and_waits_beat_resync() {
        let waiting = Outcome { waiting: vec!["a Job".into()], ..Default::default() };
        assert_eq!(waiting.clone().into_action().ok(), Some(Action::requeue(WAIT_POLL)));
        let failed = Outcome { failures: vec![failure(false)], ..waiting };
        assert!(matches!(failed.into_action(), Err(Error::ChildrenFailed { conflict: false, .. })));
        let conflict = Outcome { failures: vec![failure(true)], ..Default::default() };
        assert!(conflict.into_action().is_err_and(|e| e.is_conflict()));
        assert_eq!(Outcome::default().into_action().ok(), Some(Action::requeue(RESYNC)));
    }

    #[test]
    fn an_invalid_spec_waits_for_a_change_unless_a_recheck_is_asked() {
        let invalid = Invalid { field: "spec.x", reason: "Bad", message: "spec.x: bad".into() };
        let outcome = Outcome { invalid: Some(invalid), ..Default::default() };
        assert_eq!(outcome.clone().into_action().ok(), Some(Action::await_change()));
        let unwatched = Outcome { recheck: Some(std::time::Duration::from_secs(10)), ..outcome };
        assert_eq!(unwatched.into_action().ok(), Some(Action::requeue(std::time::Duration::from_secs(10))));
    }

    #[test]
    fn a_terminating_namespace_is_not_retried() {
        let terminating = ChildFailure {
            reason: "Forbidden".into(),
            message: "unable to create new content in namespace t because it is being terminated".into(),
            ..failure(false)
        };
        let outcome = Outcome { failures: vec![terminating], ..Default::default() };
        assert_eq!(outcome.into_action().ok(), Some(Action::await_change()));
    }
}
