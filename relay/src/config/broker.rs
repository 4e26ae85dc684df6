//! The broker options of `run`, checked: the broker's URL or nodes, what only one protocol
//! means (AMQP 0-9-1's exchanges, AMQP 1.0's address), the CloudEvents settings, and the AMQP
//! limit on short strings (exchange, routing key, content type).

use super::file::FileConfig;
use super::flags::RunArgs;
use super::layering::layer;
use super::parse::ConfigError;
use crate::broker::cloudevents::{self, CloudEvents, CloudEventsMode};
use crate::broker::urls::BrokerUrls;
use crate::defaults::AMQP_SHORT_STRING_MAX;

pub(super) fn short_string(field: &str, value: &str) -> Result<(), ConfigError> {
    if value.len() > AMQP_SHORT_STRING_MAX {
        return Err(ConfigError::new(
            field,
            format!(
                "is {} bytes; AMQP allows at most {AMQP_SHORT_STRING_MAX}",
                value.len()
            ),
        ));
    }
    Ok(())
}

/// `--broker-url`, else its AMQP 0-9-1 spelling `--amqp-url`: the newer name wins, so a
/// machine-wide `AMQP_URL` does not stand in the way of one relay's `--broker-url`. Either holds
/// one URL or a comma-separated list of full URLs ([`BrokerUrls`]). An error names the option
/// the URL came from, and the element of a list by its position.
pub(super) fn broker_urls(args: &RunArgs, file: &FileConfig) -> Result<BrokerUrls, ConfigError> {
    let broker = layer(&args.broker_url, &file.broker_url);
    let amqp = layer(&args.amqp_url, &file.amqp_url);
    let (field, text) = match (broker, amqp) {
        (Some(broker), _) => ("broker-url", broker),
        (None, Some(amqp)) => ("amqp-url", amqp),
        (None, None) => {
            return Err(ConfigError::new(
                "broker-url",
                "is missing; pass --broker-url (or --amqp-url) or set BROKER_URL (or AMQP_URL)",
            ));
        }
    };
    BrokerUrls::parse(&text).map_err(|e| ConfigError::new(field, e.to_string()))
}

/// Under AMQP 0-9-1 there is no address: the exchange says where messages go.
pub(super) fn amqp091_only(address: bool) -> Result<(), ConfigError> {
    if address {
        return Err(ConfigError::new(
            "address",
            "is an AMQP 1.0 option; pass --broker-protocol amqp10, or use --exchange with amqp091",
        ));
    }
    Ok(())
}

/// Under AMQP 1.0 messages go to one address; the options of RabbitMQ's exchanges have no
/// meaning there, and one given anyway is refused rather than ignored.
pub(super) fn amqp10_only(
    args: &RunArgs,
    file: &FileConfig,
    address: Option<&str>,
) -> Result<(), ConfigError> {
    let address = address.ok_or_else(|| {
        ConfigError::new(
            "address",
            "is missing; --broker-protocol amqp10 sends to an address (a queue or topic, e.g. \
             orders, or /queues/orders on RabbitMQ 4 and /amq/queue/orders on 3.x): pass \
             --address or set OUTBOX_RELAY_ADDRESS",
        )
    })?;
    if address.trim().is_empty() {
        return Err(ConfigError::new("address", "must not be empty"));
    }
    let given_091 = [
        (
            "exchange",
            layer(&args.exchange, &file.exchange).is_some(),
            "--address says where messages go",
        ),
        (
            "declare-exchange",
            layer(&args.declare_exchange, &file.declare_exchange).is_some(),
            "create the queue or topic on the broker",
        ),
        (
            "routing-key",
            layer(&args.routing_key, &file.routing_key).is_some(),
            "the row's type goes in the subject property",
        ),
        (
            "routing-key-column",
            args.table.columns.routing_key.is_some()
                || file
                    .columns
                    .as_ref()
                    .is_some_and(|c| c.routing_key.is_some()),
            "the row's type goes in the subject property",
        ),
        (
            "mandatory",
            layer(&args.mandatory, &file.mandatory).is_some(),
            "an AMQP 1.0 broker refuses an unknown address when the link attaches",
        ),
        (
            "dead-letter-exchange",
            layer(&args.dead_letter_exchange, &file.dead_letter_exchange).is_some(),
            "rows given up on keep their error in the error column",
        ),
        (
            "publisher-confirms",
            layer(&args.publisher_confirms, &file.publisher_confirms) == Some(false),
            "amqp10 always waits for the broker's outcome",
        ),
    ];
    if let Some((field, _, instead)) = given_091.iter().find(|(_, given, _)| *given) {
        return Err(ConfigError::new(
            *field,
            format!(
                "is an AMQP 0-9-1 option with no meaning under --broker-protocol amqp10 ({instead}); remove it"
            ),
        ));
    }
    Ok(())
}

/// The CloudEvents settings: binary mode needs a source that is a URI-reference (CloudEvents
/// requires the attribute); a source without the mode would be silently unused, so it is
/// refused.
pub(super) fn cloudevents_settings(
    mode: CloudEventsMode,
    source: Option<String>,
) -> Result<Option<CloudEvents>, ConfigError> {
    match (mode, source) {
        (CloudEventsMode::Off, None) => Ok(None),
        (CloudEventsMode::Off, Some(_)) => Err(ConfigError::new(
            "cloudevents-source",
            "only has a meaning with --cloudevents binary; add it, or remove the source",
        )),
        (CloudEventsMode::Binary, None) => Err(ConfigError::new(
            "cloudevents-source",
            "is missing: --cloudevents binary needs the source attribute of every event, a \
             URI-reference naming the producer (e.g. /orders or urn:example:orders); pass \
             --cloudevents-source or set OUTBOX_RELAY_CLOUDEVENTS_SOURCE",
        )),
        (CloudEventsMode::Binary, Some(source)) => {
            cloudevents::check_source(&source)
                .map_err(|e| ConfigError::new("cloudevents-source", e))?;
            Ok(Some(CloudEvents { source }))
        }
    }
}
