//! How ichor's Kubernetes client reaches the API server: over HTTP/2 when the server offers
//! it, as client-go does.
//!
//! kube-rs's own stack speaks HTTP/1.1 only, so every watch a step holds (a list, then a
//! long-lived response) took a connection of its own, with its own TLS handshake, for as
//! long as the step lasted. client-go negotiates HTTP/2 through ALPN
//! (`k8s.io/apimachinery/pkg/util/net/http.go`, `SetTransportDefaults` →
//! `http2.ConfigureTransports`), so all of a client's requests and watches share one
//! connection; kube-apiserver serves HTTP/2 with up to 1000 streams per connection
//! (`cmd/kube-apiserver/app/options`, `HTTP2MaxStreamsPerConnection`). Here the same: ALPN
//! offers `h2` and `http/1.1`, and a server that picks HTTP/1.1 gets it.
//!
//! The rest follows what kube-rs builds (`kube-client` `client/builder.rs`): its TLS
//! configuration (CA, client certificate, exec credentials, `tls-server-name`), its base URI,
//! authorization and extra-header layers. No retries (see `KubeClient::connect`). A proxy
//! in the kubeconfig keeps kube-rs's own HTTP/1.1 stack, which knows proxies.

use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::ConfigExt;
use tower::ServiceBuilder;

/// How long a TCP connect may take (kube-rs's `Config::connect_timeout` default).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// With streams open and nothing read for this long, the connection is pinged; client-go's
/// HTTP/2 health check does the same (`HTTP2_READ_IDLE_TIMEOUT_SECONDS`, default 30).
const PING_AFTER: Duration = Duration::from_secs(30);
/// A ping unanswered for this long ends the connection, and its requests fail (client-go's
/// `HTTP2_PING_TIMEOUT_SECONDS`, default 15): a half-open connection is not waited on.
const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// A client for `config` (retries already off), over HTTP/2 where the server offers it.
pub(super) fn client_of(config: kube::Config) -> Result<kube::Client, kube::Error> {
    if config.proxy_url.is_some() {
        return kube::Client::try_from(config);
    }
    let tls = config.rustls_client_config()?;
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_connect_timeout(Some(CONNECT_TIMEOUT));
    // Go sets TCP_NODELAY on every TCP connection; HTTP/2 writes small frames (headers,
    // window updates, pings) that Nagle's algorithm would hold back.
    tcp.set_nodelay(true);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    let https = match &config.tls_server_name {
        Some(name) => {
            let name = tokio_rustls::rustls::pki_types::ServerName::try_from(name.clone())
                .map_err(|e| {
                    kube::Error::Service(format!("tls-server-name {name:?}: {e}").into())
                })?;
            https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name))
        }
        None => https,
    };
    let https = https.enable_all_versions().wrap_connector(tcp);
    let http = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_keep_alive_interval(PING_AFTER)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .build(https);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(http);
    Ok(kube::Client::new(service, config.default_namespace))
}
