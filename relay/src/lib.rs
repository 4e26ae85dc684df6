//! The outbox relay: moves transactional-outbox rows from PostgreSQL to RabbitMQ.
//!
//! This crate owns everything about the outbox table: identifiers, SQL, the migration and the
//! lag measurement. The operator calls these functions; it never writes SQL of its own.
//!
//! The modules are layered, and each imports only from the ones listed before it (`make lint`
//! checks that no module imports form a circle):
//!
//! - [`defaults`]: every default value and limit of the relay's options, in one place;
//! - [`connect`]: what connecting needs before a driver is involved (URLs that hide their
//!   password, libpq's multi-host URLs, password files, certificate dates), and [`announce`]
//!   and [`metrics`]: leaves shared by everything above;
//! - [`database`]: opening connections (TLS as libpq means it, password files, clear failures);
//! - [`table`]: identifiers, the table's shape, its SQL, the migration, the lag reports and the
//!   on-call repairs (replay, dead letters);
//! - [`broker`]: the publisher trait (publish a batch, await its confirms) and its AMQP 0-9-1
//!   implementation;
//! - [`telemetry`]: the relay's own spans (one trace per batch) and their OTLP export, off
//!   unless the standard OTEL_EXPORTER_OTLP_* variables say where;
//! - [`protocol`]: one batch of the table protocol (claim, publish, settle), generic over the
//!   publisher, and where the next claim starts;
//! - [`config`]: the options of each command, layered flags > environment > file > defaults;
//! - [`runtime`]: a running relay process: workers, reporter, LISTEN task, HTTP endpoints;
//! - [`tools`]: load generation and a counting consumer, for demos and benchmarks;
//! - [`cli`]: the `outbox-relay` commands.

pub mod announce;
pub mod connect;
pub mod defaults;
pub mod metrics;

pub mod database;

pub mod table;

pub mod broker;

pub mod telemetry;

pub mod protocol;

pub mod config;

pub mod runtime;

pub mod tools;

pub mod cli;
