//! AMQP headers from the row's JSON headers column.

use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString};

use crate::defaults::AMQP_SHORT_STRING_MAX;

/// Why a headers value cannot become AMQP headers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadersError {
    #[error("headers must be a JSON object, got {0}")]
    NotAnObject(&'static str),
    #[error("header name {0:?} is longer than 255 bytes")]
    KeyTooLong(String),
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Converts a JSON object into an AMQP field table (nested objects and arrays included).
pub fn headers_from_json(value: &serde_json::Value) -> Result<FieldTable, HeadersError> {
    let serde_json::Value::Object(map) = value else {
        return Err(HeadersError::NotAnObject(json_kind(value)));
    };
    let mut table = FieldTable::default();
    for (key, value) in map {
        if key.len() > AMQP_SHORT_STRING_MAX {
            return Err(HeadersError::KeyTooLong(key.chars().take(40).collect()));
        }
        table.insert(key.as_str().into(), amqp_value(value)?);
    }
    Ok(table)
}

fn amqp_value(value: &serde_json::Value) -> Result<AMQPValue, HeadersError> {
    Ok(match value {
        serde_json::Value::Null => AMQPValue::Void,
        serde_json::Value::Bool(b) => AMQPValue::Boolean(*b),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => AMQPValue::LongLongInt(i),
            None => AMQPValue::Double(n.as_f64().unwrap_or(f64::NAN)),
        },
        serde_json::Value::String(s) => AMQPValue::LongString(LongString::from(s.as_str())),
        serde_json::Value::Array(items) => AMQPValue::FieldArray(FieldArray::from(
            items
                .iter()
                .map(amqp_value)
                .collect::<Result<Vec<_>, _>>()?,
        )),
        serde_json::Value::Object(_) => AMQPValue::FieldTable(headers_from_json(value)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::ShortString;
    use serde_json::json;

    #[test]
    fn json_objects_become_field_tables() {
        let table = headers_from_json(
            &json!({"tenant": "a", "n": 3, "ok": true, "tags": ["x"], "nested": {"k": 1.5}}),
        )
        .unwrap();
        let inner = table.inner();
        assert_eq!(
            inner.get(&ShortString::from("n")),
            Some(&AMQPValue::LongLongInt(3))
        );
        assert_eq!(
            inner.get(&ShortString::from("ok")),
            Some(&AMQPValue::Boolean(true))
        );
        assert!(matches!(
            inner.get(&ShortString::from("nested")),
            Some(AMQPValue::FieldTable(_))
        ));
        assert!(matches!(
            inner.get(&ShortString::from("tags")),
            Some(AMQPValue::FieldArray(_))
        ));
    }

    #[test]
    fn other_json_is_refused() {
        assert_eq!(
            headers_from_json(&json!([1, 2])),
            Err(HeadersError::NotAnObject("an array"))
        );
        assert_eq!(
            headers_from_json(&json!("x")),
            Err(HeadersError::NotAnObject("a string"))
        );
        let long = "k".repeat(300);
        assert!(matches!(
            headers_from_json(&json!({ long: 1 })),
            Err(HeadersError::KeyTooLong(_))
        ));
    }
}
