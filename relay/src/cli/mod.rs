//! The `outbox-relay` commands: run the relay, migrate the table, show the lag, or generate
//! load. Each command resolves its options, does its work and maps the outcome to an exit code:
//! 2 when the user must change something, 1 for any other failure.

use std::process::ExitCode;
use std::time::Duration;

use crate::broker::routing::ExchangeType;
use crate::config::{
    ConfigError, LogFormat, RunArgs, TableArgs, TableConfig, one_of, positive_duration,
    resolve_run, resolve_table,
};
use crate::defaults;
use crate::metrics::Metrics;
use crate::runtime::run;
use crate::secret_url::{SecretUrl, UrlKind};
use crate::table::inspect::{InspectError, inspect};
use crate::table::migrate::{MigrateError, MigrationOptions, migrate};
use crate::table::reports::measure_backlog;
use crate::table::sql::Statements;
use crate::tools::{consume, seed};
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use sqlx::{Connection, PgConnection};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "outbox-relay",
    version,
    about = "Relays transactional-outbox rows from PostgreSQL to RabbitMQ"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Relay pending rows to the broker until SIGTERM.
    Run(Box<RunArgs>),
    /// Create the pending-row index, the report table and queue-friendly autovacuum settings.
    Migrate(MigrateArgs),
    /// Print the backlog and the age of the oldest pending row.
    Lag(LagArgs),
    /// Insert test rows: bulk with COPY, or steadily with --rate.
    Seed(SeedArgs),
    /// Count messages arriving on a queue bound to the exchange (for demos and benchmarks).
    Consume(ConsumeArgs),
}

#[derive(clap::Args)]
struct ConsumeArgs {
    /// RabbitMQ URL.
    #[arg(long, env = "AMQP_URL", hide_env_values = true)]
    amqp_url: Option<String>,
    /// Exchange to bind to (declared durable if missing).
    #[arg(long, default_value = "outbox")]
    exchange: String,
    /// Exchange type used when declaring it: fanout, topic, direct or headers.
    #[arg(long, value_parser = one_of::<ExchangeType>, default_value = "fanout")]
    exchange_type: ExchangeType,
    /// Durable queue to declare, bind and drain. Default: <exchange>.consumer.
    #[arg(long)]
    queue: Option<String>,
    /// Binding key ("#" suits a topic exchange).
    #[arg(long, default_value = "")]
    binding_key: String,
    /// Stop after this many messages.
    #[arg(long)]
    expect: Option<u64>,
    /// Stop when nothing arrived for this long, e.g. 30s. Default: 30s.
    #[arg(long, value_parser = positive_duration)]
    idle_timeout: Option<Duration>,
    /// Only declare the exchange, queue and binding, then exit.
    #[arg(long)]
    setup_only: bool,
    /// Delete the queue first, so messages left from an earlier run are not counted.
    #[arg(long)]
    fresh: bool,
    /// Count distinct message ids too.
    #[arg(long)]
    distinct: bool,
    /// Hide the progress line.
    #[arg(long)]
    quiet: bool,
}

#[derive(clap::Args)]
struct MigrateArgs {
    #[command(flatten)]
    table: TableArgs,
    /// Build the reference article's covering index (payload INCLUDEd). Only for payloads known
    /// to stay well under 2.7 kB: a larger row then fails to INSERT.
    #[arg(long)]
    covering_index: bool,
    /// Install the NOTIFY trigger that wakes idle relays at once.
    #[arg(long)]
    notify: bool,
    /// Leave the table's autovacuum settings as they are.
    #[arg(long)]
    skip_autovacuum: bool,
    /// How long to keep retrying while another migration holds the lock, e.g. 5m. Default: 5m.
    #[arg(long, value_parser = positive_duration)]
    wait: Option<Duration>,
}

#[derive(clap::Args)]
struct LagArgs {
    #[command(flatten)]
    table: TableArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Stop counting at this many rows.
    #[arg(long, default_value_t = defaults::BACKLOG_CAP, allow_hyphen_values = true)]
    cap: i64,
}

#[derive(clap::Args)]
struct SeedArgs {
    #[command(flatten)]
    table: TableArgs,
    /// Rows to insert.
    #[arg(long, default_value_t = 100_000, allow_hyphen_values = true)]
    rows: i64,
    /// Approximate payload size in bytes (the article's payload is about 50).
    #[arg(long, default_value_t = 50, allow_hyphen_values = true)]
    payload_bytes: i64,
    /// Insert steadily at this many rows per second instead of one bulk COPY.
    #[arg(long, allow_hyphen_values = true)]
    rate: Option<f64>,
    /// Create the table (reference article's columns, with the configured names) if missing.
    #[arg(long)]
    create_table: bool,
    /// Hide the progress bar.
    #[arg(long)]
    quiet: bool,
}

