//! A silent network cut between a program and the servers, as a partition or a vanished node
//! looks to PostgreSQL and RabbitMQ: no RST, no FIN, nothing at all (REFERENCE.md, "Partitions
//! and half-open connections").
//!
//! The kernel here has neither netem nor tc classifiers nor iptables, so the cut is made out of
//! plain links. A [`Partition`] is a network namespace of the test's own, reaching the host
//! over a veth pair:
//!
//! - the host end `outbox-cutX` holds `10.213.X.1/30`, the namespace end (`eth0` inside)
//!   `10.213.X.2/30`, with `X` a slot in [`SLOTS`]; the namespace's only route beyond its link
//!   is [`SERVICES_ADDRESS`]`/32` through the host end, where PostgreSQL, PgBouncer and RabbitMQ
//!   listen (pg_hba trusts `10.213.0.0/16`). Nothing in it can reach any other address.
//! - [`Partition::cut`] takes the host end down. The namespace end keeps its address, route
//!   and (permanent) neighbour entry for the host end but has no carrier: the program's
//!   packets, SYNs included, vanish without an error.
//!   The host's connected route goes with the host end, so a blackhole route under it
//!   (`10.213.X.0/29`, metric 4000, added before anything else) keeps the servers' replies on
//!   the machine, where they are dropped: they never follow the default route out.
//! - [`Partition::heal`] brings the host end up again; connections the cut left alone carry on.
//!
//! A slot is held by a lock file (flock: it goes with the process that held it), so parallel
//! tests and test binaries never share one, and what a crashed run left in a slot (its pair,
//! its namespace) is removed by the next partition that takes the slot. Everything needs root,
//! as every test here runs; a step that fails panics with the `ip` command and its stderr.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::process::RelayProcess;
use crate::services::SERVICES_ADDRESS;

/// The slots `X` of `10.213.X.0/30`: above the test nodes' indexes (`crate::node`, which take
/// the first free from 1), each with a `/29` blackhole of its own.
pub const SLOTS: std::ops::RangeInclusive<u8> = 200..=250;

/// The blackhole route's metric: below (after) any route a test adds for these addresses.
const BLACKHOLE_METRIC: &str = "4000";

/// The namespace end's name inside the namespace.
const NAMESPACE_INTERFACE: &str = "eth0";

/// Partitions made by this process so far: with the process id, where the search for a free
/// slot starts, so concurrent tests rarely try the same slot first.
static MADE: AtomicU32 = AtomicU32::new(0);

/// A network namespace whose only way out, to [`SERVICES_ADDRESS`], can be cut silently and
/// healed. Removed on drop.
pub struct Partition {
    slot: u8,
    /// The namespace's name, also the host end's name (`outbox-cutX`, 13 characters).
    name: String,
    /// The slot's lock: held (open, locked) as long as the partition lives.
    _lock: std::fs::File,
}

/// What a TCP connection attempt from inside a partition came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reach {
    /// Connected (and closed again at once).
    Connected,
    /// Neither connected nor refused before the deadline: the packets vanished.
    Hung,
    /// Failed with an error (refused, unreachable), with its words.
    Failed(String),
}

impl Partition {
    /// A namespace in a free slot, linked to the host and able to reach [`SERVICES_ADDRESS`].
    /// Panics when no slot is free or a step fails.
    pub fn create() -> Self {
        std::fs::create_dir_all(lock_dir()).expect("the partitions' lock folder");
        let count = u32::try_from(SLOTS.len()).expect("a few slots");
        let start = std::process::id()
            .wrapping_mul(7)
            .wrapping_add(MADE.fetch_add(1, Ordering::Relaxed));
        for offset in 0..count {
            let slot = SLOTS.start() + u8::try_from((start + offset) % count).expect("< 51");
            let Some(lock) =
                crate::lock_file::lock(&lock_dir().join(format!("slot-{slot}.lock")), false)
            else {
                continue;
            };
            let name = format!("outbox-cut{slot}");
            // What a crashed run left in this slot goes first (the blackhole route stays: it is
            // replaced below, and its addresses may still have sockets on the host).
            if !remove_link(&name) {
                eprintln!(
                    "partition slot {slot}: a pair left by an earlier run stays; trying the next"
                );
                continue;
            }
            remove_namespace(&name);
            // Something else using these addresses (a route, an address): leave it the slot.
            if let Some(user) = foreign_use(slot) {
                eprintln!(
                    "partition slot {slot} is in use by something else ({user}); trying the next"
                );
                continue;
            }
            let partition = Self {
                slot,
                name,
                _lock: lock,
            };
            partition.set_up();
            return partition;
        }
        panic!(
            "no free partition slot: all of 10.213.{}-{}.0/30 are taken (their locks are in {})",
            SLOTS.start(),
            SLOTS.end(),
            lock_dir().display()
        )
    }

