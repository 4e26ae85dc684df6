//! HTTP in, store operations out: the URL layout of the Kubernetes API and its verbs.
//!
//! `/api/v1/...` is the core group, `/apis/<group>/<version>/...` the others; then either
//! `namespaces/<ns>/<plural>[/<name>[/status]]` or `<plural>[/<name>]` (all namespaces, or a
//! cluster-scoped kind).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::Response;
use serde_json::{Value, json};

use super::errors::{ApiError, success_status};
use super::kinds::{Kind, lookup};
use super::selector::Selector;
use super::store::{ObjectKey, Part, PatchKind, Store};
use super::watch::{WatchRequest, watch_stream};

pub type SharedStore = Arc<Mutex<Store>>;

/// What a URL addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub kind: Kind,
    /// `None`: all namespaces (lists and watches only).
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub part: Part,
}

pub fn parse_path(path: &str) -> Result<Target, ApiError> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return Err(ApiError::BadRequest(format!("not an API path: {path}"))),
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        rest => (None, rest),
    };
    let (plural, name, part) = match rest {
        [plural] => (*plural, None, Part::Main),
        [plural, name] => (*plural, Some(name.to_string()), Part::Main),
        [plural, name, "status"] => (*plural, Some(name.to_string()), Part::Status),
        _ => return Err(ApiError::BadRequest(format!("unsupported path: {path}"))),
    };
    let kind = lookup(group, version, plural).ok_or_else(|| ApiError::NotFound {
        kind: "resource".into(),
        name: format!("{group}/{version}/{plural}"),
    })?;
    Ok(Target {
        kind,
        namespace,
        name,
        part,
    })
}

/// The one handler behind every path.
pub async fn handle(
    State(store): State<SharedStore>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let query: HashMap<String, String> = uri
        .query()
        .map(|q| {
            url::form_urlencoded::parse(q.as_bytes())
                .into_owned()
                .collect()
        })
        .unwrap_or_default();
    tracing::debug!(%method, %uri, "api request");
    match route(&store, &method, uri.path(), &query, &headers, &body) {
        Ok(Reply::Object(code, value)) => json_response(code, &value),
        Ok(Reply::Watch(request)) => Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from_stream(watch_stream(store, request)))
            .expect("static headers are valid"),
        Err(error) => json_response(
            StatusCode::from_u16(error.code()).unwrap_or(StatusCode::BAD_REQUEST),
            &error.status(),
        ),
    }
}

enum Reply {
    Object(StatusCode, Value),
    Watch(WatchRequest),
}

fn route(
    store: &SharedStore,
    method: &Method,
    path: &str,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Reply, ApiError> {
    let target = parse_path(path)?;
    let selector = |name: &str| Selector::parse(query.get(name).map_or("", String::as_str));
    let labels = selector("labelSelector").map_err(ApiError::BadRequest)?;
    let fields = selector("fieldSelector").map_err(ApiError::BadRequest)?;
    let key = |name: &String| -> Result<ObjectKey, ApiError> {
        let namespace = target.namespace.clone().unwrap_or_default();
        Ok(ObjectKey {
            kind: target.kind,
            namespace,
            name: name.clone(),
        })
    };
    let mut store = store.lock().unwrap();
    let ok = |value| Ok(Reply::Object(StatusCode::OK, value));
    match (method, &target.name) {
        (&Method::GET, None) if query.get("watch").is_some_and(|w| w == "true" || w == "1") => {
            let since = query
                .get("resourceVersion")
                .filter(|rv| !rv.is_empty())
                .map(|rv| rv.parse::<u64>())
                .transpose()
                .map_err(|_| ApiError::BadRequest("resourceVersion is not a number".into()))?;
            let timeout = query
                .get("timeoutSeconds")
                .and_then(|t| t.parse::<u64>().ok())
                .unwrap_or(1800);
            Ok(Reply::Watch(WatchRequest {
                kind: target.kind,
                namespace: target.namespace.clone(),
                labels,
                fields,
                since,
                timeout: Duration::from_secs(timeout),
                bookmarks: query
                    .get("allowWatchBookmarks")
                    .is_some_and(|b| b == "true"),
            }))
        }
        (&Method::GET, None) => {
            let (items, version) =
                store.list(target.kind, target.namespace.as_deref(), &labels, &fields);
            ok(json!({
                "apiVersion": target.kind.api_version(),
                "kind": format!("{}List", target.kind.kind),
                "metadata": {"resourceVersion": version.to_string()},
                "items": items,
            }))
        }
        (&Method::GET, Some(name)) => ok(store.get(&key(name)?)?),
        (&Method::POST, None) => {
            let namespace = target.namespace.clone().unwrap_or_default();
            let created = store.create(target.kind, &namespace, parse_body(body)?)?;
            Ok(Reply::Object(StatusCode::CREATED, created))
        }
        (&Method::PUT, Some(name)) => {
            ok(store.replace(&key(name)?, target.part, parse_body(body)?)?)
        }
        (&Method::PATCH, Some(name)) => {
            let kind = patch_kind(headers, query)?;
            ok(store.patch(&key(name)?, target.part, &kind, parse_body(body)?)?)
        }
        (&Method::DELETE, Some(name)) => {
            let deleted = store.delete(&key(name)?)?;
            ok(success_status(
                target.kind.plural,
                name,
                deleted["metadata"]["uid"].as_str(),
            ))
        }
        _ => Err(ApiError::MethodNotAllowed(format!("{method} {path}"))),
    }
}

fn patch_kind(headers: &HeaderMap, query: &HashMap<String, String>) -> Result<PatchKind, ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let media_type = content_type.split(';').next().unwrap_or_default().trim();
    match media_type {
        // Strategic merge differs from merge patch only for lists with patch strategies,
        // which no request of the operator or the kubelet relies on.
        "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
            Ok(PatchKind::Merge)
        }
        "application/json-patch+json" => Ok(PatchKind::Json),
        "application/apply-patch+yaml" => match query.get("fieldManager") {
            Some(manager) if !manager.is_empty() => Ok(PatchKind::Apply {
                manager: manager.clone(),
            }),
            _ => Err(ApiError::BadRequest(
                "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value".into(),
            )),
        },
        other => Err(ApiError::UnsupportedMediaType(format!(
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {other:?})"
        ))),
    }
}

/// Request bodies are JSON; kube sends apply patches as JSON too, which YAML admits.
fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::BadRequest(format!("body is not JSON: {e}")))
}

fn json_response(code: StatusCode, value: &Value) -> Response {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(
            serde_json::to_vec(value).expect("JSON values serialize"),
        ))
        .expect("static headers are valid")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_kind_namespace_name_and_part() {
        let target = parse_path("/apis/apps/v1/namespaces/shop/deployments/orders/status").unwrap();
        assert_eq!(target.kind.kind, "Deployment");
        assert_eq!(target.namespace.as_deref(), Some("shop"));
        assert_eq!(target.name.as_deref(), Some("orders"));
        assert_eq!(target.part, Part::Status);
        let all = parse_path("/apis/outboxrelay.io/v1alpha1/outboxrelays").unwrap();
        assert_eq!((all.namespace, all.name), (None, None));
        let secrets = parse_path("/api/v1/namespaces/shop/secrets").unwrap();
        assert_eq!(secrets.kind.kind, "Secret");
        assert!(parse_path("/apis/apps/v1/namespaces/shop/replicasets").is_err());
    }
}
