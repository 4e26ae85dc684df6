//! The tests that need only what `scripts/services.sh` starts (PostgreSQL, RabbitMQ, ActiveMQ
//! Artemis) and the image tools (buildah, umoci, runc): relay processes, the CLI, the table
//! protocol, both brokers, the image. One test binary for all of them: each file as its own
//! crate compiled tokio, sqlx and lapin's generic code again and linked a binary of its own,
//! minutes of CI on two cores. Every test still uses its own table, exchanges and queues, so
//! they run side by side (`--test-threads`).
//!
//! The tests that start a Kubernetes control plane are separate binaries
//! (`tests/tests/e2e_*.rs`, `long_*.rs`): each binary shares one control plane among its tests.

mod amqp10_delivery;
mod app_faults;
mod artemis_pair;
mod bad_input;
mod broker_alarm;
mod broker_cluster;
mod chaos_tool;
mod claim_frontier;
mod claim_plan;
mod claim_seek;
mod cli;
mod collector;
mod dead_letters;
mod exchange_not_found;
mod hostile_rows;
mod identifiers;
mod image;
mod metrics_port;
mod migration;
mod mixed_versions;
mod multi_host;
mod operator_database_cut;
mod otel_spans;
mod partition;
mod per_key_ordering;
mod pg_failover;
mod pgbouncer;
mod publish_slots;
mod rate_limit;
mod relay_delivery;
mod relay_faults;
mod replay;
mod reports;
mod retried_causes;
mod secure_broker;
mod secure_postgres;
mod session_bounds;
mod settling_claim;
mod suspend;
mod table_health;
mod trace_context;
