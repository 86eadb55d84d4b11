//! `spec.postgresql.parameters`: the PostgreSQL settings a user may tune,
//! and the kind of value each takes.
//!
//! Names outside the allowlist are refused by the API server (the CRD's CEL
//! rule is built from this table); the reconciler checks values by kind.

#[derive(Clone, Copy, Debug)]
enum Kind {
    /// An integer with an optional unit kB, MB, GB or TB (`-1` where PostgreSQL allows it).
    Memory,
    /// An integer with an optional unit us, ms, s, min, h or d.
    Time,
    Integer,
    Real,
    Bool,
    OneOf(&'static [&'static str]),
    /// Free text on one line (a time zone name).
    Text,
}

/// What may be set, and its kind. Replication, TLS, sockets, WAL shipping and
/// durability settings are Keelson's (see [`FIXED`]).
const ALLOWED: &[(&str, Kind)] = &[
    ("autovacuum", Kind::Bool),
    ("autovacuum_analyze_scale_factor", Kind::Real),
    ("autovacuum_max_workers", Kind::Integer),
    ("autovacuum_naptime", Kind::Time),
    ("autovacuum_vacuum_cost_delay", Kind::Time),
    ("autovacuum_vacuum_cost_limit", Kind::Integer),
    ("autovacuum_vacuum_scale_factor", Kind::Real),
    ("autovacuum_work_mem", Kind::Memory),
    ("checkpoint_completion_target", Kind::Real),
    ("checkpoint_timeout", Kind::Time),
    ("default_statistics_target", Kind::Integer),
    (
        "default_transaction_isolation",
        Kind::OneOf(&["read uncommitted", "read committed", "repeatable read", "serializable"]),
    ),
    ("effective_cache_size", Kind::Memory),
    ("effective_io_concurrency", Kind::Integer),
    ("hash_mem_multiplier", Kind::Real),
    ("huge_pages", Kind::OneOf(&["on", "off", "try"])),
    ("idle_in_transaction_session_timeout", Kind::Time),
    ("idle_session_timeout", Kind::Time),
    ("jit", Kind::Bool),
    ("lock_timeout", Kind::Time),
    ("log_autovacuum_min_duration", Kind::Time),
    ("log_checkpoints", Kind::Bool),
    ("log_connections", Kind::Bool),
    ("log_disconnections", Kind::Bool),
    ("log_lock_waits", Kind::Bool),
    ("log_min_duration_statement", Kind::Time),
    ("log_statement", Kind::OneOf(&["none", "ddl", "mod", "all"])),
    ("log_temp_files", Kind::Memory),
    ("log_timezone", Kind::Text),
    ("maintenance_work_mem", Kind::Memory),
    ("max_connections", Kind::Integer),
    ("max_parallel_maintenance_workers", Kind::Integer),
    ("max_parallel_workers", Kind::Integer),
    ("max_parallel_workers_per_gather", Kind::Integer),
    ("max_wal_size", Kind::Memory),
    ("min_wal_size", Kind::Memory),
    ("random_page_cost", Kind::Real),
    ("seq_page_cost", Kind::Real),
    ("shared_buffers", Kind::Memory),
    ("statement_timeout", Kind::Time),
    ("temp_buffers", Kind::Memory),
    ("timezone", Kind::Text),
    ("track_io_timing", Kind::Bool),
    ("wal_buffers", Kind::Memory),
    ("work_mem", Kind::Memory),
];

/// Refused by name, with their reason: Keelson sets them, and a different
/// value would break replication, failover, TLS or durability.
pub const FIXED: &[&str] = &[
    "archive_command",
    "archive_mode",
    "cluster_name",
    "config_file",
    "data_directory",
    "fsync",
    "full_page_writes",
    "hba_file",
    "hot_standby",
    "ident_file",
    "listen_addresses",
    "max_replication_slots",
    "max_wal_senders",
    "password_encryption",
    "port",
    "primary_conninfo",
    "primary_slot_name",
    "restore_command",
    "ssl",
    "ssl_ca_file",
    "ssl_cert_file",
    "ssl_key_file",
    "ssl_min_protocol_version",
    "synchronous_commit",
    "synchronous_standby_names",
    "unix_socket_directories",
    "wal_level",
    "wal_log_hints",
    "wal_receiver_timeout",
    "wal_sender_timeout",
];

/// `max_connections` may not shrink in place: a replica with fewer than its
/// primary's cannot replay (and the roll restarts replicas first).
pub const MAX_CONNECTIONS_RULE: &str = "!has(oldSelf.max_connections) \
    || (has(self.max_connections) && int(self.max_connections) >= int(oldSelf.max_connections))";
pub const MAX_CONNECTIONS_MESSAGE: &str = "spec.postgresql.parameters.max_connections may grow but not shrink in place \
    (replicas need at least the primary's; see docs/production.md)";

