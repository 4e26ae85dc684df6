//! The row's headers column: a JSON object whose names fit an AMQP short string. Checked when
//! the row becomes a message, so a bad value dead-letters the row instead of failing a publish.

use serde_json::Value;

use crate::defaults::AMQP_SHORT_STRING_MAX;

/// Why a headers value cannot become message headers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadersError {
    #[error("headers must be a JSON object, got {0}")]
    NotAnObject(&'static str),
    #[error("header name {0:?} is longer than {max} bytes", max = AMQP_SHORT_STRING_MAX)]
    KeyTooLong(String),
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The headers of a row: none for NULL or a JSON null, the object when every name in it (nested
/// objects and arrays included) fits.
pub fn check(
    value: Option<&Value>,
) -> Result<Option<&serde_json::Map<String, Value>>, HeadersError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(map)) => {
            check_names(map)?;
            Ok(Some(map))
        }
        Some(other) => Err(HeadersError::NotAnObject(json_kind(other))),
    }
}

fn check_names(map: &serde_json::Map<String, Value>) -> Result<(), HeadersError> {
    for (key, value) in map {
        if key.len() > AMQP_SHORT_STRING_MAX {
            return Err(HeadersError::KeyTooLong(key.chars().take(40).collect()));
        }
        check_nested(value)?;
    }
    Ok(())
}

fn check_nested(value: &Value) -> Result<(), HeadersError> {
    match value {
        Value::Object(map) => check_names(map),
        Value::Array(items) => items.iter().try_for_each(check_nested),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn other_json_is_refused() {
        assert_eq!(
            check(Some(&json!([1, 2]))),
            Err(HeadersError::NotAnObject("an array"))
        );
        assert_eq!(
            check(Some(&json!("x"))),
            Err(HeadersError::NotAnObject("a string"))
        );
        let long = "k".repeat(300);
        assert!(matches!(
            check(Some(&json!({ long.clone(): 1 }))),
            Err(HeadersError::KeyTooLong(_))
        ));
        assert!(matches!(
            check(Some(&json!({"outer": [{ long: 1 }]}))),
            Err(HeadersError::KeyTooLong(_))
        ));
        assert_eq!(check(Some(&json!(null))), Ok(None));
        assert_eq!(check(None), Ok(None));
    }
}
