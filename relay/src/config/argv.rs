//! The way back from typed options to a command line: what a supervisor (the operator's
//! Deployment builder) runs. Rendering the same [`RunArgs`] that clap parses keeps one source of
//! truth for the flag names; the round-trip test below parses what is rendered and gets the
//! same options back, so a renamed or new flag cannot be forgotten here.

use std::time::Duration;

use super::flags::{ColumnArgs, RunArgs, TableArgs};
use crate::table::outbox::{ColumnRole, Columns};

/// `run` and its flags for `args`. The URLs and the pod name are never rendered: they carry
/// secrets or belong to the pod, and reach the process through its environment.
pub fn run_argv(args: &RunArgs) -> Vec<String> {
    let RunArgs {
        table,
        broker_protocol,
        broker_url: _,
        amqp_url: _,
        broker_password_file,
        broker_ca_file,
        broker_client_cert,
        broker_client_key,
        address,
        exchange,
        declare_exchange,
        routing_key,
        batch_size,
        workers,
        inflight_batches,
        max_rate,
        publisher_confirms,
        mandatory,
        publish_timeout,
        commit_timeout,
        broker_heartbeat,
        max_attempts,
        dead_letter_exchange,
        poll_interval,
        listen,
        metrics_addr,
        log_format,
        shutdown_grace,
        report_interval,
        content_type,
        cloudevents,
        cloudevents_source,
        processed_retention,
        pod_name: _,
    } = args;
    let mut argv = Argv(vec!["run".to_string()]);
    table_argv(&mut argv, table);
    argv.named("broker-protocol", broker_protocol);
    for (flag, path) in [
        ("broker-password-file", broker_password_file),
        ("broker-ca-file", broker_ca_file),
        ("broker-client-cert", broker_client_cert),
        ("broker-client-key", broker_client_key),
    ] {
        argv.shown(flag, &path.as_ref().map(|path| path.display()));
    }
    argv.text("address", address);
    argv.text("exchange", exchange);
    argv.named("declare-exchange", declare_exchange);
    argv.text("routing-key", routing_key);
    argv.shown("batch-size", batch_size);
    argv.shown("workers", workers);
    argv.shown("inflight-batches", inflight_batches);
    argv.shown("max-rate", max_rate);
    argv.shown("publisher-confirms", publisher_confirms);
    argv.shown("mandatory", mandatory);
    argv.duration("publish-timeout", publish_timeout);
    argv.duration("commit-timeout", commit_timeout);
    argv.duration("broker-heartbeat", broker_heartbeat);
    argv.shown("max-attempts", max_attempts);
    argv.text("dead-letter-exchange", dead_letter_exchange);
    argv.duration("poll-interval", poll_interval);
    argv.shown("listen", listen);
    argv.shown("metrics-addr", metrics_addr);
    argv.named("log-format", log_format);
    argv.duration("shutdown-grace", shutdown_grace);
    argv.duration("report-interval", report_interval);
    argv.text("content-type", content_type);
    argv.named("cloudevents", cloudevents);
    argv.text("cloudevents-source", cloudevents_source);
    argv.duration("processed-retention", processed_retention);
    argv.0
}

/// The column flags that map `columns` (the optional roles only when mapped).
pub fn column_args(columns: &Columns) -> ColumnArgs {
    let name = |role: ColumnRole| columns.get(role).map(|column| column.to_string());
    ColumnArgs {
        id: name(ColumnRole::Id),
        kind: name(ColumnRole::Type),
        payload: name(ColumnRole::Payload),
        occurred_at: name(ColumnRole::OccurredAt),
        processed_at: name(ColumnRole::ProcessedAt),
        error: name(ColumnRole::Error),
        routing_key: name(ColumnRole::RoutingKey),
        headers: name(ColumnRole::Headers),
        attempts: name(ColumnRole::Attempts),
        partition_key: name(ColumnRole::PartitionKey),
        traceparent: name(ColumnRole::Traceparent),
        tracestate: name(ColumnRole::Tracestate),
    }
}

