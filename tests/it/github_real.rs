//! `ichor run` against GitHub as GitHub really behaves: deliveries lost, late, refused and
//! redelivered, form-encoded hooks, secondary rate limits in each documented shape, merge
//! queues, schema edges. Real sockets throughout: ichor's octocrab client against the
//! GitHub emulator, the emulator's (or the test's) HTTP deliveries to ichor's listener.
//! Each test names the upstream behaviour it stands on; docs/twin.md has the table.

use std::time::Duration;

use ichor::controller::{Event, Running};
use ichor::sim::github::{ContentType, DeliveryOutcome, StatusState, RENOVATE_LOGIN};

use crate::controller::{until, Hub};

type TestResult = Result<(), Box<dyn std::error::Error>>;
type Error = Box<dyn std::error::Error>;

const REPO: &str = "acme/homelab";
const GOOD: &str = "renovate/talos";
const BAD: &str = "renovate/ghcr.io-siderolabs-kubelet-1.x";
const SECRET: &str = "webhook-secret-do-not-print";

fn has(hub: &Hub, sha: &str, state: StatusState) -> bool {
    hub.status(sha, "ichor/gate")
        .is_some_and(|s| s.state == state)
}

/// POST a delivery to ichor's listener, signed with the webhook secret; the status.
async fn deliver(
    running: &Running,
    event: &str,
    id: &str,
    content_type: &str,
    body: &str,
) -> Result<u16, Error> {
    use http_body_util::BodyExt;
    let req = http::Request::post(running.webhook_url().ok_or("no webhook listener")?)
        .header("x-github-event", event)
        .header("x-github-delivery", id)
        .header("content-type", content_type)
        .header(
            "x-hub-signature-256",
            ichor::forge::webhook::sign(SECRET.as_bytes(), body.as_bytes()),
        )
        .body(http_body_util::Full::new(axum::body::Bytes::from(
            body.to_string(),
        )))?;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let resp = client.request(req).await?;
    let status = resp.status().as_u16();
    let _ = resp.into_body().collect().await;
    Ok(status)
}

fn deliveries(running: &Running, result: &str, reason: &str) -> f64 {
    running.ctx.metrics.value(
        "ichor_webhook_deliveries_total",
        &[("result", result), ("reason", reason)],
    )
}

// ----- 1: the head is what the API says -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_head_judged_is_the_apis_when_a_delivery_is_lost_or_late() -> TestResult {
    let hub = Hub::start().await?;
    let running = hub.run("a").await?;
    let pr = hub.open(GOOD).await?;
    until(&hub.s, &running, "the first head's verdict", || {
        has(&hub, &pr.head_sha, StatusState::Success)
    })
    .await?;

    // GitHub loses the `push` and `synchronize` of the next head (it never redelivers
    // on its own: github/docs content/webhooks/using-webhooks/
    // handling-failed-webhook-deliveries.md). The reconcile reads the head from the API.
    hub.gh.drop_next_webhooks(2);
    let second = hub
        .gh
        .push_commit(
            REPO,
            GOOD,
            &[("docs/second.md", "second\n")],
            "docs",
            RENOVATE_LOGIN,
        )
        .await?;
    running.ctx.events.send(Event::Reconcile).await?;
    until(&hub.s, &running, "the lost head's verdict", || {
        has(&hub, &second, StatusState::Success)
    })
    .await?;

    // Deliveries arrive out of order: the third head's are held back and come after the
    // fourth's. The late one (naming an older head) freezes nothing.
    hub.gh.hold_next_webhooks(2);
    let third = hub
        .gh
        .push_commit(
            REPO,
            GOOD,
            &[("docs/third.md", "third\n")],
            "docs",
            RENOVATE_LOGIN,
        )
        .await?;
    let fourth = hub
        .gh
        .push_commit(
            REPO,
            GOOD,
            &[("docs/fourth.md", "fourth\n")],
            "docs",
            RENOVATE_LOGIN,
        )
        .await?;
    until(&hub.s, &running, "the fourth head's verdict", || {
        has(&hub, &fourth, StatusState::Success)
    })
    .await?;
    let late = hub.gh.release_held_webhooks().await;
    assert_eq!(late.len(), 2);
    assert!(late.iter().all(|d| d.status() == Some(202)), "{late:?}");
    // Then the protected branch moves: the head GitHub reports is judged against the new
    // base, however old the last delivery's head was.
    let gates = running.ctx.metrics.total("ichor_gates_total");
    hub.gh
        .push_commit(REPO, "main", &[("docs/main.md", "main\n")], "docs", "mara")
        .await?;
    until(
        &hub.s,
        &running,
        "the head judged against the new base",
        || running.ctx.metrics.total("ichor_gates_total") > gates,
    )
    .await?;
    assert!(has(&hub, &fourth, StatusState::Success));
    assert!(
        hub.status(&third, "ichor/gate").is_none(),
        "the third head was never the PR's head when ichor looked"
    );
    running.shutdown().await;
    Ok(())
}

