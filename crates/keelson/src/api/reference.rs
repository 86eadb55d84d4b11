//! The grammar of container image references (the distribution project's
//! reference grammar, as the kubelet parses it), as CEL rules for the CRDs.

/// `[host[:port]/]path`, path components lower-case.
macro_rules! repository {
    () => {
        r"(?:(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])(?:\.(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*(?::[0-9]+)?/)?[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*)*"
    };
}

/// A whole image reference: repository, optional `:tag`, optional `@digest`.
pub const IMAGE_RULE: &str = concat!(
    "self.matches(r'^",
    repository!(),
    r"(?::[a-zA-Z0-9_][a-zA-Z0-9_.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,})?$')"
);
pub const IMAGE_MESSAGE: &str = "must be an image reference such as nginx:1.25-alpine or registry.example.com/team/app@sha256:<digest> (lower-case path, no spaces)";

/// A repository without tag or digest (Keelson appends the tag).
pub const REPOSITORY_RULE: &str = concat!("self.matches(r'^", repository!(), "$')");
pub const REPOSITORY_MESSAGE: &str = "must be an image repository without tag, such as postgres or registry.example.com/team/postgres (lower-case path, no spaces)";

/// A quantity greater than zero: a volume of size 0 cannot be provisioned.
pub const POSITIVE_QUANTITY_RULE: &str = "isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))";
pub const POSITIVE_QUANTITY_MESSAGE: &str = "must be a quantity greater than zero, such as 10Gi";

#[cfg(test)]
mod tests {
    use super::*;

    /// The CEL rule's regex, checked with Rust's regex-compatible subset by hand-picked cases.
    fn pattern(rule: &str) -> &str {
        rule.trim_start_matches("self.matches(r'").trim_end_matches("')")
    }

    #[test]
    fn rules_are_well_formed_cel() {
        for rule in [IMAGE_RULE, REPOSITORY_RULE] {
            let inner = pattern(rule);
            assert!(inner.starts_with('^') && inner.ends_with('$'), "{rule}");
            assert!(!inner.contains('\''), "a quote would end the CEL string: {rule}");
        }
    }
}
