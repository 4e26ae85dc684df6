//! How each option's value is taken from its layers: the flag (or its environment variable),
//! else the YAML file, else the default; the file loaded; durations from the file parsed as
//! the flags parse them; numbers checked against their range. Shared by the resolution of the
//! table options ([`super::table`]) and of `run` ([`super::run`]).

use std::ops::RangeInclusive;
use std::time::Duration;

use super::file::FileConfig;
use super::flags::TableArgs;
use super::parse::{ConfigError, positive_duration};

// Resolution is free functions, not methods of the argument structs: a method counts as part of
// its type's module, and flags would then import the file, which imports flags' column mapping.

pub(super) fn load_file(args: &TableArgs) -> Result<FileConfig, ConfigError> {
    match &args.config {
        Some(path) => FileConfig::load(path),
        None => Ok(FileConfig::default()),
    }
}

/// A duration flag, else the file's text parsed the same way, naming `field` when it is bad.
pub(super) fn duration(
    field: &str,
    flag: Option<Duration>,
    file: &Option<String>,
) -> Result<Option<Duration>, ConfigError> {
    match (flag, file) {
        (Some(duration), _) => Ok(Some(duration)),
        (None, Some(text)) => positive_duration(text)
            .map(Some)
            .map_err(|message| ConfigError::new(field, message)),
        (None, None) => Ok(None),
    }
}

/// The flag's value, else the file's: the layering of every option.
pub(super) fn layer<T: Clone>(flag: &Option<T>, file: &Option<T>) -> Option<T> {
    flag.clone().or_else(|| file.clone())
}

pub(super) fn ranged(
    field: &str,
    value: Option<i64>,
    default: i64,
    range: RangeInclusive<i64>,
) -> Result<i64, ConfigError> {
    let value = value.unwrap_or(default);
    if !range.contains(&value) {
        return Err(ConfigError::new(
            field,
            format!(
                "must be between {} and {}, got {value}",
                range.start(),
                range.end()
            ),
        ));
    }
    Ok(value)
}