// ----- 3: redelivery after a refusal -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_delivery_is_taken_when_github_redelivers_it() -> TestResult {
    let hub = Hub::start().await?;
    let running = hub.run("a").await?;
    until(&hub.s, &running, "the first reconcile", || {
        running.ctx.metrics.total("ichor_reconciles_total") >= 1.0
    })
    .await?;
    // The loop is held up and the queue fills: the next delivery is refused with 503.
    // A closed PR takes the state lock first thing, so once the loop has started on one
    // while the test holds the lock, it takes nothing more from the queue until the lock
    // is dropped. An event already in flight may itself wait on the lock: then the lock
    // is let go for a moment and taken again.
    let started = || {
        running
            .ctx
            .metrics
            .value("ichor_events_total", &[("event", "pull_closed")])
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let held = loop {
        let held = running.ctx.state.lock().await;
        let before = started();
        running
            .ctx
            .events
            .try_send(Event::PullClosed { number: 999_999 })
            .map_err(|e| format!("the queue refused the first event: {e}"))?;
        let mut spins = 0;
        while started() <= before && spins < 10_000 {
            tokio::task::yield_now().await;
            spins += 1;
        }
        if started() > before {
            break held;
        }
        drop(held);
        assert!(
            std::time::Instant::now() < deadline,
            "the loop never took the event"
        );
        tokio::task::yield_now().await;
    };
    while running.ctx.events.try_send(Event::Reconcile).is_ok() {}
    let pr = hub.open(GOOD).await?;
    let refused = hub
        .gh
        .deliveries()
        .into_iter()
        .rev()
        .find(|d| d.event == "pull_request")
        .ok_or("no pull_request delivery")?;
    assert_eq!(refused.status(), Some(503));
    drop(held);
    until(&hub.s, &running, "the queue to drain", || {
        running.ctx.events.capacity() == ichor::controller::QUEUE_CAPACITY
    })
    .await?;

    // "Redeliver" sends the same X-GitHub-Delivery again: it is read, not a duplicate.
    let again = hub.gh.redeliver(&refused.id).await?;
    assert_eq!(
        (again.id.as_str(), again.redelivery),
        (refused.id.as_str(), true)
    );
    assert_eq!(again.status(), Some(202));
    assert_eq!(deliveries(&running, "duplicate", "pull_request"), 0.0);
    assert_eq!(deliveries(&running, "accepted", "pull_request"), 1.0);
    // A second redelivery of a delivery that was taken is the duplicate.
    assert_eq!(hub.gh.redeliver(&refused.id).await?.status(), Some(202));
    assert_eq!(deliveries(&running, "duplicate", "pull_request"), 1.0);
    until(&hub.s, &running, "the verdict", || {
        has(&hub, &pr.head_sha, StatusState::Success)
    })
    .await?;
    running.shutdown().await;
    Ok(())
}

