//! Unique names for everything a run creates, so runs never see each other's leftovers.

/// Prefix shared by every table, exchange and queue of one bench invocation.
#[derive(Debug, Clone)]
pub struct RunNames {
    prefix: String,
}

impl RunNames {
    pub fn new() -> Self {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        Self {
            prefix: format!("bench_{secs}_{}", std::process::id()),
        }
    }

    /// A valid SQL identifier (at most 63 bytes) for a table.
    pub fn table(&self, what: &str) -> String {
        let mut name = format!("{}_{what}", self.prefix);
        name.truncate(63);
        name
    }

    /// An exchange name; AMQP allows 255 bytes, we stay far below.
    pub fn exchange(&self, what: &str) -> String {
        format!("{}.{what}", self.prefix)
    }

    pub fn queue(&self, what: &str) -> String {
        format!("{}.{what}.q", self.prefix)
    }
}

static SEQUENCE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A number that differs for every call in this process, to tell runs apart.
pub fn next_run() -> usize {
    SEQUENCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}
