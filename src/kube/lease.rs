//! A Lease as a lock: one holder at a time, renewed, and lost the moment someone else holds
//! it. Every write carries the resourceVersion it read, so two writers racing end with one
//! winner and one 409 — which is re-read, never overwritten. Time comes from ichor's clock.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use serde_json::json;

use super::{KubeClient, KubeError};
use crate::clock::Timestamp;

/// What an attempt to take or keep the lock found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockState {
    /// We hold it (now renewed until `now + duration`).
    Held,
    /// Someone else holds it, and has renewed within its duration.
    HeldBy { holder: String },
}

/// Leases as observed: `namespace/name` → (what the record said, when it was first seen
/// saying it). client-go's leader election judges expiry the same way: from the local time
/// the record last changed (`observedTime`), so clocks that disagree cannot make a live
/// holder look expired (k8s.io/client-go tools/leaderelection/leaderelection.go at
/// v0.33.0, `tryAcquireOrRenew`).
pub(crate) type Observed =
    std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, (String, Timestamp)>>>;

/// How many times a conflicting write is re-read and retried before giving up.
const CONFLICT_RETRIES: usize = 3;

fn micro_time(t: Timestamp) -> serde_json::Value {
    // MicroTime on the wire: RFC 3339 with microseconds.
    let s = t.rfc3339();
    let micros = format!("{:06}", (t.as_millis() % 1000) * 1000);
    json!(s.replacen('Z', &format!(".{micros}Z"), 1))
}

fn renewed_at(lease: &Lease) -> Option<Timestamp> {
    let spec = lease.spec.as_ref()?;
    let t = spec.renew_time.as_ref().or(spec.acquire_time.as_ref())?;
    let text = serde_json::to_value(t).ok()?;
    parse_micro_time(text.as_str()?)
}

/// `2026-01-01T00:00:40.123456Z` (or without the fraction) to a timestamp, to the second.
fn parse_micro_time(text: &str) -> Option<Timestamp> {
    let whole = text.get(..19)?;
    let rest = &text[19..];
    let fraction_ok = rest == "Z"
        || rest
            .strip_prefix('.')
            .and_then(|r| r.strip_suffix('Z'))
            .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()));
    if !fraction_ok {
        return None;
    }
    Timestamp::parse_rfc3339(&format!("{whole}Z"))
}

/// Each lease as this client last wrote it (`namespace/name` → the stored Lease): the
/// holder's next renewal writes over exactly that version.
pub(crate) type Written =
    std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, Lease>>>;

impl KubeClient {
    /// The lease `key` as this client last wrote it for `holder`, if it did.
    fn written_lease(&self, key: &str, holder: &str) -> Option<Lease> {
        let m = self.written.lock().ok()?;
        m.get(key)
            .filter(|l| {
                l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(holder)
                    && l.metadata.resource_version.is_some()
            })
            .cloned()
    }

    fn remember_lease(&self, key: &str, lease: Option<Lease>) {
        if let Ok(mut m) = self.written.lock() {
            match lease {
                Some(l) => m.insert(key.to_string(), l),
                None => m.remove(key),
            };
        }
    }

    /// When `said` was first seen for the lease `key` (now, when it is new).
    fn observed(&self, key: &str, said: String, now: Timestamp) -> Timestamp {
        let Ok(mut m) = self.leases.lock() else {
            return now;
        };
        match m.get(key) {
            Some((was, since)) if *was == said => *since,
            _ => {
                m.insert(key.to_string(), (said, now));
                now
            }
        }
    }