/// Exit code for bad input: the user must change something.
const USAGE: u8 = 2;

fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn,lapin=warn"));
    // Colours only for a terminal: log files and collectors get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

fn usage_error(error: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {error}");
    ExitCode::from(USAGE)
}

fn failure(error: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {error}");
    ExitCode::FAILURE
}

/// Parses the command line and runs the command.
pub async fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run_command(*args).await,
        Command::Migrate(args) => migrate_command(args).await,
        Command::Lag(args) => lag(args).await,
        Command::Seed(args) => seed_command(args).await,
        Command::Consume(args) => consume_command(args).await,
    }
}

/// Cancels the token on SIGTERM or SIGINT.
///
/// The listeners are registered here, synchronously, and not inside the spawned task: until
/// they exist a SIGTERM takes its default action and kills the process with no exit code, so a
/// pod stopped while it starts up would look like a crash. Call it before any other work.
fn on_signal(token: CancellationToken) -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = interrupt.recv() => {}
        }
        token.cancel();
    });
    Ok(())
}

async fn run_command(args: RunArgs) -> ExitCode {
    let shutdown = CancellationToken::new();
    if let Err(e) = on_signal(shutdown.clone()) {
        return failure(format!("cannot listen for SIGTERM: {e}"));
    }
    let config = match resolve_run(&args) {
        Ok(config) => config,
        Err(e) => return usage_error(e),
    };
    init_logs(config.log_format);
    match run::run(config, Metrics::new(), shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is_user_error() => usage_error(e),
        Err(e) => failure(e),
    }
}

/// Resolves the table options and connects; bad input exits 2 before anything is written.
async fn connect(args: &TableArgs) -> Result<(TableConfig, PgConnection), ExitCode> {
    let config = resolve_table(args).map_err(usage_error)?;
    let conn = PgConnection::connect(config.database_url.expose())
        .await
        .map_err(|e| failure(format!("cannot connect to {}: {e}", config.database_url)))?;
    Ok((config, conn))
}

fn inspect_failure(e: InspectError) -> ExitCode {
    if e.is_user_error() {
        usage_error(e)
    } else {
        failure(e)
    }
}

async fn migrate_command(args: MigrateArgs) -> ExitCode {
    init_logs(LogFormat::Text);
    let wait = args.wait.unwrap_or(defaults::MIGRATE_WAIT);
    let (config, mut conn) = match connect(&args.table).await {
        Ok(pair) => pair,
        Err(code) => return code,
    };
    let options = MigrationOptions {
        covering_index: args.covering_index,
        notify: args.notify,
        skip_autovacuum: args.skip_autovacuum,
    };
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match migrate(&mut conn, &config.table, &options).await {
            Ok(report) => {
                for line in report.lines() {
                    println!("{}: {line}", config.table.name);
                }
                return ExitCode::SUCCESS;
            }
            Err(MigrateError::LockBusy) if tokio::time::Instant::now() < deadline => {
                eprintln!(
                    "another migration of {} is running; waiting",
                    config.table.name
                );
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Err(MigrateError::Table(e)) => return inspect_failure(e),
            Err(e) => return failure(e),
        }
    }
}

async fn lag(args: LagArgs) -> ExitCode {
    if args.cap < 1 {
        return usage_error(ConfigError::new(
            "cap",
            format!("must be at least 1, got {}", args.cap),
        ));
    }
    let (config, mut conn) = match connect(&args.table).await {
        Ok(pair) => pair,
        Err(code) => return code,
    };
    let shape = match inspect(&mut conn, &config.table).await {
        Ok(shape) => shape,
        Err(e) => return inspect_failure(e),
    };
    let statements = Statements::new(&config.table, shape.payload);
    match measure_backlog(&mut conn, &statements, args.cap).await {
        Ok(backlog) if args.json => {
            let value = serde_json::json!({
                "table": config.table.name.to_string(),
                "backlog": backlog.pending,
                "backlogCapped": backlog.capped,
                "oldestAgeSeconds": backlog.oldest_age_seconds,
            });
            println!("{value}");
            ExitCode::SUCCESS
        }
        Ok(backlog) => {
            let more = if backlog.capped {
                " or more (count capped)"
            } else {
                ""
            };
            println!("table: {}", config.table.name);
            println!("backlog: {}{more}", backlog.pending);
            match backlog.oldest_age_seconds {
                Some(age) => println!("oldest pending age: {age:.1} s"),
                None => println!("oldest pending age: none pending"),
            }
            ExitCode::SUCCESS
        }
        Err(e) => failure(e),
    }
}

