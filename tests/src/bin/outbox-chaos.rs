//! `outbox-chaos`: the reliability run behind `make chaos` (and `make chaos-smoke`).
//!
//! Several real relay processes drain a seeded table while kill -9, broker cuts and restarts,
//! PostgreSQL backend terminations and network stalls hit them at seeded random points. A
//! consumer in a separate process records every message id. The report says what was lost
//! (must be nothing), duplicated (within the protocol's bound) and left pending (nothing).
//! With `--ordering per-key` the rows take turns over `--keys` partition keys, the relays run
//! with per-key ordering, and the report adds the keys whose first deliveries came out of
//! order (must be none). With the `pg-failover` fault the run's database is a primary and
//! synchronous standby of its own (`outbox_tests::standby`) rather than `DATABASE_URL`'s, and
//! the relays reach it through one address that moves at each failover. With
//! `broker-node-loss` the broker is the three-node RabbitMQ cluster
//! (`outbox_tests::rabbit_cluster`): the relays are given all three nodes, the run's queue is a
//! quorum queue, and nodes 2 and 3 are stopped or killed in turn while the consumer reads from
//! node 1; `broker-alarm` raises a memory or disk alarm on node 2 or 3 there, which blocks
//! publishing on the whole cluster, and clears it after a pause. With `partition`, relay 0 runs in a network namespace of its own
//! (`outbox_tests::partition`), reaching `DATABASE_URL`'s server and the broker directly, and
//! its link is taken down silently for a while, then healed.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use outbox_relay::broker::routing::ExchangeType;
use outbox_relay::table::ident::Ident;
use outbox_relay::table::migrate::{MigrationOptions, migrate};
use outbox_relay::tools::consume::{Topology, declare};
use outbox_relay::tools::seed::{RowShape, copy_rows_shaped, create_table};
use outbox_tests::chaos::consumer;
use outbox_tests::chaos::faults::{self, FaultKind};
use outbox_tests::chaos::leaks::leaks;
use outbox_tests::chaos::report::{ChaosReport, FaultRecord, OrderingReport};
use outbox_tests::ordering::{check, expected_order};
use outbox_tests::partition::Partition;
use outbox_tests::rabbit_cluster::{self, Alarm, Lease, Resource};
use outbox_tests::standby::{Server, StandbyPair, Stop};
use outbox_tests::{db, process, proxy, unique, wait};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::process::{Child, Command};

#[derive(Parser)]
#[command(
    name = "outbox-chaos",
    about = "Relays rows under injected faults and reports losses and duplicates"
)]
struct Cli {
    #[command(subcommand)]
    mode: Option<Mode>,
    /// Rows to relay.
    #[arg(long, default_value_t = 1_000_000)]
    rows: u64,
    /// Relay processes.
    #[arg(long, default_value_t = 3)]
    relays: usize,
    /// Workers per relay process.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    #[arg(long, default_value_t = 500)]
    batch_size: usize,
    /// Seed of the fault schedule; printed in the report so a run can be repeated.
    #[arg(long)]
    seed: Option<u64>,
    /// Fault kinds to inject (comma-separated): kill-9, broker-cut, broker-restart, pg-terminate,
    /// network-stall, partition (relay 0 cut off silently, then healed; not with pg-failover or
    /// broker-node-loss), pg-failover (which runs on a standby pair of the run's own), and
    /// broker-node-loss and broker-alarm (on the three-node RabbitMQ cluster; not with
    /// broker-cut or broker-restart, which act on the single broker).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "kill-9,broker-cut,broker-restart,pg-terminate,network-stall,partition"
    )]
    faults: Vec<String>,
    /// How many faults of each kind.
    #[arg(long, default_value_t = 2)]
    per_kind: usize,
    /// A seconds-long run: 20,000 rows, two relays, one fault of each kind.
    #[arg(long)]
    smoke: bool,
    /// `per-key`: rows over `--keys` partition keys, relayed with `--ordering per-key`, and the
    /// order of every key's first deliveries checked.
    #[arg(long, default_value = "unordered", value_parser = ["unordered", "per-key"])]
    ordering: String,
    /// Partition keys under `--ordering per-key`.
    #[arg(long, default_value_t = 1000)]
    keys: u64,
}

