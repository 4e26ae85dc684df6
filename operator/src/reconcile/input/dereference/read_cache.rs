//! The Secrets and ConfigMaps reconciles have read, served again from memory while the
//! object's resourceVersion has not moved.
//!
//! A relay with a scaling block is reconciled every polling interval, and each reconcile needs
//! the objects it refers to (the database URL, its password and TLS material): at 1,000 relays
//! those reads were most of the operator's GETs (docs/scale.md). The operator already watches
//! both kinds as metadata only, to wake the relays that name a changed object; [`ReadCache`]
//! takes the newest resourceVersion from that same watch, so an object is read from the API
//! server again only when it changed, or when the watch has not seen it (yet).
//!
//! What is held: each watched object's namespace, name and version (about a hundred bytes
//! each, for every Secret or ConfigMap in the watched namespaces), and the whole object only
//! for those a relay refers to. The values stay in this process, as they did in each reconcile.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Mutex;

use kube::api::{Api, PartialObjectMeta};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

/// An object's place: namespace and name.
type Key = (String, String);

/// The objects of one kind the reconciles read, with the versions the watch saw.
pub struct ReadCache<K> {
    inner: Mutex<Known<K>>,
}

struct Known<K> {
    /// The newest resourceVersion the watch saw of each object.
    seen: HashMap<Key, String>,
    /// The object as a reconcile last read it from the API server.
    read: HashMap<Key, K>,
}

impl<K> Default for ReadCache<K> {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Known {
                seen: HashMap::new(),
                read: HashMap::new(),
            }),
        }
    }
}

impl<K> ReadCache<K>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    K::DynamicType: Default,
{
    /// Takes in one event of the metadata watch over `scope` (one namespace, or all with
    /// `None`). A new listing forgets the versions it covers: until the list has seen an object
    /// again, its reads go to the API server, so an object deleted while the watch was down is
    /// never served from memory.
    pub fn observe(&self, scope: Option<&str>, event: &watcher::Event<PartialObjectMeta<K>>) {
        let mut known = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        match event {
            watcher::Event::Init => known
                .seen
                .retain(|(namespace, _), _| scope.is_some_and(|scope| scope != namespace.as_str())),
            watcher::Event::InitApply(object) | watcher::Event::Apply(object) => {
                if let (Some(key), Some(version)) = (key_of(object), object.resource_version()) {
                    known.seen.insert(key, version);
                }
            }
            watcher::Event::Delete(object) => {
                if let Some(key) = key_of(object) {
                    known.seen.remove(&key);
                    known.read.remove(&key);
                }
            }
            watcher::Event::InitDone => {}
        }
    }

    /// The object `name` in `namespace`: from memory when the version read last is the newest
    /// the watch saw, otherwise from the API server (`None` when it does not exist there).
    pub async fn get_opt(
        &self,
        api: &Api<K>,
        namespace: &str,
        name: &str,
    ) -> kube::Result<Option<K>> {
        let key = (namespace.to_string(), name.to_string());
        if let Some(object) = self.unchanged(&key) {
            return Ok(Some(object));
        }
        let found = api.get_opt(name).await?;
        let mut known = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        match &found {
            Some(object) => known.read.insert(key, object.clone()),
            None => known.read.remove(&key),
        };
        Ok(found)
    }

    fn unchanged(&self, key: &Key) -> Option<K> {
        let known = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let seen = known.seen.get(key)?;
        let read = known.read.get(key)?;
        (read.meta().resource_version.as_ref() == Some(seen)).then(|| read.clone())
    }
}

fn key_of<K: Resource>(object: &PartialObjectMeta<K>) -> Option<Key> {
    Some((object.namespace()?, object.metadata.name.clone()?))
}

/// Where one reconcile reads the objects of one kind: through the operator's [`ReadCache`], or
/// straight from the API server (a test, a tool).
pub struct ObjectReader<'a, K> {
    api: Api<K>,
    namespace: String,
    cache: Option<&'a ReadCache<K>>,
}

