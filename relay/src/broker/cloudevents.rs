//! CloudEvents (https://cloudevents.io) binary content mode: the row's payload stays the
//! message body, byte for byte, and the event's attributes travel beside it, mapped from the
//! row: `id` ← the message id, `type` ← the type column, `source` ← `--cloudevents-source`,
//! `time` ← the claim-order column, `subject` ← the partition key when one is mapped,
//! `datacontenttype` ← the content type the relay sends (the message's content-type property,
//! as both bindings below say).
//!
//! Spelled per protocol:
//! - AMQP 1.0, the CloudEvents AMQP protocol binding: application properties prefixed
//!   `cloudEvents:`, `time` as an AMQP timestamp (the binding's native form).
//! - AMQP 0-9-1 has no binding of the CloudEvents project. RabbitMQ's own consumers follow the
//!   RabbitMQ protocol binding of Knative Eventing (knative-extensions/eventing-rabbitmq,
//!   `cloudevents-protocol-spec`): headers prefixed `ce-`, values as strings, `time` in
//!   RFC 3339. It is what Knative's RabbitMQ broker and source read and write, and what the
//!   Python SDK's `cloudevents.core.bindings.rabbitmq` decodes; the AMQP 1.0 spelling there
//!   would be read by none of them.

/// How the relay frames a message as a CloudEvent.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Deserialize,
    serde::Serialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum CloudEventsMode {
    /// Not a CloudEvent: the message as it always was.
    #[default]
    Off,
    /// Binary content mode: attributes in headers (application properties), the payload
    /// untouched.
    Binary,
}

impl CloudEventsMode {
    pub fn as_str(self) -> &'static str {
        match self {
            CloudEventsMode::Off => "off",
            CloudEventsMode::Binary => "binary",
        }
    }
}

/// The CloudEvents settings a publisher needs: present only in binary mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudEvents {
    /// The `source` attribute of every event: a URI-reference (checked by [`check_source`]).
    pub source: String,
}

/// The CloudEvents version the attributes follow.
pub const SPEC_VERSION: &str = "1.0";

/// The attribute names, without a prefix.
pub mod attributes {
    pub const SPECVERSION: &str = "specversion";
    pub const ID: &str = "id";
    pub const TYPE: &str = "type";
    pub const SOURCE: &str = "source";
    pub const TIME: &str = "time";
    pub const SUBJECT: &str = "subject";
}

/// The AMQP 1.0 binding's application-property prefix.
pub const AMQP10_PREFIX: &str = "cloudEvents:";
/// The RabbitMQ binding's header prefix (AMQP 0-9-1).
pub const AMQP091_PREFIX: &str = "ce-";

/// The `time` attribute in RFC 3339, UTC, with the column's microseconds when it has any.
pub fn rfc3339(time: chrono::DateTime<chrono::Utc>) -> String {
    time.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

/// Checks that `text` is a URI-reference (RFC 3986 §4.1), as the CloudEvents `source`
/// attribute must be: a URI (`urn:example:orders`, `https://example.com/orders`) or a relative
/// reference (`/orders`). Only the characters and the shape RFC 3986 allows, checked by hand:
/// the `url` crate parses the WHATWG way, which accepts (and rewrites) what RFC 3986 refuses.
pub fn check_source(text: &str) -> Result<(), String> {
    if text.is_empty() {
        return Err("must not be empty (CloudEvents requires a non-empty source)".into());
    }
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let allowed = b.is_ascii_alphanumeric() || b"-._~:/?#[]@!$&'()*+,;=".contains(&b);
        if b == b'%' {
            let hex = |at: usize| bytes.get(at).is_some_and(u8::is_ascii_hexdigit);
            if !(hex(i + 1) && hex(i + 2)) {
                return Err(format!(
                    "is not a URI-reference: '%' at byte {i} is not followed by two hex digits"
                ));
            }
            i += 3;
            continue;
        }
        if !allowed {
            let shown = text[i..].chars().next().unwrap_or(' ');
            return Err(format!(
                "is not a URI-reference: {shown:?} must be percent-encoded (RFC 3986)"
            ));
        }
        i += 1;
    }
    if text.matches('#').count() > 1 {
        return Err("is not a URI-reference: more than one '#'".into());
    }
    // A ':' before the first '/', '?' or '#' ends a scheme, which starts with a letter and
    // goes on with letters, digits, '+', '-' and '.'; a relative reference cannot have a ':'
    // in its first segment.
    let first_segment = text.split(['/', '?', '#']).next().unwrap_or("");
    if let Some((scheme, _)) = first_segment.split_once(':') {
        let mut chars = scheme.chars();
        let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
            && chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
        if !valid {
            return Err(format!(
                "is not a URI-reference: {scheme:?} before the ':' is not a scheme (a relative \
                 reference has no ':' in its first segment; write ./{first_segment} or a full URI)"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_references_are_accepted() {
        for source in [
            "/orders",
            "orders",
            "urn:example:orders",
            "https://example.com/orders?tenant=a#x",
            "//example.com/svc",
            "./a:b",
            "mailto:ops@example.com",
            "/caf%C3%A9",
            "urn:uuid:6e8bc430-9c3a-11d9-9669-0800200c9a66",
        ] {
            assert_eq!(check_source(source), Ok(()), "{source}");
        }
    }

    #[test]
    fn other_text_is_refused() {
        for source in [
            "",
            "has space",
            "/café",
            "1http://x",
            "a:b:c d",
            ":orders",
            "/100%",
            "/a#b#c",
            "/quote\"",
        ] {
            assert!(check_source(source).is_err(), "{source:?} was accepted");
        }
    }

    #[test]
    fn time_is_rfc3339_in_utc() {
        use chrono::TimeZone;
        let whole = chrono::Utc
            .with_ymd_and_hms(2026, 12, 5, 6, 23, 57)
            .unwrap();
        assert_eq!(rfc3339(whole), "2026-12-05T06:23:57Z");
        let micros = whole + chrono::Duration::microseconds(123_456);
        assert_eq!(rfc3339(micros), "2026-12-05T06:23:57.123456Z");
    }
}
