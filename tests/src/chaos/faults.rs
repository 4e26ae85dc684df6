//! The faults a chaos run injects, and how each is carried out on this machine.

use std::time::Duration;

use sqlx::PgConnection;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// kill -9 of one relay process, restarted after a pause.
    Kill9,
    /// `rabbitmqctl close_all_connections`.
    BrokerCut,
    /// `rabbitmqctl stop_app`, a pause, `start_app`.
    BrokerRestart,
    /// `pg_terminate_backend` of every relay session.
    PgTerminate,
    /// The TCP proxy between the relays and PostgreSQL stops forwarding for a while.
    NetworkStall,
    /// The primary of the run's own standby pair killed (`-m immediate`), the standby promoted,
    /// the relays' address (the proxy) moved to it, the old primary made again as its standby:
    /// what a `-rw` Service or a cluster endpoint does in a failover.
    PgFailover,
    /// Relay 0, which then runs in a network namespace of its own, is cut off silently (its
    /// link taken down: packets dropped, no RST, no FIN) for a while, then healed: the server
    /// ends its sessions after its dead-client timeout and the other relays take its rows.
    Partition,
    /// A node of the three-node RabbitMQ cluster the run then uses (`--broker-url` lists all
    /// three) stopped gracefully or killed (-9), started again after a pause: the relays on it
    /// move to another node. Never node 1, where the recording consumer is.
    BrokerNodeLoss,
    /// A memory or disk alarm raised on node 2 or 3 of that cluster, which stops publishing on
    /// the whole cluster (`connection.blocked`), then cleared after a pause: the relays give
    /// their claims back, hold no transaction while it lasts, and drain once it lifts.
    BrokerAlarm,
}

impl FaultKind {
    pub const ALL: [FaultKind; 9] = [
        FaultKind::Kill9,
        FaultKind::BrokerCut,
        FaultKind::BrokerRestart,
        FaultKind::PgTerminate,
        FaultKind::NetworkStall,
        FaultKind::PgFailover,
        FaultKind::BrokerNodeLoss,
        FaultKind::Partition,
        FaultKind::BrokerAlarm,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill9 => "kill-9",
            FaultKind::BrokerCut => "broker-cut",
            FaultKind::BrokerRestart => "broker-restart",
            FaultKind::PgTerminate => "pg-terminate",
            FaultKind::NetworkStall => "network-stall",
            FaultKind::PgFailover => "pg-failover",
            FaultKind::BrokerNodeLoss => "broker-node-loss",
            FaultKind::Partition => "partition",
            FaultKind::BrokerAlarm => "broker-alarm",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == text)
    }

    /// Whether it acts on the three-node RabbitMQ cluster rather than the tests' broker.
    pub fn needs_the_cluster(self) -> bool {
        matches!(self, FaultKind::BrokerNodeLoss | FaultKind::BrokerAlarm)
    }
}

fn rabbitmqctl(args: &[&str]) -> anyhow::Result<()> {
    let status = std::process::Command::new("rabbitmqctl")
        .arg("-q")
        .args(args)
        .stdout(std::process::Stdio::null())
        .status()?;
    anyhow::ensure!(status.success(), "rabbitmqctl {args:?} failed");
    Ok(())
}

pub async fn broker_cut() -> anyhow::Result<()> {
    tokio::task::spawn_blocking(|| rabbitmqctl(&["close_all_connections", "chaos: connection cut"]))
        .await?
}

pub async fn broker_restart(pause: Duration) -> anyhow::Result<()> {
    tokio::task::spawn_blocking(|| rabbitmqctl(&["stop_app"])).await??;
    tokio::time::sleep(pause).await;
    tokio::task::spawn_blocking(|| rabbitmqctl(&["start_app"])).await??;
    // Wait until the broker accepts connections again.
    for _ in 0..60 {
        if tokio::net::TcpStream::connect(("127.0.0.1", crate::ports::RABBITMQ_PORT))
            .await
            .is_ok()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    anyhow::bail!("RabbitMQ did not come back after start_app")
}

/// Terminates every session of the run (they carry its application name); returns how many.
pub async fn pg_terminate(conn: &mut PgConnection, application_name: &str) -> anyhow::Result<i64> {
    let terminated: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name = $1 AND pid <> pg_backend_pid()) AS t",
    )
    .bind(application_name)
    .fetch_one(conn)
    .await?;
    Ok(terminated)
}
