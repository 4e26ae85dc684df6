//! Toxiproxy (`github.com/Shopify/toxiproxy/v2`, built once by `scripts/toxiproxy.sh` and
//! cached by its inputs) for the application-level faults a network namespace is too coarse
//! for: latency, a bandwidth cap, a connection that stops mid-frame after so many bytes, a
//! stream that stops without closing. Each test starts a server of its own on a free port of
//! 127.0.0.1 (killed on drop), makes its proxies there and adds and removes toxics through the
//! server's HTTP API.
//!
//! What it cannot do: anything the kernel answers. Toxiproxy ends the client's TCP connection
//! in its own process and opens another to the upstream, so TCP keepalive probes are answered
//! by its kernel whatever the toxics do; a silent partition is `partition.rs`'s job.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value, json};

use crate::local_server;

/// How long a started server has to answer its API (well under a second; the rest is room for
/// a machine busy with builds).
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Starts tried, each on a new free port: the port is free when picked but another process
/// can take it before the server binds it.
const START_ATTEMPTS: u32 = 3;

/// The version `scripts/toxiproxy.sh` builds (and stamps into the binary).
pub const VERSION: &str = "v2.12.0";

/// A running Toxiproxy server of this test's own.
pub struct Toxiproxy {
    child: Child,
    /// Its API's address, `127.0.0.1:PORT`.
    api: String,
    log: PathBuf,
}

/// Which way a toxic acts: on what the client sends (`Upstream`) or on what it receives
/// (`Downstream`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Upstream,
    Downstream,
}

impl Stream {
    fn name(self) -> &'static str {
        match self {
            Stream::Upstream => "upstream",
            Stream::Downstream => "downstream",
        }
    }
}

/// The toxics the tests use, with Toxiproxy's own units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Toxic {
    /// Every piece of data waits `latency_ms`, ± up to `jitter_ms`.
    Latency { latency_ms: u64, jitter_ms: u64 },
    /// At most `rate_kb` KB (1024 bytes) a second.
    Bandwidth { rate_kb: u64 },
    /// Closes the connection once `bytes` have gone through in the toxic's direction, in the
    /// middle of whatever frame that byte belongs to; every new connection gets its own count.
    LimitData { bytes: u64 },
    /// Stops all data (dropped, not held) and closes the connection after `timeout_ms`; with 0
    /// it never closes: the stream is dead until the toxic is removed.
    Timeout { timeout_ms: u64 },
}

impl Toxic {
    fn kind(self) -> &'static str {
        match self {
            Toxic::Latency { .. } => "latency",
            Toxic::Bandwidth { .. } => "bandwidth",
            Toxic::LimitData { .. } => "limit_data",
            Toxic::Timeout { .. } => "timeout",
        }
    }

    fn attributes(self) -> Value {
        match self {
            Toxic::Latency {
                latency_ms,
                jitter_ms,
            } => json!({ "latency": latency_ms, "jitter": jitter_ms }),
            Toxic::Bandwidth { rate_kb } => json!({ "rate": rate_kb }),
            Toxic::LimitData { bytes } => json!({ "bytes": bytes }),
            Toxic::Timeout { timeout_ms } => json!({ "timeout": timeout_ms }),
        }
    }
}

/// One proxy of a [`Toxiproxy`] server: where clients connect, and its toxics.
#[derive(Debug, Clone)]
pub struct Proxy {
    api: String,
    pub name: String,
    /// Where clients connect.
    pub listen: SocketAddr,
}

impl Toxiproxy {
    /// Builds Toxiproxy if needed (scripts/toxiproxy.sh), then starts a server of this test's
    /// own on a free port of 127.0.0.1 and waits until its API answers.
    pub async fn start() -> Toxiproxy {
        let program = binary().await;
        let log = crate::process::log_path(&crate::unique("toxiproxy"));
        let mut last_failure = String::new();
        for _ in 0..START_ATTEMPTS {
            let port = local_server::free_loopback_port();
            match start_on(&program, &log, port).await {
                Ok(server) => return server,
                Err(failure) => last_failure = failure,
            }
        }
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        panic!(
            "Toxiproxy did not start ({START_ATTEMPTS} tries): {last_failure}; its log ({}):\n{said}",
            log.display()
        );
    }

    /// A proxy named `name` on a free port of 127.0.0.1, forwarding to `upstream`.
    pub async fn proxy(&self, name: &str, upstream: SocketAddr) -> Proxy {
        let body = json!({
            "name": name,
            "listen": "127.0.0.1:0",
            "upstream": upstream.to_string(),
            "enabled": true,
        });
        let created = self.call_post("/proxies", &body).await;
        let listen = created["listen"]
            .as_str()
            .and_then(|listen| listen.parse().ok())
            .unwrap_or_else(|| panic!("Toxiproxy named no listen address: {created}"));
        Proxy {
            api: self.api.clone(),
            name: name.to_string(),
            listen,
        }
    }

    /// A proxy in front of the server a postgres:// or amqp(s):// `url` names (its port, or the
    /// scheme's default), and the same URL pointing at the proxy, credentials, path and query
    /// kept (as [`crate::proxy::start_for_url`] does for the project's own proxy).
    pub async fn proxy_for_url(&self, name: &str, url: &str) -> (String, Proxy) {
        let mut url = url::Url::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        let upstream = upstream_of(&url);
        let proxy = self.proxy(name, upstream).await;
        url.set_ip_host(proxy.listen.ip())
            .and_then(|()| url.set_port(Some(proxy.listen.port())))
            .unwrap_or_else(|()| panic!("{url} cannot take the proxy's address"));
        (url.to_string(), proxy)
    }