impl<'a, K> ObjectReader<'a, K>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope> + Clone + DeserializeOwned + Debug,
    K::DynamicType: Default,
{
    pub fn new(client: kube::Client, namespace: &str, cache: Option<&'a ReadCache<K>>) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            cache,
        }
    }

    pub async fn get_opt(&self, name: &str) -> kube::Result<Option<K>> {
        match self.cache {
            Some(cache) => cache.get_opt(&self.api, &self.namespace, name).await,
            None => self.api.get_opt(name).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::marker::PhantomData;

    use k8s_openapi::api::core::v1::Secret;
    use kube::api::ObjectMeta;

    use super::*;
    use crate::test_support::api_server::{Reply, Step, finish, serve};
    use crate::test_support::mock_service;

    const PATH: &str = "/api/v1/namespaces/shop/secrets/orders-db";

    fn secret(version: &str) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some("orders-db".into()),
                namespace: Some("shop".into()),
                resource_version: Some(version.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn watched(version: &str) -> PartialObjectMeta<Secret> {
        PartialObjectMeta {
            types: None,
            metadata: secret(version).metadata,
            _phantom: PhantomData,
        }
    }

    fn version_of(found: Option<Secret>) -> Option<String> {
        found.and_then(|s| s.metadata.resource_version)
    }

    #[tokio::test]
    async fn an_unchanged_secret_is_read_once_and_a_changed_deleted_or_relisted_one_again() {
        // Exactly these GETs, in order; the server fails the test on any other request.
        let (service, handle) = mock_service::pair();
        let server = serve(
            handle,
            vec![
                Step::get(PATH, Reply::ok(serde_json::to_value(secret("7")).unwrap())),
                Step::get(PATH, Reply::ok(serde_json::to_value(secret("8")).unwrap())),
                Step::get(PATH, Reply::ok(serde_json::to_value(secret("8")).unwrap())),
                Step::get(PATH, Reply::not_found("secrets", "orders-db")),
            ],
        );
        let api: Api<Secret> = Api::namespaced(kube::Client::new(service, "shop"), "shop");
        let cache = ReadCache::<Secret>::default();
        let read = || cache.get_opt(&api, "shop", "orders-db");

        // Not seen by the watch yet: read from the API server (GET 1).
        cache.observe(Some("shop"), &watcher::Event::Init);
        let first = read().await.unwrap();
        assert_eq!(version_of(first), Some("7".into()));
        // The watch lists it at the version read: served from memory, twice.
        cache.observe(Some("shop"), &watcher::Event::InitApply(watched("7")));
        cache.observe(Some("shop"), &watcher::Event::InitDone);
        for _ in 0..2 {
            assert_eq!(version_of(read().await.unwrap()), Some("7".into()));
        }
        // A Secret in another namespace changing does not touch it.
        let mut elsewhere = watched("9");
        elsewhere.metadata.namespace = Some("billing".into());
        cache.observe(None, &watcher::Event::Apply(elsewhere));
        assert_eq!(version_of(read().await.unwrap()), Some("7".into()));
        // Changed (a rotation): read again (GET 2), then from memory at the new version.
        cache.observe(Some("shop"), &watcher::Event::Apply(watched("8")));
        assert_eq!(version_of(read().await.unwrap()), Some("8".into()));
        assert_eq!(version_of(read().await.unwrap()), Some("8".into()));
        // The watch lists again (it was down): nothing is served until it has seen it (GET 3).
        cache.observe(Some("shop"), &watcher::Event::Init);
        assert_eq!(version_of(read().await.unwrap()), Some("8".into()));
        cache.observe(Some("shop"), &watcher::Event::InitApply(watched("8")));
        assert_eq!(version_of(read().await.unwrap()), Some("8".into()));
        // Deleted: asked again, and not found (GET 4).
        cache.observe(Some("shop"), &watcher::Event::Delete(watched("10")));
        assert_eq!(read().await.unwrap(), None);

        drop(api);
        assert_eq!(finish(server).await.len(), 4);
    }
}