// ----- 2: secondary rate limits -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secondary_rate_limit_delays_a_reply_but_never_drops_it() -> TestResult {
    let hub = Hub::start().await?;
    hub.gh.add_collaborator(REPO, "mara", "maintain")?;
    let running = hub.run("a").await?;
    let pr = hub.open(GOOD).await?;
    until(&hub.s, &running, "the verdict", || {
        has(&hub, &pr.head_sha, StatusState::Success)
    })
    .await?;
    // The reply hits a secondary limit as GitHub often sends it: 403, no `retry-after`,
    // requests left in the primary window.
    hub.gh.secondary_rate_limit_shaped(1, 403, None, true);
    hub.gh
        .comment(REPO, pr.number, "/ichor plan", "mara")
        .await?;
    until(&hub.s, &running, "the reply, after the wait", || {
        hub.replies(pr.number, "@mara") >= 1
    })
    .await?;
    assert_eq!(
        hub.gh.faults().secondary_rate_limits,
        0,
        "the limit was met"
    );
    running.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_wait_never_holds_up_the_loop() -> TestResult {
    let hub = Hub::start().await?;
    hub.gh.add_collaborator(REPO, "mara", "maintain")?;
    let running = hub.run("a").await?;
    let pr = hub.open(GOOD).await?;
    until(&hub.s, &running, "the verdict", || {
        has(&hub, &pr.head_sha, StatusState::Success)
    })
    .await?;
    // The next head's status meets a 429 asking for ten minutes.
    hub.gh.secondary_rate_limit_shaped(1, 429, Some(600), true);
    let clock = hub.s.twin.talos.clock().clone();
    let t0 = clock.now();
    let next = hub
        .gh
        .push_commit(
            REPO,
            GOOD,
            &[("docs/next.md", "next\n")],
            "docs",
            RENOVATE_LOGIN,
        )
        .await?;
    hub.gh
        .comment(REPO, pr.number, "/ichor pause", "mara")
        .await?;
    let cluster = running.ctx.cluster("homelab").ok_or("no cluster")?.clone();
    let paused = || {
        cluster
            .paused_by
            .lock()
            .map(|p| p.is_some())
            .unwrap_or(false)
    };
    until(&hub.s, &running, "the pause", paused).await?;
    let after = clock.now().since(t0);
    assert!(
        after < Duration::from_secs(600),
        "the pause waited {after:?}, behind the rate limit"
    );
    // The held work is done once GitHub allows it.
    until(
        &hub.s,
        &running,
        "the new head's verdict and the reply",
        || has(&hub, &next, StatusState::Success) && hub.replies(pr.number, "@mara") >= 1,
    )
    .await?;
    assert!(clock.now().since(t0) >= Duration::from_secs(600));
    running.shutdown().await;
    Ok(())
}

// ----- 5: form-encoded webhooks -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn form_encoded_deliveries_are_read_like_json_ones() -> TestResult {
    let hub = Hub::start().await?;
    // GitHub's default content type for a repository webhook.
    hub.gh.set_webhook_content_type(ContentType::Form);
    let running = hub.run("a").await?;
    let pr = hub.open(GOOD).await?;
    until(&hub.s, &running, "the verdict", || {
        has(&hub, &pr.head_sha, StatusState::Success)
    })
    .await?;
    let sent = hub.gh.deliveries();
    let opened = sent
        .iter()
        .find(|d| d.event == "pull_request")
        .ok_or("no pull_request delivery")?;
    assert!(opened.body.starts_with("payload=%7B"), "{}", opened.body);
    assert_eq!(opened.status(), Some(202));
    assert_eq!(deliveries(&running, "accepted", "pull_request"), 1.0);
    assert_eq!(deliveries(&running, "refused", "bad_payload"), 0.0);
    // Neither form nor JSON: refused with 415, counted.
    assert_eq!(
        deliver(&running, "ping", "other-type-1", "text/plain", "{}").await?,
        415
    );
    assert_eq!(deliveries(&running, "refused", "bad_content_type"), 1.0);
    running.shutdown().await;
    Ok(())
}

// ----- 7: schema edges -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_null_merged_flag_is_read_as_github_publishes_it() -> TestResult {
    let hub = Hub::start().await?;
    let running = hub.run("a").await?;
    let pr = hub.open(GOOD).await?;
    until(&hub.s, &running, "the verdict", || {
        has(&hub, &pr.head_sha, StatusState::Success)
    })
    .await?;
    // `merged` is `["boolean", "null"]` (octokit/webhooks
    // payload-schemas/api.github.com/common/pull-request.schema.json).
    let opened = hub
        .gh
        .deliveries()
        .into_iter()
        .find(|d| d.event == "pull_request")
        .ok_or("no delivery")?;
    let mut payload: serde_json::Value = serde_json::from_str(&opened.body)?;
    payload["pull_request"]["merged"] = serde_json::Value::Null;
    payload["action"] = "edited".into();
    let status = deliver(
        &running,
        "pull_request",
        "null-merged-1",
        "application/json",
        &payload.to_string(),
    )
    .await?;
    assert_eq!(status, 202);
    assert!(hub
        .gh
        .deliveries()
        .iter()
        .all(|d| d.outcome != DeliveryOutcome::Held));
    running.shutdown().await;
    Ok(())
}

// ----- 6: merge queues -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_group_gets_its_gate_on_its_own_head() -> TestResult {
    let hub = Hub::start().await?;
    let running = hub.run("a").await?;
    let pr = hub.open(GOOD).await?;
    until(&hub.s, &running, "the PR's verdict", || {
        has(&hub, &pr.head_sha, StatusState::Success)
    })
    .await?;
    // With a merge queue GitHub waits for the required statuses on the merge group's
    // head_sha (octokit/webhooks payload-examples/api.github.com/merge_group/
    // checks_requested.payload.json), a commit no PR has as its head.
    let group = hub.gh.queue_merge_group(REPO, pr.number, "mara").await?;
    assert_ne!(group, pr.head_sha);
    until(&hub.s, &running, "the merge group's verdict", || {
        has(&hub, &group, StatusState::Success)
    })
    .await?;
    assert_eq!(deliveries(&running, "accepted", "merge_group"), 1.0);
    running.shutdown().await;
    Ok(())
}

