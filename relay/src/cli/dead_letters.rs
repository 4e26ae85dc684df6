//! `outbox-relay dead-letters list|requeue|discard` (issue 47): the options, the checks that
//! refuse bad input with exit code 2 before anything is written, and the printing. The work is
//! in `table::repair::dead_letters`.

use std::process::ExitCode;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::shared::{connect, failure, inspect_failure, parse_time, time, usage_error};
use crate::config::{ConfigError, TableArgs};
use crate::table::inspect::inspect;
use crate::table::repair::dead_letters::{self, Action, Group, Preview, Selection};

#[derive(clap::Args)]
pub struct DeadLettersArgs {
    #[command(subcommand)]
    pub command: DeadLettersCommand,
}

#[derive(clap::Subcommand)]
pub enum DeadLettersCommand {
    /// Group the dead-lettered rows by cause (their error text with ids, numbers and quoted
    /// values left out), with counts and the oldest and newest in claim order.
    List(ListArgs),
    /// Make the selected dead letters pending again (error cleared, attempts back to 0), oldest
    /// first in claim order, in batches; the running relay sends them.
    Requeue(ActArgs),
    /// Settle the selected dead letters for good: their error gets the prefix
    /// "discarded (outbox-relay dead-letters discard): " and list no longer shows them.
    Discard(ActArgs),
}

#[derive(clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub table: TableArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct ActArgs {
    #[command(flatten)]
    pub table: TableArgs,
    /// The group to act on, as `list` names it (e.g. g1a2b3c4d).
    #[arg(long)]
    pub group: Option<String>,
    /// A dead letter's id; repeat for more. With --group or a range, only the ids also in them.
    #[arg(long = "id", value_name = "UUID")]
    pub ids: Vec<Uuid>,
    /// Only dead letters whose claim-order column is at or after this RFC 3339 time
    /// (e.g. 2026-12-05T04:00:00Z).
    #[arg(long, value_name = "TIME")]
    pub from: Option<String>,
    /// Only dead letters whose claim-order column is before this RFC 3339 time.
    #[arg(long, value_name = "TIME")]
    pub to: Option<String>,
    /// Say how many rows and their time span; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Rows per transaction.
    #[arg(long, default_value_t = 500, allow_hyphen_values = true)]
    pub batch_size: i64,
}

pub async fn command(args: DeadLettersArgs) -> ExitCode {
    match args.command {
        DeadLettersCommand::List(args) => list(args).await,
        DeadLettersCommand::Requeue(args) => act(args, Action::Requeue).await,
        DeadLettersCommand::Discard(args) => act(args, Action::Discard).await,
    }
}

async fn list(args: ListArgs) -> ExitCode {
    let (config, mut conn) = match connect(&args.table, "dead-letters list", false).await {
        Ok(pair) => pair,
        Err(code) => return code,
    };
    if let Err(e) = inspect(&mut conn, &config.table).await {
        return inspect_failure(e);
    }
    let groups = match dead_letters::list(&mut conn, &config.table).await {
        Ok(groups) => groups,
        Err(e) => return failure(format!("cannot list the dead letters: {e}")),
    };
    if args.json {
        let groups: Vec<_> = groups
            .iter()
            .map(|g| {
                serde_json::json!({
                    "group": g.name,
                    "cause": g.class,
                    "rows": g.rows,
                    "oldest": g.oldest.map(time),
                    "newest": g.newest.map(time),
                    "example": g.errors.first(),
                })
            })
            .collect();
        println!("{}", serde_json::json!({ "groups": groups }));
    } else {
        print_groups(&groups);
    }
    ExitCode::SUCCESS
}

fn print_groups(groups: &[Group]) {
    if groups.is_empty() {
        println!("no dead letters");
        return;
    }
    for g in groups {
        let span = |t: Option<DateTime<Utc>>| t.map_or_else(|| "-".to_string(), time);
        println!(
            "{}  {} row(s)  oldest {}  newest {}\n    cause: {}",
            g.name,
            g.rows,
            span(g.oldest),
            span(g.newest),
            g.class
        );
    }
}

