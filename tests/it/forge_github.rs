//! ichor's GitHub client (`ichor::forge::github`) against the GitHub twin over loopback,
//! with a manual clock: statuses posted only when they change, the sticky comment, App
//! authentication and token refresh, rate limits and retries waited out on the clock,
//! ETags, permissions, and the pull request shapes.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use git2::{Oid, Repository, Signature, Time};

use ichor::clock::Clock;
use ichor::forge::github::{
    CheckAnnotation, CheckRunOut, Conclusion, ForgeError, GithubAuth, GithubClient, GithubConfig,
    Permission, RunState, StatusState,
};
use ichor::secret::Secret;
use ichor::sim::github::{
    AppInstallation, GithubApp, GithubTwin, GithubTwinConfig, RepoSpec, RENOVATE_LOGIN,
};

const REPO: &str = "home/ops";
const BUMP: &str = "renovate/ghcr.io-siderolabs-installer-1.x";
const MARKER: &str = "<!-- ichor:lab -->";

type TestResult = Result<(), Box<dyn std::error::Error>>;

struct Fixture {
    _dir: tempfile::TempDir,
    path: PathBuf,
    bump: Oid,
}

fn commit(
    repo: &Repository,
    refname: &str,
    parent: Option<Oid>,
    files: &[(&str, &str)],
    secs: i64,
) -> Result<Oid, git2::Error> {
    let sig = Signature::new("Ops", "ops@example.org", &Time::new(secs, 0))?;
    let parent = parent.map(|p| repo.find_commit(p)).transpose()?;
    let mut builder = git2::build::TreeUpdateBuilder::new();
    for (path, content) in files {
        let blob = repo.blob(content.as_bytes())?;
        builder.upsert(*path, blob, git2::FileMode::Blob);
    }
    let tree_oid = match &parent {
        Some(p) => builder.create_updated(repo, &p.tree()?)?,
        None => {
            let empty = repo.treebuilder(None)?.write()?;
            builder.create_updated(repo, &repo.find_tree(empty)?)?
        }
    };
    let tree = repo.find_tree(tree_oid)?;
    let parents: Vec<&git2::Commit<'_>> = parent.iter().collect();
    let oid = repo.commit(None, &sig, &sig, "commit", &tree, &parents)?;
    repo.reference(refname, oid, true, "commit")?;
    Ok(oid)
}

/// main with a release set, and a Renovate branch bumping Talos.
fn fixture() -> Result<Fixture, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("ops.git");
    let repo = Repository::init_bare(&path)?;
    repo.set_head("refs/heads/main")?;
    let file = "clusters/lab/release-set.yaml";
    let root = commit(
        &repo,
        "refs/heads/main",
        None,
        &[(file, "spec:\n  talos: v1.12.0\n")],
        1_767_225_600,
    )?;
    let bump = commit(
        &repo,
        &format!("refs/heads/{BUMP}"),
        Some(root),
        &[(file, "spec:\n  talos: v1.13.0\n")],
        1_767_225_700,
    )?;
    Ok(Fixture {
        _dir: dir,
        path,
        bump,
    })
}

async fn twin_with(
    fx: &Fixture,
    clock: &Clock,
    config: GithubTwinConfig,
) -> Result<GithubTwin, Box<dyn std::error::Error>> {
    Ok(GithubTwin::start_with(
        clock.clone(),
        GithubTwinConfig {
            repos: vec![RepoSpec::new(REPO, &fx.path)],
            ..config
        },
    )
    .await?)
}

fn token_config(twin: &GithubTwin) -> GithubConfig {
    GithubConfig {
        api_url: twin.base_url(),
        repo: REPO.to_string(),
        auth: GithubAuth::Token(Secret::new(twin.token())),
    }
}

async fn connect(twin: &GithubTwin, clock: &Clock) -> Result<GithubClient, ForgeError> {
    GithubClient::connect(token_config(twin), clock.clone()).await
}

/// Run `task` to completion, moving the manual clock to each sleep's deadline as the
/// client waits (rate limits, backoff). The wall-clock bound only guards against a hang.
async fn drive<T: Send + 'static>(clock: &Clock, task: tokio::task::JoinHandle<T>) -> T {
    let guard = Instant::now() + Duration::from_secs(60);
    let mut task = task;
    loop {
        if task.is_finished() {
            return (&mut task).await.expect("task panicked");
        }
        if let Some(t) = clock.next_wakeup() {
            clock.advance_to(t);
        }
        assert!(Instant::now() < guard, "the call did not finish");
        tokio::task::yield_now().await;
    }
}

/// Wait (without moving time) until the client sleeps on the clock; its deadline.
async fn sleeping_until(clock: &Clock) -> ichor::clock::Timestamp {
    let guard = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(t) = clock.next_wakeup() {
            return t;
        }
        assert!(Instant::now() < guard, "the client never waited");
        tokio::task::yield_now().await;
    }
}

/// Test-only RSA keys in PKCS#1 PEM, made with OpenSSL (testdata/keys/README.md).
const APP_KEY: &str = include_str!("../../testdata/keys/github-app.pkcs1.pem");
const OTHER_APP_KEY: &str = include_str!("../../testdata/keys/github-app-other.pkcs1.pem");

// ----- statuses -----

