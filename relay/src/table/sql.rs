//! The SQL text of the table protocol, built once per table from validated, quoted
//! identifiers. Values are always bound (`$1`, `$2`, …), never formatted in.

use std::sync::Arc;

use crate::database::PoolMode;
use crate::table::inspect::{PayloadKind, TableShape};
use crate::table::outbox::{DeliveryMode, DeliveryOrder, OutboxTable};

/// The names of the claim's output columns: every row decodes into the same shape whatever is
/// mapped, and the protocol reads the columns by these names.
pub mod columns {
    pub const ID: &str = "id";
    pub const KIND: &str = "kind";
    pub const PAYLOAD: &str = "payload";
    pub const OCCURRED_AT: &str = "occurred_at";
    pub const ROUTING_KEY: &str = "routing_key";
    pub const HEADERS: &str = "headers";
    pub const ATTEMPTS: &str = "attempts";
    pub const PARTITION_KEY: &str = "partition_key";
    /// Only when the trace-context columns are mapped: the W3C traceparent and tracestate.
    pub const TRACEPARENT: &str = "traceparent";
    pub const TRACESTATE: &str = "tracestate";
    /// Only in per-key claims: the row's lane, so a worker knows which keys go with a lane.
    pub const LANE: &str = "lane";
    /// Only in settling claims: the row's error as the claim found it, so a row put back keeps
    /// what it said and a published one has it cleared.
    pub const PRIOR_ERROR: &str = "prior_error";
}

/// Per-key ordering hashes every partition key into one of this many lanes; a lane is claimed
/// by one worker at a time (`runtime::lanes`). A power of two, so the lane is a bit mask of the
/// key's hash; fixed, because every pod of a relay must map a key to the same lane.
pub const LANES: i32 = 256;

/// The statements one worker runs, prepared as text at start.
#[derive(Debug, Clone)]
pub struct Statements {
    /// Claims up to `$1` pending rows in claim order, skipping rows other workers hold. Under
    /// per-key ordering every claim takes one more value, the lanes the worker holds (an int4[],
    /// the last placeholder), and does not skip locked rows: see [`Statements::build`].
    pub claim: Arc<str>,
    /// The same claim starting at claim position `$2` (a timestamptz: the last claimed row's
    /// occurred-at), so the index scan seeks past the processed rows whose dead entries pile up
    /// at the head of the pending index until vacuum. The bound is a value, not a row, because
    /// in delete mode that row is gone. Only a shortcut: the worker still runs the full claim
    /// regularly, which picks up rows that commit late with an older claim position.
    pub claim_from: Arc<str>,
    /// The same claim starting at the earlier of `$2` (a timestamptz, NULL for none: the first
    /// pending row an earlier wide claim found) and the database's now() minus `$3` seconds, so
    /// it picks up rows committed late with a claim position that recent while walking only
    /// the dead entries of that window, not the whole dead prefix the full claim walks.
    pub claim_recent: Arc<str>,
    /// Moves the table's shared claim frontier to `$1` (an int8: microseconds since the epoch,
    /// at most the database's now()) unless it is there already; None when the table has no
    /// frontier sequence this session may advance, and then [`Statements::claim_from`] starts
    /// at `$2` alone. See `protocol::shared_cursor`.
    pub advance_frontier: Option<Arc<str>>,
    /// Settles a batch where every row was confirmed: `$1 uuid[]`.
    pub settle_all_published: Arc<str>,
    /// Settles a batch with per-row outcomes: `$1 uuid[]`, `$2 text[]` (error or NULL),
    /// `$3 bool[]` (true = done: published or dead-lettered; false = stays pending).
    pub settle_outcomes: Arc<str>,
    /// Capped count of pending rows: `$1` is the cap.
    pub backlog: Arc<str>,
    /// Age in seconds of the oldest pending row, NULL when none is pending.
    pub oldest_age: Arc<str>,
    /// Deletes up to `$2` rows processed more than `$1` seconds ago (retention in mark mode).
    pub purge_processed: Arc<str>,
    /// Claims that settle in the same statement, where the protocol uses them: see
    /// [`SettlingClaims`]. None where a batch claims and then settles.
    pub settling: Option<SettlingClaims>,
    /// What the connection that runs these reaches: under a transaction pool they go unnamed
    /// (see [`PoolMode::named_statements`]). Session by default, as built.
    pub pool_mode: PoolMode,
}

