//! Relay configuration: flags override environment, environment overrides the YAML file,
//! and the file overrides the built-in defaults. Every value is validated here, once, with an
//! error that names the option and says what to do.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use serde::Deserialize;

use crate::broker::routing::{ExchangeType, RoutingKey};
use crate::defaults::{AMQP_SHORT_STRING_MAX, MAX_BATCH_SIZE, MAX_WORKERS};
use crate::secret_url::{SecretUrl, UrlKind};
use crate::table::ident::{Ident, TableName};
use crate::table::outbox::{Columns, DeliveryMode, OutboxTable};

/// A configuration value that cannot be used. `field` is the flag name without dashes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid --{field}: {message}")]
pub struct ConfigError {
    pub field: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Options shared by every subcommand that touches the outbox table. Each is also read from
/// the environment and from the `--config` file (same names, with underscores).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TableArgs {
    /// YAML configuration file; flags and environment override its values.
    #[arg(long, env = "OUTBOX_RELAY_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// PostgreSQL URL, e.g. postgres://user:password@host:5432/db.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Outbox table, optionally schema-qualified (schema.table). Default: outbox_messages.
    #[arg(long, env = "OUTBOX_RELAY_TABLE")]
    pub table: Option<String>,
    /// Column holding the message id (uuid). Default: id.
    #[arg(long, env = "OUTBOX_RELAY_ID_COLUMN")]
    pub id_column: Option<String>,
    /// Column holding the message type. Default: type.
    #[arg(long, env = "OUTBOX_RELAY_TYPE_COLUMN")]
    pub type_column: Option<String>,
    /// Column holding the payload (jsonb, json, text or bytea). Default: content.
    #[arg(long, env = "OUTBOX_RELAY_PAYLOAD_COLUMN")]
    pub payload_column: Option<String>,
    /// Column giving the claim order. Default: occurred_on_utc.
    #[arg(long, env = "OUTBOX_RELAY_OCCURRED_AT_COLUMN")]
    pub occurred_at_column: Option<String>,
    /// Column set when a row is processed; NULL means pending. Default: processed_on_utc.
    #[arg(long, env = "OUTBOX_RELAY_PROCESSED_AT_COLUMN")]
    pub processed_at_column: Option<String>,
    /// Column receiving the last failure text. Default: error.
    #[arg(long, env = "OUTBOX_RELAY_ERROR_COLUMN")]
    pub error_column: Option<String>,
    /// Optional column holding a per-row routing key.
    #[arg(long, env = "OUTBOX_RELAY_ROUTING_KEY_COLUMN")]
    pub routing_key_column: Option<String>,
    /// Optional jsonb column holding AMQP headers (a JSON object).
    #[arg(long, env = "OUTBOX_RELAY_HEADERS_COLUMN")]
    pub headers_column: Option<String>,
    /// Optional integer column counting broker rejections; without it a rejected message is
    /// dead-lettered at its first rejection.
    #[arg(long, env = "OUTBOX_RELAY_ATTEMPTS_COLUMN")]
    pub attempts_column: Option<String>,
    /// mark (set processed-at) or delete (remove the row) after the broker confirmed it.
    #[arg(long, env = "OUTBOX_RELAY_MODE")]
    pub mode: Option<String>,
    /// Name of this relay; keys its reports and its advisory locks. Default: the table name.
    #[arg(long, env = "OUTBOX_RELAY_NAME")]
    pub relay_name: Option<String>,
}