#[tokio::test]
async fn set_status_posts_only_when_the_status_changes() -> TestResult {
    let fx = fixture()?;
    let clock = Clock::manual();
    let twin = twin_with(&fx, &clock, GithubTwinConfig::default()).await?;
    let client = connect(&twin, &clock).await?;
    assert_eq!(client.login(), twin.login());
    assert_eq!(client.repo(), REPO);
    let sha = fx.bump.to_string();

    assert!(
        client
            .set_status(&sha, "ichor/gate", StatusState::Pending, "evaluating", None)
            .await?
    );
    assert!(
        !client
            .set_status(&sha, "ichor/gate", StatusState::Pending, "evaluating", None)
            .await?
    );
    assert_eq!(twin.statuses(REPO, &sha)?.len(), 1);

    // A restarted client has no memory: it reads the newest status and still posts nothing.
    let fresh = connect(&twin, &clock).await?;
    assert!(
        !fresh
            .set_status(&sha, "ichor/gate", StatusState::Pending, "evaluating", None)
            .await?
    );
    assert_eq!(twin.statuses(REPO, &sha)?.len(), 1);

    assert!(
        fresh
            .set_status(
                &sha,
                "ichor/gate",
                StatusState::Success,
                "all checks pass",
                Some("https://ichor.example/lab")
            )
            .await?
    );
    let all = twin.statuses(REPO, &sha)?;
    assert_eq!(all.len(), 2);
    assert_eq!(all[1].state, ichor::sim::github::StatusState::Success);
    assert_eq!(all[1].creator, twin.login());
    assert_eq!(
        all[1].target_url.as_deref(),
        Some("https://ichor.example/lab")
    );
    // The first client's memory is stale; it rereads nothing but posts the change it wants.
    assert!(
        client
            .set_status(&sha, "ichor/gate", StatusState::Failure, "blocked", None)
            .await?
    );
    assert_eq!(twin.statuses(REPO, &sha)?.len(), 3);
    Ok(())
}

#[tokio::test]
async fn renovate_contexts_are_refused_and_long_descriptions_cut_to_140() -> TestResult {
    let fx = fixture()?;
    let clock = Clock::manual();
    let twin = twin_with(&fx, &clock, GithubTwinConfig::default()).await?;
    let client = connect(&twin, &clock).await?;
    let sha = fx.bump.to_string();

    let refused = client
        .set_status(&sha, "renovate/x", StatusState::Success, "ok", None)
        .await;
    assert!(
        matches!(&refused, Err(ForgeError::Refused(m)) if m.contains("renovate/")),
        "{refused:?}"
    );
    let too_long = client
        .set_status(&sha, &"c".repeat(256), StatusState::Success, "ok", None)
        .await;
    assert!(matches!(too_long, Err(ForgeError::Refused(_))));
    assert!(twin.statuses(REPO, &sha)?.is_empty(), "nothing was sent");

    let long = "ü".repeat(200);
    assert!(
        client
            .set_status(&sha, "ichor/gate", StatusState::Failure, &long, None)
            .await?
    );
    let posted = twin.statuses(REPO, &sha)?;
    let description = posted[0].description.clone().unwrap_or_default();
    assert_eq!(description.chars().count(), 140);
    assert!(description.ends_with('…'));
    // The same long description again is recognised as unchanged.
    assert!(
        !client
            .set_status(&sha, "ichor/gate", StatusState::Failure, &long, None)
            .await?
    );
    Ok(())
}

// ----- the sticky comment -----

#[tokio::test]
async fn upsert_comment_creates_then_edits_in_place_and_ignores_others() -> TestResult {
    let fx = fixture()?;
    let clock = Clock::manual();
    let twin = twin_with(&fx, &clock, GithubTwinConfig::default()).await?;
    let pr = twin
        .open_pull_request(REPO, BUMP, "main", "Update talos", "", RENOVATE_LOGIN)
        .await?;
    // Someone else pastes our marker first: that comment must stay theirs.
    let pasted = format!("{MARKER} look, I can fake it");
    let foreign = twin.comment(REPO, pr.number, &pasted, "mallory").await?;
    let client = connect(&twin, &clock).await?;

    let id = client
        .upsert_comment(pr.number, MARKER, "checklist v1")
        .await?;
    assert_ne!(id, foreign.id);
    let again = client
        .upsert_comment(pr.number, MARKER, "checklist v2")
        .await?;
    assert_eq!(again, id, "edited in place");
    let same = client
        .upsert_comment(pr.number, MARKER, "checklist v2")
        .await?;
    assert_eq!(same, id);

    let comments = twin.comments(REPO, pr.number)?;
    assert_eq!(comments.len(), 2, "{comments:?}");
    let ours: Vec<_> = comments.iter().filter(|c| c.user == twin.login()).collect();
    assert_eq!(ours.len(), 1);
    assert_eq!(ours[0].body, format!("{MARKER}\nchecklist v2"));
    let theirs = comments.iter().find(|c| c.id == foreign.id);
    assert_eq!(theirs.map(|c| c.body.as_str()), Some(pasted.as_str()));

    // A report longer than GitHub's limit is cut, with a note, and still accepted.
    let huge = "x".repeat(300_000);
    assert_eq!(client.upsert_comment(pr.number, MARKER, &huge).await?, id);
    let cut = twin
        .comments(REPO, pr.number)?
        .into_iter()
        .find(|c| c.id == id)
        .map(|c| c.body)
        .unwrap_or_default();
    assert_eq!(cut.len(), 262_144);
    assert!(cut.starts_with(MARKER) && cut.contains("truncated"));

    let plain = client.post_comment(pr.number, "/ichor noted").await?;
    assert_ne!(plain, id);
    assert_eq!(twin.comments(REPO, pr.number)?.len(), 3);
    Ok(())
}

// ----- GitHub App authentication -----

fn app_twin_config(pem: &str) -> Result<GithubTwinConfig, Box<dyn std::error::Error>> {
    Ok(GithubTwinConfig {
        apps: vec![GithubApp::from_private_key_pem(
            1234,
            "ichor",
            pem,
            vec![AppInstallation {
                id: 99,
                repos: vec![REPO.to_string()],
            }],
        )?],
        ..GithubTwinConfig::default()
    })
}

