//! The outbox relay: moves transactional-outbox rows from PostgreSQL to RabbitMQ.
//!
//! This crate owns everything about the outbox table: identifiers, SQL, the migration and the
//! lag measurement. The operator calls these functions; it never writes SQL of its own.

pub mod backoff;
pub mod batch;
pub mod claim_cursor;
pub mod config;
pub mod consume;
pub mod database;
pub mod http;
pub mod ident;
pub mod inspect;
pub mod listener;
pub mod metrics;
pub mod migrate;
pub mod publisher;
pub mod relay;
pub mod reporter;
pub mod reports;
pub mod secret_url;
pub mod seed;
pub mod sql;
pub mod table;
pub mod worker;
