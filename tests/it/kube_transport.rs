//! ichor's Kubernetes client on the wire: HTTP/2 to the twin's API server over a real TLS
//! socket, every request and watch on one connection, and a watch budget that keeps
//! requests flowing when the server's streams per connection run short.

use std::time::Duration;

use futures_util::future::join_all;
use ichor::clock::Clock;
use ichor::kube::changes::Scope;
use ichor::kube::KubeClient;
use ichor::sim::kube::{Behaviour, KubeSeed, KubeTwin};
use ichor::sim::net::NetLimits;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A failure guard only: every wait below ends on an answer, long before this.
const GUARD: Duration = Duration::from_secs(30);

async fn twin(limits: NetLimits) -> Result<(KubeTwin, tempfile::TempDir, Clock), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let clock = Clock::manual();
    let t = KubeTwin::start_with_limits(
        clock.clone(),
        KubeSeed::nodes(1, 3),
        Behaviour::default(),
        limits,
        dir.path(),
    )
    .await
    .map_err(|e| e.to_string())?;
    Ok((t, dir, clock))
}

/// Requests and the watches of three steps share one connection, as client-go's do: one
/// TLS handshake, not one per watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_and_watches_share_one_connection() -> TestResult {
    let (t, _dir, clock) = twin(NetLimits::default()).await?;
    let kube = KubeClient::connect(Some(t.kubeconfig.as_path())).await?;
    let nodes = kube.nodes().await?;
    assert_eq!(nodes.len(), 4);
    let watches: Vec<_> = nodes
        .iter()
        .skip(1)
        .map(|n| kube.changes_of(&n.name, &[], &clock))
        .collect();
    tokio::time::timeout(GUARD, join_all(watches.iter().map(|w| w.watching()))).await?;
    let reads = join_all(nodes.iter().map(|n| kube.node(&n.name))).await;
    assert!(reads.iter().all(|r| matches!(r, Ok(Some(_)))), "{reads:?}");
    assert_eq!(t.connections(), 1, "connections the API server accepted");
    Ok(())
}

/// The server allows 8 streams on a connection and the client holds at most 4 watches:
/// three steps' watches (nine) do not take every stream, so reads still get answers, and
/// the watches past the budget fall back to a change on every beat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_past_the_budget_poll_and_leave_streams_for_requests() -> TestResult {
    let limits = NetLimits {
        http2_max_streams: 8,
        ..NetLimits::default()
    };
    let (t, _dir, clock) = twin(limits).await?;
    let kube = KubeClient::connect(Some(t.kubeconfig.as_path()))
        .await?
        .with_watch_streams(4);
    let workers: Vec<String> = kube
        .nodes()
        .await?
        .into_iter()
        .skip(1)
        .map(|n| n.name)
        .collect();
    let watches: Vec<_> = workers
        .iter()
        .map(|n| kube.changes_of(n, &[], &clock))
        .collect();
    tokio::time::timeout(GUARD, join_all(watches.iter().map(|w| w.watching()))).await?;
    assert_eq!(kube.free_watch_streams(), 0);
    for w in &watches {
        w.take();
    }
    // Sixteen reads at once over the four streams left.
    let reads = tokio::time::timeout(
        GUARD,
        join_all((0..16).map(|i| kube.node(&workers[i % workers.len()]))),
    )
    .await?;
    assert!(reads.iter().all(|r| matches!(r, Ok(Some(_)))), "{reads:?}");
    // A beat later, the watches with no stream say "look".
    clock.advance(Duration::from_secs(6));
    let looks = watches
        .iter()
        .map(|w| Box::pin(w.changed(Scope::EVERYTHING)));
    tokio::time::timeout(GUARD, futures_util::future::select_all(looks)).await?;
    Ok(())
}