    /// Take the lock `namespace/name` for `holder`, or renew it if `holder` has it. A lease
    /// whose holder has not renewed within its duration of this client seeing it so (the
    /// holder's own clock is never trusted) is free to take.
    pub async fn acquire_lease(
        &self,
        namespace: &str,
        name: &str,
        holder: &str,
        duration: Duration,
        now: Timestamp,
    ) -> Result<LockState, KubeError> {
        let api = Api::<Lease>::namespaced(self.client.clone(), namespace);
        let what = || format!("lease {namespace}/{name}");
        let key = format!("{namespace}/{name}");
        let body =
            |rv: Option<String>, acquire: Option<serde_json::Value>| -> Result<Lease, KubeError> {
                let mut spec = json!({
                    "holderIdentity": holder,
                    "leaseDurationSeconds": duration.as_secs().clamp(1, i32::MAX as u64),
                    "renewTime": micro_time(now),
                });
                spec["acquireTime"] = acquire.unwrap_or_else(|| micro_time(now));
                let mut meta = json!({"name": name, "namespace": namespace});
                if let Some(rv) = rv {
                    meta["resourceVersion"] = json!(rv);
                }
                serde_json::from_value(json!({"metadata": meta, "spec": spec})).map_err(|e| {
                    KubeError::Reply {
                        what: what(),
                        message: e.to_string(),
                    }
                })
            };
        // The holder's fast path, as client-go's leader election takes it
        // (k8s.io/client-go tools/leaderelection/leaderelection.go at v0.33.0,
        // `tryAcquireOrRenew`): renew over the lease as this client last wrote it, in one
        // write. It carries that write's resourceVersion, so it succeeds only if nobody wrote
        // since, when the lease is still ours; else 409, and the lease is read and judged.
        if let Some(last) = self.written_lease(&key, holder) {
            let acquire = last
                .spec
                .as_ref()
                .and_then(|s| s.acquire_time.as_ref())
                .and_then(|t| serde_json::to_value(t).ok());
            match api
                .replace(
                    name,
                    &PostParams::default(),
                    &body(last.metadata.resource_version.clone(), acquire)?,
                )
                .await
            {
                Ok(l) => {
                    self.remember_lease(&key, Some(l));
                    return Ok(LockState::Held);
                }
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                    self.remember_lease(&key, None);
                }
                Err(e) => return Err(KubeError::from_kube(what(), e)),
            }
        }
        for _ in 0..CONFLICT_RETRIES {
            let current = api
                .get_opt(name)
                .await
                .map_err(|e| KubeError::from_kube(what(), e))?;
            let result = match &current {
                None => api.create(&PostParams::default(), &body(None, None)?).await,
                Some(l) => {
                    let spec = l.spec.clone().unwrap_or_default();
                    let theirs = spec
                        .holder_identity
                        .clone()
                        .filter(|h| !h.is_empty() && h != holder);
                    let d =
                        Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64);
                    // What the record says, down to its version: any write by the holder
                    // (a renewal) makes it new.
                    let said = format!(
                        "{:?}|{:?}|{:?}|{:?}",
                        spec.holder_identity,
                        renewed_at(l),
                        spec.lease_duration_seconds,
                        l.metadata.resource_version
                    );
                    let seen_since = self.observed(&format!("{namespace}/{name}"), said, now);
                    let expired = seen_since.plus(d) < now;
                    if let (Some(other), false) = (&theirs, expired) {
                        return Ok(LockState::HeldBy {
                            holder: other.clone(),
                        });
                    }
                    // Ours to renew (keep when we first took it), or free to take.
                    let acquire = if theirs.is_none() {
                        spec.acquire_time
                            .as_ref()
                            .and_then(|t| serde_json::to_value(t).ok())
                    } else {
                        None
                    };
                    api.replace(
                        name,
                        &PostParams::default(),
                        &body(l.metadata.resource_version.clone(), acquire)?,
                    )
                    .await
                }
            };
            match result {
                Ok(l) => {
                    self.remember_lease(&key, Some(l));
                    return Ok(LockState::Held);
                }
                // Someone wrote in between: read again and decide again.
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => return Err(KubeError::from_kube(what(), e)),
            }
        }
        // Still racing after several rounds: whoever wrote last holds it — which may be
        // this holder itself, renewing from two places at once (a batch's nodes).
        let last = self
            .lease_holder(namespace, name)
            .await?
            .map_or_else(|| "unknown".to_string(), |h| h.holder);
        if last == holder {
            return Ok(LockState::Held);
        }
        Ok(LockState::HeldBy { holder: last })
    }

    /// Give the lock up if `holder` has it (a lost lock is left alone).
    pub async fn release_lease(
        &self,
        namespace: &str,
        name: &str,
        holder: &str,
    ) -> Result<(), KubeError> {
        let api = Api::<Lease>::namespaced(self.client.clone(), namespace);
        let what = format!("lease {namespace}/{name}");
        let Some(mut l) = api
            .get_opt(name)
            .await
            .map_err(|e| KubeError::from_kube(what.clone(), e))?
        else {
            return Ok(());
        };
        self.remember_lease(&format!("{namespace}/{name}"), None);
        let spec = l.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(holder) {
            return Ok(());
        }
        spec.holder_identity = None;
        match api.replace(name, &PostParams::default(), &l).await {
            Ok(_) => Ok(()),
            // Taken over meanwhile: it is not ours to release any more.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(KubeError::from_kube(what, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micro_times_round_trip_to_the_second() {
        let t = Timestamp(1_767_225_640_250);
        let v = micro_time(t);
        assert_eq!(v, json!("2026-01-01T00:00:40.250000Z"));
        assert_eq!(
            parse_micro_time(v.as_str().unwrap()),
            Some(Timestamp(1_767_225_640_000))
        );
        assert_eq!(
            parse_micro_time("2026-01-01T00:00:40Z"),
            Some(Timestamp(1_767_225_640_000))
        );
        assert_eq!(parse_micro_time("2026-01-01T00:00:40+01:00"), None);
        assert_eq!(parse_micro_time("garbage"), None);
    }
}
