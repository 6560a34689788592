//! The rollout lock: one Lease per cluster keeps rollouts apart. It is renewed while the
//! stages run and checked again right before every disruptive action; losing it stops every
//! action at once.

use std::time::Duration;

use super::{Flow, Rollout, Run, Stop, LOCK_DURATION, RENEW_DEADLINE};
use crate::gate::live::{lock_name, ICHOR_NAMESPACE};
use crate::kube::{KubeError, LockState};
use crate::plan::StageId;

impl Rollout<'_> {
    /// Take or renew the lock. A renewal that finds it ours is remembered from when it was
    /// sent (the lease runs from then at the latest), one that finds another holder forgets.
    pub(super) async fn acquire(&self) -> Result<LockState, KubeError> {
        let _one = self.renewing.lock().await;
        let sent = self.clock.now();
        let state = self
            .kube
            .acquire_lease(
                ICHOR_NAMESPACE,
                &lock_name(&self.cluster),
                &self.holder,
                LOCK_DURATION,
                sent,
            )
            .await?;
        if let Ok(mut r) = self.renewed.lock() {
            *r = (state == LockState::Held).then_some(sent);
        }
        Ok(state)
    }

    /// The lock was renewed within [`RENEW_DEADLINE`]: no other engine can hold it yet.
    pub(super) fn lease_fresh(&self) -> bool {
        self.renewed
            .lock()
            .ok()
            .and_then(|r| *r)
            .is_some_and(|at| self.clock.now().since(at) < RENEW_DEADLINE)
    }

    /// Renew the lock until someone else is seen holding it; then say who. A renewal that
    /// fails because the API cannot be reached (a single control plane rebooting, a VIP
    /// moving) is not a lost lock: it is retried, backing off, for as long as it takes.
    /// Nothing disruptive happens meanwhile — every disruptive action renews the lock first
    /// ([`Run::check_lock`]) — and once the API answers, a lease nobody took is renewed
    /// (or taken again) and the rollout goes on.
    pub(super) async fn keep_lock(&self) -> String {
        let every = LOCK_DURATION / 4;
        let mut wait = every;
        loop {
            self.clock.sleep(wait).await;
            // Each renewal has its own deadline: one stuck behind a dead connection must not
            // hold the renewal mutex, and every act's renewal with it.
            match super::answered(&self.clock, "renew the rollout lock", self.acquire()).await {
                Ok(LockState::Held) => wait = every,
                Ok(LockState::HeldBy { holder }) => return holder,
                // Asked again every second, as client-go's leader election retries.
                Err(_) => wait = Duration::from_secs(1),
            }
        }
    }

    pub(super) async fn release_lock(&self) {
        // Best effort: an unreleased lock expires after LOCK_DURATION anyway.
        let _ = self
            .kube
            .release_lease(ICHOR_NAMESPACE, &lock_name(&self.cluster), &self.holder)
            .await;
    }
}

impl Run<'_, '_> {
    /// Check the lock right before a disruptive action, so a stolen lock stops it.
    pub(super) async fn check_lock(&self, stage: StageId, node: &str) -> Flow<()> {
        match self
            .kube(stage, Some(node), "renew the rollout lock", || {
                self.engine.acquire()
            })
            .await?
        {
            LockState::Held => Ok(()),
            LockState::HeldBy { holder } => Err(Stop::LockLost(holder)),
        }
    }
}
