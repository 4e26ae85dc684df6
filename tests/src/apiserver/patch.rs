//! The two patch flavours controllers send: JSON merge patch (RFC 7386) and server-side apply.
//!
//! Apply is modelled for one field manager per object part, which is what a test with one
//! operator sees: the applied fields are merged into the live object (maps recursively, lists
//! and scalars replaced whole), and fields the same manager applied last time but omits now are
//! removed, as the real API server does through managed fields. No managedFields are stored.

use serde_json::{Map, Value};

/// RFC 7386: `null` removes, objects merge, everything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    json_patch::merge(target, patch);
}

/// Server-side apply of `applied` onto `live`, given what this manager applied before.
pub fn apply(live: &mut Value, previously_applied: Option<&Value>, applied: &Value) {
    if let Some(previous) = previously_applied {
        remove_dropped_fields(live, previous, applied);
    }
    merge_fields(live, applied);
}

/// Merges maps recursively; a list or scalar in `applied` replaces the live value.
fn merge_fields(live: &mut Value, applied: &Value) {
    match (live, applied) {
        (Value::Object(live), Value::Object(applied)) => {
            for (key, value) in applied {
                if value.is_null() {
                    live.remove(key);
                    continue;
                }
                match live.get_mut(key) {
                    Some(existing) if existing.is_object() && value.is_object() => {
                        merge_fields(existing, value);
                    }
                    _ => {
                        live.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (live, applied) => *live = applied.clone(),
    }
}

/// Removes from `live` every field that `previous` set and `applied` no longer sets.
fn remove_dropped_fields(live: &mut Value, previous: &Value, applied: &Value) {
    let (Value::Object(live), Value::Object(previous)) = (live, previous) else {
        return;
    };
    let empty = Map::new();
    let applied = applied.as_object().unwrap_or(&empty);
    for (key, previous_value) in previous {
        match applied.get(key) {
            None => {
                live.remove(key);
            }
            Some(applied_value) => {
                if let Some(live_value) = live.get_mut(key) {
                    remove_dropped_fields(live_value, previous_value, applied_value);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn apply_merges_maps_replaces_lists_and_forgets_dropped_fields() {
        let mut live =
            json!({"spec": {"replicas": 1, "paused": true, "list": [1, 2]}, "other": "kept"});
        let first = json!({"spec": {"replicas": 2, "list": [3], "extra": "x"}});
        apply(&mut live, None, &first);
        assert_eq!(
            live,
            json!({"spec": {"replicas": 2, "paused": true, "list": [3], "extra": "x"}, "other": "kept"})
        );
        let second = json!({"spec": {"replicas": 3, "list": [3]}});
        apply(&mut live, Some(&first), &second);
        assert_eq!(
            live,
            json!({"spec": {"replicas": 3, "paused": true, "list": [3]}, "other": "kept"})
        );
    }

    #[test]
    fn merge_patch_removes_nulls() {
        let mut live = json!({"a": {"b": 1, "c": 2}});
        merge_patch(&mut live, &json!({"a": {"b": null, "d": 3}}));
        assert_eq!(live, json!({"a": {"c": 2, "d": 3}}));
    }
}
