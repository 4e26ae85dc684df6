//! Checks per-key order the way a consumer would: the first delivery of each message of a key
//! must come in the key's claim order (occurred-at, then id); repeats after a fault are
//! allowed, as the relay promises, and do not count.

use std::collections::{HashMap, HashSet};

use sqlx::PgConnection;
use uuid::Uuid;

use outbox_relay::table::OutboxTable;

/// Each row's key and its 1-based place among its key's rows in claim order, as the table
/// says: `key_column` must be text-like. Rows with a NULL key are left out (unordered).
pub async fn expected_order(
    conn: &mut PgConnection,
    table: &OutboxTable,
    key_column: &str,
) -> HashMap<Uuid, (String, i64)> {
    let c = &table.columns;
    let sql = format!(
        "SELECT {id}, {key}::text, row_number() OVER (PARTITION BY {key} ORDER BY {occurred}, {id}) \
         FROM {t} WHERE {key} IS NOT NULL",
        id = c.id.quoted(),
        key = key_column,
        occurred = c.occurred_at.quoted(),
        t = table.name.quoted(),
    );
    let rows: Vec<(Uuid, String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .fetch_all(conn)
        .await
        .expect("the expected order");
    rows.into_iter()
        .map(|(id, key, place)| (id, (key, place)))
        .collect()
}

/// What the order check found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct OrderReport {
    /// Keys whose first deliveries did not come as 1, 2, 3, … of their claim order.
    pub keys_out_of_order: Vec<String>,
    /// Distinct messages of ordered keys that arrived.
    pub first_deliveries: usize,
    /// Arrivals of an id already seen.
    pub repeats: usize,
}

impl OrderReport {
    /// Panics unless every key came in order and `rows` distinct messages arrived, naming a
    /// few of the keys out of order.
    pub fn assert_in_order(&self, rows: u64) {
        assert_eq!(self.first_deliveries as u64, rows);
        assert!(
            self.keys_out_of_order.is_empty(),
            "{} keys out of order, e.g. {:?}",
            self.keys_out_of_order.len(),
            &self.keys_out_of_order[..self.keys_out_of_order.len().min(5)]
        );
    }
}

/// Walks `arrivals` (every id in arrival order) against `expected`: for each key, the n-th
/// first delivery must be its n-th row.
pub fn check(arrivals: &[Uuid], expected: &HashMap<Uuid, (String, i64)>) -> OrderReport {
    let mut seen = HashSet::new();
    let mut next: HashMap<&str, i64> = HashMap::new();
    let mut out_of_order: HashSet<&str> = HashSet::new();
    let mut report = OrderReport::default();
    for id in arrivals {
        if !seen.insert(*id) {
            report.repeats += 1;
            continue;
        }
        let Some((key, place)) = expected.get(id) else {
            continue;
        };
        report.first_deliveries += 1;
        let want = next.entry(key.as_str()).or_insert(1);
        if *place != *want {
            out_of_order.insert(key.as_str());
        }
        *want = place + 1;
    }
    report.keys_out_of_order = out_of_order.into_iter().map(str::to_string).collect();
    report.keys_out_of_order.sort();
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_out_of_order_is_found_and_repeats_are_not_errors() {
        let ids: Vec<Uuid> = (0..5).map(|_| Uuid::new_v4()).collect();
        let expected: HashMap<Uuid, (String, i64)> = [
            (ids[0], ("a".to_string(), 1)),
            (ids[1], ("a".to_string(), 2)),
            (ids[2], ("b".to_string(), 1)),
            (ids[3], ("b".to_string(), 2)),
        ]
        .into_iter()
        .collect();
        // a in order, with a repeat of its first row after a crash; b swapped; an unknown id.
        let report = check(&[ids[0], ids[3], ids[1], ids[0], ids[2], ids[4]], &expected);
        assert_eq!(report.keys_out_of_order, vec!["b".to_string()]);
        assert_eq!(report.first_deliveries, 4);
        assert_eq!(report.repeats, 1);
        let fine = check(&[ids[2], ids[0], ids[3], ids[1]], &expected);
        assert!(fine.keys_out_of_order.is_empty(), "{fine:?}");
    }
}
