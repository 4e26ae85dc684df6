//! The objects, the global resourceVersion counter and the change history watches replay.
//!
//! Every write goes through [`Store::commit`], which stamps server-owned metadata, bumps
//! `generation` when anything outside metadata and status changed, and skips writes that change
//! nothing (the real API server does not bump resourceVersion for a no-op, and a controller
//! would otherwise reconcile its own status writes forever).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde_json::{Value, json};

use super::errors::ApiError;
use super::kinds::Kind;
use super::patch;
use super::selector::Selector;

/// Namespace "" holds cluster-scoped objects.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

/// The part of an object a request addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Part {
    Main,
    Status,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeType {
    Added,
    Modified,
    Deleted,
}

impl ChangeType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One entry of the history: what a watch from an older resourceVersion is told.
#[derive(Debug, Clone)]
pub struct Change {
    pub resource_version: u64,
    /// When the server accepted the write.
    pub at: chrono::DateTime<chrono::Utc>,
    pub kind: Kind,
    pub change: ChangeType,
    pub object: Value,
}

/// How a PATCH body is to be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PatchKind {
    Merge,
    Json,
    Apply { manager: String },
}

/// Changes kept for watches; a watch from before the oldest gets 410 Gone and re-lists.
const HISTORY_LIMIT: usize = 100_000;

pub struct Store {
    resource_version: u64,
    objects: BTreeMap<ObjectKey, Value>,
    /// What each field manager last applied to each part, so a later apply can drop fields.
    applied: HashMap<(ObjectKey, String, Part), Value>,
    history: Vec<Arc<Change>>,
    /// Carries the latest resourceVersion to wake watches.
    notify: tokio::sync::watch::Sender<u64>,
}

impl Default for Store {
    fn default() -> Self {
        // Start well above zero: "0" means "any version" to a list or watch.
        let start = 1000;
        Self {
            resource_version: start,
            objects: BTreeMap::new(),
            applied: HashMap::new(),
            history: Vec::new(),
            notify: tokio::sync::watch::Sender::new(start),
        }
    }
}

