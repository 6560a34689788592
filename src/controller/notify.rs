//! Notifications from `ichor run`: people are told when a rollout needs them, not only the
//! PR. Two forms, configured in the controller's config (`notifications:`):
//!
//! - `webhook`: a generic JSON event document (cluster, commit, PR, stage, node, cause,
//!   the command that resumes a pause, ETA), POSTed as `application/json`;
//! - `slack`: a Slack incoming-webhook message, `{"text": "…"}` (Mattermost and Discord's
//!   Slack-compatible endpoint accept the same).
//!
//! Events: rollout started, paused, resumed, completed, failed, a health check failing and
//! recovered.
//! Each is sent once, retried with backoff on ichor's clock, from a task of its own: the
//! rollout never waits for it. At most [`MAX_PENDING`] are under way; past that an event is
//! dropped and counted. Every outcome is counted in `ichor_notifications_total{kind,result}`.
//!
//! The URLs are secrets (a Slack webhook URL is its own credential): read from a file or
//! the environment, never from the repository, never logged, never in a body.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use serde::{Deserialize, Serialize};

use crate::controller::Ctx;
use crate::rollout::{Lifecycle, Progress};
use crate::secret::Secret;

/// Events under way (sending or waiting to retry) at most; more are dropped and counted.
pub const MAX_PENDING: usize = 64;
/// Tries per event (the first and three retries, 1 s, 2 s and 4 s apart).
pub const TRIES: u32 = 4;
/// One try's deadline.
const TRY_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest cause carried (a pause reason can be long; a chat message should not be).
const MAX_CAUSE: usize = 1000;

static PENDING: AtomicUsize = AtomicUsize::new(0);

const METRIC: &str = "ichor_notifications_total";
const HELP: &str = "Notifications by kind (webhook, slack) and result (sent, failed, dropped).";

/// `notifications:` of the controller's config.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NotificationsConfig {
    #[serde(default)]
    pub webhook: Option<Destination>,
    #[serde(default)]
    pub slack: Option<Destination>,
}

/// Where a notification's URL comes from: a file or an environment variable.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Destination {
    pub url_file: Option<PathBuf>,
    pub url_env: Option<String>,
    /// A file holding the key each body is signed with (HMAC-SHA256, the
    /// `X-Signature: sha256=<hex>` header, as Flux's `generic-hmac` provider sends it), so
    /// a receiver can tell ichor's events from anyone's who learnt the URL.
    #[serde(default)]
    pub signing_key_file: Option<PathBuf>,
}

impl NotificationsConfig {
    /// The files holding the URLs, for the config's warnings (a URL file anyone can read).
    pub fn secret_files(&self) -> Vec<(&'static str, &std::path::Path)> {
        let mut out = Vec::new();
        if let Some(f) = self.webhook.as_ref().and_then(|d| d.url_file.as_deref()) {
            out.push(("notifications.webhook.urlFile", f));
        }
        if let Some(f) = self.slack.as_ref().and_then(|d| d.url_file.as_deref()) {
            out.push(("notifications.slack.urlFile", f));
        }
        if let Some(f) = self
            .webhook
            .as_ref()
            .and_then(|d| d.signing_key_file.as_deref())
        {
            out.push(("notifications.webhook.signingKeyFile", f));
        }
        out
    }

    /// Each destination names exactly one source for its URL.
    pub fn validate(&self) -> Result<(), String> {
        for (key, d) in [("webhook", &self.webhook), ("slack", &self.slack)] {
            if let Some(d) = d {
                if d.url_file.is_some() == d.url_env.is_some() {
                    return Err(format!(
                        "notifications.{key}: give exactly one of urlFile or urlEnv (the URL is a secret: never in this file)"
                    ));
                }
            }
        }
        Ok(())
    }
}

impl Destination {
    fn url(&self) -> Result<Secret, String> {
        match (&self.url_file, &self.url_env) {
            (Some(f), _) => Secret::from_file(f).map_err(|e| e.to_string()),
            (None, Some(e)) => Secret::from_env(e).map_err(|e| e.to_string()),
            (None, None) => Err("neither urlFile nor urlEnv is set".into()),
        }
    }
}

