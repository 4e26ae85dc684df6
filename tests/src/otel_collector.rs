//! A real OpenTelemetry Collector for the span tests (issue 48): the OTLP receiver and the file
//! exporter (tests/otel-collector/), built once by `scripts/otel-collector.sh` and
//! cached by its inputs. Each test starts a collector of its own, OTLP/HTTP on a free port of
//! 127.0.0.1, writing what it receives to a file of its own, so tests side by side never see
//! each other's spans; [`Collector::spans`] reads that file back.
//!
//! The file exporter writes each export request it receives as one line of OTLP JSON (an
//! `ExportTraceServiceRequest`): ids as lowercase hex, 64-bit integers as JSON strings, the
//! span kind and status code as numbers. The parser also takes the enum names and integers
//! written as numbers, which the OTLP JSON mapping allows a writer.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;

use crate::local_server;

/// How long a started collector has to accept connections (it takes well under a second; the
/// rest is room for a machine busy with builds).
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How often the file exporter flushes what it buffered to the file (its default is a second:
/// a test would wait that long for every span).
const FLUSH_INTERVAL: &str = "100ms";

/// Starts tried before giving up, each on a new free port: the port is free when picked but
/// another process can take it before the collector binds it.
const START_ATTEMPTS: u32 = 3;

/// A running collector of this test's own. Dropping it kills the process and removes its files
/// (kept when the test is panicking, to be read).
pub struct Collector {
    child: Child,
    port: u16,
    /// The file exporter's output: one OTLP JSON request per line.
    output: PathBuf,
    /// Holds the collector's configuration and `output`.
    dir: PathBuf,
    /// The collector's own stdout and stderr.
    log: PathBuf,
}

/// One span as the collector received it.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    /// The resource attribute `service.name` ("" when the resource has none).
    pub service: String,
    pub name: String,
    /// "internal", "server", "client", "producer", "consumer" or "unspecified".
    pub kind: String,
    /// Lowercase hex, 32 characters.
    pub trace_id: String,
    /// Lowercase hex, 16 characters.
    pub span_id: String,
    /// "" for a root span.
    pub parent_span_id: String,
    /// Every value as text: integers in decimal, booleans `true`/`false`, doubles as JSON
    /// writes them, bytes in base64, arrays and maps as JSON of their values' text.
    pub attributes: BTreeMap<String, String>,
    pub links: Vec<ReceivedLink>,
    /// "unset", "ok" or "error".
    pub status_code: String,
    pub status_message: String,
}

/// A link of a [`ReceivedSpan`] to another span.
#[derive(Debug, Clone)]
pub struct ReceivedLink {
    pub trace_id: String,
    pub span_id: String,
    pub attributes: BTreeMap<String, String>,
}

impl Collector {
    /// Builds the collector if needed (scripts/otel-collector.sh), then starts one
    /// of its own for this test: OTLP/HTTP on a free port of 127.0.0.1, writing every span
    /// it receives to a file of its own (fileexporter, JSON). Waits until it accepts.
    pub async fn start() -> Collector {
        let program = binary().await;
        let dir = std::env::temp_dir().join(crate::unique("outbox_otelcol"));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        let log = crate::process::log_path(&crate::unique("otel_collector"));
        let mut last_failure = String::new();
        for _ in 0..START_ATTEMPTS {
            let port = local_server::free_loopback_port();
            match start_on(&program, &dir, &log, port).await {
                Ok(collector) => return collector,
                Err(failure) => last_failure = failure,
            }
        }
        panic!(
            "the OpenTelemetry Collector did not start ({START_ATTEMPTS} tries): {last_failure}; \
             its log ({}) ends:\n{}",
            log.display(),
            crate::daemon::log_tail(&log, 30)
        );
    }

    /// The base URL for OTEL_EXPORTER_OTLP_ENDPOINT, e.g. "http://127.0.0.1:43123".
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every span received so far, parsed from the file (each line one OTLP JSON
    /// ExportTraceServiceRequest; a partial last line is skipped).
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        match std::fs::read(&self.output) {
            Ok(bytes) => parse_requests(&String::from_utf8_lossy(&bytes))
                .unwrap_or_else(|e| panic!("{}: {e}", self.output.display())),
            // The exporter makes the file when it starts; nothing received yet, either way.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => panic!("read {}: {e}", self.output.display()),
        }
    }