// ----- 12: credentials go only where they were meant to -----

/// A server that redirects every request to `to` (another origin), and one that asks for
/// credentials and records every Authorization header it is sent.
async fn redirecting_pair() -> Result<(String, std::sync::Arc<std::sync::Mutex<Vec<String>>>), Error>
{
    use axum::response::IntoResponse;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let other = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let other_port = other.local_addr()?.port();
    let record = seen.clone();
    let asks = axum::Router::new().fallback(move |headers: http::HeaderMap| {
        let record = record.clone();
        async move {
            if let Some(a) = headers.get("authorization").and_then(|v| v.to_str().ok()) {
                record.lock().map(|mut r| r.push(a.to_string())).ok();
            }
            (
                http::StatusCode::UNAUTHORIZED,
                [("www-authenticate", "Basic realm=\"GitHub\"")],
                "",
            )
                .into_response()
        }
    });
    tokio::spawn(async move {
        let _ = axum::serve(other, asks).await;
    });
    let first = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let first_port = first.local_addr()?.port();
    let redirect = axum::Router::new().fallback(move |uri: http::Uri| async move {
        let pq = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        (
            http::StatusCode::MOVED_PERMANENTLY,
            [("location", format!("http://localhost:{other_port}{pq}"))],
            "",
        )
            .into_response()
    });
    tokio::spawn(async move {
        let _ = axum::serve(first, redirect).await;
    });
    Ok((
        format!("http://127.0.0.1:{first_port}/acme/homelab.git"),
        seen,
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_another_origin_never_gets_the_token() -> TestResult {
    use ichor::git::remote::{Credentials, Mirror, Remote};
    let (url, seen) = redirecting_pair().await?;
    let dir = tempfile::tempdir()?;
    let token = "ghp_never_leaves_for_another_host_0123456789";
    let remote = Remote {
        url,
        credentials: Credentials::Token {
            user: "x-access-token".into(),
            token: ichor::secret::Secret::new(token.to_string()),
        },
        known_hosts: None,
    };
    let result = tokio::task::spawn_blocking(move || {
        let mirror = Mirror::open(&dir.path().join("mirror.git"))?;
        mirror.fetch(&remote, &["+refs/heads/*:refs/heads/*"])
    })
    .await?;
    let err = result
        .err()
        .ok_or("the fetch through a redirect succeeded")?;
    let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
    assert!(
        seen.is_empty(),
        "credentials went to another origin: {seen:?}"
    );
    let message = err.to_string();
    assert!(message.contains("another origin"), "{message}");
    assert!(!message.contains(token), "{message}");
    Ok(())
}

// ----- 10: what is quoted is not a command -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_quoted_in_a_code_block_or_a_comment_does_nothing() -> TestResult {
    let hub = Hub::start().await?;
    hub.gh.add_collaborator(REPO, "mara", "maintain")?;
    let running = hub.run("a").await?;
    let pr = hub.open(GOOD).await?;
    until(&hub.s, &running, "the verdict", || {
        has(&hub, &pr.head_sha, StatusState::Success)
    })
    .await?;
    hub.gh
        .comment(
            REPO,
            pr.number,
            "To stop it, write:\n\n```\n/ichor pause\n```\n<!--\n/ichor pause\n-->",
            "mara",
        )
        .await?;
    hub.gh
        .comment(REPO, pr.number, "/ichor plan", "mara")
        .await?;
    until(&hub.s, &running, "the reply to the real command", || {
        hub.replies(pr.number, "@mara") >= 1
    })
    .await?;
    let cluster = running.ctx.cluster("homelab").ok_or("no cluster")?.clone();
    assert!(
        cluster
            .paused_by
            .lock()
            .map(|p| p.is_none())
            .unwrap_or(false),
        "a quoted command paused the cluster"
    );
    assert_eq!(
        hub.replies(pr.number, "@mara"),
        1,
        "one reply, to the real command"
    );
    running.shutdown().await;
    Ok(())
}

// ----- the emulator delivers what GitHub delivers -----

/// `labeled` is delivered and ignored (a label changes nothing ichor judges); a PR closed
/// and `reopened` after its base moved is judged again, against the new base.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_is_ignored_and_a_reopened_pr_is_judged_against_its_new_base() -> TestResult {
    let hub = Hub::start().await?;
    let running = hub.run("a").await?;
    let pr = hub.open(GOOD).await?;
    until(&hub.s, &running, "the gate", || {
        has(&hub, &pr.head_sha, StatusState::Success)
    })
    .await?;
    let m = &running.ctx.metrics;
    let deliveries = |result: &str| {
        m.value(
            "ichor_webhook_deliveries_total",
            &[("result", result), ("reason", "pull_request")],
        )
    };
    let ignored = deliveries("ignored");
    hub.gh
        .label_pull_request(REPO, pr.number, "dependencies", RENOVATE_LOGIN)
        .await?;
    until(&hub.s, &running, "the label's delivery", || {
        deliveries("ignored") == ignored + 1.0
    })
    .await?;

    hub.gh
        .close_pull_request(REPO, pr.number, RENOVATE_LOGIN)
        .await?;
    // While it is closed, main moves on (a README edit: nothing to judge differently, but
    // a new base all the same).
    crate::controller::commit_edit(
        &git2::Repository::open_bare(&hub.origin)?,
        "main",
        "refs/heads/main",
        "README.md",
        |_| "# homelab\n\nedited while the PR was closed\n".into(),
        "docs\n",
    )?;
    let gates = m.total("ichor_gates_total");
    let accepted = deliveries("accepted");
    hub.gh
        .reopen_pull_request(REPO, pr.number, RENOVATE_LOGIN)
        .await?;
    until(&hub.s, &running, "the reopened PR judged again", || {
        deliveries("accepted") > accepted && m.total("ichor_gates_total") > gates
    })
    .await?;
    assert!(has(&hub, &pr.head_sha, StatusState::Success));
    let reopened = hub
        .gh
        .deliveries()
        .into_iter()
        .rev()
        .find(|d| d.action.as_deref() == Some("reopened"))
        .ok_or("no reopened delivery")?;
    let payload: serde_json::Value = serde_json::from_str(&reopened.body)?;
    assert_eq!(payload["pull_request"]["state"], "open");
    assert_eq!(payload["action"], "reopened");
    running.shutdown().await;
    Ok(())
}

// ----- 4: renamed or transferred repositories -----

/// Issue 17 item 4: after a rename, GitHub's webhooks carry the new name; ichor, still
/// configured with the old one, knows them by the repository's id (which a rename keeps),
/// fetches through the old clone URL's redirect, and judges the reopened PR again. A
/// delivery naming another repository id is still not ours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_of_a_renamed_repository_are_known_by_its_id() -> TestResult {
    let hub = Hub::start().await?;
    let running = hub.run("a").await?;
    let pr = hub.open(GOOD).await?;
    until(&hub.s, &running, "the gate and the repository's id", || {
        has(&hub, &pr.head_sha, StatusState::Success)
            && running
                .ctx
                .github
                .as_ref()
                .is_some_and(|g| g.repository_id().is_some())
    })
    .await?;
    const NEW: &str = "acme/homelab-renamed";
    hub.gh.rename_repo(REPO, NEW)?;
    let m = &running.ctx.metrics;
    let count = |result: &str, reason: &str| {
        m.value(
            "ichor_webhook_deliveries_total",
            &[("result", result), ("reason", reason)],
        )
    };
    let accepted = count("accepted", "pull_request");
    hub.gh
        .close_pull_request(NEW, pr.number, RENOVATE_LOGIN)
        .await?;
    until(
        &hub.s,
        &running,
        "the close, under the new name, accepted",
        || count("accepted", "pull_request") == accepted + 1.0,
    )
    .await?;
    let closed = hub
        .gh
        .deliveries()
        .into_iter()
        .rev()
        .find(|d| d.action.as_deref() == Some("closed"))
        .ok_or("no closed delivery")?;
    let mut payload: serde_json::Value = serde_json::from_str(&closed.body)?;
    assert_eq!(payload["repository"]["full_name"], NEW);

    let gates = m.total("ichor_gates_total");
    hub.gh
        .reopen_pull_request(NEW, pr.number, RENOVATE_LOGIN)
        .await?;
    until(&hub.s, &running, "the reopened PR judged again", || {
        m.total("ichor_gates_total") > gates
    })
    .await?;

    // Another repository, whatever it is called, stays another repository.
    let others = count("ignored", "another repository");
    payload["repository"]["id"] = serde_json::json!(987_654_321u64);
    payload["repository"]["full_name"] = "acme/elsewhere".into();
    let status = deliver(
        &running,
        "pull_request",
        "another-repo-1",
        "application/json",
        &payload.to_string(),
    )
    .await?;
    assert_eq!(status, 202);
    assert_eq!(count("ignored", "another repository"), others + 1.0);
    running.shutdown().await;
    Ok(())
}

