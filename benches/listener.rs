//! The webhook listener under stalled clients: how much resident memory `ichor run` grows
//! by while many connections hold a request open. Run with `cargo bench --bench listener`;
//! the figures are printed, never asserted. `ICHOR_BENCH_CONNECTIONS` (default 200) sets
//! how many connections, `ICHOR_BENCH_PARTIAL_MIB` (default 3) how much of a declared
//! 4 MiB body each sends before it stalls.
//!
//! 1. Stalled heads: each connection sends part of a request head and stops.
//! 2. Stalled bodies: each sends a whole head declaring a 4 MiB body, then part of the body,
//!    and stops. Without bounds each would be buffered (100 of them held about 380 MB).
//!
//! The controller runs with the default caps and head bound; only the timeouts are
//! longer (60 s), so that the clients are still stalled when the memory is read. The
//! clients run in the same process and write from one shared buffer, so the figure is
//! the server's buffers plus the clients' sockets: an upper bound.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ichor::clock::Clock;
use ichor::controller::{self, http, Config, Running};
use ichor::forge::webhook::MAX_BODY_BYTES;
use ichor::sim::github::{GithubTwin, GithubTwinConfig, RepoSpec};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

type Error = Box<dyn std::error::Error + Send + Sync>;

const REPO: &str = "bench/homelab";
const MIB: f64 = 1024.0 * 1024.0;

fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .unwrap_or(0.0)
        / 1024.0
}

fn main() -> Result<(), Error> {
    let connections: usize = std::env::var("ICHOR_BENCH_CONNECTIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
        .clamp(1, 5000);
    let partial_mib: usize = std::env::var("ICHOR_BENCH_PARTIAL_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .clamp(1, 4);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(bench(connections, partial_mib * 1024 * 1024 - 1))
}

async fn start(dir: &std::path::Path) -> Result<(GithubTwin, Running), Error> {
    let work = dir.join("work");
    ichor::sim::fixture::Fixture::homelab().build(&work)?;
    let origin = ichor::sim::github::private_clone(&work, dir, REPO)?;
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
    std::fs::write(dir.join("token"), gh.token())?;
    std::fs::write(dir.join("secret"), "bench-secret")?;
    let text = format!(
        "repository:\n  url: {}\ngithub:\n  repository: {REPO}\n  apiUrl: {}\n\
         credentials:\n  github:\n    tokenFile: {}\nwebhook:\n  secretFile: {}\n\
         clusters:\n  - name: homelab\n    kubeconfig: {}\n    act: false\n\
         pollInterval: 1h\nlisten: 127.0.0.1:0\nmetricsListen: 127.0.0.1:0\nstateDir: {}\n",
        gh.clone_url(REPO),
        gh.base_url(),
        dir.join("token").display(),
        dir.join("secret").display(),
        dir.join("no-kubeconfig").display(),
        dir.join("ichor").display(),
    );
    let limits = http::Limits {
        header_timeout: Duration::from_secs(60),
        body_deadline: Duration::from_secs(60),
        ..http::Limits::default()
    };
    let running =
        controller::start_with(Config::parse("bench", &text)?, Clock::system(), limits).await?;
    Ok((gh, running))
}

/// Open `n` connections that each write `opening` and then `body` bytes from `chunk`,
/// and hold them; returns the streams still open once every write ended.
async fn stall(
    addr: std::net::SocketAddr,
    n: usize,
    opening: &[u8],
    body: usize,
    chunk: &Arc<Vec<u8>>,
) -> Vec<TcpStream> {
    let mut tasks = Vec::new();
    for _ in 0..n {
        let (opening, chunk) = (opening.to_vec(), chunk.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = TcpStream::connect(addr).await.ok()?;
            c.write_all(&opening).await.ok()?;
            let mut left = body;
            while left > 0 {
                let take = left.min(chunk.len());
                // A refused connection stops here; a stalled one stops when its body is sent.
                match tokio::time::timeout(Duration::from_secs(20), c.write_all(&chunk[..take]))
                    .await
                {
                    Ok(Ok(())) => left -= take,
                    _ => break,
                }
            }
            Some(c)
        }));
    }
    let mut open = Vec::new();
    for t in tasks {
        if let Ok(Some(c)) = t.await {
            open.push(c);
        }
    }
    open
}

/// The highest RSS once the server has taken what the clients sent: the clients' writes
/// end when the kernel has the bytes, not when ichor has read them, so RSS is sampled (on
/// tokio's clock) until it has not risen for a second, at most 10 s.
async fn settled_rss_mib() -> f64 {
    let mut peak = rss_mib();
    let mut flat = 0;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = rss_mib();
        if now > peak + 0.25 {
            peak = now;
            flat = 0;
        } else {
            peak = peak.max(now);
            flat += 1;
            if flat >= 10 {
                break;
            }
        }
    }
    peak
}

fn count(running: &Running, name: &str, pairs: &[(&str, &str)]) -> f64 {
    running.ctx.metrics.value(name, pairs)
}