/// The longest value (and name) taken: bounds the CEL rules' cost.
const MAX_LENGTH: usize = 256;

/// The map's schema: bounded sizes, names from the allowlist, and
/// `max_connections` that does not shrink.
pub fn schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "maxProperties": 64,
        "additionalProperties": {"type": "string", "maxLength": MAX_LENGTH},
        "x-kubernetes-validations": [
            {"rule": names_rule(), "messageExpression": names_message()},
            {"rule": MAX_CONNECTIONS_RULE, "message": MAX_CONNECTIONS_MESSAGE},
        ],
    })
}

/// The CRD's CEL rule on the parameters map: every name is allowed.
pub fn names_rule() -> String {
    format!("self.all(name, name in [{}])", quoted(ALLOWED.iter().map(|(name, _)| *name)))
}

/// Its message, naming the first name refused and why.
pub fn names_message() -> String {
    let fixed = quoted(FIXED.iter().copied());
    format!(
        "self.filter(name, !(name in [{allowed}])).map(name, name in [{fixed}] \
         ? name + ' is set by Keelson (replication, TLS and durability depend on it)' \
         : name + ' is not a parameter Keelson lets you set (see docs/production.md)')[0]",
        allowed = quoted(ALLOWED.iter().map(|(name, _)| *name)),
    )
}

fn quoted<'a>(names: impl Iterator<Item = &'a str>) -> String {
    names.map(|name| format!("'{name}'")).collect::<Vec<_>>().join(", ")
}

/// Why `value` does not fit parameter `name`: `None` when it does.
pub fn problem(name: &str, value: &str) -> Option<String> {
    let Some((_, kind)) = ALLOWED.iter().find(|(allowed, _)| *allowed == name) else {
        let why = if FIXED.contains(&name) { "is set by Keelson" } else { "is not allowed" };
        return Some(why.into());
    };
    check(*kind, value.trim()).err()
}

fn check(kind: Kind, value: &str) -> Result<(), String> {
    let number_then = |units: &[&str]| {
        let digits = value.strip_prefix('-').unwrap_or(value);
        let end = digits.find(|c: char| !c.is_ascii_digit()).unwrap_or(digits.len());
        let (number, unit) = digits.split_at(end);
        let unit = unit.trim();
        if number.is_empty() || !(unit.is_empty() || units.contains(&unit)) {
            return Err(format!("want an integer with an optional unit ({})", units.join(", ")));
        }
        Ok(())
    };
    match kind {
        Kind::Memory => number_then(&["kB", "MB", "GB", "TB"]),
        Kind::Time => number_then(&["us", "ms", "s", "min", "h", "d"]),
        Kind::Integer => number_then(&[]),
        Kind::Real => value.parse::<f64>().map(|_| ()).map_err(|_| "want a number such as 1.1".into()),
        Kind::Bool => match value.to_ascii_lowercase().as_str() {
            "on" | "off" | "true" | "false" | "yes" | "no" | "1" | "0" => Ok(()),
            _ => Err("want on or off".into()),
        },
        Kind::OneOf(choices) => match choices.contains(&value.to_ascii_lowercase().as_str()) {
            true => Ok(()),
            false => Err(format!("want one of {}", choices.join(", "))),
        },
        Kind::Text if value.is_empty() || value.len() > 256 || value.chars().any(char::is_control) => {
            Err("want one line of at most 256 characters".into())
        }
        Kind::Text => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_name_is_both_allowed_and_fixed() {
        for (name, _) in ALLOWED {
            assert!(!FIXED.contains(name), "{name}");
        }
        assert!(names_rule().contains("'work_mem'") && names_message().contains("'synchronous_commit'"));
    }

    #[test]
    fn values_are_checked_by_kind() {
        for (name, value) in [
            ("work_mem", "8MB"),
            ("max_connections", "200"),
            ("statement_timeout", "30s"),
            ("random_page_cost", "1.1"),
            ("jit", "off"),
            ("log_statement", "ddl"),
            ("timezone", "Europe/Moscow"),
            ("log_min_duration_statement", "-1"),
        ] {
            assert_eq!(problem(name, value), None, "{name} = {value}");
        }
        for (name, value) in [
            ("work_mem", "lots"),
            ("work_mem", "8 GiB"),
            ("max_connections", "100k"),
            ("jit", "maybe"),
            ("random_page_cost", "fast"),
            ("log_statement", "everything"),
            ("timezone", "a\nb"),
        ] {
            assert!(problem(name, value).is_some(), "{name} = {value}");
        }
        assert_eq!(problem("synchronous_commit", "off").as_deref(), Some("is set by Keelson"));
        assert_eq!(problem("shared_preload_libraries", "x").as_deref(), Some("is not allowed"));
    }
}
