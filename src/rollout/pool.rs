//! Workers without batch barriers. The plan's worker batches say the order and the
//! estimate; the engine starts the next worker as soon as starting it breaks no rule —
//! `maxUnavailable`, never two holders of one volume down (both judged live, the same
//! [`rule_verdict`] a single node's start is judged by), holds, the maintenance window —
//! instead of waiting for the slowest node of a batch. A worker that cannot start yet does
//! not hold back the ones behind it. The node running ichor starts last, once every other
//! worker of the stage is done. A pause stops new starts; the nodes under way finish what
//! they started, then the first pause wins, as in a batch.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;

use futures_util::stream::{FuturesUnordered, StreamExt};

use super::{stage_key, window, Flow, Run, Stop, SIBLING_STOPPED, WAIT_EVERY};
use crate::kube::{LiveNode, LiveVolume};
use crate::plan::{StageId, Step};
use crate::releaseset::{Role, Version, VolumeProvider};

/// Why a node may not go down now: the rule that holds it, and the words for it.
pub(super) enum Held {
    /// More workers out than `maxUnavailable`: the pool's normal state while it is full.
    Slots(String),
    /// A volume with another holder out: worth saying even while other workers run.
    Volume(String),
}

impl Held {
    pub(super) fn reason(self) -> String {
        match self {
            Held::Slots(why) | Held::Volume(why) => why,
        }
    }
}

/// Why `node` may not go down now, or `None`: more workers out than `max` (those NotReady
/// or cordoned, by anyone, and those begun in this run, `active`), or a volume with another
/// replica on a node that is out. Judged from live placement, never the plan's: `volumes`
/// holds at least every volume with a replica on `node`, each with all its replicas.
pub(super) fn rule_verdict(
    node: &LiveNode,
    nodes: &[LiveNode],
    volumes: &[LiveVolume],
    active: &BTreeSet<String>,
    max: usize,
) -> Option<Held> {
    Outage::new(nodes, active, max).verdict(node, volumes)
}

/// One look at the Nodes, indexed to judge many workers against it: which nodes are out
/// (NotReady, cordoned, or begun in this run). The pool judges its whole queue on one
/// look; each verdict costs what the worker holds, not the fleet's size.
pub(super) struct Outage<'a> {
    nodes: &'a [LiveNode],
    /// Position in `nodes` by name.
    by_name: HashMap<&'a str, usize>,
    /// Positions of the nodes out, in `nodes` order (the order the wait names them in).
    out: BTreeSet<usize>,
    workers_out: usize,
    max: usize,
}

