//! Every default value and limit of the relay's options, in one place: the CLI, the YAML file
//! and the protocol read them from here.

/// AMQP short strings (type, message_id, routing key, exchange, header names) are limited to
/// 255 bytes.
pub const AMQP_SHORT_STRING_MAX: usize = 255;
pub const MAX_BATCH_SIZE: i64 = 10_000;
pub const MAX_WORKERS: i64 = 256;
