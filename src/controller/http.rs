//! The controller's HTTP: `/webhook` on `listen` (GitHub delivers there), and `/metrics`,
//! `/healthz`, `/readyz` on `metricsListen`. A webhook is verified before it is parsed,
//! deduplicated, turned into an [`Event`] and queued; the answer goes out at once (GitHub
//! gives up after 10 s), the work happens in the loop.
//!
//! The webhook port faces the internet, so each listener is HTTP/1.1 only (no HTTP/2
//! cleartext and its hundreds of streams per connection), bounds the connections it serves
//! at once, cuts off a request head that takes longer than [`HEADER_TIMEOUT`] (hyper's
//! `header_read_timeout`, which also bounds how long a kept-alive connection may idle), and
//! buffers at most [`MAX_HEAD_BYTES`] of a head. A webhook body is read within
//! [`BODY_DEADLINE`], at most [`MAX_BODY_BYTES`] of it, and at most [`WEBHOOK_IN_FLIGHT`]
//! bodies at once: what waits for its signature check is bounded by their product. The ops
//! port has its own listener and its own slots, so a flood on the webhook port cannot
//! starve `/healthz`. These are network timeouts on tokio's clock, never the controller's
//! (possibly simulated) one.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use http_body_util::BodyExt;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore, SemaphorePermit};

use crate::forge::webhook::{self, PullAction, Refusal, WebhookEvent, MAX_BODY_BYTES};

use super::{lock, Ctx, Event, Metrics};

/// A client must send a whole request head within this; a kept-alive connection waiting
/// for its next request is closed after it too. GitHub gives up on a delivery after 10 s.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// A webhook body must arrive whole within this of its head: GitHub's own 10 s.
pub const BODY_DEADLINE: Duration = Duration::from_secs(10);
/// Connections the webhook port serves at once; past it a new one is closed at once.
pub const WEBHOOK_CONNECTIONS: usize = 128;
/// Webhook bodies read at once. With [`MAX_BODY_BYTES`] (4 MiB) that is at most 64 MiB
/// buffered before a signature is checked.
pub const WEBHOOK_IN_FLIGHT: usize = 16;
/// Connections the ops port (`/metrics`, `/healthz`, `/readyz`) serves at once: a
/// Prometheus and the kubelet's probes need a few.
pub const OPS_CONNECTIONS: usize = 16;
/// hyper's read buffer per connection (`max_buf_size`), which bounds a request head: a
/// bigger one is answered 431. GitHub's heads are about 2 KiB.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;

/// What the listeners allow. The defaults are the constants above; tests and benches pass
/// shorter timeouts and smaller caps through [`super::start_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub header_timeout: Duration,
    pub body_deadline: Duration,
    pub webhook_connections: usize,
    pub webhook_in_flight: usize,
    pub ops_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_timeout: HEADER_TIMEOUT,
            body_deadline: BODY_DEADLINE,
            webhook_connections: WEBHOOK_CONNECTIONS,
            webhook_in_flight: WEBHOOK_IN_FLIGHT,
            ops_connections: OPS_CONNECTIONS,
        }
    }
}

/// The webhook bodies being read, at most `Limits::webhook_in_flight` at once.
pub struct BodyReads {
    slots: Semaphore,
    reading: Mutex<usize>,
}

impl BodyReads {
    pub fn new(limit: usize) -> Self {
        BodyReads {
            slots: Semaphore::new(limit.max(1)),
            reading: Mutex::new(0),
        }
    }

    /// A slot to read one body in, or `None` when all are taken. Never waits: a waiting
    /// request would hold its connection and buffer for as long.
    fn start<'a>(&'a self, ctx: &'a Ctx) -> Option<Reading<'a>> {
        let permit = self.slots.try_acquire().ok()?;
        self.count(ctx, |n| n + 1);
        Some(Reading {
            _permit: permit,
            reads: self,
            ctx,
        })
    }