fn app_config(twin: &GithubTwin, pem: &str) -> GithubConfig {
    GithubConfig {
        api_url: twin.base_url(),
        repo: REPO.to_string(),
        auth: GithubAuth::App {
            app_id: 1234,
            installation_id: 99,
            private_key: Secret::new(pem),
        },
    }
}

#[tokio::test]
async fn app_auth_end_to_end_with_token_refresh() -> TestResult {
    let pem = APP_KEY.to_string();
    let fx = fixture()?;
    let clock = Clock::manual();
    let twin = twin_with(&fx, &clock, app_twin_config(&pem)?).await?;
    let client = GithubClient::connect(app_config(&twin, &pem), clock.clone()).await?;
    assert_eq!(client.login(), "ichor[bot]");
    assert_eq!(twin.installation_token_requests(), 1);

    let sha = fx.bump.to_string();
    assert!(
        client
            .set_status(&sha, "ichor/gate", StatusState::Pending, "evaluating", None)
            .await?
    );
    let pr = twin
        .open_pull_request(REPO, BUMP, "main", "Update talos", "", RENOVATE_LOGIN)
        .await?;
    let id = client.upsert_comment(pr.number, MARKER, "v1").await?;
    assert_eq!(twin.statuses(REPO, &sha)?[0].creator, "ichor[bot]");
    assert_eq!(twin.comments(REPO, pr.number)?[0].user, "ichor[bot]");
    assert_eq!(twin.installation_token_requests(), 1, "the token is reused");

    // 56 minutes on: under five minutes of the token remain, so the next call buys a new one.
    clock.advance(Duration::from_secs(56 * 60));
    assert_eq!(client.upsert_comment(pr.number, MARKER, "v2").await?, id);
    assert_eq!(twin.installation_token_requests(), 2);

    // Far past every token's expiry: refreshed again, and the sticky comment is still found.
    clock.advance(Duration::from_secs(3 * 3600));
    assert_eq!(client.upsert_comment(pr.number, MARKER, "v3").await?, id);
    assert!(
        client
            .set_status(&sha, "ichor/gate", StatusState::Success, "ok", None)
            .await?
    );
    assert_eq!(twin.installation_token_requests(), 3);
    assert_eq!(twin.comments(REPO, pr.number)?.len(), 1);
    Ok(())
}

// ----- check runs (App mode) -----

fn gate_run(state: RunState, summary: &str, annotations: usize) -> CheckRunOut {
    CheckRunOut {
        state,
        title: "blocked: talos 1.13 needs kubernetes ≥ 1.31".into(),
        summary: summary.into(),
        text: "### The staged plan".into(),
        annotations: (0..annotations)
            .map(|i| CheckAnnotation {
                path: "clusters/lab/release-set.yaml".into(),
                line: 2 + i as u64,
                level: "failure",
                title: "Talos step".into(),
                message: "talos 1.13 needs kubernetes ≥ 1.31".into(),
            })
            .collect(),
    }
}

/// POST with the personal access token, as a PAT-holding workflow would.
async fn post_as_token(
    twin: &GithubTwin,
    path: &str,
    body: &str,
) -> Result<(u16, String), Box<dyn std::error::Error>> {
    use http_body_util::BodyExt;
    let req = http::Request::post(format!("{}{path}", twin.base_url()))
        .header("authorization", format!("Bearer {}", twin.token()))
        .header("user-agent", "test")
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(axum::body::Bytes::from(
            body.to_string(),
        )))?;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let resp = client.request(req).await?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

#[tokio::test]
async fn a_check_run_is_the_apps_alone_edited_in_place_and_new_annotations_make_a_new_run(
) -> TestResult {
    let pem = APP_KEY.to_string();
    let fx = fixture()?;
    let clock = Clock::manual();
    let twin = twin_with(&fx, &clock, app_twin_config(&pem)?).await?;
    let app = GithubClient::connect(app_config(&twin, &pem), clock.clone()).await?;
    let sha = fx.bump.to_string();

    // Waiting: in progress, no conclusion.
    assert!(
        app.upsert_check_run(
            &sha,
            "ichor/gate",
            &gate_run(RunState::InProgress, "judging", 0)
        )
        .await?
    );
    let runs = twin.check_runs(REPO, &sha)?;
    assert_eq!(runs.len(), 1);
    assert_eq!(
        (
            runs[0].status.as_str(),
            runs[0].conclusion.as_deref(),
            runs[0].app_id
        ),
        ("in_progress", None, 1234)
    );
    // The same again sends nothing.
    let before = app.stats().requests;
    assert!(
        !app.upsert_check_run(
            &sha,
            "ichor/gate",
            &gate_run(RunState::InProgress, "judging", 0)
        )
        .await?
    );
    assert_eq!(app.stats().requests, before);

    // A verdict with an annotation: GitHub never removes an annotation, so a new run.
    let blocked = gate_run(RunState::Completed(Conclusion::Failure), "checklist v1", 1);
    assert!(app.upsert_check_run(&sha, "ichor/gate", &blocked).await?);
    let runs = twin.check_runs(REPO, &sha)?;
    assert_eq!(runs.len(), 2);
    let newest = &runs[1];
    assert_eq!(
        (newest.status.as_str(), newest.conclusion.as_deref()),
        ("completed", Some("failure"))
    );
    assert_eq!(newest.annotations.len(), 1);
    assert_eq!(
        (
            newest.annotations[0].path.as_str(),
            newest.annotations[0].start_line
        ),
        ("clusters/lab/release-set.yaml", 2)
    );
    // The same annotations with another checklist: edited in place, not annotated twice.
    let edited = gate_run(RunState::Completed(Conclusion::Failure), "checklist v2", 1);
    assert!(app.upsert_check_run(&sha, "ichor/gate", &edited).await?);
    let runs = twin.check_runs(REPO, &sha)?;
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[1].summary.as_deref(), Some("checklist v2"));
    assert_eq!(runs[1].annotations.len(), 1);

    // A summary past GitHub's 65,535 bytes is cut (on a character boundary), not refused.
    let huge = gate_run(
        RunState::Completed(Conclusion::Failure),
        &"é".repeat(40_000),
        1,
    );
    assert!(app.upsert_check_run(&sha, "ichor/gate", &huge).await?);
    let summary = twin.check_runs(REPO, &sha)?[1]
        .summary
        .clone()
        .unwrap_or_default();
    assert!(
        summary.len() <= 65_535 && summary.contains("truncated"),
        "{}",
        summary.len()
    );

    // A restarted client finds its run again by listing: nothing new for the same output.
    let rollout = gate_run(RunState::InProgress, "rolling out", 0);
    assert!(
        app.upsert_check_run(&sha, "ichor/rollout", &rollout)
            .await?
    );
    let restarted = GithubClient::connect(app_config(&twin, &pem), clock.clone()).await?;
    assert!(
        !restarted
            .upsert_check_run(&sha, "ichor/rollout", &rollout)
            .await?
    );
    let done = gate_run(RunState::Completed(Conclusion::Success), "done", 0);
    assert!(
        restarted
            .upsert_check_run(&sha, "ichor/rollout", &done)
            .await?
    );
    let rollouts: Vec<_> = twin
        .check_runs(REPO, &sha)?
        .into_iter()
        .filter(|r| r.name == "ichor/rollout")
        .collect();
    assert_eq!(rollouts.len(), 1, "edited in place across a restart");
    assert_eq!(rollouts[0].conclusion.as_deref(), Some("success"));

    // GitHub refuses check runs to a personal access token; ichor does not try.
    let token = connect(&twin, &clock).await?;
    assert!(matches!(
        token.upsert_check_run(&sha, "ichor/gate", &edited).await,
        Err(ForgeError::Config(_))
    ));
    let (status, body) = post_as_token(
        &twin,
        &format!("/repos/{REPO}/check-runs"),
        &format!(r#"{{"name":"ichor/gate","head_sha":"{sha}","conclusion":"success"}}"#),
    )
    .await?;
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains("You must authenticate via a GitHub App."),
        "{body}"
    );
    Ok(())
}