// ----- the emulator delivers `edited` and `ready_for_review` -----

/// A PR pointed at another base (`pull_request.edited` with `changes.base`) is judged against
/// the new base's tip; a draft marked ready (`pull_request.ready_for_review`) is taken. The
/// payloads carry what octokit/webhooks' schemas say they carry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_base_change_is_judged_against_the_new_base_and_a_draft_taken_when_ready() -> TestResult {
    let hub = Hub::start().await?;
    // `release`: main and one more commit, so its tip differs from main's.
    let release_tip = crate::controller::commit_edit(
        &git2::Repository::open_bare(&hub.origin)?,
        "main",
        "refs/heads/release",
        "README.md",
        |_| "# homelab\n\nthe release line\n".into(),
        "release\n",
    )?
    .to_string();

    let running = hub.run("a").await?;
    let pr = hub.open(GOOD).await?;
    let judged_base = |number: u64| {
        running
            .ctx
            .state
            .try_lock()
            .ok()
            .and_then(|st| st.judged.get(&number.to_string()).map(|(_, b)| b.clone()))
    };
    until(&hub.s, &running, "the gate", || {
        has(&hub, &pr.head_sha, StatusState::Success)
    })
    .await?;
    assert_ne!(
        judged_base(pr.number).as_deref(),
        Some(release_tip.as_str())
    );

    let edited = hub
        .gh
        .change_pull_base(REPO, pr.number, "release", RENOVATE_LOGIN)
        .await?;
    assert_eq!(edited.base_ref, "release");
    until(&hub.s, &running, "the PR judged against release", || {
        judged_base(pr.number).as_deref() == Some(release_tip.as_str())
    })
    .await?;
    let delivery = hub
        .gh
        .deliveries()
        .into_iter()
        .rev()
        // The PR's own event: ichor editing its sticky comment meanwhile is an
        // `issue_comment` "edited" delivery too.
        .find(|d| d.event == "pull_request" && d.action.as_deref() == Some("edited"))
        .ok_or("no edited delivery")?;
    let payload: serde_json::Value = serde_json::from_str(&delivery.body)?;
    assert_eq!(payload["changes"]["base"]["ref"]["from"], "main");
    assert_eq!(payload["pull_request"]["base"]["ref"], "release");
    assert_eq!(payload["pull_request"]["base"]["sha"], release_tip.as_str());
    // A base that does not exist is GitHub's 422, and no pull_request event is delivered
    // (other events, such as the statuses ichor sets meanwhile, may be).
    let pull_events = || {
        hub.gh
            .deliveries()
            .iter()
            .filter(|d| d.event == "pull_request")
            .count()
    };
    let n = pull_events();
    assert!(hub
        .gh
        .change_pull_base(REPO, pr.number, "no-such-branch", RENOVATE_LOGIN)
        .await
        .is_err());
    assert_eq!(pull_events(), n);

    // A draft, then ready for review.
    let draft = hub
        .gh
        .open_draft_pull_request(REPO, BAD, "main", "Renovate update (draft)", RENOVATE_LOGIN)
        .await?;
    until(&hub.s, &running, "the draft's gate", || {
        has(&hub, &draft.head_sha, StatusState::Failure)
    })
    .await?;
    let accepted = deliveries(&running, "accepted", "pull_request");
    hub.gh
        .mark_ready_for_review(REPO, draft.number, RENOVATE_LOGIN)
        .await?;
    until(&hub.s, &running, "ready_for_review taken", || {
        deliveries(&running, "accepted", "pull_request") == accepted + 1.0
    })
    .await?;
    let ready = hub
        .gh
        .deliveries()
        .into_iter()
        .rev()
        .find(|d| d.action.as_deref() == Some("ready_for_review"))
        .ok_or("no ready_for_review delivery")?;
    let payload: serde_json::Value = serde_json::from_str(&ready.body)?;
    assert_eq!(payload["pull_request"]["draft"], false);
    running.shutdown().await;
    Ok(())
}

