//! `spec.postgresql.parameters` on the instances: the values checked (the
//! names were checked by the API server), and the configuration file
//! `postgresql.conf` includes (`keelson-postgres.sh`), written at each start.

use std::collections::BTreeMap;

use crate::api::parameters;
use crate::runtime::Invalid;

/// The instances' environment variable carrying the file's text.
pub const ENV: &str = "POSTGRESQL_PARAMETERS";

/// Checks every value against its parameter's kind; the first problem found.
pub fn validate(values: &BTreeMap<String, String>) -> Result<(), Invalid> {
    for (name, value) in values {
        if let Some(problem) = parameters::problem(name, value) {
            return Err(Invalid {
                field: "spec.postgresql.parameters",
                reason: "InvalidParameter",
                message: format!("spec.postgresql.parameters.{name} {value:?}: {problem}"),
            });
        }
    }
    Ok(())
}

/// The configuration file's text: one `name = 'value'` line per parameter.
pub fn conf(values: &BTreeMap<String, String>) -> String {
    values
        .iter()
        .map(|(name, value)| format!("{name} = '{}'\n", value.trim().replace('\\', "\\\\").replace('\'', "''")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn well_formed_values_render_quoted_one_per_line() {
        let values = of(&[("work_mem", "8MB"), ("timezone", "Europe/Moscow")]);
        validate(&values).expect("valid");
        assert_eq!(conf(&values), "timezone = 'Europe/Moscow'\nwork_mem = '8MB'\n");
    }

    #[test]
    fn a_bad_value_is_refused_naming_its_parameter() {
        let invalid = validate(&of(&[("jit", "on"), ("work_mem", "lots")])).expect_err("refused");
        assert!(
            invalid.message.starts_with("spec.postgresql.parameters.work_mem \"lots\": want an integer"),
            "{invalid:?}"
        );
    }

    #[test]
    fn quotes_cannot_end_a_value_early() {
        assert_eq!(conf(&of(&[("timezone", "x' ssl = 'off")])), "timezone = 'x'' ssl = ''off'\n");
    }
}
