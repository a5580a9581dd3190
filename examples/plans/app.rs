//! The app of `examples/plans`: routes, the rate-limit layer built from the policy file, and
//! reloading. Shared with `tests/examples/plans_example.rs`, which serves it on 127.0.0.1.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use tollgate::policy::{Policy, PolicyError};
use tollgate::rate_limit::AuditEvent;
use tollgate::{Limit, RateLimitLayer};

/// Reads and compiles the policy file at `path`.
pub fn load(path: &Path) -> Result<Vec<Limit>, PolicyError> {
    Policy::from_toml_file(path)?.limits()
}

/// The layer for the policy at `path`, printing every audit event.
pub fn layer(path: &Path) -> Result<RateLimitLayer, Box<dyn std::error::Error + Send + Sync>> {
    Ok(RateLimitLayer::builder()
        .limits(load(path)?)
        .on_audit(|event: &AuditEvent| println!("{event}"))
        .build()?)
}

/// Reloads the policy at `path` into `layer`; a broken file is refused and logged, and the old
/// policy keeps serving.
pub fn reload(layer: &RateLimitLayer, path: &Path, why: &str) -> bool {
    let source = format!("{why} {}", path.display());
    match load(path) {
        Ok(limits) => match layer.reload(limits, source) {
            Ok(_) => true,
            Err(error) => {
                eprintln!("policy reload refused, the old policy keeps serving: {error}");
                false
            }
        },
        Err(error) => {
            eprintln!("policy reload refused, the old policy keeps serving: {error}");
            false
        }
    }
}

/// `GET /api/items`, `POST /login` (200 with `x-password: letmein`, else 401) and `GET
/// /metrics` (Prometheus text), behind `layer` (except `/metrics`).
pub fn router(layer: RateLimitLayer, metrics: PrometheusHandle) -> Router {
    let limited = Router::new()
        .route("/api/items", get(|| async { "[\"apple\", \"pear\"]\n" }))
        .route(
            "/login",
            post(|headers: HeaderMap| async move {
                match headers.get("x-password") {
                    Some(p) if p == "letmein" => (StatusCode::OK, "welcome\n"),
                    _ => (StatusCode::UNAUTHORIZED, "wrong password\n"),
                }
            }),
        )
        .layer(layer);
    Router::new()
        .route("/metrics", get(move || async move { metrics.render() }))
        .merge(limited)
}

/// Serves `router` on `listener` with each connection's peer address (for the client-IP key).
pub async fn serve(listener: tokio::net::TcpListener, router: Router) -> std::io::Result<()> {
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}

/// `$POLICY`, or the shipped `examples/plans.toml`.
pub fn policy_path() -> PathBuf {
    std::env::var_os("POLICY")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/plans.toml"))
        })
}