#[derive(Subcommand)]
enum Mode {
    /// (internal) The recording consumer process.
    Consumer {
        #[arg(long)]
        amqp_url: String,
        #[arg(long)]
        queue: String,
        #[arg(long)]
        out: PathBuf,
    },
}

/// The partition-key column of a per-key run.
const KEY_COLUMN: &str = "aggregate_id";

struct Run {
    name: String,
    rows: u64,
    workers: usize,
    batch_size: usize,
    db_url: String,
    password: String,
    dir: PathBuf,
    relays: Vec<Child>,
    /// How many times each relay has been started (its log is appended to across restarts).
    spawns: Vec<usize>,
    started: Instant,
    /// Under per-key ordering: the relays' extra arguments.
    ordering_args: Vec<String>,
    /// The run's database: `DATABASE_URL`'s, or a standby pair of its own.
    database: Database,
    /// The run's broker: the tests' RabbitMQ, or the three-node cluster.
    broker: Broker,
    /// The queue the consumer reads.
    queue: String,
    /// Under the `partition` fault: relay 0's network namespace and the database URL it uses
    /// from inside (the server directly, not the stalling proxy, which listens on loopback), and
    /// how long a cut lasts (milliseconds). Last, so it goes after the relays it holds.
    partition: Option<(Partition, String, std::ops::Range<u64>)>,
}

/// Where the run's messages go.
enum Broker {
    /// The tests' RabbitMQ (`AMQP_URL`).
    Single,
    /// The three-node cluster, held for the run; the queue is a quorum queue.
    Cluster(Lease),
}

impl Broker {
    /// What the relays are given: one URL, or the list of the cluster's three nodes.
    fn relay_url(&self) -> String {
        match self {
            Broker::Single => outbox_tests::amqp_url(),
            Broker::Cluster(_) => rabbit_cluster::all_nodes(),
        }
    }

    /// Where the consumer and the run's own set-up connect: node 1 is never lost.
    fn url(&self) -> String {
        match self {
            Broker::Single => outbox_tests::amqp_url(),
            Broker::Cluster(_) => rabbit_cluster::node_url(1),
        }
    }
}

/// Where the run's table lives.
enum Database {
    /// The server and database `DATABASE_URL` names.
    Shared,
    /// A primary and synchronous standby of the run's own, and which of the two is the
    /// primary now (they swap at each failover).
    Pair(StandbyPair, Server),
}

impl Database {
    /// The URL of the primary now, for the run's own connections (not through the proxy).
    fn url(&self) -> String {
        match self {
            Database::Shared => outbox_tests::database_url(),
            Database::Pair(pair, primary) => pair.url(*primary),
        }
    }

    async fn connect(&self) -> sqlx::PgConnection {
        db::connect_to(&self.url()).await
    }
}

impl Run {
    fn relay_log(&self, index: usize) -> PathBuf {
        self.dir.join(format!("{}-relay-{index}.log", self.name))
    }