/// Options of `outbox-relay run`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub table: TableArgs,
    /// RabbitMQ URL, e.g. amqp://user:password@host:5672/%2f.
    #[arg(long, env = "AMQP_URL", hide_env_values = true)]
    pub amqp_url: Option<String>,
    /// Exchange to publish to ("" is the default exchange). Default: outbox.
    #[arg(long, env = "OUTBOX_RELAY_EXCHANGE")]
    pub exchange: Option<String>,
    /// Declare the exchange (durable) with this type at connect: fanout, topic, direct or
    /// headers. Without it the exchange must already exist (checked at connect).
    #[arg(long, env = "OUTBOX_RELAY_DECLARE_EXCHANGE")]
    pub declare_exchange: Option<String>,
    /// Static routing key for every message. Default: the row's type, or the routing-key column.
    #[arg(long, env = "OUTBOX_RELAY_ROUTING_KEY")]
    pub routing_key: Option<String>,
    /// Rows claimed, published and marked per transaction (1..=10000). Default: 500.
    #[arg(long, env = "OUTBOX_RELAY_BATCH_SIZE", allow_hyphen_values = true)]
    pub batch_size: Option<i64>,
    /// Concurrent claimers in this process, each with its own connections (1..=256). Default: 2.
    #[arg(long, env = "OUTBOX_RELAY_WORKERS", allow_hyphen_values = true)]
    pub workers: Option<i64>,
    /// Batches of this process at the broker at once (0 = one per worker). Other workers claim
    /// meanwhile and publish as soon as a slot frees. Default: 1.
    #[arg(
        long,
        env = "OUTBOX_RELAY_INFLIGHT_BATCHES",
        allow_hyphen_values = true
    )]
    pub inflight_batches: Option<i64>,
    /// Wait for broker confirms before marking rows. Turning this off can lose messages.
    #[arg(long, env = "OUTBOX_RELAY_PUBLISHER_CONFIRMS")]
    pub publisher_confirms: Option<bool>,
    /// Publish with the mandatory flag, so unroutable messages come back as failures.
    #[arg(long, env = "OUTBOX_RELAY_MANDATORY")]
    pub mandatory: Option<bool>,
    /// Longest wait for the confirms of one batch, e.g. 10s. Default: 10s.
    #[arg(long, env = "OUTBOX_RELAY_PUBLISH_TIMEOUT")]
    pub publish_timeout: Option<String>,
    /// Broker rejections before a message is dead-lettered (1..=1000). Default: 5.
    #[arg(long, env = "OUTBOX_RELAY_MAX_ATTEMPTS", allow_hyphen_values = true)]
    pub max_attempts: Option<i64>,
    /// Exchange that receives dead-lettered messages (optional).
    #[arg(long, env = "OUTBOX_RELAY_DEAD_LETTER_EXCHANGE")]
    pub dead_letter_exchange: Option<String>,
    /// Pause between claims when the table is empty, e.g. 200ms. Default: 200ms.
    #[arg(long, env = "OUTBOX_RELAY_POLL_INTERVAL")]
    pub poll_interval: Option<String>,
    /// Wake idle workers with LISTEN on the channel the `migrate --notify` trigger signals.
    #[arg(long, env = "OUTBOX_RELAY_LISTEN")]
    pub listen: Option<bool>,
    /// Address of the /metrics, /healthz and /readyz server. Default: 0.0.0.0:9090.
    #[arg(long, env = "OUTBOX_RELAY_METRICS_ADDR")]
    pub metrics_addr: Option<String>,
    /// text or json. Default: text.
    #[arg(long, env = "OUTBOX_RELAY_LOG_FORMAT")]
    pub log_format: Option<String>,
    /// How long SIGTERM waits for the batches in flight, e.g. 25s. Default: 25s.
    #[arg(long, env = "OUTBOX_RELAY_SHUTDOWN_GRACE")]
    pub shutdown_grace: Option<String>,
    /// How often this process writes its lag report, e.g. 5s. Default: 5s.
    #[arg(long, env = "OUTBOX_RELAY_REPORT_INTERVAL")]
    pub report_interval: Option<String>,
    /// AMQP content_type. Default: from the payload column type (application/json for json).
    #[arg(long, env = "OUTBOX_RELAY_CONTENT_TYPE")]
    pub content_type: Option<String>,
    /// Delete processed rows older than this, e.g. 168h (mark mode). Default: keep them.
    #[arg(long, env = "OUTBOX_RELAY_PROCESSED_RETENTION")]
    pub processed_retention: Option<String>,
    /// Name of this process in lag reports. Default: $POD_NAME, then the host name.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
}