    /// What the collector has logged, for a failing test's message.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        local_server::stop(&mut self.child);
        if std::thread::panicking() {
            eprintln!(
                "the OpenTelemetry Collector's files are kept in {} (its log: {})",
                self.dir.display(),
                self.log.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The collector binary, built by `scripts/otel-collector.sh`.
async fn binary() -> PathBuf {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    local_server::built_by(
        &BUILT,
        "scripts/otel-collector.sh",
        "the OpenTelemetry Collector (tests/otel-collector/) could not be built: it needs Go (the \
         version tests/otel-collector/go.mod names, or newer) and the Go module proxy; the lines \
         above say what went wrong",
    )
    .await
}

/// Starts the collector on `port` and waits until it accepts; `Err` says why it did not (it
/// exited, or did not accept in time), with the process gone.
async fn start_on(program: &Path, dir: &Path, log: &Path, port: u16) -> Result<Collector, String> {
    let output = dir.join("spans.jsonl");
    let config = dir.join("config.yaml");
    std::fs::write(&config, config_yaml(port, &output))
        .unwrap_or_else(|e| panic!("write {}: {e}", config.display()));
    let mut child =
        local_server::spawn_logged(Command::new(program).arg("--config").arg(&config), log);
    // The receivers start last, after the exporters: accepting means the pipeline is up.
    local_server::until_accepting(&mut child, port, START_TIMEOUT).await?;
    Ok(Collector {
        child,
        port,
        output,
        dir: dir.to_path_buf(),
        log: log.to_path_buf(),
    })
}

/// The collector's configuration: the OTLP receiver on HTTP only (gRPC's default port would
/// collide between tests) and the file exporter. The collector has no telemetry of its own to
/// configure (tests/otel-collector/main.go): it listens on nothing else.
fn config_yaml(port: u16, output: &Path) -> String {
    // A JSON string is a YAML string: the path needs no escaping rules of its own.
    let path = Value::String(output.display().to_string());
    format!(
        "receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{port}
exporters:
  file:
    path: {path}
    format: json
    flush_interval: {FLUSH_INTERVAL}
service:
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [file]
"
    )
}

/// The spans of every complete line of `text`. A line is complete once its newline is written:
/// the last piece, after the last newline, may still be half-written, and is left for the next
/// read.
fn parse_requests(text: &str) -> Result<Vec<ReceivedSpan>, String> {
    let mut lines: Vec<&str> = text.split('\n').collect();
    lines.pop();
    let mut spans = Vec::new();
    for (number, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let request: Value = serde_json::from_str(line)
            .map_err(|e| format!("line {} is not JSON ({e}): {line}", number + 1))?;
        request_spans(&request, &mut spans)
            .map_err(|e| format!("line {}: {e}: {line}", number + 1))?;
    }
    Ok(spans)
}

/// Appends the spans of one `ExportTraceServiceRequest` to `spans`.
fn request_spans(request: &Value, spans: &mut Vec<ReceivedSpan>) -> Result<(), String> {
    for resource_spans in list(request, "resourceSpans")? {
        let resource_attributes = match resource_spans.get("resource") {
            Some(resource) => attributes(resource)?,
            None => BTreeMap::new(),
        };
        let service = resource_attributes
            .get("service.name")
            .cloned()
            .unwrap_or_default();
        for scope_spans in list(resource_spans, "scopeSpans")? {
            for span in list(scope_spans, "spans")? {
                spans.push(parse_span(span, &service)?);
            }
        }
    }
    Ok(())
}

fn parse_span(span: &Value, service: &str) -> Result<ReceivedSpan, String> {
    let status = span.get("status");
    Ok(ReceivedSpan {
        service: service.to_string(),
        name: text(span, "name")?,
        kind: kind(span.get("kind"))?,
        trace_id: hex_id(span, "traceId")?,
        span_id: hex_id(span, "spanId")?,
        parent_span_id: hex_id(span, "parentSpanId")?,
        attributes: attributes(span)?,
        links: list(span, "links")?
            .iter()
            .map(|link| {
                Ok(ReceivedLink {
                    trace_id: hex_id(link, "traceId")?,
                    span_id: hex_id(link, "spanId")?,
                    attributes: attributes(link)?,
                })
            })
            .collect::<Result<_, String>>()?,
        status_code: status_code(status.and_then(|s| s.get("code")))?,
        status_message: match status {
            Some(status) => text(status, "message")?,
            None => String::new(),
        },
    })
}

/// The array `object[key]`; an absent key is an empty array (the JSON mapping leaves out
/// empty and default fields).
fn list<'a>(object: &'a Value, key: &str) -> Result<&'a [Value], String> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(other) => Err(format!("{key} is not an array: {other}")),
    }
}