/// A 600-node rollout's progress, as the rollout task reports it: a stage per 100 nodes,
/// an ETA change after every node, then a pause and the end.
async fn report_a_long_rollout(reporters: &ichor::controller::Reporters, sha: &str) -> TestResult {
    use ichor::forge::comment::{RolloutSection, RolloutState};
    let mut section = RolloutSection {
        commit: sha.to_string(),
        state: RolloutState::Queued("waiting for the lock".into()),
        lines: vec![],
        checks: vec![],
    };
    let report = |section: &RolloutSection| ichor::controller::RolloutReport {
        cluster: "lab".into(),
        commit: sha.to_string(),
        pr: None,
        section: section.clone(),
        sticky: None,
        several: false,
    };
    reporters.rollout(&report(&section)).await?;
    for node in 0..600 {
        section.state = RolloutState::Running {
            stage: format!("talos: workers {}", node / 100 + 1),
            eta: Some(format!(
                "{node}/600 done, ends ≈ {:02}:{:02} UTC",
                10 + node / 60,
                node % 60
            )),
        };
        section.lines.push(format!("node w-{node} upgraded"));
        reporters.rollout(&report(&section)).await?;
    }
    section.state = RolloutState::Paused {
        stage: "talos: workers 6".into(),
        node: Some("w-599".into()),
        reason: "PDB web allows no disruption".into(),
    };
    reporters.rollout(&report(&section)).await?;
    section.state = RolloutState::Completed {
        summary: "600 nodes on Talos v1.13.0".into(),
    };
    reporters.rollout(&report(&section)).await?;
    Ok(())
}

#[tokio::test]
async fn a_600_node_rollout_is_one_check_run_as_an_app_and_a_handful_of_statuses_with_a_token(
) -> TestResult {
    let pem = APP_KEY.to_string();
    let fx = fixture()?;
    let clock = Clock::manual();
    let twin = twin_with(&fx, &clock, app_twin_config(&pem)?).await?;
    let sha = fx.bump.to_string();

    // App: one run, edited in place; a pause asks for action and says how to resume.
    let app = GithubClient::connect(app_config(&twin, &pem), clock.clone()).await?;
    let reporters = ichor::controller::Reporters {
        github: Some(app),
        notes: None,
        clock: clock.clone(),
    };
    use ichor::forge::comment::{RolloutSection, RolloutState};
    let paused = RolloutSection {
        commit: sha.clone(),
        state: RolloutState::Paused {
            stage: "talos".into(),
            node: Some("w-1".into()),
            reason: "PDB web allows no disruption".into(),
        },
        lines: vec![],
        checks: vec![],
    };
    reporters
        .rollout(&ichor::controller::RolloutReport {
            cluster: "lab".into(),
            commit: sha.clone(),
            pr: None,
            section: paused,
            sticky: None,
            several: false,
        })
        .await?;
    let run = twin.check_runs(REPO, &sha)?.pop().ok_or("no run")?;
    assert_eq!(run.conclusion.as_deref(), Some("action_required"));
    assert!(run.summary.unwrap_or_default().contains("`/ichor retry`"));
    report_a_long_rollout(&reporters, &sha).await?;
    let runs = twin.check_runs(REPO, &sha)?;
    assert_eq!(runs.len(), 1, "one run per rollout, edited in place");
    assert_eq!(runs[0].conclusion.as_deref(), Some("success"));
    assert!(
        twin.statuses(REPO, &sha)?.is_empty(),
        "no status beside the run"
    );

    // Token: statuses only when the state or the stage changes, far below GitHub's 1,000.
    let token = connect(&twin, &clock).await?;
    let reporters = ichor::controller::Reporters {
        github: Some(token),
        notes: None,
        clock: clock.clone(),
    };
    report_a_long_rollout(&reporters, &sha).await?;
    let statuses = twin.statuses(REPO, &sha)?;
    assert!(statuses.len() <= 10, "{} statuses", statuses.len());
    assert_eq!(
        statuses.last().map(|s| s.state),
        Some(ichor::sim::github::StatusState::Success)
    );
    Ok(())
}

