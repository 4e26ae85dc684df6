//! Turning claimed rows into messages: the main message of a row, or why the row cannot be one,
//! and the dead letter of a row given up on.

use super::row::{ClaimedRow, Column, Malformed};
use crate::broker::Message;
use crate::broker::headers;
use crate::broker::routing::RoutingKey;
use crate::broker::trace_context::{MessageTrace, TRACEPARENT, TRACESTATE};
use crate::defaults::AMQP_SHORT_STRING_MAX;

/// The value of `column` when it fits an AMQP short string.
fn short_string(column: Column, value: &str) -> Result<&str, Malformed> {
    if value.len() > AMQP_SHORT_STRING_MAX {
        return Err(Malformed::TooLong {
            column,
            len: value.len(),
        });
    }
    Ok(value)
}

/// Turns a row into a message, or says why it cannot be one.
pub fn to_message<'a>(
    row: &'a ClaimedRow,
    routing: &'a RoutingKey,
) -> Result<Message<'a>, Malformed> {
    if let Some(problem) = &row.malformed {
        return Err(problem.clone());
    }
    let kind = row.kind.as_deref().ok_or(Malformed::Null(Column::Type))?;
    let kind = short_string(Column::Type, kind)?;
    let payload = row
        .payload
        .as_deref()
        .ok_or(Malformed::Null(Column::Payload))?;
    let routing_key = match routing {
        RoutingKey::Type => kind,
        RoutingKey::Column => row.routing_key.as_deref().unwrap_or(kind),
        RoutingKey::Static(key) => key.as_str(),
    };
    let routing_key = short_string(Column::RoutingKey, routing_key)?;
    let headers = headers::check(row.headers.as_ref())?;
    Ok(Message {
        id: row.id,
        kind,
        routing_key,
        payload,
        timestamp: timestamp(row),
        headers,
        error: None,
        trace: trace(row, headers),
        occurred_at: row.occurred_at,
        partition_key: row.partition_key.as_deref(),
    })
}

/// The row's trace context: from the trace-context columns when the row has a traceparent
/// there, else from `traceparent` and `tracestate` keys of its headers (a service that already
/// writes its propagator's headers into the headers column needs no new column). A value that
/// is not text counts as malformed.
fn trace<'a>(
    row: &'a ClaimedRow,
    headers: Option<&'a serde_json::Map<String, serde_json::Value>>,
) -> MessageTrace<'a> {
    if let Some(traceparent) = row.traceparent.as_deref() {
        return MessageTrace::of(Some(traceparent), row.tracestate.as_deref());
    }
    let Some(headers) = headers else {
        return MessageTrace::default();
    };
    let text = |name: &str| headers.get(name).map(|value| value.as_str().unwrap_or(""));
    match text(TRACEPARENT) {
        None => MessageTrace::default(),
        Some(traceparent) => MessageTrace::of(Some(traceparent), text(TRACESTATE)),
    }
}

/// The AMQP timestamp of a row: its claim position in whole seconds, when it has one after 1970.
fn timestamp(row: &ClaimedRow) -> Option<u64> {
    row.occurred_at
        .and_then(|t| u64::try_from(t.timestamp()).ok())
}

/// The dead letter of a row, with its error in a header. Over-long type and routing key are
/// left out rather than refused: a dead letter must get out whatever is wrong with the row.
pub fn dead_letter<'a>(
    row: &'a ClaimedRow,
    error: &'a str,
    routing: &'a RoutingKey,
) -> Message<'a> {
    let fits = |text: &'a str| short_string(Column::Type, text).unwrap_or("");
    let kind = fits(row.kind.as_deref().unwrap_or(""));
    Message {
        id: row.id,
        kind,
        routing_key: match routing {
            RoutingKey::Static(key) => key.as_str(),
            _ => kind,
        },
        payload: row.payload.as_deref().unwrap_or(&[]),
        timestamp: timestamp(row),
        headers: None,
        error: Some(error),
        trace: MessageTrace::default(),
        occurred_at: row.occurred_at,
        partition_key: row.partition_key.as_deref(),
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
    fn trace_context_comes_from_the_columns_else_the_headers() {
        let valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let in_headers = serde_json::json!({"traceparent": other, "tracestate": "a=1"});
        let both = ClaimedRow {
            traceparent: Some(valid.into()),
            headers: Some(in_headers.clone()),
            ..row()
        };
        let message = to_message(&both, &RoutingKey::Type).unwrap();
        let context = message.trace.context.unwrap();
        assert_eq!(context.traceparent, valid);
        assert_eq!(
            context.tracestate, None,
            "the columns win, tracestate included"
        );

        let headers_only = ClaimedRow {
            headers: Some(in_headers),
            ..row()
        };
        let message = to_message(&headers_only, &RoutingKey::Type).unwrap();
        assert_eq!(message.trace.context.unwrap().traceparent, other);
        assert_eq!(message.trace.context.unwrap().tracestate, Some("a=1"));

        // Not text, or malformed: the row still becomes a message, with the drop noted.
        for bad in [
            serde_json::json!({"traceparent": 7}),
            serde_json::json!({"traceparent": "x"}),
        ] {
            let r = ClaimedRow {
                headers: Some(bad),
                ..row()
            };
            let message = to_message(&r, &RoutingKey::Type).expect("still a message");
            assert!(message.trace.context.is_none());
            assert!(message.trace.dropped.is_some());
        }
        let plain = row();
        let message = to_message(&plain, &RoutingKey::Type).unwrap();
        assert_eq!(message.trace, Default::default());
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
                .to_string()
                .contains("payload column is NULL")
        );
        let long_type = ClaimedRow {
            kind: Some("t".repeat(256)),
            ..row()
        };
        assert!(
            to_message(&long_type, &RoutingKey::Type)
                .unwrap_err()
                .to_string()
                .contains("256 bytes")
        );
        let bad_headers = ClaimedRow {
            headers: Some(serde_json::json!([1])),
            ..row()
        };
        assert!(
            to_message(&bad_headers, &RoutingKey::Type)
                .unwrap_err()
                .to_string()
                .contains("JSON object")
        );
        let null_type = ClaimedRow {
            kind: None,
            ..row()
        };
        assert!(
            to_message(&null_type, &RoutingKey::Type)
                .unwrap_err()
                .to_string()
                .contains("type column is NULL")
        );
    }
}