async fn seed_command(args: SeedArgs) -> ExitCode {
    if args.rows < 1 {
        return usage_error(ConfigError::new(
            "rows",
            format!("must be at least 1, got {}", args.rows),
        ));
    }
    if !(0..=100_000_000).contains(&args.payload_bytes) {
        return usage_error(ConfigError::new(
            "payload-bytes",
            "must be between 0 and 100000000",
        ));
    }
    if let Some(rate) = args.rate
        && !(rate.is_finite() && rate > 0.0)
    {
        return usage_error(ConfigError::new(
            "rate",
            format!("must be a positive number, got {rate}"),
        ));
    }
    let (config, mut conn) = match connect(&args.table).await {
        Ok(pair) => pair,
        Err(code) => return code,
    };
    if args.create_table
        && let Err(e) = seed::create_table(&mut conn, &config.table).await
    {
        return failure(format!("cannot create {}: {e}", config.table.name));
    }
    if let Err(e) = inspect(&mut conn, &config.table).await {
        return inspect_failure(e);
    }
    let rows = args.rows as u64;
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(rows)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} seeding [{bar:40}] {pos}/{len} rows ({per_sec}, eta {eta})",
        )
        .expect("static template")
        .progress_chars("=> "),
    );
    let result = match args.rate {
        None => {
            seed::copy_rows(
                &mut conn,
                &config.table,
                rows,
                args.payload_bytes as usize,
                |n| bar.set_position(n),
            )
            .await
        }
        Some(rate) => seed::insert_at_rate(
            &mut conn,
            &config.table,
            rate,
            rows,
            args.payload_bytes as usize,
            |n| bar.set_position(n),
        )
        .await
        .map(|_| ()),
    };
    bar.finish();
    match result {
        Ok(()) => {
            println!("inserted {rows} rows into {}", config.table.name);
            ExitCode::SUCCESS
        }
        Err(e) => failure(e),
    }
}

async fn consume_command(args: ConsumeArgs) -> ExitCode {
    let Some(url_text) = args.amqp_url.as_deref() else {
        return usage_error(ConfigError::new(
            "amqp-url",
            "is missing; pass --amqp-url or set AMQP_URL",
        ));
    };
    let url = match SecretUrl::parse(url_text, UrlKind::Amqp) {
        Ok(url) => url,
        Err(e) => return usage_error(ConfigError::new("amqp-url", e.to_string())),
    };
    let idle = args.idle_timeout.unwrap_or(defaults::CONSUME_IDLE_TIMEOUT);
    let queue = args
        .queue
        .clone()
        .unwrap_or_else(|| format!("{}.consumer", args.exchange));
    let topology = consume::Topology {
        exchange: &args.exchange,
        kind: args.exchange_type,
        queue: &queue,
        binding_key: &args.binding_key,
    };
    if args.setup_only {
        let result = async {
            let connection =
                lapin::Connection::connect(url.expose(), lapin::ConnectionProperties::default())
                    .await?;
            let channel = connection.create_channel().await?;
            if args.fresh {
                channel
                    .queue_delete(
                        queue.as_str().into(),
                        lapin::options::QueueDeleteOptions::default(),
                    )
                    .await?;
            }
            consume::declare(&channel, &topology).await?;
            connection.close(200, "done".into()).await
        }
        .await;
        return match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => failure(format!("cannot declare on {url}: {e}")),
        };
    }
    let bar = match (args.quiet, args.expect) {
        (true, _) => ProgressBar::hidden(),
        (false, Some(n)) => ProgressBar::new(n),
        (false, None) => ProgressBar::new_spinner(),
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} consumed [{bar:40}] {pos}/{len} messages ({per_sec}, eta {eta})",
        )
        .expect("static template")
        .progress_chars("=> "),
    );
    let result = consume::consume(&url, &topology, args.expect, idle, args.distinct, |n| {
        if n.is_multiple_of(1000) {
            bar.set_position(n);
        }
    })
    .await;
    bar.finish_and_clear();
    match result {
        Ok(summary) => {
            let secs = summary.elapsed.as_secs_f64().max(1e-9);
            println!(
                "received {} messages in {:.1} s ({:.0} msg/s){}",
                summary.received,
                secs,
                summary.received as f64 / secs,
                summary
                    .distinct
                    .map(|d| format!(", {d} distinct ids"))
                    .unwrap_or_default()
            );
            if args.expect.is_some_and(|n| summary.received < n) {
                return failure(format!(
                    "expected {} messages, nothing more arrived for {idle:?}",
                    args.expect.unwrap_or(0)
                ));
            }
            ExitCode::SUCCESS
        }
        Err(e) => failure(format!("consuming from {url}: {e}")),
    }
}