impl<'a> Outage<'a> {
    pub(super) fn new(nodes: &'a [LiveNode], active: &BTreeSet<String>, max: usize) -> Outage<'a> {
        let by_name = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.as_str(), i))
            .collect();
        let mut o = Outage {
            nodes,
            by_name,
            out: BTreeSet::new(),
            workers_out: 0,
            max,
        };
        for (i, n) in nodes.iter().enumerate() {
            if !n.ready || n.cordoned || active.contains(&n.name) {
                o.mark_out(i);
            }
        }
        o
    }

    fn mark_out(&mut self, i: usize) {
        if self.out.insert(i) && self.nodes[i].role == Role::Worker {
            self.workers_out += 1;
        }
    }

    /// The node of that name, as this look saw it.
    pub(super) fn node(&self, name: &str) -> Option<&'a LiveNode> {
        self.by_name.get(name).map(|&i| &self.nodes[i])
    }

    /// `name` was begun: it counts as out for every verdict after this one.
    pub(super) fn begin(&mut self, name: &str) {
        if let Some(&i) = self.by_name.get(name) {
            self.mark_out(i);
        }
    }

    fn is_out(&self, name: &str) -> bool {
        self.by_name.get(name).is_some_and(|i| self.out.contains(i))
    }

    /// Whether `maxUnavailable` holds `node` back (the first half of [`Outage::verdict`],
    /// which needs no volume read). The node never counts against itself.
    pub(super) fn slots(&self, node: &LiveNode) -> Option<Held> {
        let me = node.name.as_str();
        if node.role != Role::Worker {
            return None;
        }
        let mine =
            usize::from(self.node(me).is_some_and(|n| n.role == Role::Worker) && self.is_out(me));
        if self.workers_out - mine < self.max {
            return None;
        }
        let unavailable: Vec<String> = self
            .out
            .iter()
            .map(|&i| &self.nodes[i])
            .filter(|n| n.role == Role::Worker && n.name != me)
            .map(|n| n.name.clone())
            .collect();
        Some(Held::Slots(format!(
            "{me} waits: {} already unavailable (NotReady, cordoned or upgrading) and maxUnavailable is {}",
            super::step::plural_list("worker", &unavailable),
            self.max,
        )))
    }

    /// Why `node` may not go down now (see [`rule_verdict`]).
    pub(super) fn verdict(&self, node: &LiveNode, volumes: &[LiveVolume]) -> Option<Held> {
        if let Some(held) = self.slots(node) {
            return Some(held);
        }
        let me = node.name.as_str();
        // Never two holders of one volume down: another replica on a node that is out (a
        // peer started a moment ago included, never counted as "elsewhere") holds this node.
        // Every replica counts, a failed one on a node that is down included: that node holds
        // the volume until it is back and the replica reused.
        let exposed: Vec<String> = volumes
            .iter()
            .filter(|v| !v.single_replica && v.holders.iter().any(|h| h == me))
            .filter_map(|v| {
                let out: Vec<&str> = v
                    .holders
                    .iter()
                    .map(String::as_str)
                    .filter(|n| *n != me && self.is_out(n))
                    .collect();
                (!out.is_empty()).then(|| format!("{} (also on {})", v.name, out.join(", ")))
            })
            .collect();
        (!exposed.is_empty()).then(|| {
            Held::Volume(format!(
                "{me} waits: {} would have a second replica on a node that is down, cordoned or upgrading",
                super::step::plural_list("volume", &exposed)
            ))
        })
    }
}

/// What the pool runs for a node: its step, or its install ahead of its turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Work {
    Step,
    Install,
}

/// What one unit of work ended in: the step's flow, or whether an install ahead applies.
type Done<'s> = (&'s str, Work, Flow<bool>);
type NodeRun<'s> = Pin<Box<dyn Future<Output = Done<'s>> + Send + 's>>;

/// `look` awaited while the work under way keeps running (what ends meanwhile goes to
/// `finished`). A node's future holds locks (the record's, the active set's) and requests
/// in flight across its awaits; left unpolled while the pool awaits one of those locks, it
/// would hold them forever.
async fn alongside<'s, T>(
    look: impl Future<Output = T>,
    running: &mut FuturesUnordered<NodeRun<'s>>,
    finished: &mut Vec<Done<'s>>,
) -> T {
    tokio::pin!(look);
    loop {
        tokio::select! {
            r = &mut look => return r,
            Some(done) = running.next(), if !running.is_empty() => finished.push(done),
        }
    }
}