#[tokio::test]
async fn an_app_on_a_skewed_clock_signs_on_githubs_time_from_its_date() -> TestResult {
    use ichor::clock::Timestamp;
    assert_eq!(
        Timestamp::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"),
        Some(Timestamp::from_millis(784_111_777_000))
    );
    assert_eq!(
        Timestamp::from_millis(784_111_777_000).http_date(),
        "Sun, 06 Nov 1994 08:49:37 GMT"
    );
    let pem = APP_KEY.to_string();
    let fx = fixture()?;
    let github = Clock::manual();
    let twin = twin_with(&fx, &github, app_twin_config(&pem)?).await?;
    // A host 15 minutes ahead (the JWT's `iat` is in GitHub's future), then one 15
    // minutes behind (its `exp` is in GitHub's past): GitHub answers 401 to both.
    for ahead in [true, false] {
        let host = Clock::manual();
        if ahead {
            host.advance(Duration::from_secs(15 * 60));
        } else {
            github.advance(Duration::from_secs(15 * 60));
        }
        let client = GithubClient::connect(app_config(&twin, &pem), host.clone()).await?;
        assert_eq!(client.login(), "ichor[bot]");
        let sha = fx.bump.to_string();
        assert!(
            client
                .set_status(
                    &sha,
                    &format!("skew/{ahead}"),
                    StatusState::Success,
                    "ok",
                    None
                )
                .await?
        );
    }
    Ok(())
}

#[tokio::test]
async fn an_installation_token_reaches_the_one_repository_with_what_ichor_needs() -> TestResult {
    let pem = APP_KEY.to_string();
    let fx = fixture()?;
    let clock = Clock::manual();
    // Installed on the whole organisation: two repositories.
    let config = GithubTwinConfig {
        apps: vec![GithubApp::from_private_key_pem(
            1234,
            "ichor",
            &pem,
            vec![AppInstallation {
                id: 99,
                repos: vec![REPO.to_string(), "home/other".to_string()],
            }],
        )?],
        ..GithubTwinConfig::default()
    };
    let twin = twin_with(&fx, &clock, config).await?;
    let client = GithubClient::connect(app_config(&twin, &pem), clock.clone()).await?;
    assert_eq!(twin.token_repos(), vec![vec![REPO.to_string()]]);
    // And it still does its work there.
    let sha = fx.bump.to_string();
    assert!(
        client
            .upsert_check_run(
                &sha,
                "ichor/gate",
                &gate_run(RunState::Completed(Conclusion::Success), "ok", 0)
            )
            .await?
    );
    Ok(())
}

#[tokio::test]
async fn a_jwt_signed_by_another_key_is_a_clear_auth_error() -> TestResult {
    let (known, other) = (APP_KEY.to_string(), OTHER_APP_KEY.to_string());
    let fx = fixture()?;
    let clock = Clock::manual();
    let twin = twin_with(&fx, &clock, app_twin_config(&known)?).await?;
    let err = match GithubClient::connect(app_config(&twin, &other), clock.clone()).await {
        Ok(_) => return Err("a foreign key was accepted".into()),
        Err(e) => e,
    };
    assert!(
        matches!(&err, ForgeError::Unauthorized { message, .. } if message.contains("JSON web token")),
        "{err:?}"
    );
    assert!(!err.is_transient());
    assert_eq!(twin.installation_token_requests(), 0);
    let shown = format!("{err} {err:?}");
    assert!(
        !shown.contains("PRIVATE KEY") && !shown.contains("eyJ"),
        "{shown}"
    );
    Ok(())
}

// ----- rate limits, retries, ETags -----

#[tokio::test]
async fn a_secondary_rate_limit_waits_retry_after_on_the_clock() -> TestResult {
    let fx = fixture()?;
    let clock = Clock::manual();
    let twin = twin_with(&fx, &clock, GithubTwinConfig::default()).await?;
    let client = connect(&twin, &clock).await?;
    let sha = fx.bump.to_string();
    twin.secondary_rate_limit_next(1, 30);

    let start = clock.now();
    let c = client.clone();
    let s = sha.clone();
    let mut task = tokio::spawn(async move {
        c.set_status(&s, "ichor/gate", StatusState::Pending, "evaluating", None)
            .await
    });
    let wake = sleeping_until(&clock).await;
    assert_eq!(wake, start.plus(Duration::from_secs(30)));
    assert!(!task.is_finished());
    assert!(twin.statuses(REPO, &sha)?.is_empty());
    clock.advance(Duration::from_secs(30));
    let posted = tokio::time::timeout(Duration::from_secs(30), &mut task).await??;
    assert!(posted?);
    assert_eq!(twin.statuses(REPO, &sha)?.len(), 1);
    assert_eq!(client.stats().rate_limited, 1);
    Ok(())
}