/// Claim statements that mark every claimed row processed as they claim it (one statement
/// instead of a claim, then an update), inside the batch's transaction: the rows the broker did
/// not confirm are put back with [`SettlingClaims::revert`] before COMMIT, so no row is settled
/// as published in a committed transaction without its confirm. The claim leaves the error
/// column as it was; `revert` also clears it on a published row that had one.
///
/// Used in mark mode for unordered claims of a plain table (not partitioned: a ctid names a row
/// only within one heap) in a UTF-8 database. Measured against the two-pass batch
/// (docs/benchmarks.md), it won there. Delete mode keeps two passes: a deleted row cannot be put
/// back as it was without reading every column of it, which costs more than the pass it saves.
/// Per-key claims keep two passes: their waves leave many rows of a batch held back.
#[derive(Debug, Clone)]
pub struct SettlingClaims {
    /// As [`Statements::claim`], marking what it claims; returns the claim's columns plus
    /// [`columns::PRIOR_ERROR`].
    pub claim: Arc<str>,
    /// As [`Statements::claim_from`], marking what it claims.
    pub claim_from: Arc<str>,
    /// As [`Statements::claim_recent`], marking what it claims.
    pub claim_recent: Arc<str>,
    /// Puts back the rows of a settling claim that were not published, and clears the error of
    /// those published that had one: `$1 uuid[]`, `$2 text[]` (the row's error from now on: its
    /// prior error when untouched, the refusal when refused, NULL when published),
    /// `$3 bool[]` (true = stays processed: published or dead-lettered), `$4 bool[]` (true = an
    /// attempt was spent: the broker refused it).
    pub revert: Arc<str>,
}

impl Statements {
    /// Statements for a table whose shape was inspected (the relay's path).
    pub fn for_shape(table: &OutboxTable, shape: &TableShape) -> Self {
        Self::build(
            table,
            shape.payload,
            shape.raw_text,
            shape.single_heap,
            shape.shared_frontier,
        )
    }

    /// Statements for a plain table (not partitioned) in a UTF-8 database, when only the payload
    /// kind is known; seeks start where the worker says, without a shared frontier.
    pub fn new(table: &OutboxTable, payload: PayloadKind) -> Self {
        Self::build(table, payload, false, true, false)
    }

    /// As [`Statements::new`], for a table whose frontier sequence the session may advance.
    pub fn with_shared_frontier(table: &OutboxTable, payload: PayloadKind) -> Self {
        Self::build(table, payload, false, true, true)
    }

    /// The same statements, for connections that reach `pool_mode`.
    pub fn for_pool(mut self, pool_mode: PoolMode) -> Self {
        self.pool_mode = pool_mode;
        self
    }

    /// sqlx's `persistent` for these statements: named and kept prepared only on a session.
    pub fn persistent(&self) -> bool {
        self.pool_mode.named_statements()
    }

