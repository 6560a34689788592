//! Wake-ups for a step waiting on its node. A step looks at its node on a beat for minutes;
//! most of those looks find nothing new. These metadata watches on what a look reads (the
//! Node, the node's pods, the Longhorn replicas of the node and of its volumes, those
//! volumes, the VolumeAttachments) only say *that* something changed: the look that follows still reads
//! everything afresh, so a lost or late event costs time, never a wrong decision.
//!
//! Each watch starts at the resourceVersion of a one-item list and re-lists when the server
//! ends it or says the version is gone (410; kube-apiserver `staging/src/k8s.io/apiserver/
//! pkg/storage/cacher`, "too old resource version"), as a client of the watch API must. A
//! watch that cannot be held (refused, unreachable, or past this client's
//! [`WATCH_STREAMS`]) reports a change on every beat, which is polling as before.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
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
/// The most Longhorn volumes a step watches one by one; past it, it watches them all.
const VOLUME_WATCHES: usize = 8;
/// The most watches one client holds at once. Over HTTP/2 they share one connection with
/// every other request, and kube-apiserver allows 250 streams on a connection unless
/// `--http2-max-streams-per-connection` says otherwise (`k8s.io/apiserver/pkg/server/
/// secure_serving.go`); a request past the limit waits for a stream to end, and a watch
/// ends only after minutes. A step holds up to 13, so a large `maxUnavailable` could
/// otherwise starve the lease renewal and the looks; past this, a step's watch falls back
/// to looking on every beat, and 50 streams stay free for requests.
pub const WATCH_STREAMS: usize = 200;

/// The watch streams a client may still open (see [`WATCH_STREAMS`]).
#[derive(Clone)]
pub struct Slots(Arc<tokio::sync::Semaphore>);

impl Default for Slots {
    fn default() -> Self {
        Slots::new(WATCH_STREAMS)
    }
}

impl Slots {
    pub fn new(streams: usize) -> Slots {
        Slots(Arc::new(tokio::sync::Semaphore::new(streams)))
    }

    /// How many watch streams may open now.
    pub fn free(&self) -> usize {
        self.0.available_permits()
    }
}

/// Whether anything a step's look reads has changed since the step last asked. Dropping it
/// ends its watches.
pub struct Changes {
    shared: Arc<Shared>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// What a settling step wakes on: changes to what its next look reads. A step reads only
/// what can change its next move (the rules in `rollout/step.rs`), so a change to anything
/// else cannot either: while its node reboots it reads only the Talos API, and only its
/// Node (the kubelet back and Ready) says a look may find something new.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scope(u8);

impl Scope {
    pub const NODE: Scope = Scope(1);
    pub const PODS: Scope = Scope(2);
    /// Longhorn's replicas and volumes.
    pub const REPLICAS: Scope = Scope(4);
    pub const ATTACHMENTS: Scope = Scope(8);
    pub const EVERYTHING: Scope = Scope(15);

    /// This scope, and `other` too when `on`.
    pub fn and(self, other: Scope, on: bool) -> Scope {
        if on {
            Scope(self.0 | other.0)
        } else {
            self
        }
    }
}

#[derive(Default)]
struct Shared {
    /// The scopes ([`Scope`] bits) changed since the last [`Changes::take`].
    seen: AtomicU8,
    /// Woken on each change, for [`Changes::changed`].
    wake: Notify,
    /// Watches open (or with nothing to watch), for [`Changes::watching`].
    open: AtomicUsize,
    opened: Notify,
}

impl Shared {
    fn saw(&self, scope: Scope) {
        self.seen.fetch_or(scope.0, Ordering::SeqCst);
        self.wake.notify_one();
    }

    /// One more watch open, or with nothing to watch.
    fn one_open(&self) {
        self.open.fetch_add(1, Ordering::SeqCst);
        self.opened.notify_waiters();
    }
}

impl Changes {
    /// True once after each change (and while a watch is down); the caller then looks.
    pub fn take(&self) -> bool {
        self.shared.seen.swap(0, Ordering::SeqCst) != 0
    }