#[tokio::test]
async fn server_errors_are_retried_with_backoff() -> TestResult {
    let fx = fixture()?;
    let clock = Clock::manual();
    let twin = twin_with(&fx, &clock, GithubTwinConfig::default()).await?;
    let client = connect(&twin, &clock).await?;
    let before = client.stats();
    twin.fail_next_requests(2, 502);
    let c = client.clone();
    let pulls = drive(&clock, tokio::spawn(async move { c.open_pulls().await })).await?;
    assert!(pulls.is_empty());
    let after = client.stats();
    assert_eq!(after.retries - before.retries, 2);
    assert_eq!(after.requests - before.requests, 3);

    // More failures than attempts: a transient error, not a hang.
    twin.fail_next_requests(10, 503);
    let c = client.clone();
    let err = drive(&clock, tokio::spawn(async move { c.pull(1).await })).await;
    assert!(
        matches!(&err, Err(e @ ForgeError::Server { status: 503, .. }) if e.is_transient()),
        "{err:?}"
    );
    Ok(())
}

#[tokio::test]
async fn an_exhausted_primary_rate_limit_waits_until_the_reset() -> TestResult {
    let fx = fixture()?;
    let clock = Clock::manual();
    let twin = twin_with(
        &fx,
        &clock,
        GithubTwinConfig {
            rate_limit: 2,
            ..GithubTwinConfig::default()
        },
    )
    .await?;
    let start = clock.now();
    let client = connect(&twin, &clock).await?; // 1: GET /user
    client.open_pulls().await?; // 2: the window is spent
    let c = client.clone();
    let mut task = tokio::spawn(async move { c.open_pulls().await });
    let wake = sleeping_until(&clock).await;
    // The twin's window resets an hour after it began; the client waits a second past it.
    assert_eq!(wake, start.plus(Duration::from_secs(3601)));
    clock.advance_to(wake);
    let pulls = tokio::time::timeout(Duration::from_secs(30), &mut task).await??;
    assert!(pulls?.is_empty());
    assert_eq!(client.stats().rate_limited, 1);
    Ok(())
}

#[tokio::test]
async fn repeated_open_pulls_are_answered_304_from_the_etag_cache() -> TestResult {
    let fx = fixture()?;
    let clock = Clock::manual();
    let twin = twin_with(&fx, &clock, GithubTwinConfig::default()).await?;
    twin.open_pull_request(REPO, BUMP, "main", "Update talos", "", RENOVATE_LOGIN)
        .await?;
    let client = connect(&twin, &clock).await?;
    let first = client.open_pulls().await?;
    let second = client.open_pulls().await?;
    assert_eq!(client.stats().not_modified, 1);
    assert_eq!(first.len(), 1);
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].head_sha, first[0].head_sha);
    // A change is seen: the ETag no longer matches.
    let moved = twin
        .push_commit(REPO, BUMP, &[("x", "y")], "more", RENOVATE_LOGIN)
        .await?;
    let third = client.open_pulls().await?;
    assert_eq!(third[0].head_sha, moved);
    assert_eq!(client.stats().not_modified, 1);
    Ok(())
}

// ----- permissions and pull requests -----

#[tokio::test]
async fn permission_of_admins_writers_readers_and_strangers() -> TestResult {
    let fx = fixture()?;
    let clock = Clock::manual();
    let twin = twin_with(&fx, &clock, GithubTwinConfig::default()).await?;
    twin.add_collaborator(REPO, "wendy", "write")?;
    twin.add_collaborator(REPO, "mae", "maintain")?;
    twin.add_collaborator(REPO, "tri", "triage")?;
    twin.add_collaborator(REPO, "reed", "read")?;
    assert!(twin.add_collaborator(REPO, "x", "owner").is_err());
    let client = connect(&twin, &clock).await?;
    assert_eq!(client.permission(twin.login()).await?, Permission::Admin);
    assert_eq!(client.permission("home").await?, Permission::Admin);
    assert_eq!(client.permission("wendy").await?, Permission::Write);
    assert_eq!(client.permission("mae").await?, Permission::Maintain);
    assert_eq!(client.permission("tri").await?, Permission::Triage);
    assert_eq!(client.permission("reed").await?, Permission::Read);
    assert_eq!(client.permission("nobody").await?, Permission::None);
    assert!(client.permission("wendy").await?.can_write());
    assert!(!client.permission("tri").await?.can_write());
    assert!(matches!(
        client.permission("../../admin").await,
        Err(ForgeError::Refused(_))
    ));
    Ok(())
}