impl Store {
    pub fn resource_version(&self) -> u64 {
        self.resource_version
    }

    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.notify.subscribe()
    }

    pub fn get(&self, key: &ObjectKey) -> Result<Value, ApiError> {
        self.objects.get(key).cloned().ok_or_else(|| not_found(key))
    }

    /// Objects of `kind` (in `namespace`, or all namespaces with `None`) matching both
    /// selectors, with the resourceVersion the list is consistent with.
    pub fn list(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        labels: &Selector,
        fields: &Selector,
    ) -> (Vec<Value>, u64) {
        let items = self
            .objects
            .iter()
            .filter(|(key, object)| {
                key.kind == kind
                    && namespace.is_none_or(|ns| key.namespace == ns)
                    && labels.matches_labels(object)
                    && fields.matches_fields(object)
            })
            .map(|(_, object)| object.clone())
            .collect();
        (items, self.resource_version)
    }

    /// Changes of `kind` after `since`, or Gone when the history no longer reaches back.
    pub fn changes_since(&self, kind: Kind, since: u64) -> Result<Vec<Arc<Change>>, ApiError> {
        if let Some(oldest) = self.history.first()
            && since + 1 < oldest.resource_version
            && self.history.len() >= HISTORY_LIMIT
        {
            return Err(ApiError::Gone(format!(
                "too old resource version: {since} ({})",
                oldest.resource_version
            )));
        }
        let start = self
            .history
            .partition_point(|change| change.resource_version <= since);
        Ok(self.history[start..]
            .iter()
            .filter(|change| change.kind == kind)
            .cloned()
            .collect())
    }

    /// Every retained version of one object, oldest first, deletion included.
    pub fn versions_of(&self, key: &ObjectKey) -> Vec<Arc<Change>> {
        self.history
            .iter()
            .filter(|change| {
                change.kind == key.kind
                    && change.object["metadata"]["name"].as_str() == Some(key.name.as_str())
                    && change.object["metadata"]["namespace"]
                        .as_str()
                        .unwrap_or_default()
                        == key.namespace
            })
            .cloned()
            .collect()
    }

    pub fn create(
        &mut self,
        kind: Kind,
        namespace: &str,
        mut body: Value,
    ) -> Result<Value, ApiError> {
        let name = match body["metadata"]["name"].as_str() {
            Some(name) if !name.is_empty() => name.to_string(),
            _ => match body["metadata"]["generateName"].as_str() {
                Some(prefix) => format!(
                    "{prefix}{}",
                    &uuid::Uuid::new_v4().simple().to_string()[..5]
                ),
                None => return Err(ApiError::BadRequest("metadata.name is required".into())),
            },
        };
        let key = ObjectKey {
            kind,
            namespace: namespace.to_string(),
            name,
        };
        if self.objects.contains_key(&key) {
            return Err(ApiError::AlreadyExists {
                kind: kind.plural.into(),
                name: key.name,
            });
        }
        if kind.status_subresource {
            // Status is the controller's to write, through /status.
            body.as_object_mut().map(|o| o.remove("status"));
        }
        Ok(self.commit(&key, body))
    }

    /// PUT: the body replaces the addressed part; a stale resourceVersion is a conflict.
    pub fn replace(&mut self, key: &ObjectKey, part: Part, body: Value) -> Result<Value, ApiError> {
        let live = self.get(key)?;
        check_resource_version(key, &live, &body)?;
        let next = self.combine(key, &live, part, body);
        Ok(self.commit(key, next))
    }

    pub fn patch(
        &mut self,
        key: &ObjectKey,
        part: Part,
        kind: &PatchKind,
        body: Value,
    ) -> Result<Value, ApiError> {
        let live = match (self.objects.get(key), kind, part) {
            (Some(live), _, _) => live.clone(),
            // Apply creates what does not exist yet, but never through /status.
            (None, PatchKind::Apply { .. }, Part::Main) => json!({}),
            (None, _, _) => return Err(not_found(key)),
        };
        let mut patched = live.clone();
        match kind {
            PatchKind::Merge => patch::merge_patch(&mut patched, &body),
            PatchKind::Json => {
                let operations: json_patch::Patch = serde_json::from_value(body)
                    .map_err(|e| ApiError::BadRequest(format!("json patch: {e}")))?;
                json_patch::patch(&mut patched, &operations)
                    .map_err(|e| ApiError::BadRequest(format!("json patch: {e}")))?;
            }
            PatchKind::Apply { manager } => {
                let applied = applied_part(key.kind, part, body);
                let slot = (key.clone(), manager.clone(), part);
                patch::apply(&mut patched, self.applied.get(&slot), &applied);
                self.applied.insert(slot, applied);
            }
        }
        let next = self.combine(key, &live, part, patched);
        Ok(self.commit(key, next))
    }

    /// Deletes the object, then (like the garbage collector, at once) what it owns.
    pub fn delete(&mut self, key: &ObjectKey) -> Result<Value, ApiError> {
        let object = self.objects.remove(key).ok_or_else(|| not_found(key))?;
        self.applied.retain(|(k, _, _), _| k != key);
        self.resource_version += 1;
        let mut gone = object.clone();
        gone["metadata"]["resourceVersion"] = json!(self.resource_version.to_string());
        self.record(key.kind, ChangeType::Deleted, gone);
        if let Some(uid) = object["metadata"]["uid"].as_str() {
            let owned: Vec<ObjectKey> = self
                .objects
                .iter()
                .filter(|(_, o)| owned_by(o, uid))
                .map(|(k, _)| k.clone())
                .collect();
            for key in owned {
                let _ = self.delete(&key);
            }
        }
        Ok(object)
    }

    /// The next version of the object from a write to `part`: for kinds with a status
    /// subresource, the other part keeps its live value.
    fn combine(&self, key: &ObjectKey, live: &Value, part: Part, mut written: Value) -> Value {
        if !key.kind.status_subresource {
            return written;
        }
        match part {
            Part::Main => {
                set_or_remove(&mut written, "status", live.get("status").cloned());
                written
            }
            Part::Status => {
                let mut next = live.clone();
                set_or_remove(&mut next, "status", written.get("status").cloned());
                next
            }
        }
    }

    /// Stores `next` under `key` with server-owned fields stamped, unless nothing changed.
    fn commit(&mut self, key: &ObjectKey, mut next: Value) -> Value {
        let live = self.objects.get(key).cloned();
        next["apiVersion"] = json!(key.kind.api_version());
        next["kind"] = json!(key.kind.kind);
        if !next["metadata"].is_object() {
            next["metadata"] = json!({});
        }
        let metadata = &mut next["metadata"];
        metadata["name"] = json!(key.name);
        if key.namespace.is_empty() {
            metadata.as_object_mut().map(|m| m.remove("namespace"));
        } else {
            metadata["namespace"] = json!(key.namespace);
        }
        for field in ["managedFields", "resourceVersion"] {
            metadata.as_object_mut().map(|m| m.remove(field));
        }
        match &live {
            Some(live) => {
                for field in ["uid", "creationTimestamp", "generation"] {
                    set_or_remove(metadata, field, live["metadata"].get(field).cloned());
                }
                if without_version(live) == next {
                    return live.clone();
                }
                if key.kind.status_subresource && spec_of(live) != spec_of(&next) {
                    let generation = live["metadata"]["generation"].as_i64().unwrap_or(0);
                    next["metadata"]["generation"] = json!(generation + 1);
                }
            }
            None => {
                metadata["uid"] = json!(uuid::Uuid::new_v4().to_string());
                metadata["creationTimestamp"] =
                    json!(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
                if key.kind.status_subresource {
                    metadata["generation"] = json!(1);
                }
                metadata.as_object_mut().map(|m| m.remove("generateName"));
            }
        }
        let change = if live.is_some() {
            ChangeType::Modified
        } else {
            ChangeType::Added
        };
        self.resource_version += 1;
        next["metadata"]["resourceVersion"] = json!(self.resource_version.to_string());
        self.objects.insert(key.clone(), next.clone());
        self.record(key.kind, change, next.clone());
        next
    }

    fn record(&mut self, kind: Kind, change: ChangeType, object: Value) {
        self.history.push(Arc::new(Change {
            resource_version: self.resource_version,
            at: chrono::Utc::now(),
            kind,
            change,
            object,
        }));
        if self.history.len() > HISTORY_LIMIT {
            let excess = self.history.len() - HISTORY_LIMIT;
            self.history.drain(..excess);
        }
        self.notify.send_replace(self.resource_version);
    }
}

