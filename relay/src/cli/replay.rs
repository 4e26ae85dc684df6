//! `outbox-relay replay` (issue 47): the options, the checks that refuse bad input with exit
//! code 2 before anything is written, and the printing. The work is in `table::repair::replay`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use chrono::{SecondsFormat, Utc};
use uuid::Uuid;

use super::shared::{connect, failure, inspect_failure, parse_time, time, usage_error};
use crate::config::{ConfigError, TableArgs};
use crate::table::inspect::inspect;
use crate::table::outbox::OutboxTable;
use crate::table::repair::replay::{self, Preview, Progress, REPLAY_HEADER, Selection};

/// How many types the dry run names; the rest are summed up in one line.
const TYPES_SHOWN: usize = 20;

#[derive(clap::Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub table: TableArgs,
    /// Only rows whose claim-order column is at or after this RFC 3339 time
    /// (e.g. 2026-12-05T04:00:00Z).
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// Only rows whose claim-order column is before this RFC 3339 time.
    #[arg(long, value_name = "TIME")]
    pub until: Option<String>,
    /// Only rows of this message type; repeat for more.
    #[arg(long = "type", value_name = "TYPE")]
    pub types: Vec<String>,
    /// Only rows of this partition key (needs --partition-key-column and --ordering per-key, as
    /// the relay runs); repeat for more.
    #[arg(long = "key", value_name = "KEY")]
    pub keys: Vec<String>,
    /// Only the rows whose ids this file lists, one uuid per line (blank lines are skipped).
    #[arg(long, value_name = "FILE")]
    pub ids_file: Option<PathBuf>,
    /// Say how many rows, their time span and their types; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Replay even though the table has no headers column, so the messages cannot carry the
    /// x-outbox-replay header and consumers cannot tell them from the first delivery.
    #[arg(long)]
    pub unmarked: bool,
    /// Rows per transaction.
    #[arg(long, default_value_t = 1000, allow_hyphen_values = true)]
    pub batch_size: i64,
}

/// The checks that need no database: the batch size, the range, the ids file, and that
/// something is selected at all.
fn check(args: &ReplayArgs) -> Result<Selection, ConfigError> {
    if args.batch_size < 1 {
        return Err(ConfigError::new(
            "batch-size",
            format!("must be at least 1, got {}", args.batch_size),
        ));
    }
    let since = parse_time("since", &args.since)?;
    let until = parse_time("until", &args.until)?;
    if let (Some(s), Some(u)) = (since, until)
        && s >= u
    {
        return Err(ConfigError::new(
            "since",
            format!(
                "{} is not before --until {}: the range is the wrong way round or empty; swap them",
                time(s),
                time(u)
            ),
        ));
    }
    let ids = match &args.ids_file {
        Some(path) => read_ids(path)?,
        None => Vec::new(),
    };
    let selection = Selection {
        since,
        until,
        types: args.types.clone(),
        keys: args.keys.clone(),
        ids,
    };
    if selection.is_empty() {
        return Err(ConfigError::new(
            "since",
            "nothing selected: give --since/--until (a claim-order range), --type, --key or \
             --ids-file to say which rows to replay",
        ));
    }
    Ok(selection)
}

/// The ids of `--ids-file`: one uuid per line, surrounding white space and blank lines
/// ignored; a bad line is named by its number.
fn read_ids(path: &Path) -> Result<Vec<Uuid>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigError::new("ids-file", format!("cannot read {}: {e}", path.display()))
    })?;
    parse_ids(&text)
        .map_err(|message| ConfigError::new("ids-file", format!("{}: {message}", path.display())))
}

fn parse_ids(text: &str) -> Result<Vec<Uuid>, String> {
    let mut ids = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let id = Uuid::parse_str(line).map_err(|e| {
            let shown: String = line.chars().take(60).collect();
            format!(
                "line {}: {shown:?} is not a uuid ({e}); one id per line",
                number + 1
            )
        })?;
        ids.push(id);
    }
    if ids.is_empty() {
        return Err("holds no id; one uuid per line".to_string());
    }
    Ok(ids)
}

/// The checks that need the resolved configuration: `--key` needs the partition-key column,
/// and a replay needs the headers column to mark its messages unless `--unmarked`.
fn check_table(args: &ReplayArgs, table: &OutboxTable) -> Result<(), ConfigError> {
    if !args.keys.is_empty() && table.columns.partition_key.is_none() {
        return Err(ConfigError::new(
            "key",
            format!(
                "selects by partition key, but no partition-key column is mapped for {}; \
                 give --partition-key-column with --ordering per-key, as the relay runs \
                 (columns.partition_key and ordering: per-key in the config file)",
                table.name
            ),
        ));
    }
    if table.columns.headers.is_none() && !args.unmarked {
        return Err(ConfigError::new(
            "headers-column",
            format!(
                "not set, so a replayed message cannot carry the {REPLAY_HEADER} header and \
                 consumers cannot tell it from the first delivery; map the table's jsonb \
                 headers column with --headers-column (columns.headers in the config file), \
                 or give --unmarked to replay without the header"
            ),
        ));
    }
    Ok(())
}

