//! Reading and writing a Secret's `data`, shared by the credentials and the
//! certificates.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;

/// `key` of `secret` as text, if it is there and not empty.
pub fn read(secret: Option<&Secret>, key: &str) -> Option<String> {
    secret
        .and_then(|s| s.data.as_ref())
        .and_then(|d| d.get(key))
        .and_then(|v| String::from_utf8(v.0.clone()).ok())
        .filter(|v| !v.is_empty())
}

/// A Secret's `data` from text entries.
pub fn data(entries: &[(&str, &str)]) -> BTreeMap<String, ByteString> {
    entries.iter().map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec()))).collect()
}