#[tokio::test]
async fn pulls_from_branches_and_forks_and_after_merge() -> TestResult {
    let fx = fixture()?;
    let clock = Clock::manual();
    let twin = twin_with(&fx, &clock, GithubTwinConfig::default()).await?;
    let renovate = twin
        .open_pull_request(REPO, BUMP, "main", "Update talos", "", RENOVATE_LOGIN)
        .await?;
    let fork_sha = twin
        .push_fork_commit(REPO, "mallory", "main", &[("evil", "1")], "evil")
        .await?;
    let fork = twin
        .open_fork_pull_request(REPO, "mallory", "main", "main", "Improve", "", "mallory")
        .await?;
    let client = connect(&twin, &clock).await?;

    let open = client.open_pulls().await?;
    assert_eq!(open.len(), 2);
    let r = open
        .iter()
        .find(|p| p.number == renovate.number)
        .ok_or("renovate PR missing")?;
    assert!(r.open && !r.merged && !r.from_fork);
    assert_eq!(r.head_ref, BUMP);
    assert_eq!(r.base_ref, "main");
    assert_eq!(r.head_sha, fx.bump.to_string());
    assert_eq!(r.author, RENOVATE_LOGIN);
    assert_eq!(r.title, "Update talos");
    assert_eq!(r.merge_commit_sha, None);
    let f = client.pull(fork.number).await?;
    assert!(f.from_fork && f.open);
    assert_eq!(f.head_ref, "main");
    assert_eq!(f.head_sha, fork_sha);
    assert_eq!(f.author, "mallory");

    // The webhook payload says the same.
    let opened = twin
        .deliveries()
        .into_iter()
        .filter(|d| d.event == "pull_request")
        .map(|d| serde_json::from_str::<serde_json::Value>(&d.body))
        .collect::<Result<Vec<_>, _>>()?;
    let fork_event = opened
        .iter()
        .find(|p| p["number"] == fork.number)
        .ok_or("no webhook for the fork PR")?;
    assert_eq!(fork_event["action"], "opened");
    assert_eq!(
        fork_event["pull_request"]["head"]["repo"]["full_name"],
        "mallory/ops"
    );
    assert_eq!(fork_event["pull_request"]["head"]["repo"]["fork"], true);
    assert_eq!(fork_event["pull_request"]["head"]["sha"], fork_sha.as_str());
    assert_eq!(fork_event["pull_request"]["base"]["ref"], "main");
    assert_eq!(fork_event["pull_request"]["merged"], false);
    assert_eq!(fork_event["repository"]["full_name"], REPO);

    let merge = twin
        .merge_pull_request(REPO, renovate.number, "home")
        .await?;
    let merged = client.pull(renovate.number).await?;
    assert!(merged.merged && !merged.open);
    assert_eq!(merged.merge_commit_sha.as_deref(), Some(merge.as_str()));
    let of_merge = client.pulls_for_commit(&merge).await?;
    assert_eq!(
        of_merge.iter().map(|p| p.number).collect::<Vec<_>>(),
        vec![renovate.number]
    );
    assert!(of_merge[0].merged);
    let still_open = client.open_pulls().await?;
    assert_eq!(
        still_open.iter().map(|p| p.number).collect::<Vec<_>>(),
        vec![fork.number]
    );
    Ok(())
}

#[tokio::test]
async fn the_token_never_appears_in_an_error() -> TestResult {
    let fx = fixture()?;
    let clock = Clock::manual();
    let twin = twin_with(&fx, &clock, GithubTwinConfig::default()).await?;
    let wrong = GithubConfig {
        api_url: twin.base_url(),
        repo: REPO.to_string(),
        auth: GithubAuth::Token(Secret::new("ghp_wrongsecret0123")),
    };
    let err = match GithubClient::connect(wrong, clock.clone()).await {
        Ok(_) => return Err("a wrong token was accepted".into()),
        Err(e) => e,
    };
    assert!(matches!(err, ForgeError::Unauthorized { .. }), "{err:?}");
    let client = connect(&twin, &clock).await?;
    let missing = client.pull(404).await;
    let bad_sha = client
        .set_status(
            &"0".repeat(40),
            "ichor/gate",
            StatusState::Success,
            "x",
            None,
        )
        .await;
    let unreachable = GithubClient::connect(
        GithubConfig {
            api_url: "http://127.0.0.1:9".into(),
            repo: REPO.into(),
            auth: GithubAuth::Token(Secret::new(twin.token())),
        },
        clock.clone(),
    );
    let unreachable = drive(&clock, tokio::spawn(unreachable)).await;
    let mut shown = format!("{err} {err:?}");
    for e in [missing.err(), bad_sha.err(), unreachable.err()] {
        let e = e.ok_or("expected an error")?;
        shown.push_str(&format!(" {e} {e:?}"));
    }
    assert!(shown.contains("404") && shown.contains("422"), "{shown}");
    assert!(!shown.contains("wrongsecret"), "{shown}");
    assert!(!shown.contains(twin.token()), "{shown}");
    Ok(())
}

// ----- the twin's App authentication, over plain HTTP -----

/// A JWT with the given claims, signed RS256 by `pem`.
fn jwt(pem: &str, claims: serde_json::Value) -> String {
    use base64::Engine as _;
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let key = ichor::forge::app::parse_private_key(&Secret::new(pem)).unwrap();
    let input = format!(
        "{}.{}",
        b64(br#"{"alg":"RS256","typ":"JWT"}"#),
        b64(claims.to_string().as_bytes())
    );
    let mut sig = vec![0u8; key.public().modulus_len()];
    key.sign(
        &ring::signature::RSA_PKCS1_SHA256,
        &ring::rand::SystemRandom::new(),
        input.as_bytes(),
        &mut sig,
    )
    .unwrap();
    format!("{input}.{}", b64(&sig))
}

/// One request to the twin; the status and the JSON body.
async fn raw(
    twin: &GithubTwin,
    method: &str,
    path: &str,
    bearer: &str,
) -> Result<(u16, serde_json::Value), Box<dyn std::error::Error>> {
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    let client: Client<_, axum::body::Body> = Client::builder(TokioExecutor::new()).build_http();
    let req = hyper::Request::builder()
        .method(method)
        .uri(format!("{}{path}", twin.base_url()))
        .header("authorization", format!("Bearer {bearer}"))
        .header("user-agent", "ichor-test")
        .body(axum::body::Body::empty())?;
    let resp = tokio::time::timeout(Duration::from_secs(20), client.request(req)).await??;
    let status = resp.status().as_u16();
    let bytes = axum::body::to_bytes(axum::body::Body::new(resp.into_body()), 1 << 20).await?;
    let json = if bytes.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_slice(&bytes)?
    };
    Ok((status, json))
}