    fn spawn_relay(&mut self, index: usize) -> Child {
        self.spawns[index] += 1;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.relay_log(index))
            .expect("relay log");
        let relay = process::binary("outbox-relay");
        let (mut command, db_url, amqp_url) = match self.partition.as_ref().filter(|_| index == 0) {
            Some((partition, inside_db_url, _)) => (
                partition.command(&relay),
                inside_db_url.clone(),
                Partition::url_inside(&self.broker.relay_url()),
            ),
            None => (
                Command::new(&relay),
                self.db_url.clone(),
                self.broker.relay_url(),
            ),
        };
        command
            .args([
                "run",
                "--table",
                &self.name,
                "--exchange",
                &self.name,
                "--relay-name",
                &self.name,
            ])
            .args([
                "--workers",
                &self.workers.to_string(),
                "--batch-size",
                &self.batch_size.to_string(),
            ])
            .args([
                "--metrics-addr",
                "127.0.0.1:0",
                "--poll-interval",
                "100ms",
                "--publish-timeout",
                "5s",
            ])
            .args([
                "--pod-name",
                &format!("chaos-{index}"),
                "--report-interval",
                "2s",
            ])
            .args(&self.ordering_args)
            .env("DATABASE_URL", db_url)
            .env("AMQP_URL", amqp_url)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn outbox-relay")
    }

    /// Waits until relay `index` logged that its latest start finished, so it is running its
    /// own SIGTERM handling. A signal that lands while the process is still being exec'd takes
    /// the default action and kills it, which says nothing about the relay's shutdown.
    async fn wait_started(&self, index: usize, limit: Duration) -> bool {
        outbox_tests::wait::holds("the relay logged that it is relaying", limit, || async {
            let log = std::fs::read_to_string(self.relay_log(index)).unwrap_or_default();
            log.matches(": relaying").count() >= self.spawns[index]
        })
        .await
    }

    fn ids_file(&self) -> PathBuf {
        self.dir.join(format!("{}.ids", self.name))
    }

    /// Ids recorded so far: every line is a 36-character uuid and a newline.
    fn delivered(&self) -> u64 {
        std::fs::metadata(self.ids_file())
            .map(|m| m.len() / 37)
            .unwrap_or(0)
    }

    fn seconds(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Waits until the consumer records new ids again; the time it took, `None` when it did
    /// not within `limit`, an error when a relay gave up for good meanwhile.
    async fn recovery(&mut self, limit: Duration) -> anyhow::Result<Option<f64>> {
        let before = self.delivered();
        let start = Instant::now();
        let flowing = wait::until_or_fail("the consumer records new ids", limit, || {
            let failed = self.failed_relay();
            let flowing = self.delivered() > before || self.delivered() >= self.rows;
            async move { failed.map_or(Ok(flowing), Err) }
        })
        .await;
        match flowing {
            Ok(()) => Ok(Some(start.elapsed().as_secs_f64())),
            Err(error) if error.is::<wait::TimedOut>() => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// A relay that exited with an error code: it will not recover by itself (a bad table,
    /// option or URL), so the run ends at once rather than waiting out its timeouts. Killed
    /// relays (no exit code) are the faults' own doing and are restarted by them.
    fn failed_relay(&mut self) -> Option<anyhow::Error> {
        for index in 0..self.relays.len() {
            let code = match self.relays[index].try_wait() {
                Ok(Some(status)) => status.code(),
                _ => continue,
            };
            if let Some(code) = code.filter(|c| *c != 0) {
                let log = std::fs::read_to_string(self.relay_log(index)).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(5).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                return Some(anyhow::anyhow!(
                    "relay {index} exited with code {code}; its last log lines:\n{}",
                    tail.join("\n")
                ));
            }
        }
        None
    }
}

fn signal(child: &Child, sig: i32) {
    if let Some(pid) = child.id() {
        // SAFETY: kill(2) takes plain integers and touches no memory of ours.
        unsafe { libc::kill(pid as i32, sig) };
    }
}

/// The fault schedule: each fault fires when this fraction of the rows has been delivered.
fn schedule(rng: &mut StdRng, kinds: &[FaultKind], per_kind: usize) -> Vec<(f64, FaultKind)> {
    let mut plan: Vec<(f64, FaultKind)> = kinds
        .iter()
        .flat_map(|k| std::iter::repeat_n(*k, per_kind))
        .map(|k| (rng.random_range(0.05..0.85), k))
        .collect();
    plan.sort_by(|a, b| a.0.total_cmp(&b.0));
    plan
}

async fn inject(
    run: &mut Run,
    kind: FaultKind,
    rng: &mut StdRng,
    admin: &mut sqlx::PgConnection,
    stall: &proxy::StallSwitch,
) -> anyhow::Result<(String, u64)> {
    let everyone = (run.relays.len() * run.workers) as u64;
    Ok(match kind {
        FaultKind::Kill9 => {
            let index = rng.random_range(0..run.relays.len());
            signal(&run.relays[index], libc::SIGKILL);
            let _ = run.relays[index].wait().await;
            let pause = Duration::from_millis(rng.random_range(500..2500));
            tokio::time::sleep(pause).await;
            run.relays[index] = run.spawn_relay(index);
            (
                format!(
                    "relay {index} killed, restarted after {:.1} s",
                    pause.as_secs_f64()
                ),
                run.workers as u64,
            )
        }
        FaultKind::BrokerCut => {
            faults::broker_cut().await?;
            ("all broker connections closed".into(), everyone)
        }
        FaultKind::BrokerRestart => {
            let pause = Duration::from_millis(rng.random_range(1000..3000));
            faults::broker_restart(pause).await?;
            (
                format!("RabbitMQ stopped for {:.1} s", pause.as_secs_f64()),
                everyone,
            )
        }
        FaultKind::PgTerminate => {
            let n = faults::pg_terminate(admin, &run.name).await?;
            (format!("{n} relay sessions terminated"), n.max(0) as u64)
        }
        FaultKind::PgFailover => {
            let Database::Pair(pair, primary) = &mut run.database else {
                anyhow::bail!("pg-failover needs the run's own standby pair");
            };
            let old = *primary;
            pair.stop(old, Stop::Immediate).await;
            // What a failover manager takes to decide, then the promotion and the address.
            let pause = Duration::from_millis(rng.random_range(500..1500));
            tokio::time::sleep(pause).await;
            pair.promote_server(old.other()).await;
            stall.repoint(pair.addr(old.other()));
            *primary = old.other();
            *admin = db::connect_to(&pair.url(old.other())).await;
            (
                format!(
                    "{} killed, {} promoted after {:.1} s and the address moved (the old primary rejoins as its standby)",
                    old.name(),
                    old.other().name(),
                    pause.as_secs_f64()
                ),
                everyone,
            )
        }
        FaultKind::BrokerNodeLoss => {
            let Broker::Cluster(lease) = &run.broker else {
                anyhow::bail!("broker-node-loss needs the run's RabbitMQ cluster");
            };
            let node = rng.random_range(2..=3);
            let kill = rng.random_bool(0.5);
            rabbit_cluster::node(if kill { "kill" } else { "stop" }, node).await;
            let pause = Duration::from_millis(rng.random_range(1000..3000));
            tokio::time::sleep(pause).await;
            // Every node up, and the queue on all three again, before the next fault.
            lease.bring_back().await;
            rabbit_cluster::await_quorum(&run.queue).await;
            (
                format!(
                    "broker node {node} {}, started again after {:.1} s",
                    if kill { "killed (-9)" } else { "stopped" },
                    pause.as_secs_f64()
                ),
                everyone,
            )
        }
        FaultKind::BrokerAlarm => {
            let Broker::Cluster(_) = &run.broker else {
                anyhow::bail!("broker-alarm needs the run's RabbitMQ cluster");
            };
            let node = rng.random_range(2..=3);
            let resource = match rng.random_bool(0.5) {
                true => Resource::Memory,
                false => Resource::Disk,
            };
            let mut alarm = Alarm::prepare(node, resource).await;
            alarm.raise().await;
            let pause = Duration::from_millis(rng.random_range(2000..5000));
            tokio::time::sleep(pause).await;
            alarm.clear().await;
            (
                format!(
                    "{} alarm on broker node {node}, cleared after {:.1} s",
                    resource.name(),
                    pause.as_secs_f64()
                ),
                everyone,
            )
        }
        FaultKind::Partition => {
            let Some((partition, _, cut_for)) = &run.partition else {
                anyhow::bail!("partition needs relay 0 in a network namespace");
            };
            let cut_for = Duration::from_millis(rng.random_range(cut_for.clone()));
            partition.cut();
            tokio::time::sleep(cut_for).await;
            partition.heal();
            (
                format!(
                    "relay 0 cut off silently for {:.1} s, then healed",
                    cut_for.as_secs_f64()
                ),
                run.workers as u64,
            )
        }
        FaultKind::NetworkStall => {
            let pause = Duration::from_millis(rng.random_range(2000..5000));
            stall.stall_for(pause).await;
            (
                format!(
                    "PostgreSQL traffic stalled for {:.1} s",
                    pause.as_secs_f64()
                ),
                0,
            )
        }
    })
}

/// Reads the consumer's file: every id in arrival order.
fn read_arrivals(path: &Path) -> anyhow::Result<Vec<uuid::Uuid>> {
    let text = std::fs::read_to_string(path)?;
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|line| Ok(uuid::Uuid::parse_str(line)?))
        .collect()
}

/// Distinct ids and how many arrived more than once.
fn distinct(arrivals: &[uuid::Uuid]) -> (std::collections::HashSet<uuid::Uuid>, u64) {
    let mut ids = std::collections::HashSet::new();
    let mut duplicates = 0;
    for id in arrivals {
        if !ids.insert(*id) {
            duplicates += 1;
        }
    }
    (ids, duplicates)
}

async fn chaos(cli: Cli) -> anyhow::Result<ChaosReport> {
    let (rows, relays, per_kind) = if cli.smoke {
        (20_000, 2, 1)
    } else {
        (cli.rows, cli.relays, cli.per_kind)
    };
    let batch_size = if cli.smoke { 200 } else { cli.batch_size };
    let kinds: Vec<FaultKind> = cli
        .faults
        .iter()
        .map(|f| FaultKind::parse(f).ok_or_else(|| anyhow::anyhow!("unknown fault {f:?}")))
        .collect::<Result<_, _>>()?;
    let seed = cli.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(1)
    });
    let mut rng = StdRng::seed_from_u64(seed);
    println!(
        "chaos: seed {seed}, {rows} rows, {relays} relays × {} workers",
        cli.workers
    );

    let name = unique("chaos");
    let dir = process::target_dir().join("chaos");
    std::fs::create_dir_all(&dir)?;
    let mut table = db::table(&name);
    let per_key = cli.ordering == "per-key";
    let keys = cli.keys.max(1);
    let ordering_args: Vec<String> = if per_key {
        table.columns.partition_key = Some(Ident::new(KEY_COLUMN)?);
        [
            "--ordering",
            "per-key",
            "--partition-key-column",
            KEY_COLUMN,
        ]
        .map(String::from)
        .to_vec()
    } else {
        Vec::new()
    };
    let database = if kinds.contains(&FaultKind::PgFailover) {
        let pair = StandbyPair::start().await;
        println!(
            "chaos: on a standby pair of the run's own (primary 127.0.0.1:{}, standby 127.0.0.1:{})",
            pair.primary_port, pair.standby_port
        );
        Database::Pair(pair, Server::Primary)
    } else {
        Database::Shared
    };
    let mut admin = database.connect().await;
    create_table(&mut admin, &table).await?;
    let shape = RowShape {
        payload_bytes: 50,
        keys,
    };
    copy_rows_shaped(&mut admin, &table, rows, shape, |_| {}).await?;
    migrate(&mut admin, &table, &MigrationOptions::default()).await?;
    // Read before the run: in delete mode the rows would be gone, and it costs the run nothing.
    let expected = match per_key {
        true => Some(expected_order(&mut admin, &table, KEY_COLUMN).await),
        false => None,
    };

    let broker = if kinds.iter().any(|kind| kind.needs_the_cluster()) {
        if kinds.contains(&FaultKind::BrokerCut) || kinds.contains(&FaultKind::BrokerRestart) {
            anyhow::bail!(
                "broker-node-loss and broker-alarm run on the RabbitMQ cluster, broker-cut and broker-restart on the single broker: leave those out of --faults"
            );
        }
        let lease = Lease::take().await;
        println!(
            "chaos: on the three-node RabbitMQ cluster ({})",
            rabbit_cluster::all_nodes().replace("guest:guest@", "")
        );
        Broker::Cluster(lease)
    } else {
        Broker::Single
    };
    let amqp = broker.url();
    let queue = match broker {
        Broker::Single => {
            let queue = format!("{name}.ids");
            let connection =
                lapin::Connection::connect(&amqp, lapin::ConnectionProperties::default()).await?;
            let channel = connection.create_channel().await?;
            declare(
                &channel,
                &Topology {
                    exchange: &name,
                    kind: ExchangeType::Fanout,
                    queue: &queue,
                    binding_key: "",
                },
            )
            .await?;
            let _ = connection.close(200, "set up".into()).await;
            queue
        }
        // A quorum queue on all three nodes (`{name}_q`), as production would have it.
        Broker::Cluster(_) => {
            rabbit_cluster::declare_quorum(&name).await;
            format!("{name}_q")
        }
    };

    // The relays reach the database of DATABASE_URL (host, port, database, user) through the
    // stalling proxy, under the run's application name so its sessions can be terminated.
    let (proxied, stall) = proxy::start_for_url(&database.url()).await?;
    let mut db_url = url::Url::parse(&proxied)?;
    // The logs are searched for the password. The user's own, or else one of the run's: trust
    // authentication ignores it.
    let password = match db_url.password() {
        Some(password) => password.to_string(),
        None => {
            let password = format!("Chaos-{seed}-Pw");
            db_url
                .set_password(Some(&password))
                .map_err(|()| anyhow::anyhow!("DATABASE_URL cannot take a password"))?;
            password
        }
    };
    db_url
        .query_pairs_mut()
        .append_pair("application_name", &name);
    let db_url = db_url.to_string();
    let partition = if kinds.contains(&FaultKind::Partition) {
        anyhow::ensure!(
            matches!((&database, &broker), (Database::Shared, Broker::Single)),
            "partition runs on DATABASE_URL's server and the single broker: leave pg-failover, \
             broker-node-loss and broker-alarm out of --faults"
        );
        // The server directly, as the proxy gives it to the others: password and name alike.
        let mut inside = url::Url::parse(&database.url())?;
        inside
            .set_password(Some(&password))
            .map_err(|()| anyhow::anyhow!("DATABASE_URL cannot take a password"))?;
        inside
            .query_pairs_mut()
            .append_pair("application_name", &name);
        // Longer than the relays' dead-client timeout (15 s) in a full run, so the server must
        // end relay 0's sessions for the others to get its rows; a few seconds in the smoke.
        let cut_for = if cli.smoke {
            3_000..5_000
        } else {
            20_000..30_000
        };
        Some((
            Partition::create(),
            Partition::url_inside(inside.as_str()),
            cut_for,
        ))
    } else {
        None
    };
    let mut run = Run {
        name: name.clone(),
        rows,
        workers: cli.workers,
        batch_size,
        db_url,
        password,
        dir,
        relays: Vec::new(),
        spawns: vec![0; relays],
        started: Instant::now(),
        ordering_args,
        database,
        broker,
        queue: queue.clone(),
        partition,
    };

    let mut consumer = Command::new(std::env::current_exe()?)
        .args(["consumer", "--amqp-url", &amqp, "--queue", &queue, "--out"])
        .arg(run.ids_file())
        .stderr(std::fs::File::create(
            run.dir.join(format!("{name}-consumer.log")),
        )?)
        .kill_on_drop(true)
        .spawn()?;
    run.relays = (0..relays).map(|i| run.spawn_relay(i)).collect();

    let mut records = Vec::new();
    let mut bound_workers = 0u64;
    for (fraction, kind) in schedule(&mut rng, &kinds, per_kind) {
        let threshold = (fraction * rows as f64) as u64;
        wait::until_or_fail(
            &format!("{threshold} ids are delivered before the next fault"),
            Duration::from_secs(600),
            || {
                let failed = run.failed_relay();
                let reached = run.delivered() >= threshold;
                async move { failed.map_or(Ok(reached), Err) }
            },
        )
        .await?;
        let at = run.seconds();
        let (detail, workers_hit) = inject(&mut run, kind, &mut rng, &mut admin, &stall).await?;
        bound_workers += workers_hit;
        let recovery = run.recovery(Duration::from_secs(120)).await?;
        if let Database::Pair(pair, primary) = &run.database
            && kind == FaultKind::PgFailover
        {
            // The old primary comes back as the new one's standby, so the next failover has
            // one to promote: a base backup, seconds, while the relays run on.
            pair.rejoin(primary.other())
                .await
                .map_err(anyhow::Error::msg)?;
        }
        println!(
            "  {at:7.1} s  {:<15} {detail}; flowing again after {}",
            kind.name(),
            recovery.map_or("—".into(), |r| format!("{r:.2} s"))
        );
        records.push(FaultRecord {
            kind: kind.name(),
            at_seconds: at,
            recovery_seconds: recovery,
            detail,
        });
    }

    let drained = wait::until_or_fail(
        "every row is settled",
        Duration::from_secs(if cli.smoke { 120 } else { 1200 }),
        || {
            let failed = run.failed_relay();
            let t = table.clone();
            let url = run.database.url();
            async move {
                match failed {
                    Some(error) => Err(error),
                    None => Ok(db::pending(&mut db::connect_to(&url).await, &t).await == 0),
                }
            }
        },
    )
    .await;
    match drained {
        Ok(()) => {}
        Err(error) if error.is::<wait::TimedOut>() => eprintln!("chaos: {error}"),
        Err(error) => return Err(error),
    }
    let mut exit_codes = Vec::new();
    for index in 0..run.relays.len() {
        if !run.wait_started(index, Duration::from_secs(60)).await {
            eprintln!("chaos: relay {index} never logged that it started");
        }
        let child = &mut run.relays[index];
        signal(child, libc::SIGTERM);
        exit_codes.push(
            tokio::time::timeout(Duration::from_secs(60), child.wait())
                .await
                .ok()
                .and_then(|s| s.ok())
                .and_then(|s| s.code()),
        );
    }
    // Let the consumer catch up (every row recorded, nothing new for a moment), then stop it.
    let mut last = run.delivered();
    let settled = wait::until(
        "the consumer has recorded every row",
        Duration::from_secs(120),
        || {
            let now = run.delivered();
            let settled = now == last && now >= rows;
            last = now;
            async move {
                if !settled {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                settled
            }
        },
    )
    .await;
    if let Err(error) = settled {
        eprintln!("chaos: {error}");
    }
    signal(&consumer, libc::SIGTERM);
    let _ = consumer.wait().await;

    let arrivals = read_arrivals(&run.ids_file())?;
    let (ids, duplicates) = distinct(&arrivals);
    let keys_out_of_order = expected
        .as_ref()
        .map(|expected| check(&arrivals, expected).keys_out_of_order);
    let table_ids = db::all_ids(&mut admin, &table).await;
    let lost = table_ids.iter().filter(|id| !ids.contains(id)).count() as u64;
    let pending = db::pending(&mut admin, &table).await;
    // Where only a leak could put it: the password may also be the user's or the database's
    // name, which the relay rightly prints in redacted endpoints.
    let url_of_password = url::Url::parse(&run.db_url)?;
    let mut secrets = 0;
    for i in 0..relays {
        let log = std::fs::read_to_string(run.relay_log(i)).unwrap_or_default();
        secrets += leaks(&log, &run.password, &url_of_password);
    }
    let consumer_log =
        std::fs::read_to_string(run.dir.join(format!("{name}-consumer.log"))).unwrap_or_default();
    secrets += leaks(&consumer_log, &run.password, &url_of_password);

    // Clean up the run's table and queue; keep the logs and the ids file for inspection.
    db::exec(&mut admin, &format!("DROP TABLE {}", table.name.quoted())).await;
    if let Ok(connection) =
        lapin::Connection::connect(&amqp, lapin::ConnectionProperties::default()).await
        && let Ok(channel) = connection.create_channel().await
    {
        let _ = channel
            .queue_delete(queue.as_str().into(), Default::default())
            .await;
        let _ = channel
            .exchange_delete(name.as_str().into(), Default::default())
            .await;
    }

    Ok(ChaosReport {
        seed,
        rows,
        relays,
        workers_per_relay: run.workers,
        batch_size,
        faults: records,
        ids_delivered: ids.len() as u64,
        ids_lost: lost,
        duplicates,
        duplicate_bound: bound_workers * batch_size as u64,
        rows_pending: pending,
        ordering: per_key.then_some(OrderingReport {
            keys,
            keys_out_of_order: keys_out_of_order.unwrap_or_default(),
        }),
        relay_exit_codes: exit_codes,
        secrets_in_logs: secrets,
        elapsed_seconds: run.seconds(),
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Mode::Consumer {
        amqp_url,
        queue,
        out,
    }) = &cli.mode
    {
        return match consumer::run(amqp_url, queue, out).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("consumer: {e}");
                ExitCode::FAILURE
            }
        };
    }
    // A failover run's report (pg-failover, the cluster's faults) beside the other's: `make chaos`
    // runs both.
    let failover = cli
        .faults
        .iter()
        .filter_map(|f| FaultKind::parse(f))
        .any(|kind| kind == FaultKind::PgFailover || kind.needs_the_cluster());
    let stem = match failover {
        true => "report-failover",
        false => "report",
    };
    match chaos(cli).await {
        Ok(report) => {
            let markdown = report.markdown();
            println!("\n{markdown}");
            let dir = process::target_dir().join("chaos");
            let _ = std::fs::write(dir.join(format!("{stem}.md")), &markdown);
            let _ = std::fs::write(
                dir.join(format!("{stem}.json")),
                serde_json::to_string_pretty(&report).unwrap_or_default(),
            );
            if report.passed() {
                println!("chaos: 1 passed, 0 failed");
                ExitCode::SUCCESS
            } else {
                println!("chaos: 0 passed, 1 failed");
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("chaos: the run could not complete: {e:#}");
            ExitCode::FAILURE
        }
    }
}
