//! The controller's HTTP: `/webhook` on `listen` (GitHub delivers there), and `/metrics`,
//! `/healthz`, `/readyz` on `metricsListen`. A webhook is verified before it is parsed,
//! deduplicated, turned into an [`Event`] and queued; the answer goes out at once (GitHub
//! gives up after 10 s), the work happens in the loop.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tokio::sync::watch;

use crate::forge::webhook::{self, PullAction, Refusal, WebhookEvent, MAX_BODY_BYTES};

use super::{lock, Ctx, Event};

pub fn webhook_router(ctx: Arc<Ctx>) -> Router {
    Router::new()
        .route("/webhook", post(receive))
        // A bigger body is refused (413) before it is read whole.
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(ctx)
}

pub fn ops_router(ctx: Arc<Ctx>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(ctx)
}

pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    mut stopped: watch::Receiver<bool>,
) {
    let shutdown = async move {
        let _ = stopped.wait_for(|s| *s).await;
    };
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
    {
        tracing::warn!(error = %e, "an HTTP listener stopped");
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
        _ => StatusCode::BAD_REQUEST,
    };
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

async fn receive(State(ctx): State<Arc<Ctx>>, headers: HeaderMap, body: Bytes) -> Response {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let Some(secret) = &ctx.webhook_secret else {
        return refuse(&ctx, &Refusal::MissingSignature);
    };
    if body.len() > MAX_BODY_BYTES {
        return refuse(&ctx, &Refusal::TooLarge);
    }
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
    let ours = |repo: &str| {
        ctx.github
            .as_ref()
            .is_some_and(|g| g.repo().eq_ignore_ascii_case(repo))
    };
    let queued = match parsed {
        WebhookEvent::Ping => return accepted(ctx, "accepted", "ping"),
        WebhookEvent::Ignored(_) => return accepted(ctx, "ignored", label),
        WebhookEvent::PullRequest(p) if ours(&p.repo) => match p.action {
            PullAction::Updated => Event::PullUpdated {
                number: p.number,
                head_sha: p.head_sha,
            },
            PullAction::Closed => Event::PullClosed { number: p.number },
        },
        WebhookEvent::Push { repo, git_ref, .. } if ours(&repo) => Event::Pushed {
            branch: git_ref.trim_start_matches("refs/heads/").to_string(),
        },
        WebhookEvent::IssueComment(c) if ours(&c.repo) && c.is_pull_request => Event::Comment {
            number: c.number,
            comment_id: c.comment_id,
            created_at: c.created_at,
            author: c.author,
            body: c.body,
        },
        WebhookEvent::IssueComment(_) => return accepted(ctx, "ignored", "issue_comment"),
        WebhookEvent::MergeGroup(g) if ours(&g.repo) => Event::MergeGroup {
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
