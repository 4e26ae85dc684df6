//! Talking to a relay's HTTP endpoints from a test.

/// The address a relay logged for its HTTP server (`serving /metrics … addr=…`).
pub fn metrics_addr(log: &str) -> Option<String> {
    let line = log.lines().find(|l| l.contains("serving /metrics"))?;
    let start = line.find("addr=")? + 5;
    Some(
        line[start..]
            .split_whitespace()
            .next()?
            .trim_matches('"')
            .to_string(),
    )
}

/// A plain HTTP/1.1 GET; returns the status code and the whole response text.
pub async fn get(addr: &str, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the relay");
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .expect("send request");
    let mut text = String::new();
    stream
        .read_to_string(&mut text)
        .await
        .expect("read response");
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, text)
}