/// The YAML file: the same options, with underscores; unknown keys are refused.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub database_url: Option<String>,
    pub amqp_url: Option<String>,
    pub table: Option<String>,
    pub columns: Option<FileColumns>,
    pub mode: Option<String>,
    pub relay_name: Option<String>,
    pub exchange: Option<String>,
    pub declare_exchange: Option<String>,
    pub routing_key: Option<String>,
    pub batch_size: Option<i64>,
    pub workers: Option<i64>,
    pub inflight_batches: Option<i64>,
    pub publisher_confirms: Option<bool>,
    pub mandatory: Option<bool>,
    pub publish_timeout: Option<String>,
    pub max_attempts: Option<i64>,
    pub dead_letter_exchange: Option<String>,
    pub poll_interval: Option<String>,
    pub listen: Option<bool>,
    pub metrics_addr: Option<String>,
    pub log_format: Option<String>,
    pub shutdown_grace: Option<String>,
    pub report_interval: Option<String>,
    pub content_type: Option<String>,
    pub processed_retention: Option<String>,
    pub pod_name: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileColumns {
    pub id: Option<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub payload: Option<String>,
    pub occurred_at: Option<String>,
    pub processed_at: Option<String>,
    pub error: Option<String>,
    pub routing_key: Option<String>,
    pub headers: Option<String>,
    pub attempts: Option<String>,
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

/// Everything that describes the table and the database, resolved and validated.
#[derive(Debug, Clone)]
pub struct TableConfig {
    pub database_url: SecretUrl,
    pub table: OutboxTable,
    pub relay_name: String,
}

/// Everything `run` needs.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub db: TableConfig,
    pub amqp_url: SecretUrl,
    pub exchange: String,
    pub declare_exchange: Option<ExchangeType>,
    pub routing_key: RoutingKey,
    pub batch_size: usize,
    pub workers: usize,
    /// Batches at the broker at once; 0 means no limit (one per worker).
    pub inflight_batches: usize,
    pub publisher_confirms: bool,
    pub mandatory: bool,
    pub publish_timeout: Duration,
    pub max_attempts: i32,
    pub dead_letter_exchange: Option<String>,
    pub poll_interval: Duration,
    pub listen: bool,
    pub metrics_addr: SocketAddr,
    pub log_format: LogFormat,
    pub shutdown_grace: Duration,
    pub report_interval: Duration,
    pub content_type: Option<String>,
    pub processed_retention: Option<Duration>,
    pub pod_name: String,
}

fn ident(
    field: &str,
    value: Option<String>,
    default: Option<&str>,
) -> Result<Option<Ident>, ConfigError> {
    match value.as_deref().or(default) {
        None => Ok(None),
        Some(name) => Ident::new(name)
            .map(Some)
            .map_err(|e| ConfigError::new(field, format!("column name {e}"))),
    }
}

fn required_ident(field: &str, value: Option<String>, default: &str) -> Result<Ident, ConfigError> {
    Ok(ident(field, value, Some(default))?.expect("a default was given"))
}

fn ranged(
    field: &str,
    value: Option<i64>,
    default: i64,
    min: i64,
    max: i64,
) -> Result<i64, ConfigError> {
    let value = value.unwrap_or(default);
    if !(min..=max).contains(&value) {
        return Err(ConfigError::new(
            field,
            format!("must be between {min} and {max}, got {value}"),
        ));
    }
    Ok(value)
}

pub fn parse_duration(
    field: &str,
    value: Option<String>,
    default: &str,
) -> Result<Duration, ConfigError> {
    let text = value.unwrap_or_else(|| default.to_string());
    let duration = humantime::parse_duration(text.trim()).map_err(|e| {
        ConfigError::new(
            field,
            format!("{e} in {text:?}; write a duration like 500ms, 10s or 1m"),
        )
    })?;
    if duration.is_zero() {
        return Err(ConfigError::new(field, "must be greater than zero"));
    }
    Ok(duration)
}

fn short_string(field: &str, value: &str) -> Result<(), ConfigError> {
    if value.len() > AMQP_SHORT_STRING_MAX {
        return Err(ConfigError::new(
            field,
            format!("is {} bytes; AMQP allows at most 255", value.len()),
        ));
    }
    Ok(())
}

impl TableArgs {
    fn load_file(&self) -> Result<FileConfig, ConfigError> {
        match &self.config {
            Some(path) => FileConfig::load(path),
            None => Ok(FileConfig::default()),
        }
    }

    /// Resolves the table options (for migrate, lag, seed and run).
    pub fn resolve(&self) -> Result<TableConfig, ConfigError> {
        let file = self.load_file()?;
        self.resolve_with(&file)
    }

