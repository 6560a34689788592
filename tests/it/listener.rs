//! The webhook listener faces the internet: slow and stalled clients are cut off, HTTP/2 is
//! not spoken, a flood of connections does not reach `/healthz` on the ops port, an
//! oversized body is refused before it is read and counted, and without a webhook secret
//! nothing listens at all. Over real sockets against `ichor run` and the GitHub emulator.
//!
//! Nothing here sleeps: a test waits for the server to close a connection, or on the
//! controller's activity counter. The timeouts are short ones passed through
//! `controller::start_with`; every wait has a generous bound of real time that only a
//! hang reaches.

use std::net::SocketAddr;
use std::time::Duration;

use ichor::clock::Clock;
use ichor::controller::{self, http::Limits, Config, Running};
use ichor::forge::webhook::MAX_BODY_BYTES;
use ichor::sim::github::{GithubTwin, GithubTwinConfig, RepoSpec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::controller::origin;

type TestResult = Result<(), Box<dyn std::error::Error>>;
type Error = Box<dyn std::error::Error>;

const REPO: &str = "acme/homelab";
const SECRET: &str = "listener-test-secret";
/// Only a hang waits this long.
const BOUND: Duration = Duration::from_secs(60);

/// The emulator and a directory with the token, the secret and ichor's state. The cluster
/// is gated only, through a kubeconfig that does not exist: these tests are about the
/// listeners, not the loop.
struct Front {
    gh: GithubTwin,
    dir: tempfile::TempDir,
}

impl Front {
    async fn start() -> Result<Front, Error> {
        let dir = tempfile::tempdir()?;
        let origin = origin(dir.path())?;
        let gh = GithubTwin::start_with(
            Clock::system(),
            GithubTwinConfig {
                repos: vec![RepoSpec {
                    full_name: REPO.into(),
                    path: origin,
                    default_branch: "main".into(),
                }],
                ..GithubTwinConfig::default()
            },
        )
        .await?;
        std::fs::write(dir.path().join("token"), gh.token())?;
        std::fs::write(dir.path().join("secret"), SECRET)?;
        Ok(Front { gh, dir })
    }

    fn config_text(&self, webhook: bool, listen: &str) -> String {
        let d = self.dir.path();
        let webhook = if webhook {
            format!("webhook:\n  secretFile: {}\n", d.join("secret").display())
        } else {
            String::new()
        };
        format!(
            "repository:\n  url: {url}\n  branch: main\n\
             github:\n  repository: {REPO}\n  apiUrl: {api}\n\
             credentials:\n  github:\n    tokenFile: {token}\n\
             {webhook}\
             clusters:\n  - name: homelab\n    kubeconfig: {kc}\n    act: false\n\
             pollInterval: 10m\nlisten: {listen}\nmetricsListen: 127.0.0.1:0\nstateDir: {state}\n\
             leaderElection:\n  identity: listener\n",
            url = self.gh.clone_url(REPO),
            api = self.gh.base_url(),
            token = d.join("token").display(),
            kc = d.join("no-kubeconfig").display(),
            state = d.join("ichor").display(),
        )
    }

    async fn run(&self, limits: Limits) -> Result<Running, Error> {
        let cfg = Config::parse("listener-test.yaml", &self.config_text(true, "127.0.0.1:0"))?;
        Ok(controller::start_with(cfg, Clock::system(), limits).await?)
    }
}

fn webhook_addr(running: &Running) -> Result<SocketAddr, Error> {
    Ok(running.webhook_addr.ok_or("no webhook listener")?)
}

/// Read until the server closes the connection (a reset counts as closed); what came.
/// Fails only when the server keeps it open past [`BOUND`].
async fn until_closed(stream: &mut TcpStream) -> Result<Vec<u8>, Error> {
    let mut got = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(BOUND, read)
        .await
        .map_err(|_| "the server kept the connection open")?;
    Ok(got)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn connections(running: &Running, listener: &str, outcome: &str) -> f64 {
    running.ctx.metrics.value(
        "ichor_http_connections_total",
        &[("listener", listener), ("outcome", outcome)],
    )
}

/// The connection count once the connection's task has ended. The client can see the close
/// first: hyper half-closes the socket before its connection future returns the error the
/// count is made from. Waits for the count (at most 5 s), never for a set time.
async fn connections_counted(running: &Running, listener: &str, outcome: &str) -> f64 {
    let give_up = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let n = connections(running, listener, outcome);
        if n > 0.0 || std::time::Instant::now() > give_up {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn refused(running: &Running, reason: &str) -> f64 {
    running.ctx.metrics.value(
        "ichor_webhook_deliveries_total",
        &[("result", "refused"), ("reason", reason)],
    )
}

/// GET a path on the ops port: the status and the body.
async fn get(addr: SocketAddr, path: &str) -> Result<(u16, String), Error> {
    use http_body_util::BodyExt;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<axum::body::Bytes>>();
    let uri: http::Uri = format!("http://{addr}{path}").parse()?;
    let resp = tokio::time::timeout(BOUND, client.get(uri))
        .await
        .map_err(|_| format!("{path} did not answer"))??;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, text(&body)))
}

fn short() -> Limits {
    Limits {
        header_timeout: Duration::from_secs(1),
        body_deadline: Duration::from_secs(1),
        ..Limits::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_head_that_never_ends_is_cut_off() -> TestResult {
    let front = Front::start().await?;
    let running = front.run(short()).await?;
    let mut slow = TcpStream::connect(webhook_addr(&running)?).await?;
    slow.write_all(b"POST /webhook HTTP/1.1\r\nHost: ichor\r\nX-GitHub-Event: ping\r\n")
        .await?;
    let got = until_closed(&mut slow).await?;
    assert!(got.is_empty(), "answered: {}", text(&got));
    assert_eq!(
        connections_counted(&running, "webhook", "header_timeout").await,
        1.0
    );
    running.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_head_past_its_bound_is_answered_431() -> TestResult {
    let front = Front::start().await?;
    let running = front.run(Limits::default()).await?;
    let mut big = TcpStream::connect(webhook_addr(&running)?).await?;
    // Exactly the bound, and not yet a whole head: the server reads all of it (so it closes
    // without a reset) and has no room for more.
    let mut head = b"POST /webhook HTTP/1.1\r\nHost: ichor\r\nX-Padding: ".to_vec();
    head.resize(controller::http::MAX_HEAD_BYTES, b'x');
    big.write_all(&head).await?;
    let got = text(&until_closed(&mut big).await?);
    assert!(got.starts_with("HTTP/1.1 431"), "{got}");
    assert_eq!(
        connections_counted(&running, "webhook", "bad_request").await,
        1.0
    );
    running.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_alive_connection_that_idles_is_closed() -> TestResult {
    let front = Front::start().await?;
    let running = front.run(short()).await?;
    let mut idle = TcpStream::connect(webhook_addr(&running)?).await?;
    // A whole request (unsigned, so refused): then the connection waits for the next one.
    idle.write_all(
        b"POST /webhook HTTP/1.1\r\nHost: ichor\r\nX-GitHub-Event: ping\r\nX-GitHub-Delivery: idle-1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
    )
    .await?;
    let got = text(&until_closed(&mut idle).await?);
    assert!(got.starts_with("HTTP/1.1 401"), "{got}");
    assert!(
        !got.to_ascii_lowercase().contains("connection: close"),
        "the answer kept the connection open: {got}"
    );
    assert_eq!(refused(&running, "missing_signature"), 1.0);
    assert_eq!(
        connections_counted(&running, "webhook", "header_timeout").await,
        1.0
    );
    running.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_is_answered_408_counted_and_cut_off() -> TestResult {
    let front = Front::start().await?;
    let running = front.run(short()).await?;
    let mut stalled = TcpStream::connect(webhook_addr(&running)?).await?;
    // As much as a body may be, declared; a few bytes of it sent.
    stalled
        .write_all(
            format!("POST /webhook HTTP/1.1\r\nHost: ichor\r\nX-GitHub-Event: push\r\nX-GitHub-Delivery: stalled-1\r\nContent-Type: application/json\r\nContent-Length: {MAX_BODY_BYTES}\r\n\r\n{{\"ref\":\"r").as_bytes(),
        )
        .await?;
    let got = text(&until_closed(&mut stalled).await?);
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(
        got.to_ascii_lowercase().contains("connection: close"),
        "{got}"
    );
    assert_eq!(refused(&running, "slow_body"), 1.0);
    assert_eq!(
        running
            .ctx
            .metrics
            .value("ichor_webhook_bodies_reading", &[]),
        0.0,
        "the body's slot is given back"
    );
    running.shutdown().await;
    Ok(())
}

/// The HTTP/2 connection preface, then an empty SETTINGS frame, as a prior-knowledge
/// client opens (RFC 9113 §3.4).
const H2_OPENING: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_prior_knowledge_is_refused_on_both_ports() -> TestResult {
    let front = Front::start().await?;
    let running = front.run(Limits::default()).await?;
    for (name, addr) in [
        ("webhook", webhook_addr(&running)?),
        ("ops", running.metrics_addr),
    ] {
        let mut h2 = TcpStream::connect(addr).await?;
        h2.write_all(H2_OPENING).await?;
        let got = until_closed(&mut h2).await?;
        // An HTTP/2 server answers with its own SETTINGS frame (type 4 in the fourth byte).
        assert!(
            got.is_empty(),
            "{name}: the server answered the HTTP/2 preface with {got:?}"
        );
        assert_eq!(
            connections_counted(&running, name, "not_http1").await,
            1.0,
            "{name}"
        );
    }
    // And hyper's own HTTP/2 client gets no answer either.
    let io = hyper_util::rt::TokioIo::new(TcpStream::connect(webhook_addr(&running)?).await?);
    let h2 = tokio::time::timeout(BOUND, async {
        let (mut send, conn) = hyper::client::conn::http2::handshake::<
            _,
            _,
            http_body_util::Empty<axum::body::Bytes>,
        >(hyper_util::rt::TokioExecutor::new(), io)
        .await?;
        tokio::spawn(conn);
        let req = http::Request::post("http://ichor/webhook").body(http_body_util::Empty::new())?;
        send.send_request(req).await?;
        Ok::<_, Error>(())
    })
    .await
    .map_err(|_| "the HTTP/2 client hung")?;
    assert!(h2.is_err(), "an HTTP/2 request was answered");
    running.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_connection_cap_new_connections_are_closed_and_healthz_still_answers() -> TestResult
{
    let front = Front::start().await?;
    let cap = 4;
    let running = front
        .run(Limits {
            webhook_connections: cap,
            // The holders below must outlive the test's own pace, however loaded the machine.
            header_timeout: Duration::from_secs(120),
            ..Limits::default()
        })
        .await?;
    let addr = webhook_addr(&running)?;
    let mut holders = Vec::new();
    for _ in 0..cap {
        holders.push(TcpStream::connect(addr).await?);
    }
    // The listener takes connections in the order they completed: these come after the
    // holders, find no slot, and are closed at once without a byte.
    let flood = 50;
    for i in 0..flood {
        let mut over = TcpStream::connect(addr).await?;
        let got = until_closed(&mut over).await?;
        assert!(
            got.is_empty(),
            "connection {i} past the cap: {}",
            text(&got)
        );
    }
    assert_eq!(
        connections(&running, "webhook", "over_cap"),
        f64::from(flood)
    );
    let (status, body) = get(running.metrics_addr, "/healthz").await?;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let (status, metrics) = get(running.metrics_addr, "/metrics").await?;
    assert_eq!(status, 200);
    assert!(
        metrics.contains(&format!(
            "ichor_http_connections_total{{listener=\"webhook\",outcome=\"over_cap\"}} {flood}"
        )),
        "{metrics}"
    );
    // The holders go: their slots come back as the server sees them close, and the next
    // connection is served (an unsigned delivery: 401).
    drop(holders);
    let served = tokio::time::timeout(BOUND, async {
        loop {
            let Ok(mut c) = TcpStream::connect(addr).await else {
                continue;
            };
            let sent = c
                .write_all(b"POST /webhook HTTP/1.1\r\nHost: ichor\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
                .await;
            if sent.is_err() {
                continue;
            }
            let got = until_closed(&mut c).await.unwrap_or_default();
            if !got.is_empty() {
                return text(&got);
            }
        }
    })
    .await
    .map_err(|_| "no connection was served after the holders left")?;
    assert!(served.starts_with("HTTP/1.1 401"), "{served}");
    running.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_bodies_read_at_once_a_delivery_is_answered_503_and_counted() -> TestResult {
    let front = Front::start().await?;
    let in_flight = 2;
    let running = front
        .run(Limits {
            webhook_in_flight: in_flight,
            body_deadline: Duration::from_secs(120),
            ..Limits::default()
        })
        .await?;
    let addr = webhook_addr(&running)?;
    let mut stalled = Vec::new();
    for i in 0..in_flight {
        let mut c = TcpStream::connect(addr).await?;
        c.write_all(
            format!("POST /webhook HTTP/1.1\r\nHost: ichor\r\nX-GitHub-Delivery: stalled-{i}\r\nContent-Length: 100\r\n\r\n{{").as_bytes(),
        )
        .await?;
        stalled.push(c);
    }
    let ctx = running.ctx.clone();
    let reading = |n: f64| {
        let ctx = ctx.clone();
        move || ctx.metrics.value("ichor_webhook_bodies_reading", &[]) == n
    };
    assert!(
        running
            .wait_until(std::future::pending(), reading(2.0), BOUND)
            .await,
        "the stalled bodies are being read"
    );
    let mut third = TcpStream::connect(addr).await?;
    third
        .write_all(b"POST /webhook HTTP/1.1\r\nHost: ichor\r\nContent-Length: 2\r\n\r\n{}")
        .await?;
    let got = text(&until_closed(&mut third).await?);
    assert!(got.starts_with("HTTP/1.1 503"), "{got}");
    assert_eq!(refused(&running, "busy"), 1.0);
    let (status, _) = get(running.metrics_addr, "/healthz").await?;
    assert_eq!(status, 200);
    // The senders give up: their slots come back.
    drop(stalled);
    assert!(
        running
            .wait_until(std::future::pending(), reading(0.0), BOUND)
            .await,
        "the slots are given back"
    );
    assert_eq!(refused(&running, "bad_body"), 2.0);
    running.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_body_is_refused_413_before_it_is_read_and_counted() -> TestResult {
    let front = Front::start().await?;
    let running = front.run(Limits::default()).await?;
    let addr = webhook_addr(&running)?;
    // Declared too large: answered before a byte of the body is sent.
    let mut declared = TcpStream::connect(addr).await?;
    declared
        .write_all(
            format!(
                "POST /webhook HTTP/1.1\r\nHost: ichor\r\nX-GitHub-Event: push\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                MAX_BODY_BYTES + 1
            )
            .as_bytes(),
        )
        .await?;
    let got = text(&until_closed(&mut declared).await?);
    assert!(got.starts_with("HTTP/1.1 413"), "{got}");
    assert_eq!(refused(&running, "too_large"), 1.0);
    // Chunked, with no length declared: cut off once the bound is passed. The client may
    // see a reset instead of the answer, since it is still writing; the count says.
    let mut chunked = TcpStream::connect(addr).await?;
    chunked
        .write_all(b"POST /webhook HTTP/1.1\r\nHost: ichor\r\nTransfer-Encoding: chunked\r\n\r\n")
        .await?;
    let (mut rd, mut wr) = chunked.into_split();
    let writer = tokio::spawn(async move {
        let chunk = vec![b'x'; 64 * 1024];
        let mut head = format!("{:x}\r\n", chunk.len()).into_bytes();
        head.extend_from_slice(&chunk);
        head.extend_from_slice(b"\r\n");
        for _ in 0..=(MAX_BODY_BYTES / chunk.len()) {
            if wr.write_all(&head).await.is_err() {
                return;
            }
        }
        let _ = wr.write_all(b"0\r\n\r\n").await;
    });
    let read = tokio::time::timeout(BOUND, async {
        let mut buf = [0u8; 4096];
        while let Ok(n) = rd.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the server kept reading an oversized body");
    writer.abort();
    assert_eq!(refused(&running, "too_large"), 2.0);
    let (_, metrics) = get(running.metrics_addr, "/metrics").await?;
    assert!(
        metrics
            .contains("ichor_webhook_deliveries_total{result=\"refused\",reason=\"too_large\"} 2"),
        "{metrics}"
    );
    running.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_webhook_secret_nothing_listens_on_listen() -> TestResult {
    let front = Front::start().await?;
    // `listen` names a port something else holds: binding it would fail the start.
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let listen = taken.local_addr()?.to_string();
    let cfg = Config::parse("listener-test.yaml", &front.config_text(false, &listen))?;
    let running = controller::start(cfg, Clock::system()).await?;
    assert_eq!(running.webhook_addr, None);
    assert_eq!(running.webhook_url(), None);
    let (status, _) = get(running.metrics_addr, "/healthz").await?;
    assert_eq!(status, 200);
    running.shutdown().await;

    // Git-only mode (a repository on disk, no GitHub): no webhook listener either.
    std::fs::create_dir_all(front.dir.path().join("git-only"))?;
    let git_only = format!(
        "repository:\n  path: {}\nclusters:\n  - name: homelab\n    kubeconfig: {}\n    act: false\n\
         listen: {listen}\nmetricsListen: 127.0.0.1:0\nstateDir: {}\n",
        origin(&front.dir.path().join("git-only"))?.display(),
        front.dir.path().join("no-kubeconfig").display(),
        front.dir.path().join("git-only-state").display(),
    );
    let running =
        controller::start(Config::parse("git-only.yaml", &git_only)?, Clock::system()).await?;
    assert_eq!(running.webhook_addr, None);
    running.shutdown().await;
    drop(taken);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ichor_run_check_says_whether_a_webhook_listener_is_bound() -> TestResult {
    let front = Front::start().await?;
    let check = |name: &str, text: String| -> Result<String, Error> {
        let path = front.dir.path().join(name);
        std::fs::write(&path, text)?;
        let out = crate::ichor(&["run", "--config", &path.to_string_lossy(), "--check"]);
        assert!(out.status.success(), "{}", crate::stderr(&out));
        Ok(crate::stdout(&out))
    };
    let with = check("with.yaml", front.config_text(true, "127.0.0.1:8080"))?;
    assert!(
        with.contains("GitHub mode; webhooks on 127.0.0.1:8080"),
        "{with}"
    );
    let without = check("without.yaml", front.config_text(false, "127.0.0.1:8080"))?;
    assert!(
        without.contains("GitHub mode; no webhook secret: no webhook listener, polls every 10m"),
        "{without}"
    );
    // Git-only mode pushes its notes into repository.path: a bare repository.
    let bare = front.dir.path().join("homelab.git");
    git2::Repository::init_bare(&bare)?;
    let git_only = check(
        "git-only.yaml",
        format!(
            "repository:\n  path: {}\nclusters:\n  - name: homelab\n    act: false\n",
            bare.display()
        ),
    )?;
    assert!(
        git_only.contains("Git-only mode; no webhook listener)"),
        "{git_only}"
    );
    Ok(())
}