/// The event document of the generic webhook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// The same for every try of one event, different for every event: a receiver drops
    /// a repeat by it (the SHA-256 of the rest of the document, 32 hex digits).
    #[serde(default)]
    pub id: String,
    /// `rollout.started`, `rollout.paused`, `rollout.resumed`, `rollout.completed`,
    /// `rollout.failed`, `healthcheck.failing`.
    pub event: String,
    pub cluster: String,
    pub commit: String,
    pub pr: Option<u64>,
    pub stage: Option<String>,
    pub node: Option<String>,
    /// Why: the pause's root cause, the failure, the failing check and its value.
    pub cause: Option<String>,
    /// What resumes a pause.
    pub resume: Option<String>,
    /// When the rollout is expected to end (started), RFC 3339.
    pub eta: Option<String>,
    pub at: String,
}

impl Event {
    /// The event with its id set from its content.
    fn with_id(mut self) -> Self {
        use sha2::Digest;
        self.id = String::new();
        let doc = serde_json::to_vec(&self).unwrap_or_default();
        let digest = sha2::Sha256::digest(&doc);
        self.id = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
        self
    }

    /// The Slack-compatible message, escaped as Slack's `mrkdwn` asks (`&`, `<`, `>`), so
    /// a cause quoting an object's status cannot ping `<!channel>` or hide a link.
    pub fn text(&self) -> String {
        self.plain_text()
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    }

    fn plain_text(&self) -> String {
        let commit = self.commit.get(..12).unwrap_or(&self.commit);
        let pr = self.pr.map(|n| format!(" (PR #{n})")).unwrap_or_default();
        let at = match (&self.stage, &self.node) {
            (Some(s), Some(n)) => format!(" in {s} at {n}"),
            (Some(s), None) => format!(" in {s}"),
            _ => String::new(),
        };
        let what = match self.event.as_str() {
            "rollout.started" => "rollout started",
            "rollout.paused" => "rollout paused",
            "rollout.resumed" => "rollout resumed",
            "rollout.completed" => "rollout completed",
            "rollout.failed" => "rollout failed",
            "healthcheck.failing" => "health check failing",
            "healthcheck.recovered" => "health check recovered",
            other => other,
        };
        let mut out = format!("ichor: {}: {what}{at}, {commit}{pr}", self.cluster);
        if let Some(c) = &self.cause {
            out.push_str(&format!(": {c}"));
        }
        if let Some(eta) = &self.eta {
            out.push_str(&format!(" (expected to end by {eta})"));
        }
        if let Some(r) = &self.resume {
            out.push_str(&format!(". To resume: {r}"));
        }
        out
    }
}

/// What the controller says resumes a paused rollout.
pub const RESUME: &str =
    "fix the cause, then comment `/ichor retry` on the PR (or run `ichor rollout --resume`)";

/// The event for a line of progress, when it is one people are told of.
pub fn event_of(
    p: &Progress,
    cluster: &str,
    commit: &str,
    pr: Option<u64>,
    now: crate::clock::Timestamp,
) -> Option<Event> {
    let base = |event: &str| Event {
        id: String::new(),
        event: event.into(),
        cluster: cluster.into(),
        commit: commit.into(),
        pr,
        stage: None,
        node: None,
        cause: None,
        resume: None,
        eta: None,
        at: now.rfc3339(),
    };
    Some(
        match p {
            Progress::Event(Lifecycle::Started { estimate_secs }) => Event {
                eta: Some(now.plus(Duration::from_secs(*estimate_secs)).rfc3339()),
                ..base("rollout.started")
            },
            Progress::Event(Lifecycle::Resumed) => base("rollout.resumed"),
            Progress::Event(Lifecycle::Completed) => base("rollout.completed"),
            Progress::Event(Lifecycle::Paused(pause)) => Event {
                stage: Some(pause.stage.clone()),
                node: pause.node.clone(),
                cause: Some(crate::releaseset::excerpt(&pause.reason, MAX_CAUSE)),
                resume: Some(RESUME.into()),
                ..base("rollout.paused")
            },
            Progress::HealthCheckRecovered { name, value } => Event {
                cause: Some(crate::releaseset::excerpt(
                    &format!("health check `{name}`: {value}"),
                    MAX_CAUSE,
                )),
                ..base("healthcheck.recovered")
            },
            Progress::HealthCheckFailing { name, value } => Event {
                cause: Some(crate::releaseset::excerpt(
                    &format!("health check `{name}`: {value}"),
                    MAX_CAUSE,
                )),
                ..base("healthcheck.failing")
            },
            _ => return None,
        }
        .with_id(),
    )
}

