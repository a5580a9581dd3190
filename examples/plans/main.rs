//! Plans, a policy file with hot reload and audit, shadow mode, failed-login counting and
//! Prometheus metrics.
//!
//! ```text
//! cargo run --example plans            # PORT (default 3000), POLICY (default examples/plans.toml)
//! curl -i -H 'x-api-key: free-key-1' http://127.0.0.1:3000/api/items   # 5 per minute, then 429
//! curl -i -H 'x-api-key: pro-key-1'  http://127.0.0.1:3000/api/items   # 20 per minute
//! curl -i -X POST -H 'x-password: nope' http://127.0.0.1:3000/login   # 3 failures per minute
//! curl -s http://127.0.0.1:3000/metrics | grep tollgate_
//! kill -HUP <pid>                      # or edit the policy file: reloaded, the audit is printed
//! ```

mod app;

use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use tollgate::policy::{Policy, PolicyWatcher};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let port: u16 = match std::env::var("PORT") {
        Ok(p) => p
            .parse()
            .map_err(|_| format!("PORT must be a port number, got {p:?}"))?,
        Err(_) => 3000,
    };
    // Errors (a policy file refused) and warnings on stderr; audit events are printed below.
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_writer(std::io::stderr)
        .init();
    let path = app::policy_path();
    let metrics = PrometheusBuilder::new().install_recorder()?;
    let layer = app::layer(&path).map_err(|e| format!("cannot start: {e}"))?;

    // Reload when the file changes...
    let reloading = layer.clone();
    let _watcher = PolicyWatcher::new(&path, move |policy: Policy| {
        reloading.reload(
            policy.limits()?,
            format!("file change {}", policy.source_name()),
        )?;
        Ok(())
    })
    .interval(Duration::from_millis(500))
    .spawn()?;
    // ... and on SIGHUP.
    #[cfg(unix)]
    {
        let (layer, path) = (layer.clone(), path.clone());
        let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                app::reload(&layer, &path, "SIGHUP");
            }
        });
    }

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!(
        "listening on http://{} with the policy {} (pid {})",
        listener.local_addr()?,
        path.display(),
        std::process::id()
    );
    app::serve(listener, app::router(layer, metrics)).await?;
    Ok(())
}