    fn resolve_with(&self, file: &FileConfig) -> Result<TableConfig, ConfigError> {
        let pick = |flag: &Option<String>, from_file: &Option<String>| {
            flag.clone().or_else(|| from_file.clone())
        };
        let url_text = pick(&self.database_url, &file.database_url).ok_or_else(|| {
            ConfigError::new(
                "database-url",
                "is missing; pass --database-url or set DATABASE_URL",
            )
        })?;
        let database_url = SecretUrl::parse(&url_text, UrlKind::Postgres)
            .map_err(|e| ConfigError::new("database-url", e.to_string()))?;

        let table_text = pick(&self.table, &file.table).unwrap_or_else(|| "outbox_messages".into());
        let name = TableName::parse(&table_text)
            .map_err(|e| ConfigError::new("table", format!("table name {e}")))?;

        let fc = file.columns.as_ref();
        let col = |flag: &Option<String>, get: fn(&FileColumns) -> &Option<String>| {
            flag.clone().or_else(|| fc.and_then(|c| get(c).clone()))
        };
        let defaults = Columns::default();
        let columns = Columns {
            id: required_ident(
                "id-column",
                col(&self.id_column, |c| &c.id),
                defaults.id.as_str(),
            )?,
            kind: required_ident(
                "type-column",
                col(&self.type_column, |c| &c.kind),
                defaults.kind.as_str(),
            )?,
            payload: required_ident(
                "payload-column",
                col(&self.payload_column, |c| &c.payload),
                defaults.payload.as_str(),
            )?,
            occurred_at: required_ident(
                "occurred-at-column",
                col(&self.occurred_at_column, |c| &c.occurred_at),
                defaults.occurred_at.as_str(),
            )?,
            processed_at: required_ident(
                "processed-at-column",
                col(&self.processed_at_column, |c| &c.processed_at),
                defaults.processed_at.as_str(),
            )?,
            error: required_ident(
                "error-column",
                col(&self.error_column, |c| &c.error),
                defaults.error.as_str(),
            )?,
            routing_key: ident(
                "routing-key-column",
                col(&self.routing_key_column, |c| &c.routing_key),
                None,
            )?,
            headers: ident(
                "headers-column",
                col(&self.headers_column, |c| &c.headers),
                None,
            )?,
            attempts: ident(
                "attempts-column",
                col(&self.attempts_column, |c| &c.attempts),
                None,
            )?,
        };

        let mode_text = pick(&self.mode, &file.mode).unwrap_or_else(|| "mark".into());
        let mode = DeliveryMode::parse(&mode_text).ok_or_else(|| {
            ConfigError::new(
                "mode",
                format!("{mode_text:?} is not a delivery mode; use mark or delete"),
            )
        })?;

        let relay_name =
            pick(&self.relay_name, &file.relay_name).unwrap_or_else(|| name.to_string());
        if relay_name.is_empty()
            || relay_name.len() > 200
            || relay_name.chars().any(char::is_control)
        {
            return Err(ConfigError::new(
                "relay-name",
                "must be 1 to 200 printable characters",
            ));
        }

        Ok(TableConfig {
            database_url,
            table: OutboxTable {
                name,
                columns,
                mode,
            },
            relay_name,
        })
    }
}

impl RunArgs {
    pub fn resolve(&self) -> Result<RelayConfig, ConfigError> {
        let file = self.table.load_file()?;
        let db = self.table.resolve_with(&file)?;
        let pick = |flag: &Option<String>, from_file: &Option<String>| {
            flag.clone().or_else(|| from_file.clone())
        };

        let amqp_text = pick(&self.amqp_url, &file.amqp_url).ok_or_else(|| {
            ConfigError::new("amqp-url", "is missing; pass --amqp-url or set AMQP_URL")
        })?;
        let amqp_url = SecretUrl::parse(&amqp_text, UrlKind::Amqp)
            .map_err(|e| ConfigError::new("amqp-url", e.to_string()))?;

        let exchange = pick(&self.exchange, &file.exchange).unwrap_or_else(|| "outbox".into());
        short_string("exchange", &exchange)?;
        let declare_exchange = match pick(&self.declare_exchange, &file.declare_exchange) {
            None => None,
            Some(text) => Some(ExchangeType::parse(&text).ok_or_else(|| {
                ConfigError::new(
                    "declare-exchange",
                    format!(
                        "{text:?} is not an exchange type; use fanout, topic, direct or headers"
                    ),
                )
            })?),
        };
        let routing_key = match pick(&self.routing_key, &file.routing_key) {
            Some(key) => {
                short_string("routing-key", &key)?;
                RoutingKey::Static(key)
            }
            None if db.table.columns.routing_key.is_some() => RoutingKey::Column,
            None => RoutingKey::Type,
        };
        let dead_letter_exchange = pick(&self.dead_letter_exchange, &file.dead_letter_exchange);
        if let Some(dlx) = &dead_letter_exchange {
            short_string("dead-letter-exchange", dlx)?;
        }

        let batch_size = ranged(
            "batch-size",
            self.batch_size.or(file.batch_size),
            500,
            1,
            MAX_BATCH_SIZE,
        )? as usize;
        let workers = ranged("workers", self.workers.or(file.workers), 2, 1, MAX_WORKERS)? as usize;
        let inflight_batches = ranged(
            "inflight-batches",
            self.inflight_batches.or(file.inflight_batches),
            1,
            0,
            MAX_WORKERS,
        )? as usize;
        let max_attempts = ranged(
            "max-attempts",
            self.max_attempts.or(file.max_attempts),
            5,
            1,
            1000,
        )? as i32;

        let metrics_text =
            pick(&self.metrics_addr, &file.metrics_addr).unwrap_or_else(|| "0.0.0.0:9090".into());
        let metrics_addr = metrics_text.parse().map_err(|_| {
            ConfigError::new(
                "metrics-addr",
                format!("{metrics_text:?} is not an address; write host:port such as 0.0.0.0:9090"),
            )
        })?;

        let log_text = pick(&self.log_format, &file.log_format).unwrap_or_else(|| "text".into());
        let log_format = match log_text.as_str() {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            other => {
                return Err(ConfigError::new(
                    "log-format",
                    format!("{other:?} is not text or json"),
                ));
            }
        };

        let content_type = pick(&self.content_type, &file.content_type);
        if let Some(ct) = &content_type {
            short_string("content-type", ct)?;
        }

        let pod_name = pick(&self.pod_name, &file.pod_name)
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| format!("pid-{}", std::process::id()));

