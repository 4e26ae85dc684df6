//! A TCP proxy that can stall: it forwards bytes both ways until told to stop forwarding, then
//! holds every connection open without moving a byte until resumed — the network stall a
//! relay must survive without losing or double-marking rows. It can also stall only the
//! replies, so what a client sends still arrives while nothing it waits for comes back. And it
//! can cut: close every connection it carries at once, as a broker restart or a dropped link
//! does, while new connections are still accepted. And it can be repointed: new connections go
//! to another upstream, as a stable address does when what stands behind it moves (a `-rw`
//! Service or a DNS name after a failover).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Clone)]
pub struct StallSwitch {
    /// Client to upstream.
    requests: Arc<watch::Sender<bool>>,
    /// Upstream to client.
    replies: Arc<watch::Sender<bool>>,
    /// Bumped by [`StallSwitch::cut`]; a connection made before the bump closes.
    cuts: Arc<watch::Sender<u64>>,
    /// Where the next connection goes.
    upstream: Arc<watch::Sender<SocketAddr>>,
}

impl StallSwitch {
    pub fn stall(&self) {
        self.requests.send_replace(true);
        self.replies.send_replace(true);
    }

    /// Holds back only what the upstream sends (for a broker: confirms and heartbeats).
    pub fn stall_replies(&self) {
        self.replies.send_replace(true);
    }

    pub fn resume(&self) {
        self.requests.send_replace(false);
        self.replies.send_replace(false);
    }

    /// Closes every connection the proxy carries now (both sides see the TCP close).
    pub fn cut(&self) {
        self.cuts.send_modify(|cuts| *cuts += 1);
    }

    /// Sends the connections made from now on to `upstream`; the ones it carries stay where they
    /// are (as a Service's endpoints or a DNS answer change: an open connection is not moved).
    pub fn repoint(&self, upstream: SocketAddr) {
        self.upstream.send_replace(upstream);
    }

    /// Stalls for `duration`, then resumes.
    pub async fn stall_for(&self, duration: Duration) {
        self.stall();
        tokio::time::sleep(duration).await;
        self.resume();
    }
}

/// Listens on an ephemeral loopback port and forwards to `upstream`.
pub async fn start(upstream: SocketAddr) -> std::io::Result<(SocketAddr, StallSwitch)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (requests, requests_stalled) = watch::channel(false);
    let (replies, replies_stalled) = watch::channel(false);
    let (cuts, cut) = watch::channel(0u64);
    let (upstreams, upstream_now) = watch::channel(upstream);
    let switch = StallSwitch {
        requests: Arc::new(requests),
        replies: Arc::new(replies),
        cuts: Arc::new(cuts),
        upstream: Arc::new(upstreams),
    };
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let upstream = *upstream_now.borrow();
            let (requests_stalled, replies_stalled) =
                (requests_stalled.clone(), replies_stalled.clone());
            let mut cut = cut.clone();
            cut.mark_unchanged();
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    return;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                // A cut drops both pumps, and with them both sockets.
                tokio::select! {
                    _ = async {
                        tokio::join!(
                            pump(client_read, server_write, requests_stalled),
                            pump(server_read, client_write, replies_stalled)
                        )
                    } => {}
                    _ = cut.changed() => {}
                }
            });
        }
    });
    Ok((addr, switch))
}

/// Starts a proxy in front of the server `url` names (its port, or the scheme's default for
/// PostgreSQL and AMQP); returns the same URL pointing at the proxy, credentials, path and
/// query kept.
pub async fn start_for_url(url: &str) -> std::io::Result<(String, StallSwitch)> {
    let mut url = url::Url::parse(url).map_err(std::io::Error::other)?;
    let default_port = match url.scheme() {
        "postgres" | "postgresql" => Some(5432),
        "amqp" => Some(5672),
        "amqps" => Some(5671),
        _ => None,
    };
    let upstream = url
        .socket_addrs(|| default_port)?
        .into_iter()
        .next()
        .ok_or_else(|| std::io::Error::other("the URL names no address"))?;
    let (addr, switch) = start(upstream).await?;
    url.set_ip_host(addr.ip())
        .and_then(|()| url.set_port(Some(addr.port())))
        .map_err(|()| std::io::Error::other("the URL cannot take the proxy's address"))?;
    Ok((url.to_string(), switch))
}