/// The event of a rollout that failed (an error, not a pause).
pub fn failed(
    cluster: &str,
    commit: &str,
    pr: Option<u64>,
    why: &str,
    now: crate::clock::Timestamp,
) -> Event {
    Event {
        id: String::new(),
        event: "rollout.failed".into(),
        cluster: cluster.into(),
        commit: commit.into(),
        pr,
        stage: None,
        node: None,
        cause: Some(crate::releaseset::excerpt(why, MAX_CAUSE)),
        resume: None,
        eta: None,
        at: now.rfc3339(),
    }
    .with_id()
}

/// Send `event` to every destination the controller's config names.
pub fn send(ctx: &Arc<Ctx>, event: Event) {
    if let Some(cfg) = &ctx.cfg.notifications {
        send_with(cfg, &ctx.metrics, &ctx.clock, event);
    }
}

/// Send `event` to every destination of `cfg`, each from its own task, counting outcomes
/// in `metrics` and waiting between tries on `clock`.
pub fn send_with(
    cfg: &NotificationsConfig,
    metrics: &Arc<crate::controller::metrics::Metrics>,
    clock: &crate::clock::Clock,
    event: Event,
) {
    for (kind, dest) in [
        ("webhook", cfg.webhook.clone()),
        ("slack", cfg.slack.clone()),
    ] {
        let Some(dest) = dest else { continue };
        if PENDING.fetch_add(1, Ordering::AcqRel) >= MAX_PENDING {
            PENDING.fetch_sub(1, Ordering::AcqRel);
            metrics.inc(METRIC, HELP, &[("kind", kind), ("result", "dropped")]);
            tracing::warn!(kind, event = %event.event, "notification dropped: too many under way");
            continue;
        }
        let metrics = metrics.clone();
        let clock = clock.clone();
        let event = event.clone();
        tokio::spawn(async move {
            let result = deliver(&clock, kind, &dest, &event).await;
            PENDING.fetch_sub(1, Ordering::AcqRel);
            let word = if result.is_ok() { "sent" } else { "failed" };
            metrics.inc(METRIC, HELP, &[("kind", kind), ("result", word)]);
            if let Err(why) = result {
                tracing::warn!(kind, event = %event.event, "notification not delivered: {why}");
            }
        });
    }
}

async fn deliver(
    clock: &crate::clock::Clock,
    kind: &str,
    dest: &Destination,
    event: &Event,
) -> Result<(), String> {
    let url = dest.url()?;
    let body = match kind {
        "slack" => serde_json::json!({ "text": event.text() }).to_string(),
        _ => serde_json::to_string(event).map_err(|e| e.to_string())?,
    };
    let signature = match (&dest.signing_key_file, kind) {
        (Some(f), "webhook") => {
            let key = Secret::from_file(f).map_err(|e| e.to_string())?;
            Some(signature(key.expose().trim().as_bytes(), body.as_bytes())?)
        }
        _ => None,
    };
    let mut wait = Duration::from_secs(1);
    let mut last = String::new();
    for attempt in 1..=TRIES {
        let mut req = hyper::Request::post(url.expose())
            .header("content-type", "application/json")
            .header("user-agent", "ichor");
        if let Some(sig) = &signature {
            req = req.header("x-signature", sig.as_str());
        }
        let req = req
            .body(Body::from(body.clone()))
            // The URL is not said: it is the secret.
            .map_err(|_| "the configured URL is not a valid URL".to_string())?;
        match crate::outbound::call(req, TRY_TIMEOUT, 64 << 10).await {
            Ok(a) if (200..300).contains(&a.status) => return Ok(()),
            // A 4xx other than 429 will not change by retrying.
            Ok(a) if (400..500).contains(&a.status) && a.status != 429 => {
                return Err(format!("the receiver refused it: HTTP {}", a.status))
            }
            Ok(a) => last = format!("HTTP {}", a.status),
            Err(why) => last = why,
        }
        if attempt < TRIES {
            clock.sleep(wait).await;
            wait *= 2;
        }
    }
    Err(format!("{TRIES} tries, the last: {last}"))
}

/// `sha256=<hex>` of HMAC-SHA256 over `body` with `key`.
pub fn signature(key: &[u8], body: &[u8]) -> Result<String, String> {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key)
        .map_err(|_| "the signing key cannot key an HMAC".to_string())?;
    mac.update(body);
    let sum = mac.finalize().into_bytes();
    Ok(format!(
        "sha256={}",
        sum.iter().map(|b| format!("{b:02x}")).collect::<String>()
    ))
}