    /// What the server has logged, for a failing test's message.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn call_post(&self, path: &str, body: &Value) -> Value {
        post_json(&self.api, path, body).await
    }
}

impl Drop for Toxiproxy {
    fn drop(&mut self) {
        local_server::stop(&mut self.child);
        if std::thread::panicking() {
            eprintln!("Toxiproxy's log: {}", self.log.display());
        }
    }
}

impl Proxy {
    /// Adds toxic `name` of `toxic`'s kind, acting on `stream`, on every connection
    /// (toxicity 1), those open now and those made later.
    pub async fn add(&self, name: &str, stream: Stream, toxic: Toxic) {
        let body = json!({
            "name": name,
            "type": toxic.kind(),
            "stream": stream.name(),
            "toxicity": 1.0,
            "attributes": toxic.attributes(),
        });
        let path = format!("/proxies/{}/toxics", self.name);
        post_json(&self.api, &path, &body).await;
    }

    /// Removes toxic `name`; the connections it acted on carry on (unless it closed them).
    pub async fn remove(&self, name: &str) {
        let path = format!("/proxies/{}/toxics/{name}", self.name);
        let (code, text) = crate::http::delete(&self.api, &path).await;
        assert_eq!(code, 204, "DELETE {path} on Toxiproxy: {text}");
    }

    /// The names of the toxics the proxy has now.
    pub async fn toxics(&self) -> Vec<String> {
        let path = format!("/proxies/{}/toxics", self.name);
        let (code, text) = crate::http::get(&self.api, &path).await;
        assert_eq!(code, 200, "GET {path} on Toxiproxy: {text}");
        let toxics: Value = serde_json::from_str(body(&text))
            .unwrap_or_else(|e| panic!("GET {path}: not JSON ({e}): {text}"));
        toxics
            .as_array()
            .map(|all| {
                all.iter()
                    .filter_map(|toxic| toxic["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// POSTs `body` as JSON and returns the JSON answer; panics on anything but 200 or 201.
async fn post_json(api: &str, path: &str, body: &Value) -> Value {
    let (code, text) =
        crate::http::post(api, path, "application/json", body.to_string().as_bytes()).await;
    assert!(
        code == 200 || code == 201,
        "POST {path} {body} on Toxiproxy: {text}"
    );
    serde_json::from_str(self::body(&text))
        .unwrap_or_else(|e| panic!("POST {path}: not JSON ({e}): {text}"))
}

/// The body of a whole HTTP response (Toxiproxy's answers are small, never chunked).
fn body(response: &str) -> &str {
    response
        .split_once("\r\n\r\n")
        .map_or("", |(_, body)| body)
        .trim()
}

/// The socket address a database or broker URL names, the scheme's default port if none.
fn upstream_of(url: &url::Url) -> SocketAddr {
    let default_port = match url.scheme() {
        "postgres" | "postgresql" => Some(5432),
        "amqp" => Some(5672),
        "amqps" => Some(5671),
        _ => None,
    };
    url.socket_addrs(|| default_port)
        .ok()
        .and_then(|addrs| addrs.into_iter().next())
        .unwrap_or_else(|| panic!("{url} names no address"))
}

/// The server binary, built by `scripts/toxiproxy.sh`.
async fn binary() -> PathBuf {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    local_server::built_by(
        &BUILT,
        "scripts/toxiproxy.sh",
        "Toxiproxy could not be built: it needs Go and the Go module proxy; the lines above say \
         what went wrong",
    )
    .await
}

/// Starts the server on `port` and waits until its API answers with the pinned version; `Err`
/// says why it did not, with the process gone.
async fn start_on(program: &Path, log: &Path, port: u16) -> Result<Toxiproxy, String> {
    let mut child = local_server::spawn_logged(
        Command::new(program)
            .args(["-host", "127.0.0.1", "-port", &port.to_string()])
            // Its default logs every API call at trace level, several lines each.
            .env("LOG_LEVEL", "info"),
        log,
    );
    local_server::until_accepting(&mut child, port, START_TIMEOUT).await?;
    let api = format!("127.0.0.1:{port}");
    let (code, text) = crate::http::get(&api, "/version").await;
    if code != 200 || !text.contains(VERSION) {
        local_server::stop(&mut child);
        return Err(format!(
            "GET /version on {api} answered {code}, not {VERSION}: {text}"
        ));
    }
    Ok(Toxiproxy {
        child,
        api,
        log: log.to_path_buf(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toxics_carry_toxiproxys_names_and_units() {
        let latency = Toxic::Latency {
            latency_ms: 20,
            jitter_ms: 5,
        };
        assert_eq!(latency.kind(), "latency");
        assert_eq!(latency.attributes(), json!({"latency": 20, "jitter": 5}));
        assert_eq!(
            Toxic::LimitData { bytes: 9 }.attributes(),
            json!({"bytes": 9})
        );
        assert_eq!(Toxic::Timeout { timeout_ms: 0 }.kind(), "timeout");
        assert_eq!(Toxic::Bandwidth { rate_kb: 32 }.kind(), "bandwidth");
        assert_eq!(Stream::Downstream.name(), "downstream");
    }

    #[test]
    fn a_url_names_its_upstream_with_the_schemes_default_port() {
        let url = url::Url::parse("postgres://u:p@127.0.0.1/db?sslmode=disable").unwrap();
        assert_eq!(upstream_of(&url), "127.0.0.1:5432".parse().unwrap());
        let url = url::Url::parse("amqp://guest:guest@127.0.0.1:5673/%2f").unwrap();
        assert_eq!(upstream_of(&url), "127.0.0.1:5673".parse().unwrap());
    }
}