        let processed_retention = match pick(&self.processed_retention, &file.processed_retention) {
            None => None,
            Some(text) => Some(parse_duration("processed-retention", Some(text), "")?),
        };

        Ok(RelayConfig {
            declare_exchange,
            processed_retention,
            db,
            amqp_url,
            exchange,
            routing_key,
            batch_size,
            workers,
            inflight_batches,
            publisher_confirms: self
                .publisher_confirms
                .or(file.publisher_confirms)
                .unwrap_or(true),
            mandatory: self.mandatory.or(file.mandatory).unwrap_or(false),
            publish_timeout: parse_duration(
                "publish-timeout",
                pick(&self.publish_timeout, &file.publish_timeout),
                "10s",
            )?,
            max_attempts,
            dead_letter_exchange,
            poll_interval: parse_duration(
                "poll-interval",
                pick(&self.poll_interval, &file.poll_interval),
                "200ms",
            )?,
            listen: self.listen.or(file.listen).unwrap_or(true),
            metrics_addr,
            log_format,
            shutdown_grace: parse_duration(
                "shutdown-grace",
                pick(&self.shutdown_grace, &file.shutdown_grace),
                "25s",
            )?,
            report_interval: parse_duration(
                "report-interval",
                pick(&self.report_interval, &file.report_interval),
                "5s",
            )?,
            content_type,
            pod_name,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_args() -> RunArgs {
        RunArgs {
            table: TableArgs {
                database_url: Some("postgres://u:pw@localhost/test".into()),
                ..Default::default()
            },
            amqp_url: Some("amqp://guest:guest@localhost:5672/%2f".into()),
            ..Default::default()
        }
    }

    #[test]
    fn defaults_match_the_reference_table() {
        let config = run_args().resolve().unwrap();
        assert_eq!(config.db.table.name.to_string(), "outbox_messages");
        assert_eq!(config.db.table.columns, Columns::default());
        assert_eq!(config.batch_size, 500);
        assert_eq!(config.inflight_batches, 1);
        assert!(config.publisher_confirms);
        assert_eq!(config.routing_key, RoutingKey::Type);
        assert_eq!(config.db.relay_name, "outbox_messages");
    }

    #[test]
    fn flags_override_the_file() {
        let file =
            FileConfig::parse("table: app.events\nbatch_size: 50\ncolumns:\n  payload: body\n")
                .unwrap();
        let mut args = run_args();
        args.batch_size = Some(70);
        let db = args.table.resolve_with(&file).unwrap();
        assert_eq!(db.table.name.to_string(), "app.events");
        assert_eq!(db.table.columns.payload.as_str(), "body");
        args.table.table = Some("other".into());
        assert_eq!(
            args.table
                .resolve_with(&file)
                .unwrap()
                .table
                .name
                .to_string(),
            "other"
        );
    }

    #[test]
    fn bad_values_name_their_option() {
        type Mutation = Box<dyn Fn(&mut RunArgs)>;
        let cases: Vec<(Mutation, &str)> = vec![
            (
                Box::new(|a| a.table.table = Some("outbox; drop table x".into())),
                "table",
            ),
            (
                Box::new(|a| a.table.payload_column = Some("".into())),
                "payload-column",
            ),
            (Box::new(|a| a.batch_size = Some(0)), "batch-size"),
            (Box::new(|a| a.batch_size = Some(-5)), "batch-size"),
            (Box::new(|a| a.workers = Some(100_000)), "workers"),
            (
                Box::new(|a| a.inflight_batches = Some(-1)),
                "inflight-batches",
            ),
            (Box::new(|a| a.table.mode = Some("archive".into())), "mode"),
            (
                Box::new(|a| a.amqp_url = Some("http://x".into())),
                "amqp-url",
            ),
            (
                Box::new(|a| a.table.database_url = Some("::::".into())),
                "database-url",
            ),
            (
                Box::new(|a| a.publish_timeout = Some("soon".into())),
                "publish-timeout",
            ),
            (
                Box::new(|a| a.poll_interval = Some("0s".into())),
                "poll-interval",
            ),
            (
                Box::new(|a| a.metrics_addr = Some("nowhere".into())),
                "metrics-addr",
            ),
            (Box::new(|a| a.exchange = Some("x".repeat(300))), "exchange"),
        ];
        for (mutate, field) in cases {
            let mut args = run_args();
            mutate(&mut args);
            let err = args.resolve().unwrap_err();
            assert_eq!(err.field, field, "{err}");
            assert!(err.to_string().starts_with(&format!("invalid --{field}: ")));
        }
    }

    #[test]
    fn file_keys_are_checked() {
        let err = FileConfig::parse("batch_sise: 5\n").unwrap_err();
        assert!(err.contains("batch_sise"), "{err}");
        let err = FileConfig::parse("columns:\n  paylod: x\n").unwrap_err();
        assert!(err.contains("paylod"), "{err}");
        assert!(FileConfig::parse("batch_size: [1").is_err());
        assert!(FileConfig::parse("- a\n- b\n").is_err());
        assert!(FileConfig::parse("batch_size: many\n").is_err());
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        const KNOWN_KEYS: &[&str] = &[
            "database_url",
            "amqp_url",
            "table",
            "columns",
            "mode",
            "relay_name",
            "exchange",
            "declare_exchange",
            "routing_key",
            "batch_size",
            "workers",
            "inflight_batches",
            "publisher_confirms",
            "mandatory",
            "publish_timeout",
            "max_attempts",
            "dead_letter_exchange",
            "poll_interval",
            "listen",
            "metrics_addr",
            "log_format",
            "shutdown_grace",
            "report_interval",
            "content_type",
            "processed_retention",
            "pod_name",
        ];

        proptest! {
            // Any text at all: the parser answers Ok or Err, it never panics.
            #[test]
            fn fuzz_config_parser_never_panics(text in "\\PC{0,200}") {
                let _ = FileConfig::parse(&text);
            }

            // YAML-looking text built from real and invented keys and odd values.
            #[test]
            fn fuzz_config_parser_on_yaml_shapes(
                lines in proptest::collection::vec(("[a-z_]{1,16}", prop_oneof![
                    Just("1".to_string()), Just("-5".to_string()), Just("[".to_string()), Just("{a: 1}".to_string()),
                    Just("true".to_string()), Just("''".to_string()), "[a-z0-9 .;]{0,20}",
                ]), 0..8)
            ) {
                let text: String = lines.iter().map(|(k, v)| format!("{k}: {v}\n")).collect();
                if let Err(message) = FileConfig::parse(&text) {
                    prop_assert!(!message.is_empty());
                }
            }

            #[test]
            fn fuzz_unknown_keys_are_named(key in "[a-z_]{1,24}") {
                prop_assume!(!KNOWN_KEYS.contains(&key.as_str()));
                let err = FileConfig::parse(&format!("{key}: 1\n")).unwrap_err();
                prop_assert!(err.contains(&key), "{}", err);
            }

            // Whatever the table text, resolution answers with a ConfigError naming --table or succeeds.
            #[test]
            fn fuzz_table_names_resolve_or_name_the_field(table in "\\PC{0,80}") {
                let mut args = TableArgs {
                    database_url: Some("postgres://u@localhost/db".into()),
                    table: Some(table),
                    ..Default::default()
                };
                match args.resolve() {
                    Ok(config) => prop_assert!(config.table.name.quoted().starts_with('"')),
                    Err(e) => prop_assert_eq!(e.field, "table"),
                }
                args.table = None;
                prop_assert!(args.resolve().is_ok());
            }
        }
    }
}
