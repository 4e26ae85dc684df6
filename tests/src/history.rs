//! Every version of one object, as a watch delivers them: what the API server stored, in order,
//! with the moment it arrived. The tests use it where polling could miss a short-lived value
//! (a Deployment at 3 replicas for half a second, a condition reason between two polls).

use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use futures::StreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;

/// One stored version of the object and when the watch delivered it.
pub type Version = (DateTime<Utc>, serde_json::Value);

pub struct History {
    versions: Arc<Mutex<Vec<Version>>>,
    task: JoinHandle<()>,
}

impl History {
    /// Starts watching the object `name` of `api`; versions are kept until dropped.
    pub fn record<K>(api: Api<K>, name: &str) -> Self
    where
        K: Resource + Clone + DeserializeOwned + Serialize + Debug + Send + Sync + 'static,
    {
        let versions = Arc::new(Mutex::new(Vec::new()));
        let sink = versions.clone();
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let task = tokio::spawn(async move {
            let mut stream = watcher::watcher(api, config).boxed();
            let mut last_version: Option<String> = None;
            while let Some(event) = stream.next().await {
                let object = match event {
                    Ok(Event::Apply(object) | Event::InitApply(object)) => object,
                    Ok(_) => continue,
                    Err(_) => {
                        // The watcher re-lists by itself; a short pause keeps a failing
                        // server from being hammered.
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                };
                // A re-list repeats the current version: keep each resourceVersion once.
                let version = object.meta().resource_version.clone();
                if version.is_some() && version == last_version {
                    continue;
                }
                last_version = version;
                if let Ok(value) = serde_json::to_value(&object) {
                    sink.lock().unwrap().push((Utc::now(), value));
                }
            }
        });
        Self { versions, task }
    }

    /// Every version so far, oldest first, with when it arrived.
    pub fn versions(&self) -> Vec<Version> {
        self.versions.lock().unwrap().clone()
    }
}

impl Drop for History {
    fn drop(&mut self) {
        self.task.abort();
    }
}