    fn count(&self, ctx: &Ctx, f: impl FnOnce(usize) -> usize) {
        let mut n = lock(&self.reading);
        *n = f(*n);
        ctx.metrics.set(
            "ichor_webhook_bodies_reading",
            "Webhook request bodies being read, before their signature is checked.",
            &[],
            *n as f64,
        );
        drop(n);
        // Tests wait on this instead of sleeping.
        ctx.bump();
    }
}

struct Reading<'a> {
    _permit: SemaphorePermit<'a>,
    reads: &'a BodyReads,
    ctx: &'a Ctx,
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        self.reads.count(self.ctx, |n| n.saturating_sub(1));
    }
}

pub fn webhook_router(ctx: Arc<Ctx>) -> Router {
    Router::new()
        .route("/webhook", post(receive))
        .with_state(ctx)
}

pub fn ops_router(ctx: Arc<Ctx>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(ctx)
}

/// One listener's name (a metric label) and bounds.
#[derive(Debug, Clone, Copy)]
pub struct Listener {
    pub name: &'static str,
    pub max_connections: usize,
    pub header_timeout: Duration,
}

async fn stopping(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|s| *s).await;
}

fn connection(metrics: &Metrics, listener: &str, outcome: &str) {
    metrics.inc(
        "ichor_http_connections_total",
        "HTTP connections by listener and how they ended.",
        &[("listener", listener), ("outcome", outcome)],
    );
}

/// Serve `app` over HTTP/1.1 on `listener` until `stopped`, then finish the requests in
/// flight and return.
///
/// Past `max_connections` a new connection is accepted and closed at once rather than
/// left in the kernel's backlog: the client learns at once (GitHub shows a failed
/// delivery, which the reconcile catches up; a probe fails and is retried), it is counted
/// (`outcome="over_cap"`), and a backlog would only hold it past GitHub's 10 s.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    spec: Listener,
    metrics: Arc<Metrics>,
    stopped: watch::Receiver<bool>,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let max = spec
        .max_connections
        .clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
    let slots = Arc::new(Semaphore::new(max));
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(spec.header_timeout)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(true);
    // Warn at most once a minute, with how many since: a flood must not flood the log too.
    let mut over_cap = Quiet::default();
    let mut accept_failed = Quiet::default();
    let mut stop = std::pin::pin!(stopping(stopped.clone()));
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = &mut stop => break,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            // Out of file descriptors and the like: back off rather than spin.
            Err(e) => {
                if let Some(n) = accept_failed.due() {
                    tracing::warn!(listener = spec.name, error = %e, times = n, "cannot accept a connection");
                }
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(50)) => continue,
                    () = &mut stop => break,
                }
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            connection(&metrics, spec.name, "over_cap");
            if let Some(n) = over_cap.due() {
                tracing::warn!(
                    listener = spec.name,
                    max_connections = max,
                    times = n,
                    "too many connections: new ones are closed at once"
                );
            }
            drop(tcp);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let conn = http1.serve_connection(
            TokioIo::new(tcp),
            hyper_util::service::TowerToHyperService::new(app.clone()),
        );
        let (metrics, stopped, name) = (metrics.clone(), stopped.clone(), spec.name);
        tokio::spawn(async move {
            // Declared first, so it is given back after the connection (and its socket) is
            // dropped.
            let _slot = slot;
            let mut conn = std::pin::pin!(conn);
            let ended = tokio::select! {
                r = conn.as_mut() => r,
                () = stopping(stopped) => {
                    // Requests in flight finish (each bounded by the timeouts); an idle
                    // connection closes now.
                    conn.as_mut().graceful_shutdown();
                    conn.as_mut().await
                }
            };
            let outcome = match &ended {
                Ok(()) => "closed",
                Err(e) if e.is_timeout() => "header_timeout",
                Err(e) if e.is_parse_version_h2() => "not_http1",
                Err(e) if e.is_parse() => "bad_request",
                Err(_) => "error",
            };
            // Counted as the connection ends (hyper may have half-closed the socket already,
            // so a client can see the close a moment before the count).
            connection(&metrics, name, outcome);
            if let Err(e) = ended {
                tracing::debug!(listener = name, error = %e, "connection ended");
            }
        });
    }
    // No new client waits in the backlog of a listener that stopped accepting.
    drop(listener);
    // Every connection gives its slot back when it ends.
    let _ = slots
        .acquire_many(u32::try_from(max).unwrap_or(u32::MAX))
        .await;
}