impl<'r, 'a> Run<'r, 'a> {
    /// The workers of `steps` (the stage's worker batches, in plan order), each driven by
    /// `f` (given the Node as the pool's look saw it, a moment before), started as slots
    /// free. `gates` counts the disruptive units for the `between`
    /// health gate, which follows each worker.
    pub(super) async fn pool<'s, F, Fut>(
        &'s self,
        stage: StageId,
        steps: &[&'s Step],
        f: F,
        gates: &'s tokio::sync::Mutex<usize>,
        total: usize,
    ) -> Flow<()>
    where
        F: Fn(&'s str, Option<LiveNode>) -> Fut,
        Fut: Future<Output = Flow<()>> + Send + 's,
    {
        let prefix = format!("{}/", super::step_prefix(stage));
        let mut queue: Vec<&'s str> = steps
            .iter()
            .flat_map(|s| s.nodes.iter().map(String::as_str))
            .collect();
        // Nodes an earlier run began go first: they may be out already. Those asked to
        // upgrade are out whatever the Node shows (a look may catch one up between its
        // install and its reboot).
        let (begun, asked): (BTreeSet<String>, BTreeSet<String>) = {
            let stored = self.stored.lock().await;
            let begun: Vec<(String, bool)> = stored
                .record
                .steps
                .iter()
                .filter(|(_, m)| m.started_at.is_some() && m.finished_at.is_none())
                .filter_map(|(k, m)| {
                    k.strip_prefix(&prefix)
                        .map(|n| (n.to_string(), m.upgrade_requested))
                })
                .collect();
            (
                begun.iter().map(|(n, _)| n.clone()).collect(),
                begun
                    .into_iter()
                    .filter(|(_, a)| *a)
                    .map(|(n, _)| n)
                    .collect(),
            )
        };
        queue.sort_by_key(|n| !begun.contains(*n));
        let mut running: FuturesUnordered<NodeRun<'s>> = FuturesUnordered::new();
        // What ended while the pool was looking at who may start, handled next.
        let mut finished: Vec<Done<'s>> = Vec::new();
        let mut first: Option<Stop> = None;
        let mut held_back: Option<Stop> = None;
        // Installs ahead (Talos ≥ 1.13, Talos and one-drain stages): in flight, and done
        // on nodes whose step has not begun. At most one round (`maxUnavailable`) ahead,
        // so a pause leaves few nodes installed but not rebooted.
        let mut installs = matches!(stage, StageId::Talos | StageId::Workers);
        let mut installing: BTreeSet<&'s str> = BTreeSet::new();
        let mut installed: BTreeSet<&'s str> = BTreeSet::new();
        let round = self.engine.policy.max_unavailable.get() as usize;
        // Woken by the clock or by an install ahead ending: no step ended, no slot freed.
        let mut no_slot_freed = false;
        loop {
            let gating = self.gating.load(std::sync::atomic::Ordering::SeqCst) > 0;
            // This run's own steps fill every slot: a look could start nothing, and reads
            // every Node; the next step to end wakes the pool anyway.
            let full = running.len().saturating_sub(installing.len()) >= round;
            let worth_a_look = !(std::mem::take(&mut no_slot_freed) && full);
            if first.is_none() && !queue.is_empty() && !gating && worth_a_look {
                let idle = running.len() == installing.len();
                let look = self.startable(stage, &mut queue, (&begun, &asked), &installing, idle);
                let started = match alongside(look, &mut running, &mut finished).await {
                    Ok(started) => started,
                    Err(Stop::LockLost(h)) => return Err(Stop::LockLost(h)),
                    // A pause request (or a record that cannot be written): nothing new
                    // starts, and the nodes under way finish what they started.
                    Err(stop) => {
                        first.get_or_insert(stop);
                        Vec::new()
                    }
                };
                for (name, _) in &started {
                    installed.remove(name);
                }
                if installs && self.window_open() {
                    let ahead: Vec<&'s str> = queue
                        .iter()
                        .copied()
                        .filter(|n| !installing.contains(n) && !installed.contains(n))
                        .filter(|n| !begun.contains(*n))
                        .take(round.saturating_sub(installing.len() + installed.len()))
                        .collect();
                    for name in ahead {
                        installing.insert(name);
                        running.push(Box::pin(async move {
                            (name, Work::Install, self.install_ahead(stage, name).await)
                        }));
                    }
                }
                for (name, seen) in started {
                    let node = f(name, seen);
                    running.push(Box::pin(async move {
                        let r = node.await;
                        self.active.lock().await.remove(name);
                        let r = match r {
                            // The `between` gate after the node, one gate at a time; no
                            // worker starts while one is open (the pool sees `gating`).
                            Ok(()) => {
                                self.gating
                                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                                let mut done = gates.lock().await;
                                let r = self.health_between(stage, name, &mut done, total).await;
                                self.gating
                                    .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                                r
                            }
                            err => err,
                        };
                        (name, Work::Step, r.map(|()| true))
                    }));
                }
            }
            if running.is_empty() && finished.is_empty() {
                if queue.is_empty() || first.is_some() {
                    break;
                }
                // Nothing may start now (said as the rollout's wait): look again later.
                self.engine.clock.sleep(WAIT_EVERY).await;
                continue;
            }
            if finished.is_empty() {
                let next = if first.is_none() && !queue.is_empty() {
                    tokio::select! {
                        r = running.next() => r,
                        // Someone else's node may come back, a hold may go: look again.
                        _ = self.engine.clock.sleep(WAIT_EVERY) => {
                            no_slot_freed = true;
                            None
                        }
                    }
                } else {
                    running.next().await
                };
                finished.extend(next);
            }
            // An install ahead ending frees no slot, and the installs ahead stay one round
            // (the next starts when a node's turn takes one off it).
            if !finished.is_empty() && finished.iter().all(|(_, w, _)| *w == Work::Install) {
                no_slot_freed = true;
            }
            for (name, work, r) in std::mem::take(&mut finished) {
                if work == Work::Install {
                    installing.remove(name);
                    match r {
                        Ok(true) => {
                            installed.insert(name);
                        }
                        // Talos ≤ 1.12: its upgrade installs and reboots in one call.
                        Ok(false) => installs = false,
                        Err(_) => {}
                    }
                }
                match r {
                    Ok(_) => {}
                    Err(Stop::LockLost(h)) => return Err(Stop::LockLost(h)),
                    Err(Stop::Pause(p)) => {
                        if p.reason.contains(SIBLING_STOPPED) {
                            held_back.get_or_insert(Stop::Pause(p));
                        } else {
                            if let Ok(mut h) = self.halted.lock() {
                                h.get_or_insert_with(|| {
                                    format!(
                                        "{name} paused: {}",
                                        crate::releaseset::excerpt(&p.reason, 200)
                                    )
                                });
                            }
                            first.get_or_insert(Stop::Pause(p));
                        }
                    }
                }
            }
        }
        if let Ok(mut h) = self.halted.lock() {
            *h = None;
        }
        match first.or(held_back) {
            Some(stop) => Err(self.naming_installed_ahead(stage, stop).await),
            None => Ok(()),
        }
    }

    /// A pause names the nodes of `stage` installed ahead and not rebooted: a reboot of
    /// their own brings them up on the target, undrained.
    pub(super) async fn naming_installed_ahead(&self, stage: StageId, stop: Stop) -> Stop {
        let Stop::Pause(mut p) = stop else {
            return stop;
        };
        let left = self.installed_not_rebooted(stage).await;
        if !left.is_empty() {
            p.reason = format!(
                "{}; installed ahead and not rebooted: {} (each boots Talos {} at its next reboot, drained or not)",
                p.reason,
                left.join(", "),
                self.target.talos
            );
        }
        Stop::Pause(p)
    }

    /// Nodes of `stage` the target was installed on ahead of a turn that has not come:
    /// the record keeps them (`installedBoot` on a step not begun), the pause names them.
    pub(super) async fn installed_not_rebooted(&self, stage: StageId) -> Vec<String> {
        let prefix = format!("{}/", super::step_prefix(stage));
        self.stored
            .lock()
            .await
            .record
            .steps
            .iter()
            .filter(|(_, m)| m.installed_boot.is_some() && !m.upgrade_requested)
            .filter_map(|(k, _)| k.strip_prefix(&prefix).map(str::to_string))
            .collect()
    }

    pub(super) fn window_open(&self) -> bool {
        !matches!(
            window::state(&self.engine.policy.maintenance_windows, self.now()),
            window::WindowState::Closed { .. }
        )
    }

    /// The workers of `queue` that may start now, taken out of it in order (and marked
    /// begun in `active`). Judged on one look at the nodes and volumes: a node begun by an
    /// earlier run goes at once (it is out already), a node already on the stage's target
    /// needs no slot, a held node or one that would break a rule waits without holding back
    /// the next, the node running ichor waits until it is the last one. Said as the
    /// rollout's wait when nothing runs and nothing may start.
    async fn startable<'s>(
        &'s self,
        stage: StageId,
        queue: &mut Vec<&'s str>,
        (begun, asked): (&BTreeSet<String>, &BTreeSet<String>),
        busy: &BTreeSet<&'s str>,
        idle: bool,
    ) -> Flow<Vec<(&'s str, Option<LiveNode>)>> {
        let e = self.engine;
        if let Some(why) = e.pause_requested.and_then(|f| f()) {
            return Err(self.pause(stage, queue.first().copied(), why));
        }
        let now = self.now();
        if let window::WindowState::Closed { opens_at } =
            window::state(&e.policy.maintenance_windows, now)
        {
            if idle {
                self.waiting(
                    stage,
                    Some(format!(
                        "{} starts in the next maintenance window, {}",
                        queue.first().copied().unwrap_or("the next worker"),
                        window::describe(opens_at)
                    )),
                )
                .await?;
            }
            return Ok(Vec::new());
        }
        let me = self.plan.ichor_node.as_deref();
        // The look's likely starter is the queue's first worker free to go: its volumes are
        // read beside the Nodes (by label, Longhorn only), not after them, and used if the
        // slots let it go.
        let likely = match e.volumes {
            VolumeProvider::Longhorn => queue
                .iter()
                .copied()
                .find(|n| !busy.contains(n) && !begun.contains(*n) && Some(*n) != me),
            _ => None,
        };
        let likely_volumes = async {
            match likely {
                Some(name) => Box::pin(self.volumes_of(stage, name, true, &[]))
                    .await
                    .map(Some),
                None => Ok(None),
            }
        };
        let (nodes, likely_volumes) = tokio::join!(self.live_nodes(stage), likely_volumes);
        let (nodes, mut likely_volumes) = (nodes?, likely_volumes?);
        let max = e.max_unavailable();
        let mut active = self.active.lock().await;
        let mut outage = Outage::new(&nodes, &active, max);
        // The volume rule reads, for a worker the slots let go, the volumes it holds with
        // every replica of each (Longhorn: a few objects by label); without Longhorn's
        // labels, every volume, once per look.
        let mut every_volume: Option<Vec<LiveVolume>> = None;
        let mut go: Vec<(&'s str, Option<LiveNode>)> = Vec::new();
        // Full slots and the ichor node's turn are the pool's normal state, said only when
        // nothing runs; a hold or a volume holding a node back is said while others run.
        let mut wait: Option<String> = None;
        let mut notable: Option<String> = None;
        let mut keep = Vec::new();
        let last = queue.len() == 1 && busy.is_empty();
        for &name in queue.iter() {
            // Its install ahead is still running: its turn waits for it, the next goes.
            if busy.contains(name) {
                keep.push(name);
                continue;
            }
            let Some(live) = outage.node(name) else {
                // Its own step says it is gone.
                go.push((name, None));
                continue;
            };
            // Begun by an earlier run and out by ichor's own act (its cordon, its upgrade):
            // it goes on at once. Begun but nothing disrupted yet, it is judged as a fresh
            // start is (its slot, its volumes, a hold): the rules may have changed while it
            // was stopped.
            if begun.contains(name) && (asked.contains(name) || self.ours(live)) {
                active.insert(name.to_string());
                outage.begin(name);
                go.push((name, Some(live.clone())));
                continue;
            }
            if self.on_stage_target(stage, live) {
                go.push((name, Some(live.clone())));
                continue;
            }
            if Some(name) == me && !(last && idle) {
                wait.get_or_insert_with(|| {
                    format!("{name} runs ichor: it goes once every other worker is done")
                });
                keep.push(name);
                continue;
            }
            if let Some(reason) = &live.hold {
                notable.get_or_insert_with(|| {
                    format!(
                        "{name} is held ({}={}); remove the annotation to let it go",
                        crate::kube::HOLD,
                        crate::releaseset::excerpt(reason, 120)
                    )
                });
                keep.push(name);
                continue;
            }
            // The volumes are read only for a worker the slots let go.
            let held = match outage.slots(live) {
                Some(held) => Some(held),
                None => {
                    let held_here;
                    let volumes: &[LiveVolume] = match e.volumes {
                        // Boxed: the look is awaited inside the pool's future, which every
                        // node's future is already part of.
                        VolumeProvider::Longhorn => {
                            let read = likely_volumes.take_if(|_| likely == Some(name));
                            held_here = match read {
                                Some(read) => read,
                                None => Box::pin(self.volumes_of(stage, name, true, &[])).await?,
                            };
                            &held_here
                        }
                        _ => {
                            if every_volume.is_none() {
                                every_volume = Some(Box::pin(self.volumes(stage)).await?);
                            }
                            every_volume.as_deref().unwrap_or_default()
                        }
                    };
                    outage.verdict(live, volumes)
                }
            };
            match held {
                Some(Held::Slots(why)) => {
                    wait.get_or_insert(why);
                    keep.push(name);
                }
                Some(Held::Volume(why)) => {
                    notable.get_or_insert(why);
                    keep.push(name);
                }
                None => {
                    active.insert(name.to_string());
                    outage.begin(name);
                    go.push((name, Some(live.clone())));
                }
            }
        }
        drop(active);
        *queue = keep;
        if !go.is_empty() {
            self.waiting(stage, None).await?;
        } else if notable.is_some() {
            self.waiting(stage, notable).await?;
        } else if idle {
            self.waiting(stage, wait).await?;
        }
        if !go.is_empty() {
            tracing::debug!(
                cluster = %e.cluster,
                stage = stage_key(stage),
                "starting {}",
                go.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
            );
        }
        Ok(go)
    }

    /// The node already runs what the stage moves it to, Ready and not cordoned: its step
    /// only confirms it and takes no slot.
    fn on_stage_target(&self, stage: StageId, n: &LiveNode) -> bool {
        let talos = || {
            n.talos
                .as_deref()
                .and_then(|t| Version::parse(t).ok())
                .as_ref()
                == Some(&self.target.talos)
        };
        let kubelet = || n.kubelet == self.target.kubernetes.tag();
        n.ready
            && !n.cordoned
            && match stage {
                StageId::Talos => talos(),
                StageId::Kubelet => kubelet(),
                // The string compare first: most nodes waiting are not on it yet.
                StageId::Workers => kubelet() && talos(),
                _ => false,
            }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    /// The hang the 60-node bench found: a worker's future took a lock, the pool then
    /// waited for that lock without polling the worker, and nothing moved again.
    #[tokio::test]
    async fn the_pool_keeps_polling_the_workers_while_it_waits_for_a_lock() {
        let lock = tokio::sync::Mutex::new(());
        let (answer, answered) = tokio::sync::oneshot::channel::<()>();
        let mut running: FuturesUnordered<NodeRun<'_>> = FuturesUnordered::new();
        let lock_ref = &lock;
        running.push(Box::pin(async move {
            // Holds the lock across a request, as a node's step holds the active set.
            let _held = lock_ref.lock().await;
            let _ = answered.await;
            ("w-1", Work::Step, Ok(true))
        }));
        assert!(
            running.next().now_or_never().is_none(),
            "the worker holds the lock"
        );
        answer.send(()).ok();

        let look = || async { *lock.lock().await };
        // Awaited alone, the pool's look would wait on the worker forever.
        assert!(look().now_or_never().is_none());
        let mut finished = Vec::new();
        let looked = alongside(look(), &mut running, &mut finished).now_or_never();
        assert_eq!(looked, Some(()));
        assert_eq!(finished.len(), 1);
        assert_eq!((finished[0].0, finished[0].1), ("w-1", Work::Step));
    }

    fn node(name: &str, role: Role, ready: bool, cordoned: bool) -> LiveNode {
        LiveNode {
            name: name.into(),
            role,
            internal_ip: None,
            kubelet: "v1.33.5".into(),
            talos: Some("v1.12.6".into()),
            boot_id: String::new(),
            ready,
            cordoned,
            cordoned_by_ichor: false,
            cordoned_for: None,
            hold: None,
        }
    }

    fn volume(name: &str, holders: &[&str], single: bool) -> LiveVolume {
        LiveVolume {
            name: name.into(),
            provider: "longhorn",
            robustness: Some("healthy".into()),
            state: Some("attached".into()),
            nodes: holders.iter().map(|h| h.to_string()).collect(),
            holders: holders.iter().map(|h| h.to_string()).collect(),
            single_replica: single,
        }
    }

    /// One look judges the whole queue: each verdict, with the nodes begun before it on
    /// that look, is the one a fresh look with those nodes active gives (the rule judged
    /// alone), whatever the order the queue comes in.
    #[test]
    fn one_look_judges_each_worker_as_the_rule_alone_would() {
        let nodes = vec![
            node("cp-1", Role::Controlplane, true, false),
            node("w-1", Role::Worker, true, false),
            node("w-2", Role::Worker, false, false),
            node("w-3", Role::Worker, true, false),
            node("w-4", Role::Worker, true, true),
            node("w-5", Role::Worker, true, false),
            node("w-6", Role::Worker, true, false),
            node("w-7", Role::Worker, true, false),
        ];
        let volumes = vec![
            volume("pvc-a", &["w-1", "w-3", "w-5"], false),
            volume("pvc-b", &["w-2", "w-6"], false),
            volume("pvc-c", &["w-7", "w-7"], false),
            volume("pvc-d", &["w-5"], true),
            volume("pvc-e", &["w-6", "cp-1", "gone"], false),
        ];
        let orders = [
            ["w-1", "w-3", "w-5", "w-6", "w-7", "w-4", "cp-1"],
            ["cp-1", "w-7", "w-6", "w-5", "w-4", "w-3", "w-1"],
            ["w-4", "w-6", "w-1", "cp-1", "w-7", "w-3", "w-5"],
        ];
        let mut judged = 0;
        for max in 1..=5 {
            for order in &orders {
                let mut active = BTreeSet::new();
                let mut look = Outage::new(&nodes, &active, max);
                for name in order {
                    let Some(n) = look.node(name) else {
                        panic!("{name} is in the look")
                    };
                    let once = look.verdict(n, &volumes).map(Held::reason);
                    let alone = Outage::new(&nodes, &active, max)
                        .verdict(n, &volumes)
                        .map(Held::reason);
                    assert_eq!(once, alone, "{name} with {active:?} active, max {max}");
                    if once.is_none() {
                        active.insert(name.to_string());
                        look.begin(name);
                    }
                    judged += usize::from(once.is_some());
                }
            }
        }
        assert!(judged > 0, "some worker was held");
    }

    /// The rule's words: the workers out by name (never the node itself), and each volume
    /// with the other holders that are out.
    #[test]
    fn a_held_worker_is_told_which_rule_holds_it() {
        let nodes = vec![
            node("w-1", Role::Worker, true, false),
            node("w-2", Role::Worker, false, false),
            node("w-3", Role::Worker, true, true),
            node("w-4", Role::Worker, true, false),
        ];
        let volumes = vec![
            volume("pvc-a", &["w-1", "w-2"], false),
            volume("pvc-b", &["w-4", "w-1"], false),
        ];
        let active = BTreeSet::from(["w-4".to_string()]);
        let held = |max| rule_verdict(&nodes[0], &nodes, &volumes, &active, max).map(Held::reason);
        assert_eq!(
            held(3).as_deref(),
            Some("w-1 waits: workers w-2, w-3, w-4 already unavailable (NotReady, cordoned or upgrading) and maxUnavailable is 3")
        );
        assert_eq!(
            held(4).as_deref(),
            Some("w-1 waits: volumes pvc-a (also on w-2), pvc-b (also on w-4) would have a second replica on a node that is down, cordoned or upgrading")
        );
        // Itself out (cordoned by someone), it does not count against itself.
        assert!(rule_verdict(&nodes[2], &nodes, &[], &active, 3).is_none());
    }
}