/// What an apply to `part` may set: server-owned metadata is ignored, and for kinds with a
/// status subresource the main resource's apply carries no status and /status's only status.
fn applied_part(kind: Kind, part: Part, mut body: Value) -> Value {
    if let Some(metadata) = body.get_mut("metadata").and_then(Value::as_object_mut) {
        for field in [
            "resourceVersion",
            "uid",
            "creationTimestamp",
            "generation",
            "managedFields",
            "name",
            "namespace",
        ] {
            metadata.remove(field);
        }
    }
    if let Some(object) = body.as_object_mut() {
        object.remove("apiVersion");
        object.remove("kind");
        if kind.status_subresource {
            match part {
                Part::Main => {
                    object.remove("status");
                }
                Part::Status => object.retain(|k, _| k == "status"),
            }
        }
    }
    body
}

fn check_resource_version(key: &ObjectKey, live: &Value, body: &Value) -> Result<(), ApiError> {
    match body["metadata"]["resourceVersion"].as_str() {
        Some(wanted)
            if !wanted.is_empty()
                && Some(wanted) != live["metadata"]["resourceVersion"].as_str() =>
        {
            Err(ApiError::Conflict {
                kind: key.kind.plural.into(),
                name: key.name.clone(),
            })
        }
        _ => Ok(()),
    }
}

fn not_found(key: &ObjectKey) -> ApiError {
    ApiError::NotFound {
        kind: key.kind.plural.into(),
        name: key.name.clone(),
    }
}

fn owned_by(object: &Value, uid: &str) -> bool {
    object["metadata"]["ownerReferences"]
        .as_array()
        .is_some_and(|owners| owners.iter().any(|o| o["uid"].as_str() == Some(uid)))
}

fn set_or_remove(object: &mut Value, field: &str, value: Option<Value>) {
    let Some(map) = object.as_object_mut() else {
        return;
    };
    match value {
        Some(value) => {
            map.insert(field.to_string(), value);
        }
        None => {
            map.remove(field);
        }
    }
}

/// The object as it would be stored before a resourceVersion is stamped, for no-op detection.
fn without_version(object: &Value) -> Value {
    let mut copy = object.clone();
    copy["metadata"]
        .as_object_mut()
        .map(|m| m.remove("resourceVersion"));
    copy
}

/// Everything but metadata and status: a change here bumps `generation`.
fn spec_of(object: &Value) -> Value {
    let mut copy = object.clone();
    if let Some(map) = copy.as_object_mut() {
        map.remove("metadata");
        map.remove("status");
    }
    copy
}