// ----- payloads, field for field -----

/// Required keys, from octokit/webhooks `payload-schemas/api.github.com/` (the schemas
/// GitHub's deliveries are checked against there): `common/repository.schema.json`.
const REPOSITORY: &[&str] = &[
    "id",
    "node_id",
    "name",
    "full_name",
    "private",
    "owner",
    "html_url",
    "description",
    "fork",
    "url",
    "forks_url",
    "keys_url",
    "collaborators_url",
    "teams_url",
    "hooks_url",
    "issue_events_url",
    "events_url",
    "assignees_url",
    "branches_url",
    "tags_url",
    "blobs_url",
    "git_tags_url",
    "git_refs_url",
    "trees_url",
    "statuses_url",
    "languages_url",
    "stargazers_url",
    "contributors_url",
    "subscribers_url",
    "subscription_url",
    "commits_url",
    "git_commits_url",
    "comments_url",
    "issue_comment_url",
    "contents_url",
    "compare_url",
    "merges_url",
    "archive_url",
    "downloads_url",
    "issues_url",
    "pulls_url",
    "milestones_url",
    "notifications_url",
    "labels_url",
    "releases_url",
    "deployments_url",
    "created_at",
    "updated_at",
    "pushed_at",
    "git_url",
    "ssh_url",
    "clone_url",
    "svn_url",
    "homepage",
    "size",
    "stargazers_count",
    "watchers_count",
    "language",
    "has_issues",
    "has_projects",
    "has_downloads",
    "has_wiki",
    "has_pages",
    "forks_count",
    "mirror_url",
    "archived",
    "open_issues_count",
    "license",
    "forks",
    "open_issues",
    "watchers",
    "default_branch",
    "is_template",
    "web_commit_signoff_required",
    "topics",
    "visibility",
    "custom_properties",
];
/// `common/pull-request.schema.json`.
const PULL_REQUEST: &[&str] = &[
    "url",
    "id",
    "node_id",
    "html_url",
    "diff_url",
    "patch_url",
    "issue_url",
    "number",
    "state",
    "locked",
    "title",
    "user",
    "body",
    "created_at",
    "updated_at",
    "closed_at",
    "merged_at",
    "merge_commit_sha",
    "assignee",
    "assignees",
    "requested_reviewers",
    "requested_teams",
    "labels",
    "milestone",
    "commits_url",
    "review_comments_url",
    "review_comment_url",
    "comments_url",
    "statuses_url",
    "head",
    "base",
    "_links",
    "author_association",
    "auto_merge",
    "active_lock_reason",
    "draft",
    "merged",
    "mergeable",
    "rebaseable",
    "mergeable_state",
    "merged_by",
    "comments",
    "review_comments",
    "maintainer_can_modify",
    "commits",
    "additions",
    "deletions",
    "changed_files",
];
/// `common/user.schema.json`.
const USER: &[&str] = &[
    "login",
    "id",
    "node_id",
    "avatar_url",
    "gravatar_id",
    "url",
    "html_url",
    "followers_url",
    "following_url",
    "gists_url",
    "starred_url",
    "subscriptions_url",
    "organizations_url",
    "repos_url",
    "events_url",
    "received_events_url",
    "type",
    "site_admin",
];
/// `common/issue-comment.schema.json`.
const COMMENT: &[&str] = &[
    "url",
    "html_url",
    "issue_url",
    "id",
    "node_id",
    "user",
    "created_at",
    "updated_at",
    "author_association",
    "performed_via_github_app",
    "body",
    "reactions",
];

