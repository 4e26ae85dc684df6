//! Relay configuration: flags override environment, environment overrides the YAML file,
//! and the file overrides the built-in defaults ([`crate::defaults`]). Every value is validated
//! here, once, with an error that names the option and says what to do.
//!
//! - [`flags`]: the flags and their environment variables, as clap parses them;
//! - [`file`]: the YAML file;
//! - [`parse`]: the value types and parsers both share;
//! - [`layering`]: each value taken from its layers;
//! - [`table`]: the table and database options of every command, resolved ([`TableConfig`]);
//! - [`broker`]: the broker options of `run`, checked;
//! - [`run`]: everything `run` needs, resolved ([`RelayConfig`]);
//! - [`argv`]: the way back, from typed options to a command line.

pub mod argv;
pub mod broker;
pub mod file;
pub mod flags;
pub mod layering;
pub mod parse;
pub mod run;
pub mod table;

pub use file::FileConfig;
pub use flags::{ColumnArgs, RunArgs, TableArgs};
pub use parse::{ConfigError, LogFormat, one_of, positive_duration};
pub use run::{RelayConfig, resolve_run};
pub use table::{TableConfig, resolve_table};

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::run::resolve_run_with;
    use super::table::resolve_table_with;
    use super::*;
    use crate::broker::BrokerProtocol;
    use crate::broker::cloudevents::{CloudEvents, CloudEventsMode};
    use crate::broker::routing::{ExchangeType, RoutingKey};
    use crate::broker::tls::ClientCert;
    use crate::database::PoolMode;
    use crate::defaults;
    use crate::table::outbox::{Columns, DeliveryOrder};

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
    fn every_session_of_its_own_carries_the_bounds_and_a_transaction_pool_none() {
        let mut args = run_args();
        args.table.idle_in_transaction_timeout = Some(Duration::from_secs(45));
        let config = resolve_run(&args).unwrap();
        let bounds = config.db.database.session_bounds().copied().unwrap();
        assert_eq!(bounds.idle_in_transaction, Duration::from_secs(45));
        assert_eq!(bounds.dead_client, defaults::DEAD_CLIENT_TIMEOUT);

        args.table.database_pool_mode = Some(PoolMode::Transaction);
        args.table.session_database_url = Some("postgres://u:pw@localhost:5432/test".into());
        let config = resolve_run(&args).unwrap();
        assert_eq!(config.db.database.session_bounds(), None);
        let session = config.db.session_database.as_ref().unwrap();
        assert_eq!(session.session_bounds(), Some(&bounds));

        // Unset, the bound follows a long publish timeout instead of refusing it.
        let mut args = run_args();
        args.publish_timeout = Some(Duration::from_secs(60));
        let config = resolve_run(&args).unwrap();
        let bounds = config.db.database.session_bounds().copied().unwrap();
        assert_eq!(bounds.idle_in_transaction, Duration::from_secs(80));
        assert_eq!(config.db.session_bounds, bounds);
    }

    #[test]
    fn per_key_ordering_and_its_column_come_together() {
        let mut args = run_args();
        args.table.ordering = Some(DeliveryOrder::PerKey);
        let err = resolve_run(&args).unwrap_err();
        assert_eq!(err.field, "ordering", "{err}");
        assert!(err.to_string().contains("--partition-key-column"), "{err}");

        args.table.columns.partition_key = Some("aggregate_id".into());
        let config = resolve_run(&args).unwrap();
        assert_eq!(config.db.table.ordering, DeliveryOrder::PerKey);
        assert_eq!(
            config.db.table.columns.partition_key.map(|c| c.to_string()),
            Some("aggregate_id".into())
        );

        args.table.ordering = None;
        let err = resolve_run(&args).unwrap_err();
        assert_eq!(err.field, "partition-key-column", "{err}");
        assert!(err.to_string().contains("--ordering per-key"), "{err}");

        let file =
            FileConfig::parse("ordering: per-key\ncolumns:\n  partition_key: order_id\n").unwrap();
        assert_eq!(file.ordering, Some(DeliveryOrder::PerKey));
    }

    #[test]
    fn transaction_pooling_refuses_what_needs_a_session_without_a_session_url() {
        let mut args = run_args();
        args.table.database_pool_mode = Some(PoolMode::Transaction);
        let config = resolve_run(&args).unwrap();
        assert_eq!(config.db.pool_mode, PoolMode::Transaction);
        assert!(config.db.session_database("x").is_err());

        type Mutation = Box<dyn Fn(&mut RunArgs)>;
        let needs_session: Vec<(Mutation, &str)> = vec![
            (
                Box::new(|a| {
                    a.table.ordering = Some(DeliveryOrder::PerKey);
                    a.table.columns.partition_key = Some("order_id".into());
                }),
                "per-key ordering",
            ),
            (Box::new(|a| a.listen = Some(true)), "--listen"),
        ];
        // Not asked for, LISTEN is left off: the workers poll.
        assert!(!config.listen);
        for (mutate, need) in needs_session {
            let mut refused = args.clone();
            mutate(&mut refused);
            let err = resolve_run(&refused).unwrap_err();
            let text = err.to_string();
            assert_eq!(err.field, "session-database-url", "{text}");
            for named in [
                need,
                "--database-pool-mode transaction",
                "--session-database-url",
            ] {
                assert!(text.contains(named), "{named}: {text}");
            }
            assert!(!text.contains(":pw@"), "{text}");

            refused.table.session_database_url =
                Some("postgres://u:direct-pw@db-direct:5432/test".into());
            refused.table.database_password_file = Some("/run/pw".into());
            let config = resolve_run(&refused).unwrap();
            assert!(config.listen);
            let session = config.db.session_database(need).unwrap();
            assert_eq!(
                session.url().redacted(),
                "postgres://u:***@db-direct:5432/test"
            );
            assert_eq!(
                session.password_file(),
                Some(std::path::Path::new("/run/pw"))
            );
        }
    }

    #[test]
    fn a_session_url_without_transaction_pooling_is_refused_and_the_file_takes_both() {
        let mut args = run_args();
        args.table.session_database_url = Some("postgres://u:pw@direct/test".into());
        let err = resolve_run(&args).unwrap_err();
        assert_eq!(err.field, "session-database-url", "{err}");
        assert!(
            err.to_string().contains("--database-pool-mode transaction"),
            "{err}"
        );
        assert!(!err.to_string().contains("pw@"), "{err}");

        let file = FileConfig::parse(
            "database_pool_mode: transaction\nsession_database_url: postgres://u@direct/test\n",
        )
        .unwrap();
        let db = resolve_table_with(&run_args().table, &file).unwrap();
        assert_eq!(db.pool_mode, PoolMode::Transaction);
        assert!(db.session_database("migrate").is_ok());
        assert!(FileConfig::parse("database_pool_mode: statement\n").is_err());
        // The default: a session, reached by --database-url itself.
        let db = resolve_table_with(&run_args().table, &FileConfig::default()).unwrap();
        assert_eq!(db.pool_mode, PoolMode::Session);
        assert_eq!(db.session_database("migrate").unwrap(), &db.database);
    }

    fn amqp10_args() -> RunArgs {
        RunArgs {
            broker_protocol: Some(BrokerProtocol::Amqp10),
            broker_url: Some("amqp://outbox:outbox@localhost:5673".into()),
            amqp_url: None,
            address: Some("orders".into()),
            ..run_args()
        }
    }

    #[test]
    fn amqp10_needs_an_address_and_refuses_the_options_of_exchanges() {
        let config = resolve_run(&amqp10_args()).unwrap();
        assert_eq!(config.broker_protocol, BrokerProtocol::Amqp10);
        assert_eq!(config.address.as_deref(), Some("orders"));
        type Mutation = Box<dyn Fn(&mut RunArgs)>;
        let refused: Vec<(Mutation, &str)> = vec![
            (Box::new(|a| a.address = None), "address"),
            (Box::new(|a| a.address = Some(" ".into())), "address"),
            (Box::new(|a| a.exchange = Some("orders".into())), "exchange"),
            (
                Box::new(|a| a.declare_exchange = Some(ExchangeType::Topic)),
                "declare-exchange",
            ),
            (
                Box::new(|a| a.routing_key = Some("k".into())),
                "routing-key",
            ),
            (
                Box::new(|a| a.table.columns.routing_key = Some("rk".into())),
                "routing-key-column",
            ),
            (Box::new(|a| a.mandatory = Some(true)), "mandatory"),
            (
                Box::new(|a| a.dead_letter_exchange = Some("dlx".into())),
                "dead-letter-exchange",
            ),
            (
                Box::new(|a| a.publisher_confirms = Some(false)),
                "publisher-confirms",
            ),
        ];
        for (mutate, field) in refused {
            let mut args = amqp10_args();
            mutate(&mut args);
            let err = resolve_run(&args).unwrap_err();
            assert_eq!(err.field, field, "{err}");
            assert!(!err.to_string().contains("secret-pw"), "{err}");
        }
    }

    #[test]
    fn cloudevents_binary_needs_a_uri_reference_source() {
        let mut args = run_args();
        assert_eq!(resolve_run(&args).unwrap().cloudevents, None);
        args.cloudevents = Some(CloudEventsMode::Binary);
        let err = resolve_run(&args).unwrap_err();
        assert_eq!(err.field, "cloudevents-source", "{err}");
        assert!(err.to_string().contains("is missing"), "{err}");
        args.cloudevents_source = Some("not a uri".into());
        assert_eq!(resolve_run(&args).unwrap_err().field, "cloudevents-source");
        args.cloudevents_source = Some("/orders".into());
        assert_eq!(
            resolve_run(&args).unwrap().cloudevents,
            Some(CloudEvents {
                source: "/orders".into()
            })
        );
        args.cloudevents = None;
        assert_eq!(resolve_run(&args).unwrap_err().field, "cloudevents-source");
        let file =
            FileConfig::parse("cloudevents: binary\ncloudevents_source: urn:example:orders\n")
                .unwrap();
        let config = resolve_run_with(&run_args(), &file).unwrap();
        assert_eq!(config.cloudevents.unwrap().source, "urn:example:orders");
    }

    #[test]
    fn a_tracestate_column_needs_a_traceparent_column() {
        let mut args = run_args();
        args.table.columns.tracestate = Some("tracestate".into());
        assert_eq!(resolve_run(&args).unwrap_err().field, "tracestate-column");
        args.table.columns.traceparent = Some("traceparent".into());
        let columns = resolve_run(&args).unwrap().db.table.columns;
        assert_eq!(columns.traceparent.unwrap().as_str(), "traceparent");
    }

    #[test]
    fn the_broker_url_has_two_spellings_and_the_newer_one_wins() {
        let by_new_name = RunArgs {
            broker_url: Some("amqp://guest:guest@localhost:5672/%2f".into()),
            amqp_url: None,
            ..run_args()
        };
        assert!(resolve_run(&by_new_name).is_ok());
        let both_same = RunArgs {
            broker_url: by_new_name.broker_url.clone(),
            ..run_args()
        };
        assert!(resolve_run(&both_same).is_ok());
        let differ = RunArgs {
            broker_url: Some("amqp://other:pw@elsewhere:5672/%2f".into()),
            ..run_args()
        };
        let chosen = resolve_run(&differ).unwrap().broker_urls;
        assert_eq!(chosen.to_string(), "amqp://other:***@elsewhere:5672/%2f");
        let bad_new = RunArgs {
            broker_url: Some("http://x".into()),
            ..run_args()
        };
        assert_eq!(resolve_run(&bad_new).unwrap_err().field, "broker-url");
        // Issue 44: a list of nodes; a bad element is named by its position, without its text.
        let list = RunArgs {
            broker_url: Some("amqp://u:pw1@h1:5672/%2f,amqp://u:pw2@h2:5673/%2f".into()),
            ..run_args()
        };
        assert_eq!(resolve_run(&list).unwrap().broker_urls.len(), 2);
        let bad_element = RunArgs {
            amqp_url: Some("amqp://u:pw1@h1:5672/%2f,amqps://u:pw2@/x".into()),
            ..run_args()
        };
        let err = resolve_run(&bad_element).unwrap_err();
        assert_eq!(err.field, "amqp-url");
        assert!(
            err.to_string()
                .starts_with("invalid --amqp-url: element 2 of 2 is not a URL"),
            "{err}"
        );
        assert!(!err.to_string().contains("pw1") && !err.to_string().contains("pw2"));
        let neither = RunArgs {
            amqp_url: None,
            ..run_args()
        };
        let missing = resolve_run(&neither).unwrap_err();
        assert!(
            missing.to_string().contains("--broker-url (or --amqp-url)"),
            "{missing}"
        );
        let address_under_091 = RunArgs {
            address: Some("orders".into()),
            ..run_args()
        };
        assert_eq!(
            resolve_run(&address_under_091).unwrap_err().field,
            "address"
        );
    }

    /// The pairing is checked once, in `BrokerTls::new`, which every source goes through: flags
    /// (and the environment, which clap puts in the same fields; tests/tests/services/cli.rs runs
    /// that one), the YAML file, and a mix of the two.
    #[test]
    fn a_broker_client_certificate_needs_its_key_from_every_source() {
        let names_both = |err: &ConfigError| {
            let text = err.to_string();
            assert!(
                text.contains("--broker-client-cert") && text.contains("--broker-client-key"),
                "{text}"
            );
        };
        let mut args = run_args();
        args.broker_client_cert = Some("/tls/client.pem".into());
        let err = resolve_run(&args).unwrap_err();
        assert_eq!(err.field, "broker-client-cert", "{err}");
        names_both(&err);

        let file = FileConfig::parse("broker_client_key: /tls/client.key\n").unwrap();
        let err = resolve_run_with(&run_args(), &file).unwrap_err();
        assert_eq!(err.field, "broker-client-key", "{err}");
        names_both(&err);

        let paired = resolve_run_with(&args, &file).unwrap().broker_tls.client;
        assert_eq!(
            paired,
            Some(ClientCert {
                cert: "/tls/client.pem".into(),
                key: "/tls/client.key".into()
            })
        );
    }

    #[test]
    fn defaults_match_the_reference_table() {
        let config = resolve_run(&run_args()).unwrap();
        assert_eq!(config.db.table.name.to_string(), "outbox_messages");
        assert_eq!(config.db.table.columns, Columns::default());
        assert_eq!(config.batch_size, 500);
        assert_eq!(config.inflight_batches, 1);
        assert_eq!(config.max_rate, None, "no limit unless asked for");
        let limited = RunArgs {
            max_rate: Some(2.5),
            ..run_args()
        };
        assert_eq!(resolve_run(&limited).unwrap().max_rate, Some(2.5));
        let file = FileConfig::parse("max_rate: 400\n").unwrap();
        assert_eq!(
            resolve_run_with(&run_args(), &file).unwrap().max_rate,
            Some(400.0)
        );
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
        let db = resolve_table_with(&args.table, &file).unwrap();
        assert_eq!(db.table.name.to_string(), "app.events");
        assert_eq!(db.table.columns.payload.as_str(), "body");
        args.table.table = Some("other".into());
        assert_eq!(
            resolve_table_with(&args.table, &file)
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
                Box::new(|a| a.table.columns.payload = Some("".into())),
                "payload-column",
            ),
            (Box::new(|a| a.batch_size = Some(0)), "batch-size"),
            (Box::new(|a| a.batch_size = Some(-5)), "batch-size"),
            (Box::new(|a| a.workers = Some(100_000)), "workers"),
            (
                Box::new(|a| a.inflight_batches = Some(-1)),
                "inflight-batches",
            ),
            (Box::new(|a| a.max_rate = Some(0.0)), "max-rate"),
            (Box::new(|a| a.max_rate = Some(-5.0)), "max-rate"),
            (Box::new(|a| a.max_rate = Some(f64::NAN)), "max-rate"),
            (Box::new(|a| a.max_rate = Some(f64::INFINITY)), "max-rate"),
            (Box::new(|a| a.max_rate = Some(0.5)), "max-rate"),
            (Box::new(|a| a.max_rate = Some(2e6)), "max-rate"),
            (
                Box::new(|a| a.amqp_url = Some("http://x".into())),
                "amqp-url",
            ),
            (
                Box::new(|a| a.table.database_url = Some("::::".into())),
                "database-url",
            ),
            (Box::new(|a| a.exchange = Some("x".repeat(300))), "exchange"),
            (
                Box::new(|a| a.table.dead_client_timeout = Some(Duration::from_secs(2))),
                "dead-client-timeout",
            ),
            (
                Box::new(|a| {
                    a.table.idle_in_transaction_timeout = Some(Duration::from_millis(500));
                }),
                "idle-in-transaction-timeout",
            ),
            // The server would end a batch's session while it awaits its confirms.
            (
                Box::new(|a| a.table.idle_in_transaction_timeout = Some(Duration::from_secs(8))),
                "idle-in-transaction-timeout",
            ),
        ];
        for (mutate, field) in cases {
            let mut args = run_args();
            mutate(&mut args);
            let err = resolve_run(&args).unwrap_err();
            assert_eq!(err.field, field, "{err}");
            assert!(err.to_string().starts_with(&format!("invalid --{field}: ")));
        }
        // Values with a type of their own are refused by clap as it parses them, naming the
        // flag the same way.
        #[derive(clap::Parser)]
        struct Run {
            #[command(flatten)]
            args: RunArgs,
        }
        let typed = [
            ("mode", "archive"),
            ("publish-timeout", "soon"),
            ("poll-interval", "0s"),
            ("metrics-addr", "nowhere"),
            ("declare-exchange", "queue"),
            ("log-format", "xml"),
            ("database-pool-mode", "statement"),
            ("max-rate", "fast"),
        ];
        for (field, value) in typed {
            let flag = format!("--{field}");
            let Err(err) = <Run as clap::Parser>::try_parse_from(["run", &flag, value]) else {
                panic!("{flag} {value} was accepted");
            };
            use clap::error::ErrorKind;
            assert!(
                matches!(
                    err.kind(),
                    ErrorKind::ValueValidation | ErrorKind::InvalidValue
                ),
                "{err}"
            );
            assert!(err.to_string().contains(&flag), "{err}");
        }
    }

    /// The help texts say the defaults in words; they must be the ones that apply.
    #[test]
    fn help_texts_state_the_defaults_that_apply() {
        use crate::table::outbox::DeliveryMode;
        use clap::ValueEnum;
        let command = <RunArgs as clap::Args>::augment_args(clap::Command::new("run"));
        let help = |id: &str| {
            command
                .get_arguments()
                .find(|a| a.get_id() == id)
                .and_then(|a| a.get_help())
                .map(|h| h.to_string())
                .unwrap_or_else(|| panic!("no help for {id}"))
        };
        let duration = |d: Duration| humantime::format_duration(d).to_string();
        let name = |v: clap::builder::PossibleValue| v.get_name().to_string();
        let stated = [
            ("table", defaults::TABLE.to_string()),
            ("id_column", defaults::columns::ID.into()),
            ("type_column", defaults::columns::TYPE.into()),
            ("payload_column", defaults::columns::PAYLOAD.into()),
            ("occurred_at_column", defaults::columns::OCCURRED_AT.into()),
            (
                "processed_at_column",
                defaults::columns::PROCESSED_AT.into(),
            ),
            ("error_column", defaults::columns::ERROR.into()),
            (
                "mode",
                name(DeliveryMode::default().to_possible_value().unwrap()),
            ),
            ("exchange", defaults::EXCHANGE.into()),
            ("batch_size", defaults::BATCH_SIZE.to_string()),
            ("workers", defaults::WORKERS.to_string()),
            ("inflight_batches", defaults::INFLIGHT_BATCHES.to_string()),
            ("max_attempts", defaults::MAX_ATTEMPTS.to_string()),
            ("publish_timeout", duration(defaults::PUBLISH_TIMEOUT)),
            ("commit_timeout", duration(defaults::COMMIT_TIMEOUT)),
            ("broker_heartbeat", duration(defaults::BROKER_HEARTBEAT)),
            (
                "idle_in_transaction_timeout",
                duration(defaults::IDLE_IN_TRANSACTION_TIMEOUT),
            ),
            (
                "dead_client_timeout",
                duration(defaults::DEAD_CLIENT_TIMEOUT),
            ),
            ("poll_interval", duration(defaults::POLL_INTERVAL)),
            ("metrics_addr", defaults::METRICS_ADDR.to_string()),
            (
                "log_format",
                name(LogFormat::default().to_possible_value().unwrap()),
            ),
            ("shutdown_grace", duration(defaults::SHUTDOWN_GRACE)),
            ("report_interval", duration(defaults::REPORT_INTERVAL)),
        ];
        for (id, default) in stated {
            let text = help(id);
            assert!(
                text.trim_end_matches('.')
                    .ends_with(&format!("Default: {default}")),
                "{id}: {text}"
            );
        }
        for (id, range) in [
            ("batch_size", defaults::BATCH_SIZE_RANGE),
            ("workers", defaults::WORKERS_RANGE),
            ("max_attempts", defaults::MAX_ATTEMPTS_RANGE),
        ] {
            let text = help(id);
            let stated = format!("({}..={})", range.start(), range.end());
            assert!(text.contains(&stated), "{id}: {text}");
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
        assert!(FileConfig::parse("mode: archive\n").is_err());
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        /// The file's keys, as serde itself lists them when it refuses an unknown one, so
        /// this list cannot fall behind the struct.
        fn known_keys() -> Vec<String> {
            let error = FileConfig::parse("surely_not_a_key: 1\n").unwrap_err();
            let (_, listed) = error
                .split_once("expected one of")
                .unwrap_or_else(|| panic!("serde_yaml no longer lists the fields: {error}"));
            let names = listed.split('`').skip(1).step_by(2);
            names.map(str::to_string).collect()
        }

        /// The file takes every option of `run` (flag names with underscores), except the
        /// file itself, with the column flags under `columns:`.
        #[test]
        fn the_file_and_the_flags_know_the_same_options() {
            use clap::CommandFactory;
            #[derive(clap::Parser)]
            struct Run {
                #[command(flatten)]
                args: RunArgs,
            }
            let mut flags: Vec<String> = Run::command()
                .get_arguments()
                .filter_map(|arg| arg.get_long())
                .filter(|long| *long != "config" && !long.ends_with("-column"))
                .map(|long| long.replace('-', "_"))
                .chain(["columns".to_string()])
                .collect();
            let mut keys = known_keys();
            flags.sort();
            keys.sort();
            assert!(keys.len() > 20, "{keys:?}");
            assert_eq!(keys, flags);
        }

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
                prop_assume!(!known_keys().contains(&key));
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
                match resolve_table(&args) {
                    Ok(config) => prop_assert!(config.table.name.quoted().starts_with('"')),
                    Err(e) => prop_assert_eq!(e.field, "table"),
                }
                args.table = None;
                prop_assert!(resolve_table(&args).is_ok());
            }
        }
    }
}