/// The string `object[key]`, "" when absent.
fn text(object: &Value, key: &str) -> Result<String, String> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(format!("{key} is not a string: {other}")),
    }
}

/// A trace or span id (hex in OTLP JSON), lowercased; "" when absent.
fn hex_id(object: &Value, key: &str) -> Result<String, String> {
    let id = text(object, key)?;
    if !id.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!("{key} is not hex: {id:?}"));
    }
    Ok(id.to_ascii_lowercase())
}

/// A protobuf enum in OTLP JSON: its number, or its name; the default (0) when absent.
fn enum_number(value: Option<&Value>, prefix: &str, names: &[&str]) -> Result<usize, String> {
    match value {
        None | Some(Value::Null) => Ok(0),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(|n| n as usize)
            .filter(|n| *n < names.len())
            .ok_or_else(|| format!("unknown {prefix} {n}")),
        Some(Value::String(name)) => names
            .iter()
            .position(|known| {
                name.strip_prefix(prefix)
                    .is_some_and(|rest| rest.eq_ignore_ascii_case(known))
            })
            .ok_or_else(|| format!("unknown {prefix} {name:?}")),
        Some(other) => Err(format!("{prefix} is neither a number nor a name: {other}")),
    }
}

const KINDS: [&str; 6] = [
    "unspecified",
    "internal",
    "server",
    "client",
    "producer",
    "consumer",
];

fn kind(value: Option<&Value>) -> Result<String, String> {
    Ok(KINDS[enum_number(value, "SPAN_KIND_", &KINDS)?].to_string())
}

const STATUS_CODES: [&str; 3] = ["unset", "ok", "error"];

fn status_code(value: Option<&Value>) -> Result<String, String> {
    Ok(STATUS_CODES[enum_number(value, "STATUS_CODE_", &STATUS_CODES)?].to_string())
}

/// `object.attributes`, a list of `{"key", "value": AnyValue}`, as key → text.
fn attributes(object: &Value) -> Result<BTreeMap<String, String>, String> {
    list(object, "attributes")?
        .iter()
        .map(|pair| {
            let key = text(pair, "key")?;
            let value = any_value(pair.get("value").unwrap_or(&Value::Null))
                .map_err(|e| format!("attribute {key}: {e}"))?;
            Ok((key, value))
        })
        .collect()
}

