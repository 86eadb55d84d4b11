//! What only the reconciler can check; the schema and CEL rules catch the rest.

use crate::api::mydatabase::{MyDatabaseSpec, SUPPORTED_MAJORS};
use crate::runtime::Invalid;

/// Checks the spec; the first problem found is returned.
pub fn validate(spec: &MyDatabaseSpec) -> Result<(), Invalid> {
    let major = spec.version.split('.').next().and_then(|m| m.parse::<u32>().ok());
    if !major.is_some_and(|m| SUPPORTED_MAJORS.contains(&m)) {
        return Err(Invalid {
            field: "spec.version",
            reason: "UnsupportedVersion",
            message: format!("spec.version {:?}: supported majors are {SUPPORTED_MAJORS:?}", spec.version),
        });
    }
    if let Some(postgresql) = &spec.postgresql {
        super::parameters::validate(&postgresql.parameters)?;
    }
    if let Some(backup) = &spec.backup {
        validate_cron(&backup.schedule).map_err(|problem| Invalid {
            field: "spec.backup.schedule",
            reason: "InvalidSchedule",
            message: format!("spec.backup.schedule {:?}: {problem}", backup.schedule),
        })?;
    }
    Ok(())
}

const MONTHS: [&str; 12] = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"];
const DAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

/// Validates a 5-field cron expression as the CronJob controller reads it.
pub fn validate_cron(schedule: &str) -> Result<(), String> {
    let schedule = schedule.trim();
    if schedule.starts_with('@') {
        return match schedule {
            "@yearly" | "@annually" | "@monthly" | "@weekly" | "@daily" | "@midnight" | "@hourly" => Ok(()),
            other => Err(format!("unknown macro {other}")),
        };
    }
    let fields: Vec<&str> = schedule.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(format!("want 5 fields (minute hour day-of-month month day-of-week), got {}", fields.len()));
    }
    let specs: [(&str, u32, u32, &[&str], u32); 5] = [
        ("minute", 0, 59, &[], 0),
        ("hour", 0, 23, &[], 0),
        ("day-of-month", 1, 31, &[], 0),
        ("month", 1, 12, &MONTHS, 1),
        ("day-of-week", 0, 7, &DAYS, 0),
    ];
    for (field, (name, min, max, names, name_base)) in fields.iter().zip(specs) {
        validate_field(field, min, max, names, name_base).map_err(|e| format!("{name} field {field:?}: {e}"))?;
    }
    Ok(())
}

fn value(text: &str, min: u32, max: u32, names: &[&str], name_base: u32) -> Result<u32, String> {
    let lower = text.to_ascii_lowercase();
    let parsed = match names.iter().position(|n| *n == lower) {
        Some(index) => index as u32 + name_base,
        None => text.parse::<u32>().map_err(|_| format!("{text:?} is not a number"))?,
    };
    if parsed < min || parsed > max {
        return Err(format!("{parsed} is outside {min}-{max}"));
    }
    Ok(parsed)
}

fn validate_field(field: &str, min: u32, max: u32, names: &[&str], name_base: u32) -> Result<(), String> {
    for part in field.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((range, step)) => (range, Some(step)),
            None => (part, None),
        };
        if let Some(step) = step {
            let step: u32 = step.parse().map_err(|_| format!("step {step:?} is not a number"))?;
            if step == 0 {
                return Err("step 0".into());
            }
        }
        if range == "*" || range == "?" {
            continue;
        }
        match range.split_once('-') {
            Some((low, high)) => {
                let (low, high) = (value(low, min, max, names, name_base)?, value(high, min, max, names, name_base)?);
                if low > high {
                    return Err(format!("range {low}-{high} runs backwards"));
                }
            }
            None => {
                value(range, min, max, names, name_base)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tutorial_schedule_and_common_forms_are_valid() {
        for ok in ["0 2 * * *", "*/15 * * * *", "0 0 1,15 * mon-fri", "30 3 * jan-mar 0", "@daily", "5 4 * * 7"] {
            assert_eq!(validate_cron(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn bad_schedules_name_the_problem() {
        assert!(validate_cron("61 2 * * *").unwrap_err().contains("minute"));
        assert!(validate_cron("0 24 * * *").unwrap_err().contains("hour"));
        assert!(validate_cron("0 2 * *").unwrap_err().contains("5 fields"));
        assert!(validate_cron("0 2 * * funday").unwrap_err().contains("day-of-week"));
        assert!(validate_cron("*/0 * * * *").is_err());
        assert!(validate_cron("5-1 * * * *").unwrap_err().contains("backwards"));
        assert!(validate_cron("@sometimes").is_err());
    }
}
