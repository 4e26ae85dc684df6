//! The ports of the test servers, read at compile time from `scripts/services/ports.env`, the
//! one place they are written (the shell scripts source it, the Makefile includes it). A name
//! missing there, or a value that is not a number from 1 to 65535, fails the build with an
//! error naming it.

/// The file as this crate was compiled with it.
const PORTS_ENV: &str = include_str!("../../scripts/services/ports.env");

/// Why [`lookup`] found no number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Problem {
    /// No line `NAME=…`.
    Missing,
    /// A line `NAME=…` whose value is not a decimal number from 1 to 65535.
    NotANumber,
}

/// The value of the line `NAME=value` of `text` (a ports.env: one `NAME=value` a line, comments
/// on lines of their own starting with `#`, which no name does). `const` so that the constants
/// below are made while compiling.
const fn lookup(text: &str, name: &str) -> Result<u16, Problem> {
    let text = text.as_bytes();
    let name = name.as_bytes();
    let mut line = 0;
    while line < text.len() {
        let mut end = line;
        while end < text.len() && text[end] != b'\n' {
            end += 1;
        }
        if line_names(text, line, end, name) {
            return number(text, line + name.len() + 1, end);
        }
        line = end + 1;
    }
    Err(Problem::Missing)
}

/// The line `text[line..end]` starts with `name=`.
const fn line_names(text: &[u8], line: usize, end: usize, name: &[u8]) -> bool {
    if line + name.len() >= end || text[line + name.len()] != b'=' {
        return false;
    }
    let mut i = 0;
    while i < name.len() {
        if text[line + i] != name[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// `text[start..end]` as a number from 1 to 65535.
const fn number(text: &[u8], start: usize, end: usize) -> Result<u16, Problem> {
    if start == end {
        return Err(Problem::NotANumber);
    }
    let mut value: u32 = 0;
    let mut i = start;
    while i < end {
        let digit = text[i];
        if !digit.is_ascii_digit() {
            return Err(Problem::NotANumber);
        }
        value = value * 10 + (digit - b'0') as u32;
        if value > u16::MAX as u32 {
            return Err(Problem::NotANumber);
        }
        i += 1;
    }
    if value == 0 {
        return Err(Problem::NotANumber);
    }
    Ok(value as u16)
}

/// `ports_env!("NAME")`: the number of `NAME` in ports.env. In a constant it is found while
/// compiling, and a name missing there stops the build with a message naming it (a `const fn`
/// can only panic with a message fixed in advance, so the macro writes one for each name).
macro_rules! ports_env {
    ($name:literal) => {
        match lookup(PORTS_ENV, $name) {
            Ok(value) => value,
            Err(Problem::Missing) => panic!(concat!(
                "scripts/services/ports.env has no line ",
                $name,
                "=<number>"
            )),
            Err(Problem::NotANumber) => panic!(concat!(
                "scripts/services/ports.env: ",
                $name,
                " is not a number from 1 to 65535"
            )),
        }
    };
}

/// The main PostgreSQL cluster, database `test`.
pub const PG_PORT: u16 = ports_env!("PG_PORT");
/// The cluster that offers no TLS.
pub const PLAIN_PG_PORT: u16 = ports_env!("PLAIN_PG_PORT");
/// The cluster whose certificate expired.
pub const EXPIRED_PG_PORT: u16 = ports_env!("EXPIRED_PG_PORT");
/// PgBouncer in front of the main cluster.
pub const PGBOUNCER_PORT: u16 = ports_env!("PGBOUNCER_PORT");
/// RabbitMQ: AMQP 0-9-1 and AMQP 1.0.
pub const RABBITMQ_PORT: u16 = ports_env!("RABBITMQ_PORT");
/// RabbitMQ inside TLS.
pub const RABBITMQ_TLS_PORT: u16 = ports_env!("RABBITMQ_TLS_PORT");
/// ActiveMQ Artemis: AMQP 1.0.
pub const ARTEMIS_PORT: u16 = ports_env!("ARTEMIS_PORT");
/// The same Artemis, answering a full address with `modified`.
pub const ARTEMIS_MODIFIED_PORT: u16 = ports_env!("ARTEMIS_MODIFIED_PORT");
/// The same Artemis inside TLS.
pub const ARTEMIS_TLS_PORT: u16 = ports_env!("ARTEMIS_TLS_PORT");
/// How far above its AMQP port a private Artemis (or a pair member) has its core acceptor.
pub const ARTEMIS_CORE_PORT_OFFSET: u16 = ports_env!("ARTEMIS_CORE_PORT_OFFSET");
/// The private Artemis that amqp10_delivery crashes and starts again.
pub const PRIVATE_ARTEMIS_PORT: u16 = ports_env!("PRIVATE_ARTEMIS_PORT");
/// Node 1 of the three-node RabbitMQ 3.10 cluster; node N listens N - 1 above.
pub const RABBIT_CLUSTER_FIRST_PORT: u16 = ports_env!("RABBIT_CLUSTER_FIRST_PORT");
/// How far above its AMQP port a cluster node has its Erlang distribution port.
pub const RABBIT_CLUSTER_DIST_PORT_OFFSET: u16 = ports_env!("RABBIT_CLUSTER_DIST_PORT_OFFSET");
/// Node 1 of the three-node RabbitMQ 4.0 cluster; node N listens N - 1 above.
pub const RABBIT4_CLUSTER_FIRST_PORT: u16 = ports_env!("RABBIT4_CLUSTER_FIRST_PORT");
/// The RabbitMQ 4.0 cluster's own Erlang port mapper.
pub const RABBIT4_CLUSTER_EPMD_PORT: u16 = ports_env!("RABBIT4_CLUSTER_EPMD_PORT");
/// RabbitMQ 4 (`scripts/services.sh rabbitmq4`): AMQP 0-9-1 and AMQP 1.0.
pub const RABBITMQ4_PORT: u16 = ports_env!("RABBITMQ4_PORT");
/// RabbitMQ 4 inside TLS.
pub const RABBITMQ4_TLS_PORT: u16 = ports_env!("RABBITMQ4_TLS_PORT");
/// The first port of the PostgreSQL standby pairs' slots.
pub const STANDBY_PAIR_FIRST_PORT: u16 = ports_env!("STANDBY_PAIR_FIRST_PORT");
/// How many standby pairs' slots (two ports each) there are.
pub const STANDBY_PAIR_SLOTS: u16 = ports_env!("STANDBY_PAIR_SLOTS");
/// The first port of the Artemis pairs' slots.
pub const ARTEMIS_PAIR_FIRST_PORT: u16 = ports_env!("ARTEMIS_PAIR_FIRST_PORT");
/// How many Artemis pairs' slots (two ports each) there are.
pub const ARTEMIS_PAIR_SLOTS: u16 = ports_env!("ARTEMIS_PAIR_SLOTS");
/// The OCI registry `make dist` starts when it is given none.
pub const REGISTRY_PORT: u16 = ports_env!("REGISTRY_PORT");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_found_on_its_own_line_and_comments_are_skipped() {
        let text =
            "# FIRST_PORT=1 is a comment\nFIRST_PORTS=3\nOTHER_FIRST_PORT=2\nFIRST_PORT=5441\n";
        assert_eq!(lookup(text, "FIRST_PORT"), Ok(5441));
        assert_eq!(lookup(text, "OTHER_FIRST_PORT"), Ok(2));
        assert_eq!(
            lookup("A=1\nB=65535", "B"),
            Ok(65535),
            "no newline at the end"
        );
    }

    #[test]
    fn a_missing_name_or_a_value_that_is_no_port_number_is_an_error() {
        let text =
            "# MISSING=1\nEMPTY=\nWORD=abc\nZERO=0\nBIG=65536\nSPACED=5432 \nQUOTED=\"5432\"\n";
        assert_eq!(lookup(text, "MISSING"), Err(Problem::Missing));
        assert_eq!(lookup(text, "MISS"), Err(Problem::Missing));
        for name in ["EMPTY", "WORD", "ZERO", "BIG", "SPACED", "QUOTED"] {
            assert_eq!(lookup(text, name), Err(Problem::NotANumber), "{name}");
        }
    }

    #[test]
    #[should_panic(expected = "scripts/services/ports.env has no line NO_SUCH_PORT=<number>")]
    fn a_missing_name_panics_naming_it() {
        // Called at run time here; in a constant the same panic stops the build.
        let _port: u16 = ports_env!("NO_SUCH_PORT");
    }

    #[test]
    fn every_line_of_ports_env_is_a_comment_or_a_name_once_and_a_number() {
        let mut names = std::collections::BTreeSet::new();
        for line in PORTS_ENV.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let (name, _) = line.split_once('=').unwrap_or_else(|| {
                panic!("ports.env: {line:?} is neither a comment nor NAME=value")
            });
            // The shell takes the last of two lines, lookup the first: one line each.
            assert!(names.insert(name), "ports.env names {name} twice");
            assert!(
                lookup(PORTS_ENV, name).is_ok(),
                "ports.env: {line:?}: {:?}",
                lookup(PORTS_ENV, name)
            );
        }
        assert!(names.contains("PG_PORT"), "{names:?}");
    }
}
