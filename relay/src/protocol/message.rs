//! Turning claimed rows into messages: the main message of a row, or why the row cannot be one,
//! and the dead letter of a row given up on.

use super::claim::ClaimedRow;
use crate::broker::Message;
use crate::broker::headers::headers_from_json;
use crate::broker::routing::RoutingKey;
use crate::defaults::AMQP_SHORT_STRING_MAX;

/// Turns a row into a message, or says why it cannot be one.
pub fn to_message<'a>(row: &'a ClaimedRow, routing: &'a RoutingKey) -> Result<Message<'a>, String> {
    if let Some(problem) = &row.malformed {
        return Err(problem.clone());
    }
    let kind = row
        .kind
        .as_deref()
        .ok_or("malformed row: the type column is NULL")?;
    if kind.len() > AMQP_SHORT_STRING_MAX {
        return Err(format!(
            "malformed row: type is {} bytes; AMQP allows at most 255",
            kind.len()
        ));
    }
    let payload = row
        .payload
        .as_deref()
        .ok_or("malformed row: the payload column is NULL")?;
    let routing_key = match routing {
        RoutingKey::Type => kind,
        RoutingKey::Column => row.routing_key.as_deref().unwrap_or(kind),
        RoutingKey::Static(key) => key.as_str(),
    };
    if routing_key.len() > AMQP_SHORT_STRING_MAX {
        return Err(format!(
            "malformed row: routing key is {} bytes; AMQP allows at most 255",
            routing_key.len()
        ));
    }
    let headers = match &row.headers {
        None | Some(serde_json::Value::Null) => None,
        Some(value) => Some(headers_from_json(value).map_err(|e| format!("malformed row: {e}"))?),
    };
    Ok(Message {
        id: row.id,
        kind,
        routing_key,
        payload,
        timestamp: row
            .occurred_at
            .and_then(|t| u64::try_from(t.timestamp()).ok()),
        headers,
    })
}

/// The dead letter of a row, with its error in a header. Over-long type and routing key are
/// left out rather than refused: a dead letter must get out whatever is wrong with the row.
pub fn dead_letter<'a>(row: &'a ClaimedRow, error: &str, routing: &'a RoutingKey) -> Message<'a> {
    let mut headers = lapin::types::FieldTable::default();
    headers.insert(
        "x-outbox-error".into(),
        lapin::types::AMQPValue::LongString(error.into()),
    );
    let kind = row.kind.as_deref().unwrap_or("");
    Message {
        id: row.id,
        kind: if kind.len() > AMQP_SHORT_STRING_MAX {
            ""
        } else {
            kind
        },
        routing_key: match routing {
            RoutingKey::Static(key) => key.as_str(),
            _ if kind.len() <= AMQP_SHORT_STRING_MAX => kind,
            _ => "",
        },
        payload: row.payload.as_deref().unwrap_or(&[]),
        timestamp: row
            .occurred_at
            .and_then(|t| u64::try_from(t.timestamp()).ok()),
        headers: Some(headers),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> ClaimedRow {
        ClaimedRow::sample()
    }

    #[test]
    fn routing_key_follows_the_setting() {
        let r = row();
        assert_eq!(
            to_message(&r, &RoutingKey::Type).unwrap().routing_key,
            "OrderCreated"
        );
        assert_eq!(
            to_message(&r, &RoutingKey::Column).unwrap().routing_key,
            "orders"
        );
        let fixed = RoutingKey::Static("all".into());
        assert_eq!(to_message(&r, &fixed).unwrap().routing_key, "all");
        let no_column = ClaimedRow {
            routing_key: None,
            ..row()
        };
        assert_eq!(
            to_message(&no_column, &RoutingKey::Column)
                .unwrap()
                .routing_key,
            "OrderCreated"
        );
    }

    #[test]
    fn malformed_rows_say_why() {
        let null_payload = ClaimedRow {
            payload: None,
            ..row()
        };
        assert!(
            to_message(&null_payload, &RoutingKey::Type)
                .unwrap_err()
                .contains("payload column is NULL")
        );
        let long_type = ClaimedRow {
            kind: Some("t".repeat(256)),
            ..row()
        };
        assert!(
            to_message(&long_type, &RoutingKey::Type)
                .unwrap_err()
                .contains("256 bytes")
        );
        let bad_headers = ClaimedRow {
            headers: Some(serde_json::json!([1])),
            ..row()
        };
        assert!(
            to_message(&bad_headers, &RoutingKey::Type)
                .unwrap_err()
                .contains("JSON object")
        );
        let null_type = ClaimedRow {
            kind: None,
            ..row()
        };
        assert!(
            to_message(&null_type, &RoutingKey::Type)
                .unwrap_err()
                .contains("type column is NULL")
        );
    }
}
