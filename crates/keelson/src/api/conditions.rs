//! Kubernetes-style status conditions shared by every Keelson kind.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// A condition as a reconcile computes it, before timestamps are attached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredCondition {
    pub type_: &'static str,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

impl DesiredCondition {
    pub fn new(type_: &'static str, status: bool, reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self { type_, status, reason: reason.into(), message: message.into() }
    }
}

/// On any Keelson object, `"true"`: Keelson reads it and writes its status,
/// but changes none of its children (no apply, no failover) until removed.
/// Deletion still runs its finalizer.
pub const PAUSED_ANNOTATION: &str = "keelson.dev/paused";

/// Whether `object` carries `PAUSED_ANNOTATION=true`.
pub fn is_paused<K: kube::Resource>(object: &K) -> bool {
    object.meta().annotations.as_ref().and_then(|a| a.get(PAUSED_ANNOTATION)).is_some_and(|v| v == "true")
}

/// The condition a paused object's status carries.
pub fn paused() -> DesiredCondition {
    DesiredCondition::new(
        "Paused",
        true,
        "Annotated",
        format!("{PAUSED_ANNOTATION}=true: Keelson changes none of its children; remove the annotation to resume"),
    )
}

/// Builds the condition list for a new status from the previous one.
///
/// `lastTransitionTime` moves only when a condition's status flips, so a
/// reconcile that observes nothing new produces an identical list (and no
/// status write).
pub fn merge_conditions(
    previous: &[Condition],
    desired: &[DesiredCondition],
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    desired
        .iter()
        .map(|want| {
            let status = if want.status { "True" } else { "False" }.to_string();
            let last_transition_time = previous
                .iter()
                .find(|c| c.type_ == want.type_ && c.status == status)
                .map(|c| c.last_transition_time.clone())
                .unwrap_or_else(|| now.clone());
            Condition {
                type_: want.type_.to_string(),
                status,
                reason: want.reason.clone(),
                message: want.message.clone(),
                observed_generation: generation,
                last_transition_time,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap_or(Timestamp::UNIX_EPOCH))
    }

    #[test]
    fn transition_time_is_kept_while_status_holds() {
        let first = merge_conditions(&[], &[DesiredCondition::new("Ready", true, "Ok", "fine")], Some(1), &at(100));
        let second =
            merge_conditions(&first, &[DesiredCondition::new("Ready", true, "Ok", "still fine")], Some(2), &at(200));
        assert_eq!(second[0].last_transition_time, at(100));
        assert_eq!(second[0].message, "still fine");
        assert_eq!(second[0].observed_generation, Some(2));
    }

    #[test]
    fn transition_time_moves_when_status_flips() {
        let first = merge_conditions(&[], &[DesiredCondition::new("Ready", true, "Ok", "")], Some(1), &at(100));
        let second =
            merge_conditions(&first, &[DesiredCondition::new("Ready", false, "Broken", "")], Some(1), &at(200));
        assert_eq!(second[0].last_transition_time, at(200));
        assert_eq!(second[0].status, "False");
    }
}