fn table_argv(argv: &mut Argv, args: &TableArgs) {
    let TableArgs {
        config,
        database_url: _,
        database_password_file,
        database_pool_mode,
        session_database_url: _,
        idle_in_transaction_timeout,
        dead_client_timeout,
        table,
        columns,
        mode,
        ordering,
        relay_name,
    } = args;
    argv.shown("config", &config.as_ref().map(|path| path.display()));
    argv.shown(
        "database-password-file",
        &database_password_file.as_ref().map(|path| path.display()),
    );
    argv.named("database-pool-mode", database_pool_mode);
    argv.duration("idle-in-transaction-timeout", idle_in_transaction_timeout);
    argv.duration("dead-client-timeout", dead_client_timeout);
    argv.text("table", table);
    for role in ColumnRole::ALL {
        argv.text(role.option(), &columns.get(role).cloned());
    }
    argv.named("mode", mode);
    argv.named("ordering", ordering);
    argv.text("relay-name", relay_name);
}

/// Flag-value pairs, each added only when the option is set.
struct Argv(Vec<String>);

impl Argv {
    fn push(&mut self, flag: &str, value: String) {
        self.0.push(format!("--{flag}"));
        self.0.push(value);
    }

    fn text(&mut self, flag: &str, value: &Option<String>) {
        if let Some(value) = value {
            self.push(flag, value.clone());
        }
    }

    fn shown(&mut self, flag: &str, value: &Option<impl std::fmt::Display>) {
        if let Some(value) = value {
            self.push(flag, value.to_string());
        }
    }

    /// A value enum by the name clap parses.
    fn named<T: clap::ValueEnum>(&mut self, flag: &str, value: &Option<T>) {
        if let Some(name) = value.as_ref().and_then(T::to_possible_value) {
            self.push(flag, name.get_name().to_string());
        }
    }

    fn duration(&mut self, flag: &str, value: &Option<Duration>) {
        if let Some(duration) = value {
            self.push(flag, duration_text(*duration));
        }
    }
}

