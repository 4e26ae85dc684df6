//! The value types and parsers that the flags, the file and the resolution share.

use std::time::Duration;

/// A configuration value that cannot be used. `field` is the flag name without dashes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid --{field}: {message}")]
pub struct ConfigError {
    pub field: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// How the relay (and the operator) writes its log lines. The operator's CRD uses this type.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Deserialize,
    serde::Serialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// For people at a terminal.
    #[default]
    Text,
    /// One JSON object per line, for log pipelines.
    Json,
}

/// One of the names of a value enum. Clap's own error for a bad one spreads over four lines;
/// this one fits the one line every bad input gets.
pub fn one_of<T: clap::ValueEnum>(text: &str) -> Result<T, String> {
    T::from_str(text, false).map_err(|_| {
        let names: Vec<String> = T::value_variants()
            .iter()
            .filter_map(|v| v.to_possible_value())
            .map(|p| p.get_name().to_string())
            .collect();
        match names.split_last() {
            Some((last, [])) => format!("use {last}"),
            Some((last, rest)) => format!("use {} or {last}", rest.join(", ")),
            None => "no value is accepted".into(),
        }
    })
}

/// A duration greater than zero, written like 500ms, 10s or 1m: the value parser of every
/// duration flag and file key.
pub fn positive_duration(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text.trim())
        .map_err(|e| format!("{e} in {text:?}; write a duration like 500ms, 10s or 1m"))?;
    if duration.is_zero() {
        return Err("must be greater than zero".into());
    }
    Ok(duration)
}