fn missing(value: &serde_json::Value, at: &str, keys: &[&str], out: &mut Vec<String>) {
    match value.as_object() {
        Some(obj) => out.extend(
            keys.iter()
                .filter(|k| !obj.contains_key(**k))
                .map(|k| format!("{at}.{k}")),
        ),
        None => out.push(format!("{at} is not an object")),
    }
}

/// Every delivery the emulator makes in a PR's life has every key GitHub's published
/// schemas require, the ones ichor never reads included: a client tested against thinner
/// payloads could depend on a field's absence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_delivery_has_the_fields_githubs_schemas_require() -> TestResult {
    let hub = Hub::start().await?;
    {
        let repo = git2::Repository::open_bare(&hub.origin)?;
        let main = repo.find_reference("refs/heads/main")?.peel_to_commit()?;
        let sig = git2::Signature::now("Mara", "mara@homelab.example")?;
        repo.commit(
            Some("refs/heads/release"),
            &sig,
            &sig,
            "release\n",
            &main.tree()?,
            &[&main],
        )?;
    }
    let running = hub.run("a").await?;
    let pr = hub.open(GOOD).await?;
    hub.gh
        .push_commit(REPO, GOOD, &[("NOTES.md", "x\n")], "notes", RENOVATE_LOGIN)
        .await?;
    hub.gh
        .label_pull_request(REPO, pr.number, "dependencies", RENOVATE_LOGIN)
        .await?;
    hub.gh
        .change_pull_base(REPO, pr.number, "release", RENOVATE_LOGIN)
        .await?;
    hub.gh
        .comment(REPO, pr.number, "/ichor plan", "mara")
        .await?;
    hub.gh
        .close_pull_request(REPO, pr.number, RENOVATE_LOGIN)
        .await?;
    hub.gh
        .reopen_pull_request(REPO, pr.number, RENOVATE_LOGIN)
        .await?;
    let draft = hub
        .gh
        .open_draft_pull_request(REPO, BAD, "main", "draft", RENOVATE_LOGIN)
        .await?;
    hub.gh
        .mark_ready_for_review(REPO, draft.number, RENOVATE_LOGIN)
        .await?;
    hub.gh.queue_merge_group(REPO, draft.number, "mara").await?;
    hub.gh.merge_pull_request(REPO, pr.number, "mara").await?;

    let mut seen = std::collections::BTreeSet::new();
    let mut gaps = Vec::new();
    for d in hub.gh.deliveries() {
        let p: serde_json::Value = serde_json::from_str(&d.body)?;
        let name = format!("{}.{}", d.event, d.action.clone().unwrap_or_default());
        seen.insert(name.clone());
        let top: &[&str] = match d.event.as_str() {
            "pull_request" if d.action.as_deref() == Some("edited") => &[
                "action",
                "changes",
                "number",
                "pull_request",
                "repository",
                "sender",
            ],
            "pull_request" => &["action", "number", "pull_request", "repository", "sender"],
            "push" => &[
                "ref",
                "before",
                "after",
                "created",
                "deleted",
                "forced",
                "base_ref",
                "compare",
                "commits",
                "head_commit",
                "repository",
                "pusher",
                "sender",
            ],
            "issue_comment" => &["action", "issue", "comment", "repository", "sender"],
            "merge_group" => &["action", "merge_group", "repository", "sender"],
            other => return Err(format!("an unexpected {other} delivery").into()),
        };
        missing(&p, &name, top, &mut gaps);
        missing(
            &p["repository"],
            &format!("{name}.repository"),
            REPOSITORY,
            &mut gaps,
        );
        missing(
            &p["repository"]["owner"],
            &format!("{name}.repository.owner"),
            USER,
            &mut gaps,
        );
        missing(&p["sender"], &format!("{name}.sender"), USER, &mut gaps);
        if d.event == "pull_request" {
            let pull = &p["pull_request"];
            missing(
                pull,
                &format!("{name}.pull_request"),
                PULL_REQUEST,
                &mut gaps,
            );
            missing(
                &pull["user"],
                &format!("{name}.pull_request.user"),
                USER,
                &mut gaps,
            );
            for end in ["head", "base"] {
                let at = format!("{name}.pull_request.{end}");
                missing(
                    &pull[end],
                    &at,
                    &["label", "ref", "sha", "user", "repo"],
                    &mut gaps,
                );
                missing(
                    &pull[end]["repo"],
                    &format!("{at}.repo"),
                    REPOSITORY,
                    &mut gaps,
                );
            }
        }
        if d.event == "issue_comment" {
            missing(
                &p["comment"],
                &format!("{name}.comment"),
                COMMENT,
                &mut gaps,
            );
            missing(
                &p["issue"],
                &format!("{name}.issue"),
                &["reactions", "pull_request"],
                &mut gaps,
            );
        }
        if d.event == "merge_group" {
            missing(
                &p["merge_group"],
                &format!("{name}.merge_group"),
                &[
                    "head_sha",
                    "head_ref",
                    "base_ref",
                    "base_sha",
                    "head_commit",
                ],
                &mut gaps,
            );
        }
        if d.event == "push" {
            // A push's repository times are epoch seconds (the schema's `oneOf` integer).
            assert!(
                p["repository"]["created_at"].is_u64(),
                "{name}: {}",
                p["repository"]["created_at"]
            );
        }
    }
    assert!(gaps.is_empty(), "missing: {gaps:#?}");
    for want in [
        "pull_request.opened",
        "pull_request.synchronize",
        "pull_request.labeled",
        "pull_request.edited",
        "pull_request.closed",
        "pull_request.reopened",
        "pull_request.ready_for_review",
        "push.",
        "issue_comment.created",
        "merge_group.checks_requested",
    ] {
        assert!(seen.contains(want), "no {want} delivery: {seen:?}");
    }
    running.shutdown().await;
    Ok(())
}
