//! The YAML configuration file: the options of `run` with underscores, and the column mapping
//! under `columns:`. Unknown keys are refused, so a typo is named instead of ignored. Durations
//! stay text here and are parsed with the flags' parser when resolved, so an error names the
//! option (the YAML parser cannot say which key a value came from).

use std::net::SocketAddr;

use serde::Deserialize;

use super::flags::ColumnArgs;
use super::parse::{ConfigError, LogFormat};
use crate::broker::BrokerProtocol;
use crate::broker::cloudevents::CloudEventsMode;
use crate::broker::routing::ExchangeType;
use crate::database::PoolMode;
use crate::table::outbox::{DeliveryMode, DeliveryOrder};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub database_url: Option<String>,
    pub database_password_file: Option<std::path::PathBuf>,
    pub database_pool_mode: Option<PoolMode>,
    pub session_database_url: Option<String>,
    pub idle_in_transaction_timeout: Option<String>,
    pub dead_client_timeout: Option<String>,
    pub broker_protocol: Option<BrokerProtocol>,
    pub broker_url: Option<String>,
    pub amqp_url: Option<String>,
    pub broker_password_file: Option<std::path::PathBuf>,
    pub broker_ca_file: Option<std::path::PathBuf>,
    pub broker_client_cert: Option<std::path::PathBuf>,
    pub broker_client_key: Option<std::path::PathBuf>,
    pub address: Option<String>,
    pub table: Option<String>,
    pub columns: Option<ColumnArgs>,
    pub mode: Option<DeliveryMode>,
    pub ordering: Option<DeliveryOrder>,
    pub relay_name: Option<String>,
    pub exchange: Option<String>,
    pub declare_exchange: Option<ExchangeType>,
    pub routing_key: Option<String>,
    pub batch_size: Option<i64>,
    pub workers: Option<i64>,
    pub inflight_batches: Option<i64>,
    pub max_rate: Option<f64>,
    pub publisher_confirms: Option<bool>,
    pub mandatory: Option<bool>,
    pub publish_timeout: Option<String>,
    pub commit_timeout: Option<String>,
    pub broker_heartbeat: Option<String>,
    pub max_attempts: Option<i64>,
    pub dead_letter_exchange: Option<String>,
    pub poll_interval: Option<String>,
    pub listen: Option<bool>,
    pub metrics_addr: Option<SocketAddr>,
    pub log_format: Option<LogFormat>,
    pub shutdown_grace: Option<String>,
    pub report_interval: Option<String>,
    pub content_type: Option<String>,
    pub cloudevents: Option<CloudEventsMode>,
    pub cloudevents_source: Option<String>,
    pub processed_retention: Option<String>,
    pub pod_name: Option<String>,
}

impl FileConfig {
    pub fn load(path: &std::path::Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::new("config", format!("cannot read {}: {e}", path.display()))
        })?;
        Self::parse(&text)
            .map_err(|e| ConfigError::new("config", format!("{}: {e}", path.display())))
    }

    /// Parses the YAML text; the error names the unknown or mistyped key.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        serde_yaml::from_str(text).map_err(|e| e.to_string())
    }
}