/// The duration in the largest unit that holds it exactly (168h, 5m, 30s, 250ms), which reads
/// like what a user writes; humantime parses it back to the same value.
fn duration_text(duration: Duration) -> String {
    let nanos = duration.as_nanos();
    const UNITS: [(u128, &str); 5] = [
        (3_600_000_000_000, "h"),
        (60_000_000_000, "m"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
    ];
    for (size, unit) in UNITS {
        if nanos >= size && nanos.is_multiple_of(size) {
            return format!("{}{unit}", nanos / size);
        }
    }
    format!("{nanos}ns")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::routing::ExchangeType;
    use crate::config::LogFormat;
    use crate::table::outbox::DeliveryMode;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(clap::Subcommand)]
    enum Command {
        Run(RunArgs),
    }

    /// Every option set, none to its default, so a flag this module forgets cannot hide.
    fn everything() -> RunArgs {
        RunArgs {
            table: TableArgs {
                config: Some("/etc/relay.yaml".into()),
                database_url: None,
                database_password_file: Some("/var/run/secrets/db/password".into()),
                database_pool_mode: Some(crate::database::PoolMode::Transaction),
                session_database_url: None,
                idle_in_transaction_timeout: Some(Duration::from_secs(40)),
                dead_client_timeout: Some(Duration::from_secs(12)),
                table: Some("sales.events".into()),
                columns: ColumnArgs {
                    id: Some("event_id".into()),
                    kind: Some("event_type".into()),
                    payload: Some("body".into()),
                    occurred_at: Some("created_at".into()),
                    processed_at: Some("sent_at".into()),
                    error: Some("last_error".into()),
                    routing_key: Some("rk".into()),
                    headers: Some("hdrs".into()),
                    attempts: Some("tries".into()),
                    partition_key: Some("order_id".into()),
                    traceparent: Some("trace_parent".into()),
                    tracestate: Some("trace_state".into()),
                },
                mode: Some(DeliveryMode::Delete),
                ordering: Some(crate::table::outbox::DeliveryOrder::PerKey),
                relay_name: Some("shop/orders".into()),
            },
            broker_protocol: Some(crate::broker::BrokerProtocol::Amqp10),
            broker_url: None,
            amqp_url: None,
            broker_password_file: Some("/var/run/secrets/mq/password".into()),
            broker_ca_file: Some("/var/run/secrets/mq-ca/ca.crt".into()),
            broker_client_cert: Some("/var/run/secrets/mq-client/tls.crt".into()),
            broker_client_key: Some("/var/run/secrets/mq-client/tls.key".into()),
            address: Some("/amq/queue/sales".into()),
            exchange: Some("sales".into()),
            declare_exchange: Some(ExchangeType::Topic),
            routing_key: Some("sales.static".into()),
            batch_size: Some(1234),
            workers: Some(7),
            inflight_batches: Some(3),
            max_rate: Some(250.5),
            publisher_confirms: Some(false),
            mandatory: Some(true),
            publish_timeout: Some(Duration::from_secs(3)),
            commit_timeout: Some(Duration::from_secs(4)),
            broker_heartbeat: Some(Duration::from_secs(7)),
            max_attempts: Some(9),
            dead_letter_exchange: Some("sales.dlx".into()),
            poll_interval: Some(Duration::from_millis(50)),
            listen: Some(true),
            metrics_addr: Some("0.0.0.0:9090".parse().unwrap()),
            log_format: Some(LogFormat::Json),
            shutdown_grace: Some(Duration::from_secs(40)),
            report_interval: Some(Duration::from_millis(2500)),
            content_type: Some("application/cloudevents+json".into()),
            cloudevents: Some(crate::broker::cloudevents::CloudEventsMode::Binary),
            cloudevents_source: Some("urn:example:sales".into()),
            processed_retention: Some(Duration::from_secs(168 * 3600)),
            pod_name: None,
        }
    }

    fn parse(argv: &[String]) -> RunArgs {
        let cli = Cli::try_parse_from(
            std::iter::once("outbox-relay".to_string()).chain(argv.iter().cloned()),
        )
        .unwrap_or_else(|e| panic!("{argv:?} does not parse: {e}"));
        let Command::Run(mut parsed) = cli.command;
        // Only the environment can set these (the test machine may); they are never rendered.
        parsed.table.database_url = None;
        parsed.amqp_url = None;
        parsed.pod_name = None;
        parsed
    }

    #[test]
    fn what_is_rendered_parses_back_to_the_same_options() {
        let args = everything();
        let argv = run_argv(&args);
        assert_eq!(argv[0], "run");
        assert_eq!(parse(&argv), args);
    }

    #[test]
    fn unset_options_and_secrets_stay_off_the_command_line() {
        let mut args = RunArgs::default();
        args.table.database_url = Some("postgres://app:Pw-123@db/x".into());
        args.amqp_url = Some("amqp://app:Pw-123@mq/%2f".into());
        args.pod_name = Some("orders-0".into());
        assert_eq!(run_argv(&args), vec!["run"]);
    }

    #[test]
    fn durations_read_as_a_user_writes_them() {
        let text = |d| duration_text(d);
        assert_eq!(text(Duration::from_secs(168 * 3600)), "168h");
        assert_eq!(text(Duration::from_secs(300)), "5m");
        assert_eq!(text(Duration::from_secs(90)), "90s");
        assert_eq!(text(Duration::from_millis(2500)), "2500ms");
        assert_eq!(text(Duration::from_nanos(1500)), "1500ns");
    }

    #[test]
    fn column_args_name_every_mapped_column() {
        let columns = Columns::default();
        let args = column_args(&columns);
        assert_eq!(args.id.as_deref(), Some("id"));
        assert_eq!(args.routing_key, None);
    }
}
