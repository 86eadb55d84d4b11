//! Tells people what applying a child did: a log line, an Event for what
//! they should know (spec updates, drift taken back), a metric.
//! Secret values never reach logs or Events.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::EventType;

use super::context::Context;
use super::drift::ChildChange;
use super::metrics::{ChildWriteLabels, DriftLabels};

/// Logs, counts and publishes Events for what applying one child did.
pub async fn child_change(
    ctx: &Context,
    owner: &ObjectReference,
    kind: &str,
    child_name: &str,
    change: &ChildChange,
    owner_was_reconciled_before: bool,
) {
    let kind = kind.to_string();
    // Secret values never reach logs or Events.
    let secret = kind == "Secret";
    let shown = |value: &serde_json::Value| if secret { "<redacted>".to_string() } else { value.to_string() };
    let namespace = owner.namespace.as_deref().unwrap_or_default();
    let owner_name = owner.name.as_deref().unwrap_or_default();
    let action = match change {
        ChildChange::Unchanged => return,
        ChildChange::Created if owner_was_reconciled_before => {
            tracing::info!(
                namespace,
                name = owner_name,
                child = child_name,
                "Drift detected! Updating {kind}: it was deleted, recreating it"
            );
            ctx.metrics
                .drift_corrections
                .get_or_create(&DriftLabels { kind: kind.clone(), field: "(deleted)".into() })
                .inc();
            let note = format!("{kind} {child_name} was deleted by someone else; recreated it");
            ctx.event(owner, EventType::Warning, "DriftCorrected", "Recreate", note).await;
            "create"
        }
        // Routine: a log line, no Event (each would be a write to the API server, and the
        // child's own controller reports its work); Events are for drift, spec changes, failures.
        ChildChange::Created => {
            tracing::info!(namespace, name = owner_name, child = child_name, "creating {kind}");
            "create"
        }
        ChildChange::Updated(fields) => {
            let paths: Vec<&str> = fields.iter().map(|f| f.path.as_str()).collect();
            tracing::info!(namespace, name = owner_name, child = child_name, fields = ?paths, "updating {kind} to the new spec");
            let note = format!("Updated {kind} {child_name}: {}", paths.join(", "));
            ctx.event(owner, EventType::Normal, "Updated", "Update", note).await;
            "update"
        }
        ChildChange::DriftCorrected(fields) => {
            let mut notes = Vec::new();
            for field in fields {
                tracing::info!(
                    namespace,
                    name = owner_name,
                    child = child_name,
                    field = %field.path,
                    desired = %shown(&field.desired),
                    actual = %shown(&field.actual),
                    "Drift detected! Updating {kind}"
                );
                ctx.metrics
                    .drift_corrections
                    .get_or_create(&DriftLabels { kind: kind.clone(), field: field.field() })
                    .inc();
                notes.push(format!(
                    "{} was {}, set back to {}",
                    field.path,
                    shown(&field.actual),
                    shown(&field.desired)
                ));
            }
            let note = format!("{kind} {child_name} was changed by someone else: {}", notes.join("; "));
            ctx.event(owner, EventType::Warning, "DriftCorrected", "Update", truncate(note, 1000)).await;
            "drift_correct"
        }
    };
    ctx.metrics.child_writes.get_or_create(&ChildWriteLabels { kind, action }).inc();
}

fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut cut = max;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    text
}