/// Counts an event and says when to log it: the first time, then at most once a minute.
#[derive(Default)]
struct Quiet {
    last: Option<Instant>,
    since: u64,
}

impl Quiet {
    fn due(&mut self) -> Option<u64> {
        self.since += 1;
        let now = Instant::now();
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < Duration::from_secs(60))
        {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.since))
    }
}

async fn metrics(State(ctx): State<Arc<Ctx>>) -> Response {
    (
        [("content-type", "text/plain; version=0.0.4")],
        ctx.metrics.render(),
    )
        .into_response()
}

async fn ready(State(ctx): State<Arc<Ctx>>) -> Response {
    if ctx.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the repository has not been fetched yet\n",
        )
            .into_response()
    }
}

fn refuse(ctx: &Ctx, r: &Refusal) -> Response {
    ctx.metrics.inc(
        "ichor_webhook_deliveries_total",
        "Webhook deliveries, by result and reason.",
        &[("result", "refused"), ("reason", r.label())],
    );
    tracing::warn!(reason = r.label(), "webhook refused: {r}");
    let status = match r {
        Refusal::MissingSignature | Refusal::MalformedSignature | Refusal::BadSignature => {
            StatusCode::UNAUTHORIZED
        }
        Refusal::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        Refusal::UnsupportedContentType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        Refusal::SlowBody => StatusCode::REQUEST_TIMEOUT,
        Refusal::Busy => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::BAD_REQUEST,
    };
    let unread = matches!(
        r,
        Refusal::TooLarge | Refusal::SlowBody | Refusal::Busy | Refusal::UnreadableBody
    );
    if unread {
        // The body was not read to its end: the connection cannot carry another request.
        return (status, [(header::CONNECTION, "close")], format!("{r}\n")).into_response();
    }
    (status, format!("{r}\n")).into_response()
}

fn accepted(ctx: &Ctx, result: &'static str, reason: &str) -> Response {
    ctx.metrics.inc(
        "ichor_webhook_deliveries_total",
        "Webhook deliveries, by result and reason.",
        &[("result", result), ("reason", reason)],
    );
    (StatusCode::ACCEPTED, format!("{result}\n")).into_response()
}

/// A fixed set of event names for metric labels: anything else is `other`, so a sender
/// cannot grow the metric without bound.
fn event_label(event: &str) -> &'static str {
    match event {
        "ping" => "ping",
        "pull_request" => "pull_request",
        "push" => "push",
        "issue_comment" => "issue_comment",
        "merge_group" => "merge_group",
        _ => "other",
    }
}

/// Read a body of at most [`MAX_BODY_BYTES`] within `deadline`. Nothing is reserved on
/// the sender's word (a `Content-Length` may lie): the buffer grows with what arrives.
async fn read_body(body: Body, deadline: Duration) -> Result<Bytes, Refusal> {
    let read = async {
        let mut body = body;
        let mut out: Vec<u8> = Vec::new();
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame.map_err(|_| Refusal::UnreadableBody)?.into_data() else {
                continue;
            };
            let len = out.len().saturating_add(data.len());
            if len > MAX_BODY_BYTES {
                return Err(Refusal::TooLarge);
            }
            if len > out.capacity() {
                // Doubling, but never past the bound.
                let want = out.capacity().saturating_mul(2).clamp(len, MAX_BODY_BYTES);
                out.reserve_exact(want - out.len());
            }
            out.extend_from_slice(&data);
        }
        Ok(Bytes::from(out))
    };
    tokio::time::timeout(deadline, read)
        .await
        .unwrap_or(Err(Refusal::SlowBody))
}

