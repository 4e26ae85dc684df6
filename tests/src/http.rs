//! Talking to HTTP endpoints from a test: a relay's, the OpenTelemetry Collector's, Toxiproxy's.

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
    request(addr, get_message(path).into_bytes()).await
}

fn get_message(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n\r\n")
}

/// A plain HTTP/1.1 POST of `body` as `content_type`; returns the status code and the whole
/// response text.
pub async fn post(addr: &str, path: &str, content_type: &str, body: &[u8]) -> (u16, String) {
    let mut message = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    message.extend_from_slice(body);
    request(addr, message).await
}

/// A plain HTTP/1.1 DELETE; returns the status code and the whole response text.
pub async fn delete(addr: &str, path: &str) -> (u16, String) {
    request(
        addr,
        format!("DELETE {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").into_bytes(),
    )
    .await
}

/// A GET that may find nothing listening (a process starting or stopping): `None` then.
pub async fn try_get(addr: &str, path: &str) -> Option<(u16, String)> {
    try_request(addr, get_message(path).as_bytes()).await.ok()
}

/// Sends `message` (a whole request) on a new connection and reads the response to its end.
async fn request(addr: &str, message: Vec<u8>) -> (u16, String) {
    try_request(addr, &message)
        .await
        .unwrap_or_else(|e| panic!("HTTP request to {addr}: {e}"))
}

async fn try_request(addr: &str, message: &[u8]) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.write_all(message).await?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await?;
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((code, text))
}
