//! The CloudEvents Python SDK (PyPI `cloudevents`, with `pika` for AMQP 0-9-1) decoding the
//! relay's messages: tests/cloudevents/decode.py, run in a venv cached under
//! `~/.cache/outbox-relay/cloudevents-venv-<hash of tests/cloudevents/requirements.txt>`, so a
//! new pin makes a new venv and an unchanged one is reused.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// One event as the SDK decoded it.
#[derive(Debug, serde::Deserialize)]
pub struct Decoded {
    pub attributes: serde_json::Map<String, serde_json::Value>,
    pub data: serde_json::Value,
    /// The message body the SDK was handed, as it arrived.
    pub body_b64: String,
}

impl Decoded {
    pub fn attribute(&self, name: &str) -> Option<&str> {
        self.attributes.get(name).and_then(|v| v.as_str())
    }

    pub fn body(&self) -> Vec<u8> {
        base64_decode(&self.body_b64)
    }
}

fn folder() -> PathBuf {
    crate::repo_root().join("tests/cloudevents")
}

/// The venv's python, made (under a lock, once per requirements) when missing.
pub fn python() -> PathBuf {
    let requirements = folder().join("requirements.txt");
    let output = Command::new("sha256sum")
        .arg(&requirements)
        .output()
        .expect("sha256sum");
    let key: String = String::from_utf8_lossy(&output.stdout)
        .chars()
        .take(12)
        .collect();
    let cache = crate::cache_dir();
    std::fs::create_dir_all(&cache).expect("cache dir");
    let venv = cache.join(format!("cloudevents-venv-{key}"));
    let python = venv.join("bin/python");
    let _lock = crate::lock_file::lock(&cache.join("cloudevents-venv.lock"), true);
    if python.exists() && venv.join("ready").exists() {
        return python;
    }
    let _ = std::fs::remove_dir_all(&venv);
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .expect("python3 -m venv (apt-get install python3-venv)");
    assert!(made.success(), "python3 -m venv {}", venv.display());
    let installed = Command::new(venv.join("bin/pip"))
        .args(["install", "-q", "--disable-pip-version-check", "-r"])
        .arg(&requirements)
        .status()
        .expect("pip install");
    assert!(
        installed.success(),
        "pip install -r {}",
        requirements.display()
    );
    std::fs::write(venv.join("ready"), "").expect("mark the venv ready");
    python
}

fn decoded(output: std::process::Output) -> Vec<Decoded> {
    assert!(
        output.status.success(),
        "decode.py failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

/// Takes `count` messages from `queue` on RabbitMQ (AMQP 0-9-1) and decodes them with the
/// SDK's RabbitMQ binding.
pub fn decode_from_rabbitmq(queue: &str, count: usize) -> Vec<Decoded> {
    let output = Command::new(python())
        .arg(folder().join("decode.py"))
        .args(["rabbitmq", &crate::amqp_url(), queue, &count.to_string()])
        .output()
        .expect("run decode.py");
    decoded(output)
}

/// An AMQP 1.0 message as a Python AMQP 1.0 client hands it to the SDK.
#[derive(Debug, serde::Serialize)]
pub struct Amqp10Message {
    pub content_type: Option<String>,
    pub application_properties: serde_json::Map<String, serde_json::Value>,
    pub body_b64: String,
}

/// Decodes AMQP 1.0 messages with the SDK's AMQP binding.
pub fn decode_amqp10(messages: &[Amqp10Message]) -> Vec<Decoded> {
    let mut child = Command::new(python())
        .arg(folder().join("decode.py"))
        .arg("amqp")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run decode.py");
    // Written from a thread: the script answers each line as it reads it, and a pipe that
    // fills on either side would otherwise hold both processes.
    let lines: Vec<String> = messages
        .iter()
        .map(|message| serde_json::to_string(message).expect("json"))
        .collect();
    let mut stdin = child.stdin.take().expect("stdin");
    let writer = std::thread::spawn(move || {
        for line in lines {
            writeln!(stdin, "{line}").expect("write to decode.py");
        }
    });
    let output = child.wait_with_output().expect("decode.py output");
    writer.join().expect("the writer thread");
    decoded(output)
}

/// Standard base64, the form Python's base64 module writes and reads.
pub fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

pub fn base64_decode(text: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .unwrap_or_else(|e| panic!("base64 from decode.py: {e}"))
}