async fn receive(State(ctx): State<Arc<Ctx>>, headers: HeaderMap, body: Body) -> Response {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let Some(secret) = &ctx.webhook_secret else {
        return refuse(&ctx, &Refusal::MissingSignature);
    };
    // A declared length past the bound is refused before a byte of the body is read.
    let declared = header("content-length").and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return refuse(&ctx, &Refusal::TooLarge);
    }
    let Some(_reading) = ctx.body_reads.start(&ctx) else {
        return refuse(&ctx, &Refusal::Busy);
    };
    let body = match read_body(body, ctx.limits.body_deadline).await {
        Ok(b) => b,
        Err(r) => return refuse(&ctx, &r),
    };
    // The signature first: nothing of an unsigned body is read.
    if let Err(r) = webhook::verify(
        secret.expose().as_bytes(),
        &body,
        header("x-hub-signature-256"),
    ) {
        return refuse(&ctx, &r);
    }
    let (event, delivery) =
        match webhook::headers(header("x-github-event"), header("x-github-delivery")) {
            Ok(h) => h,
            Err(r) => return refuse(&ctx, &r),
        };
    if !lock(&ctx.dedupe).first_time(delivery) {
        return accepted(&ctx, "duplicate", event_label(event));
    }
    let answer = take(&ctx, event, header("content-type"), &body);
    // Only a delivery that was taken is remembered: GitHub's "Redeliver" of a refused one
    // carries the same `X-GitHub-Delivery`, and must be read afresh.
    if !answer.status().is_success() {
        lock(&ctx.dedupe).forget(delivery);
    }
    answer
}

/// Read a verified, first-seen delivery and queue what it asks for.
fn take(ctx: &Ctx, event: &str, content_type: Option<&str>, body: &[u8]) -> Response {
    let json = match webhook::payload(content_type, body) {
        Ok(j) => j,
        Err(r) => return refuse(ctx, &r),
    };
    let parsed = match webhook::parse(event, &json) {
        Ok(p) => p,
        Err(r) => return refuse(ctx, &r),
    };
    let label = event_label(event);
    let ours = |repo: &str, id: Option<u64>| {
        ctx.github
            .as_ref()
            .is_some_and(|g| g.is_this_repository(repo, id))
    };
    let queued = match parsed {
        WebhookEvent::Ping => return accepted(ctx, "accepted", "ping"),
        WebhookEvent::Ignored(_) => return accepted(ctx, "ignored", label),
        WebhookEvent::PullRequest(p) if ours(&p.repo, p.repo_id) => match p.action {
            PullAction::Updated => Event::PullUpdated {
                number: p.number,
                head_sha: p.head_sha,
            },
            PullAction::Closed => Event::PullClosed { number: p.number },
        },
        WebhookEvent::Push {
            repo,
            repo_id,
            git_ref,
            ..
        } if ours(&repo, repo_id) => Event::Pushed {
            branch: git_ref.trim_start_matches("refs/heads/").to_string(),
        },
        WebhookEvent::IssueComment(c) if ours(&c.repo, c.repo_id) && c.is_pull_request => {
            Event::Comment {
                number: c.number,
                comment_id: c.comment_id,
                created_at: c.created_at,
                author: c.author,
                body: c.body,
            }
        }
        WebhookEvent::IssueComment(_) => return accepted(ctx, "ignored", "issue_comment"),
        WebhookEvent::MergeGroup(g) if ours(&g.repo, g.repo_id) => Event::MergeGroup {
            head_sha: g.head_sha,
            head_ref: g.head_ref.trim_start_matches("refs/heads/").to_string(),
            base_ref: g.base_ref.trim_start_matches("refs/heads/").to_string(),
        },
        _ => return accepted(ctx, "ignored", "another repository"),
    };
    match ctx.events.try_send(queued) {
        Ok(()) => accepted(ctx, "accepted", label),
        Err(_) => {
            ctx.metrics.inc(
                "ichor_webhook_deliveries_total",
                "Webhook deliveries, by result and reason.",
                &[("result", "refused"), ("reason", "queue_full")],
            );
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "busy; the next reconcile catches up\n",
            )
                .into_response()
        }
    }
}