    fn build(
        table: &OutboxTable,
        payload: PayloadKind,
        raw_text: bool,
        single_heap: bool,
        shared_frontier: bool,
    ) -> Self {
        let t = table.name.quoted();
        let c = &table.columns;
        let (id, kind, body, occurred, processed, error) = (
            c.id.quoted(),
            c.kind.quoted(),
            c.payload.quoted(),
            c.occurred_at.quoted(),
            c.processed_at.quoted(),
            c.error.quoted(),
        );
        // Every row decodes into the same shape whatever is mapped (see `columns`), so the
        // worker reads it without branching per table.
        // In a SQL_ASCII database, converting to SQL_ASCII hands the stored bytes over as they
        // are (bytea), where a UTF-8 client encoding would make the server reject them.
        let text = |expr: String| {
            if raw_text {
                format!("convert_to({expr}::text, 'SQL_ASCII')")
            } else {
                format!("{expr}::text")
            }
        };
        let payload_expr = match payload {
            PayloadKind::Json | PayloadKind::Text => text(format!("t.{body}")),
            PayloadKind::Bytes => format!("t.{body}"),
        };
        let kind_expr = text(format!("t.{kind}"));
        let routing_expr = c
            .routing_key
            .as_ref()
            .map_or("NULL::text".to_string(), |col| {
                text(format!("t.{}", col.quoted()))
            });
        let headers_expr = c.headers.as_ref().map_or("NULL::jsonb".to_string(), |col| {
            format!("t.{}::jsonb", col.quoted())
        });
        let attempts_expr = c.attempts.as_ref().map_or("0".to_string(), |col| {
            format!("coalesce(t.{}, 0)::int4", col.quoted())
        });

        let per_key = table.ordering == DeliveryOrder::PerKey && c.partition_key.is_some();
        // Only per-key claims need the key; the unordered claim does not read or send it.
        let key_expr = match (&c.partition_key, per_key) {
            (Some(col), true) => text(format!("t.{}", col.quoted())),
            _ => "NULL::text".to_string(),
        };
        // Per-key ordering: a worker claims only rows of the lanes it holds, where no other
        // relay worker claims (runtime::lanes), so it need not skip locked rows, and must not:
        // a row locked by someone else would let a later row of its key overtake it. It waits
        // instead (bounded by the batch's database timeout). A NULL key is unordered, its
        // lane spread by the id. Ties in occurred-at are broken by id, so the order of a key is
        // total.
        let lane_expr = c.partition_key.as_ref().map_or(String::new(), |col| {
            format!(
                "(hashtext(coalesce(t.{}::text, t.{id}::text)) & {})",
                col.quoted(),
                LANES - 1
            )
        });
        // The claim's columns and its FROM … FOR UPDATE clause, apart: a settling claim locks
        // in a CTE with the same clause and returns the same columns from its UPDATE.
        let (select_list, claim_clause) = {
            use columns::*;
            let lane_column = if per_key {
                format!(", {lane_expr} AS {LANE}")
            } else {
                String::new()
            };
            // The trace context only when mapped: a table without it claims what it always did.
            let mut trace_columns = String::new();
            for (column, name) in [(&c.traceparent, TRACEPARENT), (&c.tracestate, TRACESTATE)] {
                if let Some(col) = column {
                    let expr = text(format!("t.{}", col.quoted()));
                    trace_columns.push_str(&format!(", {expr} AS {name}"));
                }
            }
            let select_list = format!(
                "t.{id} AS {ID}, {kind_expr} AS {KIND}, {payload_expr} AS {PAYLOAD}, \
                 t.{occurred}::timestamptz AS {OCCURRED_AT}, {routing_expr} AS {ROUTING_KEY}, \
                 {headers_expr} AS {HEADERS}, {attempts_expr} AS {ATTEMPTS}, \
                 {key_expr} AS {PARTITION_KEY}{trace_columns}{lane_column}"
            );
            let claim_clause = |bound: &str, lanes_placeholder: usize| {
                let (lanes, order, lock) = if per_key {
                    (
                        format!(" AND {lane_expr} = ANY(${lanes_placeholder}::int4[])"),
                        format!("t.{occurred}, t.{id}"),
                        "FOR UPDATE OF t",
                    )
                } else {
                    (
                        String::new(),
                        format!("t.{occurred}"),
                        "FOR UPDATE OF t SKIP LOCKED",
                    )
                };
                format!(
                    "FROM {t} AS t WHERE t.{processed} IS NULL{bound}{lanes} \
                     ORDER BY {order} LIMIT $1 {lock}"
                )
            };
            (select_list, claim_clause)
        };
        // The three starts of a claim (see the fields' docs), as `claim_clause`s.
        // The `from` bound is the claim's own output (the column cast to timestamptz). Against a
        // timestamp column the comparison is btree's cross-type timestamp >= timestamptz, which
        // converts with the session time zone exactly as the claim did, and is still an index
        // condition. The `recent` bound: LEAST ignores a NULL horizon, and the bound is a stable
        // expression, computed once per statement, so it stays an index condition.
        // With a shared frontier the seek starts at the later of its own bound and the
        // frontier: one sequence read per claim, an InitPlan the index condition takes as a
        // value. The per-key claims never seek, so they keep the plain text.
        let frontier = (shared_frontier && !per_key).then(|| table.frontier_sequence().quoted());
        let seek_from = match &frontier {
            Some(sequence) => format!(
                "greatest($2::timestamptz, \
                 (SELECT to_timestamp(f.last_value::float8 / 1000000) FROM {sequence} AS f))"
            ),
            None => "$2::timestamptz".to_string(),
        };
        let starts = [
            claim_clause("", 2),
            claim_clause(&format!(" AND t.{occurred} >= {seek_from}"), 3),
            claim_clause(
                &format!(
                    " AND t.{occurred} >= least($2::timestamptz, now() - make_interval(secs => $3::float8))"
                ),
                4,
            ),
        ];
        let [claim, claim_from, claim_recent] = starts
            .each_ref()
            .map(|clause| format!("SELECT {select_list} {clause}"));

        let settle_all_published = match table.mode {
            DeliveryMode::Mark => format!(
                "UPDATE {t} SET {processed} = now(), {error} = NULL WHERE {id} = ANY($1::uuid[])"
            ),
            DeliveryMode::Delete => format!("DELETE FROM {t} WHERE {id} = ANY($1::uuid[])"),
        };

        // `spent` says when a row spends an attempt (a refusal by the broker).
        let attempts_set = |spent: &str| {
            c.attempts.as_ref().map_or(String::new(), |col| {
                let col = col.quoted();
                format!(", {col} = coalesce(t.{col}, 0) + CASE WHEN {spent} THEN 1 ELSE 0 END")
            })
        };
        let outcomes = "unnest($1::uuid[], $2::text[], $3::bool[]) AS u(id, error, done)";
        let update_outcomes = |only_failed: &str| {
            format!(
                "UPDATE {t} AS t SET {processed} = CASE WHEN u.done THEN now() ELSE NULL END, \
                 {error} = u.error{} FROM {outcomes} WHERE t.{id} = u.id{only_failed}",
                attempts_set("u.error IS NOT NULL")
            )
        };
        let settle_outcomes = match table.mode {
            DeliveryMode::Mark => update_outcomes(""),
            // Published rows go; failed and dead-lettered rows stay with their error so they
            // can be inspected. Both parts run in one statement, on disjoint rows.
            DeliveryMode::Delete => format!(
                "WITH published AS (DELETE FROM {t} AS t USING {outcomes} \
                 WHERE t.{id} = u.id AND u.error IS NULL) {}",
                update_outcomes(" AND u.error IS NOT NULL")
            ),
        };

        let backlog = format!(
            "SELECT count(*) FROM (SELECT 1 FROM {t} WHERE {processed} IS NULL LIMIT $1) AS pending"
        );
        let oldest_age = format!(
            "SELECT extract(epoch FROM now() - ({occurred})::timestamptz)::float8 FROM {t} \
             WHERE {processed} IS NULL ORDER BY {occurred} LIMIT 1"
        );

        let purge_processed = format!(
            "DELETE FROM {t} WHERE {id} IN (SELECT {id} FROM {t} WHERE {processed} IS NOT NULL \
             AND {processed} < now() - make_interval(secs => $1) LIMIT $2)"
        );

        // A row settled and put back in one transaction is written twice, so only the rare
        // batch with a row the broker did not confirm (or one that had an error) pays for it.
        // The UPDATE finds the claimed rows by ctid, a TID scan instead of a primary-key probe
        // per row: they are locked from the claim on, so their ctid cannot move in between. The
        // ctids go in as an array, not a join: a generic plan would hash-join the whole table.
        // The error column is left as it was, and returned, so a row put back keeps it.
        // A partitioned table's ctids repeat from partition to partition: it keeps two passes.
        let settles_in_claim =
            table.mode == DeliveryMode::Mark && !per_key && !raw_text && single_heap;
        let settling = settles_in_claim.then(|| {
            let settle = |clause: &String| {
                use columns::PRIOR_ERROR;
                format!(
                    "UPDATE {t} AS t SET {processed} = now() \
                     WHERE t.ctid = ANY(ARRAY(SELECT t.ctid {clause})) \
                     RETURNING {select_list}, t.{error}::text AS {PRIOR_ERROR}"
                )
            };
            SettlingClaims {
                claim: settle(&starts[0]).into(),
                claim_from: settle(&starts[1]).into(),
                claim_recent: settle(&starts[2]).into(),
                revert: format!(
                    "UPDATE {t} AS t SET {processed} = CASE WHEN u.done THEN t.{processed} END, \
                     {error} = u.error{} \
                     FROM unnest($1::uuid[], $2::text[], $3::bool[], $4::bool[]) \
                     AS u(id, error, done, spent) WHERE t.{id} = u.id",
                    attempts_set("u.spent")
                )
                .into(),
            }
        });

        // setval is not transactional: the other relays see the frontier move at once, while
        // this batch still publishes. Never past now(): one row dated ahead of the others
        // must not send every seek past them. Two relays racing may set it a little back; the
        // next claim sets it forward again.
        let advance_frontier = frontier.map(|sequence| {
            let to = "least($1::int8, (extract(epoch FROM now()) * 1000000)::int8)";
            format!(
                "SELECT setval('{sequence}'::regclass, {to}) FROM {sequence} \
                 WHERE last_value < {to}"
            )
            .into()
        });

        Self {
            settling,
            advance_frontier,
            pool_mode: PoolMode::Session,
            purge_processed: purge_processed.into(),
            claim: claim.into(),
            claim_from: claim_from.into(),
            claim_recent: claim_recent.into(),
            settle_all_published: settle_all_published.into(),
            settle_outcomes: settle_outcomes.into(),
            backlog: backlog.into(),
            oldest_age: oldest_age.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::ident::{Ident, TableName};

    fn table() -> OutboxTable {
        OutboxTable::new(TableName::parse("app.outbox").unwrap())
    }

    #[test]
    fn claim_skips_locked_rows_in_claim_order() {
        let s = Statements::new(&table(), PayloadKind::Json);
        assert!(
            s.claim
                .contains("FROM \"app\".\"outbox\" AS t WHERE t.\"processed_on_utc\" IS NULL")
        );
        assert!(
            s.claim
                .contains("ORDER BY t.\"occurred_on_utc\" LIMIT $1 FOR UPDATE OF t SKIP LOCKED")
        );
        assert!(
            s.claim
                .contains("NULL::text AS routing_key, NULL::jsonb AS headers, 0 AS attempts")
        );
        assert!(s.claim_from.contains(
            "IS NULL AND t.\"occurred_on_utc\" >= $2::timestamptz ORDER BY t.\"occurred_on_utc\" LIMIT $1 FOR UPDATE OF t SKIP LOCKED"
        ));
        assert!(s.claim_recent.contains(
            "IS NULL AND t.\"occurred_on_utc\" >= least($2::timestamptz, now() - make_interval(secs => $3::float8)) ORDER BY"
        ));
    }

    #[test]
    fn optional_columns_are_read_when_mapped() {
        let mut t = table();
        t.columns.routing_key = Some(Ident::new("rk").unwrap());
        t.columns.headers = Some(Ident::new("hdrs").unwrap());
        t.columns.attempts = Some(Ident::new("tries").unwrap());
        let s = Statements::new(&t, PayloadKind::Bytes);
        assert!(
            s.claim
                .contains("t.\"content\" AS payload, t.\"occurred_on_utc\"")
        );
        assert!(
            s.claim
                .contains("t.\"rk\"::text AS routing_key, t.\"hdrs\"::jsonb AS headers, coalesce(t.\"tries\", 0)::int4")
        );
        assert!(
            s.settle_outcomes
                .contains("\"tries\" = coalesce(t.\"tries\", 0) + CASE")
        );
    }

    #[test]
    fn mark_mode_settles_in_the_claim_by_ctid_and_keeps_the_error() {
        let s = Statements::new(&table(), PayloadKind::Json);
        let settling = s.settling.expect("mark mode");
        // The claim's own clause, locked and skipping locked rows, inside the UPDATE.
        let clause = s.claim.split_once(" FROM ").unwrap().1;
        assert!(settling.claim.starts_with(
            "UPDATE \"app\".\"outbox\" AS t SET \"processed_on_utc\" = now() WHERE t.ctid = ANY(ARRAY(SELECT t.ctid FROM "
        ));
        assert!(settling.claim.contains(clause), "{}", settling.claim);
        assert!(
            !settling.claim.contains("\"error\" ="),
            "{}",
            settling.claim
        );
        assert!(settling.claim.ends_with("t.\"error\"::text AS prior_error"));
        // Per-key ordering and SQL_ASCII databases keep two passes.
        let mut per_key = table();
        per_key.columns.partition_key = Some(Ident::new("k").unwrap());
        per_key.ordering = DeliveryOrder::PerKey;
        assert!(
            Statements::new(&per_key, PayloadKind::Json)
                .settling
                .is_none()
        );
        let plain = TableShape {
            payload: PayloadKind::Json,
            raw_text: false,
            server_autovacuum: true,
            single_heap: true,
            shared_frontier: false,
        };
        assert!(Statements::for_shape(&table(), &plain).settling.is_some());
        let sql_ascii = TableShape {
            raw_text: true,
            ..plain.clone()
        };
        assert!(
            Statements::for_shape(&table(), &sql_ascii)
                .settling
                .is_none()
        );
        // A partitioned table's ctids are not unique, so it keeps two passes.
        let partitioned = TableShape {
            single_heap: false,
            ..plain
        };
        assert!(
            Statements::for_shape(&table(), &partitioned)
                .settling
                .is_none()
        );
    }

    #[test]
    fn delete_mode_deletes_only_published_rows() {
        let mut t = table();
        t.mode = DeliveryMode::Delete;
        let s = Statements::new(&t, PayloadKind::Json);
        assert!(
            s.settle_all_published
                .starts_with("DELETE FROM \"app\".\"outbox\"")
        );
        assert!(s.settle_outcomes.contains("u.error IS NULL) UPDATE"));
        assert!(s.settle_outcomes.ends_with("AND u.error IS NOT NULL"));
    }

    #[test]
    fn sql_ascii_databases_hand_text_over_as_raw_bytes() {
        let shape = TableShape {
            payload: PayloadKind::Text,
            raw_text: true,
            server_autovacuum: true,
            single_heap: true,
            shared_frontier: false,
        };
        let s = Statements::for_shape(&table(), &shape);
        assert!(s.claim.contains("convert_to(t.\"type\"::text, 'SQL_ASCII') AS kind, convert_to(t.\"content\"::text, 'SQL_ASCII')"));
        let utf8 = Statements::for_shape(
            &table(),
            &TableShape {
                raw_text: false,
                ..shape
            },
        );
        assert!(!utf8.claim.contains("convert_to"));
    }

    /// The `$n` placeholders of a statement, in order of first appearance.
    fn placeholders(sql: &str) -> Vec<u32> {
        let mut found = Vec::new();
        let mut rest = sql;
        while let Some(at) = rest.find('$') {
            rest = &rest[at + 1..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            if let Ok(n) = digits.parse()
                && !found.contains(&n)
            {
                found.push(n);
            }
        }
        found
    }

    #[test]
    fn every_statement_binds_its_values() {
        // Every mode and every optional column, so each variant of each statement is checked.
        let mut t = table();
        t.columns.routing_key = Some(Ident::new("rk").unwrap());
        t.columns.headers = Some(Ident::new("hdrs").unwrap());
        t.columns.attempts = Some(Ident::new("tries").unwrap());
        for mode in [DeliveryMode::Mark, DeliveryMode::Delete] {
            t.mode = mode;
            let s = Statements::new(&t, PayloadKind::Text);
            // Mark mode claims with the settling claims, delete mode in two passes.
            assert_eq!(s.settling.is_some(), mode == DeliveryMode::Mark);
            let settling = s.settling.iter().flat_map(|settling| {
                [
                    (&settling.claim, 1),
                    (&settling.claim_from, 2),
                    (&settling.claim_recent, 3),
                    (&settling.revert, 4),
                ]
            });
            // Each statement with the values its callers bind: $1..$n, every one used.
            for (text, values) in [
                (&s.claim, 1),
                (&s.claim_from, 2),
                (&s.claim_recent, 3),
                (&s.settle_all_published, 1),
                (&s.settle_outcomes, 3),
                (&s.backlog, 1),
                (&s.oldest_age, 0),
                (&s.purge_processed, 2),
            ]
            .into_iter()
            .chain(settling)
            {
                let mut used = placeholders(text);
                used.sort_unstable();
                assert_eq!(used, (1..=values).collect::<Vec<u32>>(), "{text}");
                // No value is formatted in: the text holds no string literal at all.
                assert!(!text.contains('\''), "a literal in {text}");
            }
        }
    }

    #[test]
    fn per_key_claims_take_the_held_lanes_in_a_total_order_and_wait_for_locks() {
        let mut t = table();
        t.columns.partition_key = Some(Ident::new("aggregate_id").unwrap());
        t.ordering = DeliveryOrder::PerKey;
        let s = Statements::new(&t, PayloadKind::Json);
        let lane = format!(
            "(hashtext(coalesce(t.\"aggregate_id\"::text, t.\"id\"::text)) & {})",
            LANES - 1
        );
        for (text, lanes) in [(&s.claim, 2), (&s.claim_from, 3), (&s.claim_recent, 4)] {
            assert!(
                text.contains(&format!("{lane} = ANY(${lanes}::int4[])")),
                "{text}"
            );
            assert!(
                text.ends_with("ORDER BY t.\"occurred_on_utc\", t.\"id\" LIMIT $1 FOR UPDATE OF t"),
                "{text}"
            );
            assert!(text.contains("t.\"aggregate_id\"::text AS partition_key"));
            let mut used = placeholders(text);
            used.sort_unstable();
            assert_eq!(used, (1..=lanes).collect::<Vec<u32>>(), "{text}");
        }
        // The column alone changes nothing: unordered claims skip locked rows as before.
        t.ordering = DeliveryOrder::Unordered;
        let unordered = Statements::new(&t, PayloadKind::Json);
        assert!(unordered.claim.ends_with("FOR UPDATE OF t SKIP LOCKED"));
        assert!(!unordered.claim.contains("hashtext"));
        assert!(unordered.claim.contains("NULL::text AS partition_key"));
    }
}