/// An OTLP `AnyValue` as text (see [`ReceivedSpan::attributes`]); an empty value is "".
fn any_value(value: &Value) -> Result<String, String> {
    let Some(object) = value.as_object() else {
        return match value {
            Value::Null => Ok(String::new()),
            other => Err(format!("not an AnyValue: {other}")),
        };
    };
    let Some((kind, inner)) = object.iter().next() else {
        return Ok(String::new());
    };
    match (kind.as_str(), inner) {
        ("stringValue" | "bytesValue", Value::String(s)) => Ok(s.clone()),
        ("boolValue", Value::Bool(b)) => Ok(b.to_string()),
        // 64-bit integers are strings in OTLP JSON; a writer may also give a number.
        ("intValue", Value::String(s)) => s
            .parse::<i64>()
            .map(|n| n.to_string())
            .map_err(|e| format!("intValue {s:?}: {e}")),
        ("intValue", Value::Number(n)) if n.is_i64() => Ok(n.to_string()),
        // NaN and the infinities are strings; every other double a number.
        ("doubleValue", Value::Number(n)) => Ok(n.to_string()),
        ("doubleValue", Value::String(s)) => Ok(s.clone()),
        ("arrayValue", inner) => {
            let texts = list(inner, "values")?
                .iter()
                .map(any_value)
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Value::from(texts).to_string())
        }
        ("kvlistValue", inner) => {
            let map = list(inner, "values")?
                .iter()
                .map(|pair| {
                    let value = any_value(pair.get("value").unwrap_or(&Value::Null))?;
                    Ok((text(pair, "key")?, Value::String(value)))
                })
                .collect::<Result<serde_json::Map<_, _>, String>>()?;
            Ok(Value::Object(map).to_string())
        }
        (kind, inner) => Err(format!("unknown value {kind}: {inner}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request in the shape the file exporter writes it (kind and status code as numbers,
    /// ints as strings, defaults left out), with a second, root span.
    const REQUEST: &str = r#"{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"svc"}}]},"scopeSpans":[{"scope":{"name":"s"},"spans":[{"traceId":"0AF7651916CD43DD8448EB211C80319C","spanId":"b7ad6b7169203331","parentSpanId":"00f067aa0ba902b7","name":"publish x","kind":4,"startTimeUnixNano":"1","endTimeUnixNano":"2","attributes":[{"key":"n","value":{"intValue":"100"}},{"key":"b","value":{"boolValue":false}},{"key":"d","value":{"doubleValue":1.5}},{"key":"a","value":{"arrayValue":{"values":[{"stringValue":"x"},{"intValue":"2"}]}}},{"key":"e","value":{}}],"links":[{"traceId":"4bf92f3577b34da6a3ce929d0e0e4736","spanId":"00f067aa0ba902b7","attributes":[{"key":"messaging.message.id","value":{"stringValue":"m1"}}]}],"status":{"code":2,"message":"boom"}},{"traceId":"0af7651916cd43dd8448eb211c80319c","spanId":"00f067aa0ba902b7","name":"root","status":{}}]}]}]}"#;

    #[test]
    fn a_request_line_gives_every_field_of_each_span() {
        let spans = parse_requests(&format!("{REQUEST}\n")).unwrap();
        assert_eq!(spans.len(), 2);
        let span = &spans[0];
        assert_eq!(span.service, "svc");
        assert_eq!(span.name, "publish x");
        assert_eq!(span.kind, "producer");
        assert_eq!(span.trace_id, "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(span.span_id, "b7ad6b7169203331");
        assert_eq!(span.parent_span_id, "00f067aa0ba902b7");
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            span.attributes,
            map(&[
                ("n", "100"),
                ("b", "false"),
                ("d", "1.5"),
                ("a", r#"["x","2"]"#),
                ("e", ""),
            ])
        );
        assert_eq!(span.links.len(), 1);
        assert_eq!(span.links[0].trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(span.links[0].span_id, "00f067aa0ba902b7");
        assert_eq!(
            span.links[0].attributes,
            map(&[("messaging.message.id", "m1")])
        );
        assert_eq!(span.status_code, "error");
        assert_eq!(span.status_message, "boom");

        let root = &spans[1];
        assert_eq!(
            (root.kind.as_str(), root.parent_span_id.as_str()),
            ("unspecified", "")
        );
        assert_eq!(
            (root.status_code.as_str(), root.status_message.as_str()),
            ("unset", "")
        );
        assert!(root.attributes.is_empty() && root.links.is_empty());
    }

    #[test]
    fn a_half_written_last_line_waits_for_its_newline() {
        let text = format!("{REQUEST}\n{}", &REQUEST[..REQUEST.len() / 2]);
        assert_eq!(parse_requests(&text).unwrap().len(), 2);
        // Complete but not yet ended by its newline: still left for the next read.
        let text = format!("{REQUEST}\n{REQUEST}");
        assert_eq!(parse_requests(&text).unwrap().len(), 2);
        assert_eq!(
            parse_requests(&format!("{REQUEST}\n{REQUEST}\n"))
                .unwrap()
                .len(),
            4
        );
        assert!(parse_requests("").unwrap().is_empty());
    }

    #[test]
    fn a_broken_complete_line_is_an_error_naming_it() {
        let text = format!("{}\n{REQUEST}\n", &REQUEST[..20]);
        let error = parse_requests(&text).unwrap_err();
        assert!(error.starts_with("line 1 is not JSON"), "{error}");
    }

    #[test]
    fn enum_names_are_read_as_well_as_numbers() {
        assert_eq!(
            kind(Some(&Value::from("SPAN_KIND_CONSUMER"))).unwrap(),
            "consumer"
        );
        assert_eq!(kind(Some(&Value::from(3))).unwrap(), "client");
        assert_eq!(
            status_code(Some(&Value::from("STATUS_CODE_OK"))).unwrap(),
            "ok"
        );
        assert!(kind(Some(&Value::from(9))).is_err());
        assert!(status_code(Some(&Value::from("STATUS_CODE_MAYBE"))).is_err());
    }
}