    /// Whether a change in `scope` came since the last [`Changes::take`] (nothing cleared).
    pub fn pending(&self, scope: Scope) -> bool {
        self.shared.seen.load(Ordering::SeqCst) & scope.0 != 0
    }

    /// Until a change in `scope` (one that came since the last [`Changes::take`] included);
    /// then everything pending is taken: the look that follows reads it all afresh.
    pub async fn changed(&self, scope: Scope) {
        loop {
            if self.pending(scope) {
                self.take();
                return;
            }
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

/// One watch a step holds: its selectors, and for a kind with no selector for the node, a
/// test on the whole object (the watch then carries objects, not metadata only).
struct Watch<K> {
    fields: Option<String>,
    labels: Option<String>,
    keep: Option<fn(&K, &str) -> bool>,
}

impl<K> Watch<K> {
    fn fields(f: String) -> Watch<K> {
        Watch {
            fields: Some(f),
            labels: None,
            keep: None,
        }
    }
    fn every() -> Watch<K> {
        Watch {
            fields: None,
            labels: None,
            keep: None,
        }
    }
    fn labels(l: String) -> Watch<K> {
        Watch {
            fields: None,
            labels: Some(l),
            keep: None,
        }
    }
}

impl KubeClient {
    /// Watches on what a look at `node` reads: its Node, its pods, the Longhorn replicas on
    /// it and of `volumes`, those volumes, and its VolumeAttachments (which select on no
    /// field but their name: all are watched, and only the node's count).
    pub fn changes_of(&self, node: &str, volumes: &[String], clock: &Clock) -> Changes {
        let shared = Arc::new(Shared::default());
        let c = &self.client;
        let on = Follower {
            node: node.to_string(),
            shared: shared.clone(),
            clock: clock.clone(),
            scope: Scope::PODS,
            slots: self.watch_slots.clone(),
        };
        let mut tasks = vec![
            tokio::spawn(follow(
                Api::<Node>::all(c.clone()),
                Watch::fields(format!("metadata.name={node}")),
                Follower {
                    scope: Scope::NODE,
                    ..on.clone()
                },
            )),
            tokio::spawn(follow(
                Api::<Pod>::all(c.clone()),
                Watch::fields(format!("spec.nodeName={node}")),
                on.clone(),
            )),
            tokio::spawn(follow(
                Api::<VolumeAttachment>::all(c.clone()),
                Watch {
                    fields: None,
                    labels: None,
                    keep: Some(|va: &VolumeAttachment, node: &str| va.spec.node_name == node),
                },
                Follower {
                    scope: Scope::ATTACHMENTS,
                    ..on.clone()
                },
            )),
        ];
        let replicas =
            || Api::<DynamicObject>::all_with(c.clone(), &longhorn("Replica", "replicas"));
        let on = Follower {
            scope: Scope::REPLICAS,
            ..on
        };
        if label_value(node) {
            tasks.push(tokio::spawn(follow(
                replicas(),
                Watch::labels(format!("{LONGHORN_NODE_LABEL}={node}")),
                on.clone(),
            )));
        }
        let mut every: Vec<&str> = volumes.iter().map(String::as_str).collect();
        every.sort();
        every.dedup();
        let names: Vec<&str> = every.iter().copied().filter(|v| label_value(v)).collect();
        if !names.is_empty() {
            tasks.push(tokio::spawn(follow(
                replicas(),
                Watch::labels(format!("{LONGHORN_VOLUME_LABEL} in ({})", names.join(","))),
                on.clone(),
            )));
        }
        // The volumes themselves: Longhorn's volume controller writes a volume's robustness
        // after its replica's change, a moment later, and a look judges both. A field
        // selector names one object, so one watch per volume; past a handful, or for a name
        // a selector cannot carry, one watch on every volume (more wake-ups, none missed).
        let volumes_api =
            || Api::<DynamicObject>::all_with(c.clone(), &longhorn("Volume", "volumes"));
        if every.len() > VOLUME_WATCHES || names.len() < every.len() {
            tasks.push(tokio::spawn(follow(volumes_api(), Watch::every(), on)));
        } else {
            for v in names {
                tasks.push(tokio::spawn(follow(
                    volumes_api(),
                    Watch::fields(format!("metadata.name={v}")),
                    on.clone(),
                )));
            }
        }
        Changes { shared, tasks }
    }
}

/// Whose changes a watch reports, and to whom.
#[derive(Clone)]
struct Follower {
    node: String,
    shared: Arc<Shared>,
    clock: Clock,
    /// What this watch's changes are to.
    scope: Scope,
    /// The client's watch streams: one is held while the watch is open.
    slots: Slots,
}

/// What one watch reports: a change that counts, one that does not, a bookmark, or its end.
enum Signal {
    Change(bool),
    Bookmark,
    End,
}

fn signal<T>(ev: Result<WatchEvent<T>, kube::Error>, counts: impl Fn(&T) -> bool) -> Signal {
    match ev {
        Ok(WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o)) => {
            Signal::Change(counts(&o))
        }
        Ok(WatchEvent::Bookmark(_)) => Signal::Bookmark,
        // 410 and the like: what happened meanwhile is unknown; re-list.
        Ok(WatchEvent::Error(_)) | Err(_) => Signal::End,
    }
}

/// Follow one watch for as long as the step lasts, marking a change on every event that
/// counts and on every gap (a gap may hide a change). A kind the server does not serve (no
/// Longhorn here: 404) ends quietly: nothing of it can change.
async fn follow<K>(api: Api<K>, w: Watch<K>, on: Follower)
where
    K: Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let mut lp = ListParams::default().limit(1);
    let mut wp = WatchParams::default().timeout(WATCH_SECS);
    if let Some(f) = &w.fields {
        lp = lp.fields(f);
        wp = wp.fields(f);
    }
    if let Some(l) = &w.labels {
        lp = lp.labels(l);
        wp = wp.labels(l);
    }
    let Follower {
        node,
        shared,
        clock,
        scope,
        slots,
    } = on;
    let mut opened = false;
    loop {
        // Every stream taken: look on every beat until one frees.
        let Ok(_slot) = slots.0.clone().try_acquire_owned() else {
            if !opened {
                opened = true;
                shared.one_open();
            }
            shared.saw(scope);
            clock.sleep(RETRY).await;
            continue;
        };
        // From now on: the list's version, so the watch replays nothing already there.
        let from = match api.list_metadata(&lp).await {
            Ok(list) => list.metadata.resource_version.unwrap_or_default(),
            Err(kube::Error::Api(s)) if s.code == 404 => return shared.one_open(),
            Err(_) => {
                shared.saw(scope);
                clock.sleep(RETRY).await;
                continue;
            }
        };
        let stream = match w.keep {
            Some(keep) => api.watch(&wp, &from).await.map(|s| {
                let node = node.clone();
                s.map(move |ev| signal(ev, |o| keep(o, &node))).boxed()
            }),
            None => api
                .watch_metadata(&wp, &from)
                .await
                .map(|s| s.map(|ev| signal(ev, |_| true)).boxed()),
        };
        let Ok(mut stream) = stream else {
            shared.saw(scope);
            clock.sleep(RETRY).await;
            continue;
        };
        if !opened {
            opened = true;
            shared.one_open();
        }
        while let Some(sig) = stream.next().await {
            match sig {
                Signal::Change(true) => shared.saw(scope),
                Signal::Change(false) | Signal::Bookmark => {}
                Signal::End => break,
            }
        }
        shared.saw(scope);
    }
}
