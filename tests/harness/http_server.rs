//! Serving an axum app on a free loopback port, shared by the HTTP tests.

use std::net::SocketAddr;

use axum::Router;

/// Serves `app` on a free 127.0.0.1 port with connection info (what `PeerIp` and `ClientIp`
/// read), and returns its address.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

/// [`serve`], answering the base URL (`http://127.0.0.1:PORT`).
#[allow(dead_code)] // not every test file uses both
pub async fn serve_url(app: Router) -> String {
    format!("http://{}", serve(app).await)
}

/// Serves `app` as `axum::serve(listener, app)` does, without connection info (the mistake the
/// misconfiguration tests make on purpose), and returns its address.
#[allow(dead_code)] // not every test file uses it
pub async fn serve_without_connect_info(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}