/// The checks that need no database: the range and the batch size, and that something is
/// selected at all.
fn check(args: &ActArgs, action: Action) -> Result<Selection, ConfigError> {
    if args.batch_size < 1 {
        return Err(ConfigError::new(
            "batch-size",
            format!("must be at least 1, got {}", args.batch_size),
        ));
    }
    let from = parse_time("from", &args.from)?;
    let to = parse_time("to", &args.to)?;
    if let (Some(f), Some(t)) = (from, to)
        && f >= t
    {
        return Err(ConfigError::new(
            "from",
            format!(
                "{} is not before --to {}: the range is the wrong way round or empty; swap them",
                time(f),
                time(t)
            ),
        ));
    }
    if args.group.is_none() && args.ids.is_empty() && from.is_none() && to.is_none() {
        return Err(ConfigError::new(
            "group",
            format!(
                "nothing selected: give --group (see `outbox-relay dead-letters list`), --id or \
                 --from/--to to say which dead letters to {}",
                action.verb()
            ),
        ));
    }
    Ok(Selection {
        errors: None,
        ids: args.ids.clone(),
        from,
        to,
    })
}

async fn act(args: ActArgs, action: Action) -> ExitCode {
    let mut selection = match check(&args, action) {
        Ok(selection) => selection,
        Err(e) => return usage_error(e),
    };
    let command = format!("dead-letters {}", action.verb());
    let (config, mut conn) = match connect(&args.table, &command, !args.dry_run).await {
        Ok(pair) => pair,
        Err(code) => return code,
    };
    if let Err(e) = inspect(&mut conn, &config.table).await {
        return inspect_failure(e);
    }
    if let Some(name) = &args.group {
        let groups = match dead_letters::list(&mut conn, &config.table).await {
            Ok(groups) => groups,
            Err(e) => return failure(format!("cannot list the dead letters: {e}")),
        };
        match groups.into_iter().find(|g| &g.name == name) {
            Some(group) => selection.errors = Some(group.errors),
            None => {
                return usage_error(ConfigError::new(
                    "group",
                    format!(
                        "{name} is not a group of the dead letters in {}; \
                         `outbox-relay dead-letters list` shows the groups",
                        config.table.name
                    ),
                ));
            }
        }
    }
    let preview = match dead_letters::preview(&mut conn, &config.table, &selection).await {
        Ok(preview) => preview,
        Err(e) => return failure(format!("cannot count the dead letters: {e}")),
    };
    if preview.rows == 0 {
        return usage_error(ConfigError::new(
            selected_by(&args),
            format!(
                "the selection matches no dead letter in {}; `outbox-relay dead-letters list` \
                 shows what there is",
                config.table.name
            ),
        ));
    }
    let span = describe(&preview);
    if args.dry_run {
        println!(
            "would {} {} dead letter(s) {span}; nothing written (--dry-run)",
            action.verb(),
            preview.rows
        );
        return ExitCode::SUCCESS;
    }
    let total = preview.rows;
    let done = dead_letters::apply(
        &mut conn,
        &config.table,
        &selection,
        action,
        usize::try_from(args.batch_size).unwrap_or(usize::MAX),
        |n| eprintln!("{}: {n}/{total} row(s)", action.verb()),
    )
    .await;
    match done {
        Ok(n) => {
            let past = match action {
                Action::Requeue => "requeued",
                Action::Discard => "discarded",
            };
            println!("{past} {n} dead letter(s) {span}");
            ExitCode::SUCCESS
        }
        Err(e) => failure(format!(
            "{} stopped: {e}; the batches before it are committed, run it again for the rest",
            action.verb()
        )),
    }
}

/// The option that chose the selection, for the message of an empty one.
fn selected_by(args: &ActArgs) -> &'static str {
    if args.group.is_some() {
        "group"
    } else if !args.ids.is_empty() {
        "id"
    } else if args.from.is_some() {
        "from"
    } else {
        "to"
    }
}

fn describe(preview: &Preview) -> String {
    match (preview.oldest, preview.newest) {
        (Some(o), Some(n)) => format!("from {} to {}", time(o), time(n)),
        _ => String::new(),
    }
}