    /// The namespace's name (`ip netns exec NAME …`); the host end has the same name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The host end's interface, the one [`Partition::cut`] takes down.
    pub fn host_interface(&self) -> &str {
        &self.name
    }

    /// The namespace end's address: the `client_addr` the servers see for programs inside.
    pub fn address(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 213, self.slot, 2)
    }

    /// The host end's address, the namespace's gateway to [`SERVICES_ADDRESS`].
    pub fn host_address(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 213, self.slot, 1)
    }

    /// `url` as a program inside reaches the same server: a loopback host becomes
    /// [`SERVICES_ADDRESS`] (see `crate::services::url_for_pods`); anything else is kept.
    pub fn url_inside(url: &str) -> String {
        crate::services::url_for_pods(url)
            .unwrap_or_else(|e| panic!("the URL a partitioned program uses: {e}"))
    }

    /// The tests' database URL as seen from inside.
    pub fn database_url(&self) -> String {
        Self::url_inside(&crate::database_url())
    }

    /// The tests' broker URL as seen from inside.
    pub fn amqp_url(&self) -> String {
        Self::url_inside(&crate::amqp_url())
    }

    /// A command that runs `program` inside the namespace (`ip netns exec NAME program`); add
    /// its arguments. `ip` execs the program, so the child's pid is the program's.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> tokio::process::Command {
        let mut command = tokio::process::Command::new("ip");
        command.args(["netns", "exec", &self.name]).arg(program);
        command
    }

    /// `outbox-relay <args>` inside the namespace, its `DATABASE_URL` and `AMQP_URL` the tests'
    /// own with the host [`SERVICES_ADDRESS`]; otherwise as `crate::process::spawn_relay`.
    pub fn spawn_relay(&self, name: &str, args: &[&str]) -> RelayProcess {
        self.spawn_relay_with_env(name, args, &[])
    }

    /// [`Partition::spawn_relay`] with these environment variables added (they win).
    pub fn spawn_relay_with_env(
        &self,
        name: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> RelayProcess {
        let relay = crate::process::binary("outbox-relay");
        let relay = relay.to_str().expect("the relay's path is UTF-8");
        let mut argv = vec!["netns", "exec", &self.name, relay];
        argv.extend_from_slice(args);
        let (database_url, amqp_url) = (self.database_url(), self.amqp_url());
        let mut vars = vec![
            ("DATABASE_URL", database_url.as_str()),
            ("AMQP_URL", amqp_url.as_str()),
        ];
        vars.extend_from_slice(env);
        crate::process::spawn_relay_program(Path::new("ip"), name, &argv, &vars)
    }

    /// Tries a TCP connection from inside to [`SERVICES_ADDRESS`]:`port`, giving up after
    /// `within` (bash's `/dev/tcp` under `timeout`).
    pub async fn reach(&self, port: u16, within: Duration) -> Reach {
        let seconds = format!("{:.1}", within.as_secs_f64());
        let open = format!("exec 3<>/dev/tcp/{SERVICES_ADDRESS}/{port}");
        let output = self
            .command("timeout")
            .args([seconds.as_str(), "bash", "-c", &open])
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .expect("run ip netns exec … timeout bash");
        match output.status.code() {
            Some(0) => Reach::Connected,
            // timeout(1)'s code for a command it had to stop.
            Some(124) => Reach::Hung,
            code => Reach::Failed(format!(
                "exit {code:?}: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            )),
        }
    }

    /// Cuts the namespace off: the host end goes down, and from now on nothing passes either
    /// way, silently. Connections stay open on both sides.
    pub fn cut(&self) {
        ip(&["link", "set", &self.name, "down"]);
        assert!(
            self.blackhole_present(),
            "the blackhole route {} went away: the servers' replies could leave the machine",
            self.blackhole()
        );
    }

    /// Ends the cut: the host end comes up, with whatever route went away with it.
    pub fn heal(&self) {
        ip(&["link", "set", &self.name, "up"]);
        // The kernel brings the connected route back with the link; if it did not, add it.
        let connected = self.connected_route();
        let deadline = Instant::now() + Duration::from_secs(2);
        while ip_output(&["route", "show", "exact", &connected, "dev", &self.name])
            .trim()
            .is_empty()
        {
            if Instant::now() >= deadline {
                ip(&[
                    "route",
                    "replace",
                    &connected,
                    "dev",
                    &self.name,
                    "proto",
                    "kernel",
                    "scope",
                    "link",
                    "src",
                    &self.host_address().to_string(),
                ]);
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.route_to_services();
    }

    /// Host sockets still talking to this slot's addresses (`ss` lines), TIME-WAIT left out:
    /// the servers' ends of connections from inside.
    pub fn host_sockets(&self) -> Vec<String> {
        host_sockets(self.slot, false).unwrap_or_else(|error| panic!("{error}"))
    }

    /// `10.213.X.0/29`, the blackhole under the pair.
    fn blackhole(&self) -> String {
        blackhole(self.slot)
    }

    /// `10.213.X.0/30`, the link's own network.
    fn connected_route(&self) -> String {
        format!("10.213.{}.0/30", self.slot)
    }

    fn blackhole_present(&self) -> bool {
        ip_output(&["route", "show", "exact", &self.blackhole()]).contains("blackhole")
    }

    fn set_up(&self) {
        // Before anything else: replies for these addresses stay on the machine whatever
        // happens to the pair.
        ip(&[
            "route",
            "replace",
            "blackhole",
            &self.blackhole(),
            "metric",
            BLACKHOLE_METRIC,
        ]);
        ip(&["netns", "add", &self.name]);
        ip(&[
            "link",
            "add",
            &self.name,
            "type",
            "veth",
            "peer",
            "name",
            NAMESPACE_INTERFACE,
            "netns",
            &self.name,
        ]);
        ip(&[
            "addr",
            "add",
            &format!("{}/30", self.host_address()),
            "dev",
            &self.name,
        ]);
        ip(&["link", "set", &self.name, "up"]);
        let inside = |args: &[&str]| {
            let mut argv = vec!["-n", self.name.as_str()];
            argv.extend_from_slice(args);
            ip(&argv);
        };
        inside(&["link", "set", "lo", "up"]);
        inside(&[
            "addr",
            "add",
            &format!("{}/30", self.address()),
            "dev",
            NAMESPACE_INTERFACE,
        ]);
        inside(&["link", "set", NAMESPACE_INTERFACE, "up"]);
        self.route_to_services();
    }

    /// Inside: [`SERVICES_ADDRESS`]`/32` through the host end (replaced, so also a repair),
    /// and the host end's MAC address as a permanent neighbour. Without it the namespace asks
    /// for the host end by ARP once its entry goes stale, and during a cut that fails after
    /// about 3 s: connects and sends then fail at once with "No route to host", so the cut
    /// would not be silent for the program inside. With it, a partition looks like one beyond
    /// the first hop: nothing comes back, not even an error.
    fn route_to_services(&self) {
        let mac_file = format!("/sys/class/net/{}/address", self.name);
        let mac = std::fs::read_to_string(&mac_file)
            .unwrap_or_else(|e| panic!("read the host end's MAC address from {mac_file}: {e}"));
        ip(&[
            "-n",
            &self.name,
            "neigh",
            "replace",
            &self.host_address().to_string(),
            "lladdr",
            mac.trim(),
            "dev",
            NAMESPACE_INTERFACE,
            "nud",
            "permanent",
        ]);
        ip(&[
            "-n",
            &self.name,
            "route",
            "replace",
            &format!("{SERVICES_ADDRESS}/32"),
            "via",
            &self.host_address().to_string(),
            "dev",
            NAMESPACE_INTERFACE,
        ]);
    }

    /// The blackhole route goes only when no host socket is left for these addresses: one
    /// still there (a server's end of a connection the cut orphaned, a FIN being retried)
    /// would otherwise send to them along the default route, off the machine. Such sockets are
    /// destroyed first (`ss -K`; their last words go into the blackhole); any that remain keep
    /// the route, and the next partition in this slot replaces it.
    fn remove_blackhole(&self) {
        let left = match host_sockets(self.slot, false) {
            Ok(sockets) if sockets.is_empty() => Ok(sockets),
            Ok(_) => host_sockets(self.slot, true).and_then(|_| host_sockets(self.slot, false)),
            Err(error) => Err(error),
        };
        match left {
            Ok(left) if left.is_empty() => {}
            Ok(left) => {
                eprintln!(
                    "partition {}: {} host socket(s) still talk to {}, so its blackhole route stays: {left:?}",
                    self.name,
                    left.len(),
                    self.blackhole()
                );
                return;
            }
            Err(error) => {
                eprintln!(
                    "partition {}: {error}, so its blackhole route stays",
                    self.name
                );
                return;
            }
        }
        if let Err(error) = try_ip(&[
            "route",
            "del",
            "blackhole",
            &self.blackhole(),
            "metric",
            BLACKHOLE_METRIC,
        ]) {
            eprintln!("{error}");
        }
    }
}

impl Drop for Partition {
    /// The pair first (`ip netns del` only unmounts the namespace: a process still inside, a
    /// relay not yet reaped, would keep it and the pair alive), then the blackhole route (never
    /// while the pair exists, and only once nothing on the host sends to these addresses any
    /// more), then the namespace. Never panics: it runs while a failed test unwinds.
    fn drop(&mut self) {
        if remove_link(&self.name) {
            self.remove_blackhole();
        } else {
            eprintln!(
                "partition {}: the pair could not be deleted, so its blackhole route stays",
                self.name
            );
        }
        remove_namespace(&self.name);
    }
}

/// An address or route of the host in `10.213.X.0/24` that is not a partition's (a test node's,
/// say).
fn foreign_use(slot: u8) -> Option<String> {
    let prefix = format!("10.213.{slot}.");
    let ours = blackhole(slot);
    let addresses = ip_output(&["-4", "-o", "addr", "show"]);
    let routes = ip_output(&["-4", "route", "show", "table", "all"]);
    addresses
        .lines()
        .chain(routes.lines())
        .find(|line| line.contains(&prefix) && !line.contains(&ours))
        .map(|line| line.trim().to_string())
}

/// The host's TCP sockets (TIME-WAIT left out) whose peer is in slot X's blackhole, as `ss`
/// lines; with `destroy`, `ss -K` destroys them too (their last words go into the blackhole).
fn host_sockets(slot: u8, destroy: bool) -> Result<Vec<String>, String> {
    let mut command = std::process::Command::new("ss");
    if destroy {
        command.arg("-K");
    }
    let output = command
        .args(["-Htn", "state", "all", "exclude", "time-wait", "dst"])
        .arg(blackhole(slot))
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("could not run ss (Debian's iproute2 package): {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "ss failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(str::to_string)
        .collect())
}

/// `10.213.X.0/29`, the blackhole under slot X's pair.
fn blackhole(slot: u8) -> String {
    format!("10.213.{slot}.0/29")
}

/// Deletes the pair whose host end is `name` (both ends go with it); true when it is gone.
fn remove_link(name: &str) -> bool {
    if !link_exists(name) {
        return true;
    }
    if let Err(error) = try_ip(&["link", "del", name]) {
        eprintln!("{error}");
    }
    !link_exists(name)
}

fn remove_namespace(name: &str) {
    if namespace_path(name).exists()
        && let Err(error) = try_ip(&["netns", "del", name])
    {
        eprintln!("{error}");
    }
}

fn lock_dir() -> PathBuf {
    std::env::temp_dir().join("outbox-partitions")
}

fn namespace_path(name: &str) -> PathBuf {
    Path::new("/run/netns").join(name)
}

fn link_exists(name: &str) -> bool {
    std::process::Command::new("ip")
        .args(["link", "show", "dev", name])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// Runs `ip ARGS`; the error names the command and quotes its stderr.
fn try_ip(args: &[&str]) -> Result<String, String> {
    let what = format!("ip {}", args.join(" "));
    let output = std::process::Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("could not run {what} (Debian's iproute2 package): {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "{what} failed (the partition tests run as root): {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// [`try_ip`], panicking with its sentence.
fn ip(args: &[&str]) {
    if let Err(error) = try_ip(args) {
        panic!("{error}");
    }
}

/// [`try_ip`]'s stdout, panicking with its sentence.
fn ip_output(args: &[&str]) -> String {
    try_ip(args).unwrap_or_else(|error| panic!("{error}"))
}