/// Copies one direction, pausing while the switch says "stalled".
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut stalled: watch::Receiver<bool>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // Hold the bytes while stalled: nothing reaches the other side until resumed.
        while *stalled.borrow_and_update() {
            if stalled.changed().await.is_err() {
                return;
            }
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server; every chunk it receives is also reported on the returned channel.
    async fn echo_server() -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>) {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = echo.local_addr().unwrap();
        let (arrived, arrivals) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = echo.accept().await {
                let arrived = arrived.clone();
                tokio::spawn(async move {
                    let mut b = [0u8; 16];
                    while let Ok(n) = s.read(&mut b).await {
                        if n == 0 {
                            break;
                        }
                        let _ = arrived.send(b[..n].to_vec());
                        if s.write_all(&b[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        (addr, arrivals)
    }

    /// Checks that the echo of `expected` does not reach `client` while the proxy is stalled,
    /// and does once `switch` resumes it.
    async fn assert_held_until_resumed(
        client: &mut TcpStream,
        switch: &StallSwitch,
        expected: &[u8],
    ) {
        let mut reply = vec![0u8; expected.len()];
        let blocked =
            tokio::time::timeout(Duration::from_millis(300), client.read_exact(&mut reply)).await;
        assert!(blocked.is_err(), "bytes crossed a stalled proxy");
        switch.resume();
        tokio::time::timeout(Duration::from_secs(2), client.read_exact(&mut reply))
            .await
            .expect("resumed proxy forwards")
            .unwrap();
        assert_eq!(reply, expected);
    }

    #[tokio::test]
    async fn forwards_and_stalls() {
        let (echo_addr, _arrivals) = echo_server().await;
        let (addr, switch) = start(echo_addr).await.unwrap();
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(b"hi").await.unwrap();
        let mut reply = [0u8; 2];
        client.read_exact(&mut reply).await.unwrap();
        assert_eq!(&reply, b"hi");

        switch.stall();
        client.write_all(b"yo").await.unwrap();
        assert_held_until_resumed(&mut client, &switch, b"yo").await;
    }

    #[tokio::test]
    async fn a_cut_closes_the_connections_it_carries_and_new_ones_work() {
        let (echo_addr, _arrivals) = echo_server().await;
        let (addr, switch) = start(echo_addr).await.unwrap();
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(b"hi").await.unwrap();
        let mut reply = [0u8; 2];
        client.read_exact(&mut reply).await.unwrap();

        switch.cut();
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(2), client.read_to_end(&mut rest))
            .await
            .expect("the cut connection closes");
        assert!(closed.is_ok_and(|n| n == 0) || rest.is_empty());

        let mut again = TcpStream::connect(addr).await.unwrap();
        again.write_all(b"yo").await.unwrap();
        tokio::time::timeout(Duration::from_secs(2), again.read_exact(&mut reply))
            .await
            .expect("a connection after the cut is carried")
            .unwrap();
        assert_eq!(&reply, b"yo");
    }

    #[tokio::test]
    async fn a_repointed_proxy_sends_new_connections_to_the_new_upstream() {
        let (first, mut first_arrivals) = echo_server().await;
        let (second, mut second_arrivals) = echo_server().await;
        let (addr, switch) = start(first).await.unwrap();
        let mut before = TcpStream::connect(addr).await.unwrap();
        before.write_all(b"a").await.unwrap();
        let arrived = tokio::time::timeout(Duration::from_secs(2), first_arrivals.recv()).await;
        assert_eq!(arrived.unwrap().as_deref(), Some(&b"a"[..]));

        switch.repoint(second);
        let mut after = TcpStream::connect(addr).await.unwrap();
        after.write_all(b"b").await.unwrap();
        let arrived = tokio::time::timeout(Duration::from_secs(2), second_arrivals.recv()).await;
        assert_eq!(arrived.unwrap().as_deref(), Some(&b"b"[..]));
        // The connection made before stays with the first upstream.
        before.write_all(b"c").await.unwrap();
        let arrived = tokio::time::timeout(Duration::from_secs(2), first_arrivals.recv()).await;
        assert_eq!(arrived.unwrap().as_deref(), Some(&b"c"[..]));
    }

    #[tokio::test]
    async fn stalling_replies_lets_requests_through() {
        let (echo_addr, mut arrivals) = echo_server().await;
        let (addr, switch) = start(echo_addr).await.unwrap();
        let mut client = TcpStream::connect(addr).await.unwrap();

        switch.stall_replies();
        client.write_all(b"go").await.unwrap();
        let request = tokio::time::timeout(Duration::from_secs(2), arrivals.recv())
            .await
            .expect("the request crosses while only replies are stalled");
        assert_eq!(request.as_deref(), Some(&b"go"[..]));
        assert_held_until_resumed(&mut client, &switch, b"go").await;
    }
}