/// The bearer token for the Prometheus of `cluster`'s health checks, bound to its URL, from
/// the controller's config (`clusters[].prometheus`); unreadable is said here, never the token.
pub fn prometheus_credential(ctx: &Ctx, cluster: &str) -> Option<crate::prometheus::Credential> {
    let p = ctx
        .cfg
        .clusters
        .iter()
        .find(|c| c.name == cluster)?
        .prometheus
        .clone()?;
    let bound = Secret::from_file(&p.token_file)
        .map_err(|e| e.to_string())
        .and_then(|t| crate::prometheus::Credential::new(&p.url, t));
    match bound {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(cluster, "no Prometheus credential: {e}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Timestamp;
    use crate::rollout::record::Pause;

    #[test]
    fn the_config_names_where_each_url_comes_from() {
        let base = "repository:\n  path: /srv/repo\nclusters:\n  - name: homelab\n    prometheus:\n      url: https://prometheus.example:9090\n      tokenFile: /etc/ichor/prom-token\n    act: false\n";
        let ok = format!("{base}notifications:\n  webhook:\n    urlFile: /etc/ichor/hook\n  slack:\n    urlEnv: ICHOR_SLACK_URL\n");
        let c = crate::controller::config::Config::parse("ichor.yaml", &ok).unwrap();
        let n = c.notifications.unwrap();
        assert!(n.webhook.unwrap().url_file.is_some());
        assert_eq!(n.slack.unwrap().url_env.as_deref(), Some("ICHOR_SLACK_URL"));
        assert!(c.clusters[0].prometheus.is_some());
        let both = format!("{base}notifications:\n  webhook:\n    urlFile: /a\n    urlEnv: B\n");
        let e = crate::controller::config::Config::parse("ichor.yaml", &both).unwrap_err();
        assert!(
            e.to_string().contains("exactly one of urlFile or urlEnv"),
            "{e}"
        );
        assert_eq!(e.line, Some(9));
        // A token bound to plain http off loopback is refused where it is configured.
        let http = base.replace("https://prometheus.example", "http://prometheus.example");
        let e = crate::controller::config::Config::parse("ichor.yaml", &http).unwrap_err();
        assert!(
            e.to_string()
                .contains("clusters[0].prometheus.url: plain http"),
            "{e}"
        );
        let inline =
            format!("{base}notifications:\n  slack:\n    url: https://hooks.slack.com/x\n");
        assert!(crate::controller::config::Config::parse("ichor.yaml", &inline).is_err());
    }

    #[test]
    fn events_carry_what_a_person_needs() {
        let now = Timestamp::from_millis(1_780_000_000_000);
        let p = Progress::Event(Lifecycle::Paused(Pause {
            stage: "talos".into(),
            node: Some("w-1".into()),
            reason: "health check `db` (between) has not held".into(),
            since: now.rfc3339(),
        }));
        let e = event_of(&p, "homelab", "0123456789abcdef", Some(7), now).unwrap();
        assert_eq!(e.event, "rollout.paused");
        assert_eq!(e.node.as_deref(), Some("w-1"));
        assert!(e.resume.as_deref().unwrap().contains("/ichor retry"));
        let t = e.text();
        assert!(t.starts_with("ichor: homelab: rollout paused in talos at w-1, 0123456789ab (PR #7): health check `db`"), "{t}");
        let s = event_of(
            &Progress::Event(Lifecycle::Started {
                estimate_secs: 3600,
            }),
            "homelab",
            "c",
            None,
            now,
        )
        .unwrap();
        assert_eq!(s.eta, Some(now.plus(Duration::from_secs(3600)).rfc3339()));
        assert!(event_of(&Progress::Note("x".into()), "h", "c", None, now).is_none());
        // Each event its own id; the same event the same id (every try carries it).
        assert_eq!(e.id.len(), 32);
        assert_ne!(e.id, s.id);
        assert_eq!(
            e.id,
            event_of(&p, "homelab", "0123456789abcdef", Some(7), now)
                .unwrap()
                .id
        );
    }

    #[test]
    fn slack_text_is_escaped_so_a_cause_cannot_ping_or_link() {
        let now = Timestamp::from_millis(1_780_000_000_000);
        let p = Progress::HealthCheckFailing {
            name: "db".into(),
            value: "false for <!channel> & <https://evil.example|docs>".into(),
        };
        let t = event_of(&p, "homelab", "c", None, now).unwrap().text();
        assert!(
            t.ends_with("false for &lt;!channel&gt; &amp; &lt;https://evil.example|docs&gt;"),
            "{t}"
        );
        assert!(!t.contains('<') && !t.contains('>'), "{t}");
    }

    #[test]
    fn the_signature_is_github_and_fluxs_hmac_sha256() {
        // RFC 4231 test case 2.
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?").unwrap(),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
