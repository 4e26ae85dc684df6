//! Which format an AMQP 1.0 target address is in, said once at start: RabbitMQ 4 has two (its
//! v2 `/queues/NAME` and `/exchanges/NAME/KEY`, and 3.x's v1, deprecated in 4.0 and refused where
//! `deprecated_features.permit.amqp_address_v1 = false`), while Artemis, ActiveMQ and Service
//! Bus take a plain name. A v1 address keeps working on 4.0 until the broker refuses it, so the
//! line names its v2 form ahead of that day.

/// The format of a target address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressFormat {
    /// RabbitMQ 4's `/queues/NAME`.
    V2Queue,
    /// RabbitMQ 4's `/exchanges/NAME` or `/exchanges/NAME/KEY`.
    V2Exchange,
    /// RabbitMQ 3.x's format (`/amq/queue/NAME`, `/exchange/NAME/KEY`, `/queue/NAME`,
    /// `/topic/KEY`), with its v2 form when there is one.
    V1 { v2: Option<String> },
    /// A plain name, or any other address: another broker's (Artemis, ActiveMQ, Service Bus).
    Plain,
}

impl AddressFormat {
    pub fn of(address: &str) -> Self {
        if address.starts_with("/queues/") {
            return Self::V2Queue;
        }
        if address.starts_with("/exchanges/") {
            return Self::V2Exchange;
        }
        let v1 = |v2: Option<String>| Self::V1 { v2 };
        if let Some(queue) = address.strip_prefix("/amq/queue/") {
            return v1(Some(format!("/queues/{}", segment(queue))));
        }
        if let Some(queue) = address.strip_prefix("/queue/") {
            return v1(Some(format!("/queues/{}", segment(queue))));
        }
        if let Some(key) = address.strip_prefix("/topic/") {
            return v1(Some(format!("/exchanges/amq.topic/{}", segment(key))));
        }
        if let Some(rest) = address.strip_prefix("/exchange/") {
            let v2 = match rest.split_once('/') {
                Some((exchange, key)) => {
                    format!("/exchanges/{}/{}", segment(exchange), segment(key))
                }
                None => format!("/exchanges/{}", segment(rest)),
            };
            return v1(Some(v2));
        }
        // `/queue` alone: the v1 target whose queue is each message's subject; v2 says it with
        // a null address, which --address cannot give.
        if address == "/queue" {
            return v1(None);
        }
        Self::Plain
    }

    /// A short name for the log's `format` field.
    pub fn label(&self) -> &'static str {
        match self {
            Self::V2Queue | Self::V2Exchange => "rabbitmq-v2",
            Self::V1 { .. } => "rabbitmq-v1",
            Self::Plain => "plain",
        }
    }

    /// The start line's sentence about `address`.
    pub fn describe(&self, address: &str) -> String {
        match self {
            Self::V2Queue => {
                format!("AMQP 1.0 target {address}: RabbitMQ 4's v2 address format, a queue")
            }
            Self::V2Exchange => format!(
                "AMQP 1.0 target {address}: RabbitMQ 4's v2 address format, an exchange (and \
                 routing key)"
            ),
            Self::V1 { v2 } => {
                let instead = match v2 {
                    Some(v2) => format!("give --address {v2}"),
                    None => "give --address in the v2 format, /queues/NAME or \
                             /exchanges/NAME/ROUTING-KEY"
                        .to_string(),
                };
                format!(
                    "AMQP 1.0 target {address}: RabbitMQ 3.x's v1 address format, which RabbitMQ \
                     4 deprecates and refuses where amqp_address_v1 is not permitted; for \
                     RabbitMQ 4, {instead}"
                )
            }
            Self::Plain => format!(
                "AMQP 1.0 target {address}: a plain address, as Artemis, ActiveMQ and Service \
                 Bus name a queue or topic (RabbitMQ 4 takes /queues/NAME or \
                 /exchanges/NAME/ROUTING-KEY)"
            ),
        }
    }
}

/// `text` as one segment of a v2 address: RabbitMQ 4 percent-decodes each segment, so anything
/// but RFC 3986's unreserved characters is encoded (a `/` inside a name included).
fn segment(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(byte as char);
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rabbitmq_4s_v2_addresses_are_named_as_such() {
        assert_eq!(AddressFormat::of("/queues/orders"), AddressFormat::V2Queue);
        assert_eq!(
            AddressFormat::of("/exchanges/sales/orders.created"),
            AddressFormat::V2Exchange
        );
        let line = AddressFormat::V2Queue.describe("/queues/orders");
        assert!(line.contains("v2 address format, a queue"), "{line}");
    }

    #[test]
    fn a_v1_address_names_its_v2_form() {
        let v2_of = |address: &str| match AddressFormat::of(address) {
            AddressFormat::V1 { v2 } => v2,
            other => panic!("{address}: {other:?}"),
        };
        assert_eq!(
            v2_of("/amq/queue/orders").as_deref(),
            Some("/queues/orders")
        );
        assert_eq!(v2_of("/queue/orders").as_deref(), Some("/queues/orders"));
        assert_eq!(
            v2_of("/exchange/sales/orders.created").as_deref(),
            Some("/exchanges/sales/orders.created")
        );
        assert_eq!(
            v2_of("/exchange/sales").as_deref(),
            Some("/exchanges/sales")
        );
        assert_eq!(
            v2_of("/topic/orders.*").as_deref(),
            Some("/exchanges/amq.topic/orders.%2A")
        );
        // A v2 segment is percent-encoded: a space, a slash inside a routing key.
        assert_eq!(
            v2_of("/exchange/my sales/eu/orders").as_deref(),
            Some("/exchanges/my%20sales/eu%2Forders")
        );
        assert_eq!(v2_of("/queue"), None);

        let line = AddressFormat::of("/amq/queue/orders").describe("/amq/queue/orders");
        assert!(
            line.contains("v1 address format")
                && line.contains("amqp_address_v1")
                && line.contains("--address /queues/orders"),
            "{line}"
        );
        let line = AddressFormat::of("/queue").describe("/queue");
        assert!(line.contains("/queues/NAME"), "{line}");
    }

    #[test]
    fn any_other_address_is_another_brokers_plain_name() {
        for address in [
            "orders",
            "outbox-full.orders",
            "topic://orders",
            "/custom/path",
        ] {
            assert_eq!(
                AddressFormat::of(address),
                AddressFormat::Plain,
                "{address}"
            );
        }
        let line = AddressFormat::Plain.describe("orders");
        assert!(line.contains("a plain address"), "{line}");
        assert_eq!(AddressFormat::Plain.label(), "plain");
    }
}