/// The refusal when the selection matches nothing: when the table has no settled row at all,
/// it says why that is likely and what makes replay possible.
fn nothing_matched(args: &ReplayArgs, table: &OutboxTable, any_settled: bool) -> ConfigError {
    let mut message = format!(
        "the selection matches no delivered row in {} (a row the relay marked processed \
         without an error)",
        table.name
    );
    if !any_settled {
        message.push_str(
            "; the table holds no processed row at all: the relay probably runs in delete mode \
             (--mode delete, deliveryMode: delete), which deletes each row once the broker \
             confirmed it, so nothing is left to replay. Replay needs mark mode (--mode mark, \
             the default) and the processed rows kept: by default they are kept for good; a \
             retention (--processed-retention, spec.relay.processedRetention) deletes them \
             once older than it, so set it at least as long as you may need to replay",
        );
    } else {
        message.push_str(
            "; rows processed longer ago than --processed-retention \
             (spec.relay.processedRetention) are deleted by the relay",
        );
    }
    ConfigError::new(selected_by(args), message)
}

/// The option that chose the selection, for the message of an empty one.
fn selected_by(args: &ReplayArgs) -> &'static str {
    if args.ids_file.is_some() {
        "ids-file"
    } else if !args.keys.is_empty() {
        "key"
    } else if !args.types.is_empty() {
        "type"
    } else if args.since.is_some() {
        "since"
    } else {
        "until"
    }
}

pub async fn command(args: ReplayArgs) -> ExitCode {
    let selection = match check(&args) {
        Ok(selection) => selection,
        Err(e) => return usage_error(e),
    };
    let (config, mut conn) = match connect(&args.table, "replay", !args.dry_run).await {
        Ok(pair) => pair,
        Err(code) => return code,
    };
    let table = &config.table;
    if let Err(e) = inspect(&mut conn, table).await {
        return inspect_failure(e);
    }
    if let Err(e) = check_table(&args, table) {
        return usage_error(e);
    }
    let preview = match replay::preview(&mut conn, table, &selection).await {
        Ok(preview) => preview,
        Err(e) => return failure(format!("cannot count the rows to replay: {e}")),
    };
    if preview.rows == 0 {
        let any = match replay::any_settled(&mut conn, table).await {
            Ok(any) => any,
            Err(e) => return failure(format!("cannot read {}: {e}", table.name)),
        };
        return usage_error(nothing_matched(&args, table, any));
    }
    let span = describe(&preview);
    if args.dry_run {
        println!(
            "would replay {} row(s) {span}; nothing written (--dry-run)",
            preview.rows
        );
        print_types(&preview);
        return ExitCode::SUCCESS;
    }
    let replayed_at = Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true);
    let total = preview.rows;
    let done = replay::apply(
        &mut conn,
        table,
        &selection,
        usize::try_from(args.batch_size).unwrap_or(usize::MAX),
        &replayed_at,
        |p| eprintln!("replay: {}/{total} row(s){}", p.rows, reached(&p)),
    )
    .await;
    let marked = if table.columns.headers.is_some() {
        format!("marked {REPLAY_HEADER}: {replayed_at}")
    } else {
        "unmarked (--unmarked)".to_string()
    };
    match done {
        Ok(p) => {
            println!(
                "replayed {} row(s) {span}, {marked}; the relay sends them again",
                p.rows
            );
            ExitCode::SUCCESS
        }
        Err(stopped) => failure(format!(
            "replay stopped after {} row(s){}: {}; the batches before it are committed, run \
             it again with --since set to the position reached for the rest",
            stopped.progress.rows,
            reached(&stopped.progress),
            stopped.error
        )),
    }
}

fn reached(progress: &Progress) -> String {
    progress.position.map_or_else(String::new, |p| {
        format!(", claim order reached {}", time(p.occurred))
    })
}

fn describe(preview: &Preview) -> String {
    match (preview.oldest, preview.newest) {
        (Some(o), Some(n)) => format!("from {} to {}", time(o), time(n)),
        _ => String::new(),
    }
}

fn print_types(preview: &Preview) {
    for t in preview.types.iter().take(TYPES_SHOWN) {
        println!("  {:>8}  {}", t.rows, t.kind);
    }
    if preview.types.len() > TYPES_SHOWN {
        let rest: i64 = preview.types[TYPES_SHOWN..].iter().map(|t| t.rows).sum();
        println!(
            "  {rest:>8}  ({} more types)",
            preview.types.len() - TYPES_SHOWN
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_file_lines_are_named_by_number() {
        let a = Uuid::new_v4();
        let b = Uuid::new_v4();
        assert_eq!(parse_ids(&format!("{a}\n\n  {b}  \n")), Ok(vec![a, b]));
        let err = parse_ids(&format!("{a}\nnot-an-id\n")).unwrap_err();
        assert!(
            err.starts_with("line 2: \"not-an-id\" is not a uuid"),
            "{err}"
        );
        assert_eq!(
            parse_ids("\n \n"),
            Err("holds no id; one uuid per line".to_string())
        );
    }
}
