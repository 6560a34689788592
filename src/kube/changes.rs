//! Wake-ups for a step waiting on its node. A step looks at its node on a beat for minutes;
//! most of those looks find nothing new. These metadata watches on what a look reads (the
//! Node, the node's pods, the Longhorn replicas of the node and of its volumes, the
//! VolumeAttachments) only say *that* something changed: the look that follows still reads
//! everything afresh, so a lost or late event costs time, never a wrong decision.
//!
//! Each watch starts at the resourceVersion of a one-item list and re-lists when the server
//! ends it or says the version is gone (410; kube-apiserver `staging/src/k8s.io/apiserver/
//! pkg/storage/cacher`, "too old resource version"), as a client of the watch API must. A
//! watch that cannot be held (refused, unreachable) reports a change on every beat, which
//! is polling as before.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DynamicObject, ListParams, WatchEvent, WatchParams};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;

use super::inventory::{label_value, longhorn, LONGHORN_NODE_LABEL, LONGHORN_VOLUME_LABEL};
use super::KubeClient;
use crate::clock::Clock;

/// How long a watch asks the server to hold it open (kube-rs's default is the same order:
/// the apiserver ends watches after a few minutes and clients re-list).
const WATCH_SECS: u32 = 290;
/// The wait before a watch that failed is tried again.
const RETRY: Duration = Duration::from_secs(5);

/// Whether anything a step's look reads has changed since the step last asked. Dropping it
/// ends its watches.
pub struct Changes {
    shared: Arc<Shared>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

#[derive(Default)]
struct Shared {
    seen: AtomicBool,
    /// Woken on each change, for [`Changes::changed`].
    wake: Notify,
    /// Watches open (or with nothing to watch), for [`Changes::watching`].
    open: AtomicUsize,
    opened: Notify,
}

impl Shared {
    fn saw(&self) {
        self.seen.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }
}

impl Changes {
    /// True once after each change (and while a watch is down); the caller then looks.
    pub fn take(&self) -> bool {
        self.shared.seen.swap(false, Ordering::SeqCst)
    }

    /// Until the next change (one that came since the last [`Changes::take`] included).
    pub async fn changed(&self) {
        while !self.take() {
            self.shared.wake.notified().await;
        }
    }

    /// Until every watch has opened once: from then on no change is missed.
    pub async fn watching(&self) {
        loop {
            let opened = self.shared.opened.notified();
            if self.shared.open.load(Ordering::SeqCst) >= self.tasks.len() {
                return;
            }
            opened.await;
        }
    }
}

impl Drop for Changes {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl KubeClient {
    /// Watches on what a look at `node` reads: its Node, its pods, the Longhorn replicas on
    /// it and of `volumes`, and the VolumeAttachments (which have no field selector for
    /// their node; a cluster has few, and they change only when a volume moves).
    pub fn changes_of(&self, node: &str, volumes: &[String], clock: &Clock) -> Changes {
        let shared = Arc::new(Shared::default());
        let mut tasks = Vec::new();
        let by_name = format!("metadata.name={node}");
        let mut spawn = |f: futures_util::future::BoxFuture<'static, ()>| {
            tasks.push(tokio::spawn(f));
        };
        let c = self.client.clone();
        spawn(Box::pin(follow(
            Api::<Node>::all(c.clone()),
            Some(by_name),
            None,
            shared.clone(),
            clock.clone(),
        )));
        spawn(Box::pin(follow(
            Api::<Pod>::all(c.clone()),
            Some(format!("spec.nodeName={node}")),
            None,
            shared.clone(),
            clock.clone(),
        )));
        spawn(Box::pin(follow(
            Api::<VolumeAttachment>::all(c.clone()),
            None,
            None,
            shared.clone(),
            clock.clone(),
        )));
        let replicas =
            || Api::<DynamicObject>::all_with(c.clone(), &longhorn("Replica", "replicas"));
        if label_value(node) {
            spawn(Box::pin(follow(
                replicas(),
                None,
                Some(format!("{LONGHORN_NODE_LABEL}={node}")),
                shared.clone(),
                clock.clone(),
            )));
        }
        let mut names: Vec<&String> = volumes.iter().filter(|v| label_value(v)).collect();
        names.sort();
        names.dedup();
        if !names.is_empty() {
            let names: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
            spawn(Box::pin(follow(
                replicas(),
                None,
                Some(format!("{LONGHORN_VOLUME_LABEL} in ({})", names.join(","))),
                shared.clone(),
                clock.clone(),
            )));
        }
        Changes { shared, tasks }
    }
}

/// Follow one watch for as long as the step lasts, marking `seen` on every event and on
/// every gap (a gap may hide a change). A kind the server does not serve (no Longhorn
/// here: 404) ends quietly: nothing of it can change.
async fn follow<K>(
    api: Api<K>,
    fields: Option<String>,
    labels: Option<String>,
    shared: Arc<Shared>,
    clock: Clock,
) where
    K: Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let mut lp = ListParams::default().limit(1);
    let mut wp = WatchParams::default().timeout(WATCH_SECS);
    if let Some(f) = &fields {
        lp = lp.fields(f);
        wp = wp.fields(f);
    }
    if let Some(l) = &labels {
        lp = lp.labels(l);
        wp = wp.labels(l);
    }
    let mut opened = false;
    loop {
        // From now on: the list's version, so the watch replays nothing already there.
        let from = match api.list_metadata(&lp).await {
            Ok(list) => list.metadata.resource_version.unwrap_or_default(),
            Err(kube::Error::Api(s)) if s.code == 404 => {
                shared.open.fetch_add(1, Ordering::SeqCst);
                shared.opened.notify_waiters();
                return;
            }
            Err(_) => {
                shared.saw();
                clock.sleep(RETRY).await;
                continue;
            }
        };
        let stream = match api.watch_metadata(&wp, &from).await {
            Ok(s) => s,
            Err(_) => {
                shared.saw();
                clock.sleep(RETRY).await;
                continue;
            }
        };
        if !opened {
            opened = true;
            shared.open.fetch_add(1, Ordering::SeqCst);
            shared.opened.notify_waiters();
        }
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(WatchEvent::Bookmark(_)) => {}
                Ok(WatchEvent::Added(_) | WatchEvent::Modified(_) | WatchEvent::Deleted(_)) => {
                    shared.saw();
                }
                // 410 and the like: what happened meanwhile is unknown; re-list.
                Ok(WatchEvent::Error(_)) | Err(_) => break,
            }
        }
        shared.saw();
    }
}