fn over_cap(running: &Running) -> f64 {
    count(
        running,
        "ichor_http_connections_total",
        &[("listener", "webhook"), ("outcome", "over_cap")],
    )
}

fn busy(running: &Running) -> f64 {
    count(
        running,
        "ichor_webhook_deliveries_total",
        &[("result", "refused"), ("reason", "busy")],
    )
}

/// Wait (on tokio's clock, at most 10 s) until `n` connections have ended on the webhook
/// port in all, so the next phase starts with every slot free.
async fn all_ended(running: &Running, n: f64) {
    for _ in 0..200 {
        if running.ctx.metrics.total("ichor_http_connections_total") >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn bench(n: usize, partial: usize) -> Result<(), Error> {
    let dir = tempfile::tempdir()?;
    let (_gh, running) = start(dir.path()).await?;
    let addr = running.webhook_addr.ok_or("no webhook listener")?;
    let chunk = Arc::new(vec![b'x'; 64 * 1024]);
    let bound_heads = http::WEBHOOK_CONNECTIONS as f64 * http::MAX_HEAD_BYTES as f64 / MIB;
    let bound_bodies = http::WEBHOOK_IN_FLIGHT as f64 * MAX_BODY_BYTES as f64 / MIB;
    println!(
        "limits: {} webhook connections, {} bodies read at once, {} KiB per head, {} MiB per body",
        http::WEBHOOK_CONNECTIONS,
        http::WEBHOOK_IN_FLIGHT,
        http::MAX_HEAD_BYTES / 1024,
        MAX_BODY_BYTES / 1024 / 1024
    );

    // 1. Stalled heads: 8 KiB of a header line that never ends.
    let before = rss_mib();
    let t0 = Instant::now();
    let head = b"POST /webhook HTTP/1.1\r\nHost: ichor\r\nX-GitHub-Event: push\r\nX-Padding: ";
    let held = stall(addr, n, head, 8 * 1024, &chunk).await;
    let opened = t0.elapsed().as_secs_f64();
    let peak = settled_rss_mib().await;
    let grown = peak - before;
    let refused = over_cap(&running);
    println!("\n1. {n} connections sending 8 KiB of a request head that never ends ({opened:.1} s to open)");
    println!(
        "   held {}, closed past the cap {refused}",
        n as f64 - refused
    );
    println!(
        "   RSS {before:.1} MiB → {peak:.1} MiB: grew {grown:.1} MiB ({:.1} KiB a connection; \
         the heads' bound is {bound_heads:.1} MiB)",
        grown * 1024.0 / n as f64,
    );
    drop(held);
    all_ended(&running, n as f64).await;

    // 2. Stalled bodies.
    let (over_before, busy_before) = (over_cap(&running), busy(&running));
    let before = rss_mib();
    let t0 = Instant::now();
    let opening = format!(
        "POST /webhook HTTP/1.1\r\nHost: ichor\r\nX-GitHub-Event: push\r\nX-GitHub-Delivery: stalled\r\n\
         Content-Type: application/json\r\nContent-Length: {MAX_BODY_BYTES}\r\n\r\n"
    );
    let held = stall(addr, n, opening.as_bytes(), partial, &chunk).await;
    let sent = t0.elapsed().as_secs_f64();
    let peak = settled_rss_mib().await;
    let grown = peak - before;
    let reading = count(&running, "ichor_webhook_bodies_reading", &[]);
    let unbounded = n as f64 * partial as f64 / MIB;
    println!(
        "\n2. {n} connections sending {:.1} MiB of a declared {} MiB body, then stalling ({sent:.1} s to send)",
        partial as f64 / MIB,
        MAX_BODY_BYTES / 1024 / 1024,
    );
    println!(
        "   bodies being read {reading}, answered 503 busy {}, closed past the cap {}",
        busy(&running) - busy_before,
        over_cap(&running) - over_before,
    );
    println!(
        "   RSS {before:.1} MiB → {peak:.1} MiB: grew {grown:.1} MiB, against {unbounded:.0} MiB an \
         unbounded listener would buffer (ratio {:.3}; the bodies' bound is {bound_bodies:.0} MiB)",
        grown / unbounded,
    );
    let status = healthz(running.metrics_addr).await;
    println!("   /healthz meanwhile: {status}");
    drop(held);
    running.shutdown().await;
    Ok(())
}

/// The status line `/healthz` answers with.
async fn healthz(addr: std::net::SocketAddr) -> String {
    use tokio::io::AsyncReadExt;
    let Ok(mut c) = TcpStream::connect(addr).await else {
        return "no connection".into();
    };
    if c.write_all(b"GET /healthz HTTP/1.1\r\nHost: ichor\r\nConnection: close\r\n\r\n")
        .await
        .is_err()
    {
        return "write failed".into();
    }
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out);
    text.lines().next().unwrap_or("no answer").to_string()
}