#[tokio::test]
async fn the_twin_checks_jwt_times_and_token_scope_as_github_does() -> TestResult {
    let pem = APP_KEY.to_string();
    let fx = fixture()?;
    let clock = Clock::manual();
    let twin = twin_with(&fx, &clock, app_twin_config(&pem)?).await?;
    let now = (clock.now().as_millis() / 1000) as i64;
    let claims = |iat: i64, exp: i64| serde_json::json!({ "iat": iat, "exp": exp, "iss": 1234 });
    let message = |v: &serde_json::Value| v["message"].as_str().unwrap_or_default().to_string();

    let (status, app) = raw(
        &twin,
        "GET",
        "/app",
        &jwt(&pem, claims(now - 60, now + 540)),
    )
    .await?;
    assert_eq!(status, 200, "{app}");
    assert_eq!(app["slug"], "ichor");
    let (status, inst) = raw(
        &twin,
        "GET",
        "/repos/home/ops/installation",
        &jwt(&pem, claims(now - 60, now + 540)),
    )
    .await?;
    assert_eq!((status, inst["id"].clone()), (200, serde_json::json!(99)));

    for (iat, exp, expected) in [
        (
            now - 700,
            now - 100,
            "'Expiration time' claim ('exp') must be a numeric value",
        ),
        (now + 120, now + 500, "'Issued at' claim ('iat')"),
        (
            now - 60,
            now + 600,
            "'Expiration time' claim ('exp') is too far in the future",
        ),
    ] {
        let (status, body) = raw(&twin, "GET", "/app", &jwt(&pem, claims(iat, exp))).await?;
        assert_eq!(status, 401, "{body}");
        assert!(message(&body).starts_with(expected), "{body}");
    }
    // A personal access token is no JWT.
    let (status, _) = raw(&twin, "GET", "/app", twin.token()).await?;
    assert_eq!(status, 401);

    let (status, token) = raw(
        &twin,
        "POST",
        "/app/installations/99/access_tokens",
        &jwt(&pem, claims(now - 60, now + 540)),
    )
    .await?;
    assert_eq!(status, 201, "{token}");
    assert_eq!(token["repository_selection"], "selected");
    assert_eq!(
        token["expires_at"],
        clock.now().plus(Duration::from_secs(3600)).rfc3339()
    );
    let ghs = token["token"].as_str().unwrap_or_default().to_string();
    assert!(ghs.starts_with("ghs_"));
    let (status, _) = raw(
        &twin,
        "POST",
        "/app/installations/7/access_tokens",
        &jwt(&pem, claims(now - 60, now + 540)),
    )
    .await?;
    assert_eq!(status, 404, "not this App's installation");

    assert_eq!(
        raw(&twin, "GET", "/repos/home/ops/pulls", &ghs).await?.0,
        200
    );
    assert_eq!(
        raw(&twin, "GET", "/repos/other/repo/pulls", &ghs).await?.0,
        404
    );
    assert_eq!(raw(&twin, "GET", "/user", &ghs).await?.0, 403);
    clock.advance(Duration::from_secs(3600));
    let (status, body) = raw(&twin, "GET", "/repos/home/ops/pulls", &ghs).await?;
    assert_eq!(
        (status, message(&body)),
        (401, "Bad credentials".to_string())
    );
    Ok(())
}

/// Issue 17 item 4: a renamed or transferred repository answers its old name with GitHub's
/// redirect (301 for a GET, 307 for a write, `Location: …/repositories/{id}/…`). The client
/// follows it within the API, keeps the method and body, and goes straight to the new place
/// afterwards.
#[tokio::test]
async fn a_renamed_repository_is_followed_through_githubs_redirects() -> TestResult {
    let fx = fixture()?;
    let clock = Clock::manual();
    let twin = twin_with(&fx, &clock, GithubTwinConfig::default()).await?;
    let client = connect(&twin, &clock).await?;
    let sha = fx.bump.to_string();
    twin.rename_repo(REPO, "home/ops-renamed")?;

    // A write: 307 keeps the POST and its body.
    assert!(
        client
            .set_status(&sha, "ichor/gate", StatusState::Pending, "evaluating", None)
            .await?
    );
    let posted = twin.statuses("home/ops-renamed", &sha)?;
    assert_eq!(posted.len(), 1);
    assert_eq!(posted[0].description.as_deref(), Some("evaluating"));
    // A read after the move is learnt goes to `/repositories/{id}` at once: one answer,
    // no redirect in between.
    let before = client.stats().requests;
    client.open_pulls().await?;
    assert_eq!(client.stats().requests - before, 1);
    // A fresh client meets the 301 on its first read and follows it.
    let fresh = connect(&twin, &clock).await?;
    let before = fresh.stats().requests;
    fresh.open_pulls().await?;
    assert_eq!(fresh.stats().requests - before, 2, "a 301, then the answer");
    Ok(())
}

#[tokio::test]
async fn requests_name_ichor_and_a_request_without_a_user_agent_is_refused() -> TestResult {
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    let fx = fixture()?;
    let clock = Clock::manual();
    let twin = twin_with(&fx, &clock, GithubTwinConfig::default()).await?;
    // As GitHub does: no `User-Agent`, no answer but 403.
    let client: Client<_, axum::body::Body> = Client::builder(TokioExecutor::new()).build_http();
    let req = hyper::Request::builder()
        .uri(format!("{}/repos/{REPO}", twin.base_url()))
        .header("authorization", format!("Bearer {}", twin.token()))
        .body(axum::body::Body::empty())?;
    let resp = tokio::time::timeout(Duration::from_secs(20), client.request(req)).await??;
    assert_eq!(resp.status().as_u16(), 403);
    let bytes = axum::body::to_bytes(axum::body::Body::new(resp.into_body()), 1 << 20).await?;
    let body: serde_json::Value = serde_json::from_slice(&bytes)?;
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("User-Agent"),
        "{body}"
    );
    // ichor's client names itself, so the same twin answers it.
    let ichor = connect(&twin, &clock).await?;
    assert_eq!(ichor.login(), twin.login());
    assert!(ichor.open_pulls().await?.is_empty());
    // octocrab appends its own `octocrab` after it; ichor's comes first.
    assert_eq!(
        twin.last_user_agent().first().map(String::as_str),
        Some(concat!("ichor/", env!("CARGO_PKG_VERSION")))
    );
    Ok(())
}
