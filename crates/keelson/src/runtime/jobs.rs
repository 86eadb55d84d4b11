//! How Jobs ended, in the Job controller's own conditions.

use k8s_openapi::api::batch::v1::{Job, JobCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// The Job's condition `type_` when it holds.
pub fn job_condition<'a>(job: &'a Job, type_: &str) -> Option<&'a JobCondition> {
    job.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == type_ && c.status == "True")
}

fn job_condition_time(job: &Job, type_: &str) -> Option<Time> {
    job_condition(job, type_)?.last_transition_time.clone()
}

/// When a Job finished and whether it succeeded; None while it runs.
pub fn job_finished(job: &Job) -> Option<(Time, bool)> {
    let succeeded = job_condition_time(job, "Complete")
        .or_else(|| job_condition_time(job, "SuccessCriteriaMet"))
        .map(|t| (job.status.as_ref().and_then(|s| s.completion_time.clone()).unwrap_or(t), true));
    succeeded.or_else(|| job_condition_time(job, "Failed").map(|t| (t, false)))
}
