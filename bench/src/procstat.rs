//! CPU time and peak memory of processes, read from /proc (Linux).

use std::collections::HashMap;

/// Clock ticks per second, the unit of the CPU fields of /proc/<pid>/stat.
fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions; it only reads a constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// user + system CPU ticks of one process, and its command name.
fn read_stat(pid: u32) -> Option<(String, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name sits in parentheses and may itself contain spaces or parentheses.
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text[open + 1..close].to_string();
    let fields: Vec<&str> = text[close + 1..].split_whitespace().collect();
    // After the name: state is field 3 of the man page, utime 14, stime 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((comm, utime + stime))
}

/// CPU ticks of every process whose command name is one of `names`.
fn ticks_by_name(names: &[&str]) -> HashMap<u32, u64> {
    let mut found = HashMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some((comm, ticks)) = read_stat(pid)
            && names.contains(&comm.as_str())
        {
            found.insert(pid, ticks);
        }
    }
    found
}

/// Whether a `postgres` process serves a client (its title reads `postgres: <cluster>: <user>
/// <database> <host> <state>`), rather than being the postmaster or a background process
/// (autovacuum, checkpointer, WAL writer, …), whose work comes at times of its own choosing.
fn is_client_backend(pid: u32) -> bool {
    const BACKGROUND: [&str; 10] = [
        "autovacuum",
        "checkpointer",
        "background writer",
        "walwriter",
        "logical replication",
        "stats collector",
        "archiver",
        "startup",
        "walsender",
        "walreceiver",
    ];
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let title = String::from_utf8_lossy(&cmdline);
    title.starts_with("postgres: ") && !BACKGROUND.iter().any(|kind| title.contains(kind))
}

/// CPU ticks of the process under test, PostgreSQL and RabbitMQ at one instant.
#[derive(Debug, Clone, Default)]
pub struct CpuSnapshot {
    subject: u64,
    postgres: HashMap<u32, u64>,
    /// The client backends among `postgres`.
    postgres_backends: Vec<u32>,
    rabbitmq: HashMap<u32, u64>,
}

/// CPU seconds spent between two snapshots.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct CpuSeconds {
    /// The relay process, or the bench process itself for the in-process ceiling and naive loop.
    pub subject: f64,
    /// Every PostgreSQL process.
    pub postgres: f64,
    /// PostgreSQL's client backends alone: the statements' own cost, without autovacuum, the
    /// checkpointer and the WAL writer, so it moves less from run to run.
    pub postgres_backends: f64,
    pub rabbitmq: f64,
}

impl CpuSeconds {
    /// Microseconds of CPU per message, per process: what each spends on one message, a figure
    /// that machine noise moves much less than msg/s. Zeros for a run that moved nothing.
    pub fn per_message_us(&self, messages: u64) -> CpuSeconds {
        if messages == 0 {
            return CpuSeconds::default();
        }
        let us = |seconds: f64| seconds * 1e6 / messages as f64;
        CpuSeconds {
            subject: us(self.subject),
            postgres: us(self.postgres),
            postgres_backends: us(self.postgres_backends),
            rabbitmq: us(self.rabbitmq),
        }
    }
}

impl CpuSnapshot {
    /// `subjects`: the processes under test, summed (several relay processes as one).
    pub fn take(subjects: &[u32]) -> Self {
        let postgres = ticks_by_name(&["postgres"]);
        let postgres_backends = postgres
            .keys()
            .copied()
            .filter(|&pid| is_client_backend(pid))
            .collect();
        Self {
            subject: subjects
                .iter()
                .filter_map(|&pid| read_stat(pid).map(|(_, t)| t))
                .sum(),
            postgres,
            postgres_backends,
            rabbitmq: ticks_by_name(&["beam.smp", "erl_child_setup", "epmd"]),
        }
    }

    /// CPU seconds from `self` to `later`. Processes started in between (new backends) count
    /// from zero; processes that ended in between are lost, which only under-counts.
    pub fn until(&self, later: &CpuSnapshot) -> CpuSeconds {
        let delta = |before: &HashMap<u32, u64>, after: &HashMap<u32, u64>| {
            after
                .iter()
                .map(|(pid, t)| t.saturating_sub(before.get(pid).copied().unwrap_or(0)))
                .sum::<u64>()
        };
        let hz = ticks_per_second();
        // A backend is told apart when the later snapshot sees it (a new one counts from zero).
        let backends = |snapshot: &CpuSnapshot| -> HashMap<u32, u64> {
            snapshot
                .postgres
                .iter()
                .filter(|(pid, _)| later.postgres_backends.contains(pid))
                .map(|(&pid, &ticks)| (pid, ticks))
                .collect()
        };
        CpuSeconds {
            subject: later.subject.saturating_sub(self.subject) as f64 / hz,
            postgres: delta(&self.postgres, &later.postgres) as f64 / hz,
            postgres_backends: delta(&backends(self), &backends(later)) as f64 / hz,
            rabbitmq: delta(&self.rabbitmq, &later.rabbitmq) as f64 / hz,
        }
    }
}

/// Peak resident set size (VmHWM) of a process, in MiB.
pub fn peak_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// The 1-minute load average, to say how busy the machine was.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_client_backends_count_as_backends() {
        use sqlx::Connection;
        let url = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
        let mut conn = sqlx::PgConnection::connect(&url)
            .await
            .expect("PostgreSQL must run (make services)");
        let mine: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert!(is_client_backend(mine as u32));
        let background: Vec<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity WHERE backend_type IN ('checkpointer', 'walwriter', 'autovacuum launcher')",
        )
        .fetch_all(&mut conn)
        .await
        .unwrap();
        assert!(!background.is_empty());
        for pid in background {
            assert!(!is_client_backend(pid as u32), "pid {pid}");
        }
        assert!(!is_client_backend(std::process::id()));
    }

    #[test]
    fn reads_this_process() {
        let pid = std::process::id();
        assert!(read_stat(pid).is_some());
        assert!(peak_rss_mib(pid).unwrap() > 0.0);
    }

    #[test]
    fn cpu_per_message_is_in_microseconds() {
        let cpu = CpuSeconds {
            subject: 0.5,
            postgres: 1.0,
            postgres_backends: 0.75,
            rabbitmq: 0.25,
        };
        let us = cpu.per_message_us(100_000);
        assert_eq!(
            (us.subject, us.postgres, us.postgres_backends, us.rabbitmq),
            (5.0, 10.0, 7.5, 2.5)
        );
        assert_eq!(cpu.per_message_us(0).subject, 0.0);
    }
}
