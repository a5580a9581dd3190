//! The concurrency limit: slots held until the response body ends or is dropped (through a
//! real hyper server and a real client as well as `oneshot`), the FIFO queue, `max_wait`,
//! queue bounds and configuration errors. Time is tokio's paused clock.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tollgate::concurrency::ConcurrencyLimitLayer;
use tollgate::key::{HeaderKey, Key, PeerIp};
use tollgate::MissingKey;
use tower::{service_fn, ServiceBuilder, ServiceExt};

type Chunks = mpsc::Sender<Result<Frame<Bytes>, Infallible>>;
type Streaming = StreamBody<ReceiverStream<Result<Frame<Bytes>, Infallible>>>;

/// Serves `layer` around a handler whose body streams what the test sends: each request's
/// chunk sender is handed to the test on the returned receiver, after a first chunk.
async fn serve(layer: ConcurrencyLimitLayer) -> (String, mpsc::UnboundedReceiver<Chunks>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (senders_tx, senders) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let senders_tx = senders_tx.clone();
            let svc = ServiceBuilder::new()
                .layer(layer.clone())
                .service(service_fn(move |_req: Request<Incoming>| {
                    let senders_tx = senders_tx.clone();
                    async move {
                        let (tx, rx) = mpsc::channel(4);
                        tx.send(Ok(Frame::data(Bytes::from_static(b"first"))))
                            .await
                            .unwrap();
                        senders_tx.send(tx).unwrap();
                        Ok::<_, Infallible>(Response::new(StreamBody::new(ReceiverStream::new(rx))))
                    }
                }));
            tokio::spawn(async move {
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(svc))
                    .await;
            });
        }
    });
    (format!("http://{addr}/"), senders)
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

#[tokio::test]
async fn a_streaming_response_holds_its_slot_until_its_last_frame_over_http() {
    let layer = ConcurrencyLimitLayer::builder(1)
        .name("one")
        .build()
        .unwrap();
    let (url, mut senders) = serve(layer.clone()).await;
    let http = client();

    let mut first = http.get(&url).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(first.chunk().await.unwrap().unwrap(), "first");
    let chunks = senders.recv().await.unwrap();
    // Headers are out, the body is not finished: still in flight.
    assert_eq!(layer.in_flight(&Key::global()), 1);
    let refused = http.get(&url).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["type"], "urn:tollgate:problem:concurrency-limited");
    assert_eq!(body["policy"], "one");
    assert_eq!(body["in_flight"], 1);

    chunks
        .send(Ok(Frame::data(Bytes::from_static(b" last"))))
        .await
        .unwrap();
    drop(chunks); // the end of the body
    let mut rest = Vec::new();
    while let Some(c) = first.chunk().await.unwrap() {
        rest.extend_from_slice(&c);
    }
    assert_eq!(rest, b" last");
    // The client has the end of the body, so the server polled it: the slot is back.
    assert_eq!(layer.in_flight(&Key::global()), 0);
    let next = http.get(&url).send().await.unwrap();
    assert_eq!(next.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_client_that_disconnects_mid_body_gives_its_slot_back() {
    let layer = ConcurrencyLimitLayer::builder(1).build().unwrap();
    let (url, mut senders) = serve(layer.clone()).await;
    let http = client();

    let mut res = http.get(&url).send().await.unwrap();
    assert_eq!(res.chunk().await.unwrap().unwrap(), "first");
    let chunks = senders.recv().await.unwrap();
    assert_eq!(layer.in_flight(&Key::global()), 1);
    drop(res); // the client closes the connection with the body unread
    drop(http);

    // The server notices when it writes next (or reads the close): it drops the body, and with
    // it the slot. The chunk channel closes at that moment.
    let mut sent = 0;
    while chunks
        .send(Ok(Frame::data(Bytes::from(vec![b'x'; 16 * 1024]))))
        .await
        .is_ok()
    {
        sent += 1;
        assert!(
            sent < 10_000,
            "the server never dropped the body of a closed connection"
        );
    }
    assert_eq!(layer.in_flight(&Key::global()), 0);
    let res = client().get(&url).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

fn ok_service(
    layer: ConcurrencyLimitLayer,
    order: Arc<Mutex<Vec<String>>>,
) -> impl tower::Service<
    Request<()>,
    Response = Response<tollgate::concurrency::ResponseBody<Full<Bytes>>>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(move |req: Request<()>| {
            let order = Arc::clone(&order);
            async move {
                let id = req
                    .headers()
                    .get("x-id")
                    .map_or("", |v| v.to_str().unwrap())
                    .to_owned();
                order.lock().unwrap().push(id);
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("done"))))
            }
        }))
}

fn req(id: &str) -> Request<()> {
    Request::get("/").header("x-id", id).body(()).unwrap()
}

#[tokio::test]
async fn dropping_or_finishing_the_body_releases_the_slot() {
    let layer = ConcurrencyLimitLayer::builder(1).build().unwrap();
    let svc = ok_service(layer.clone(), Default::default());
    let res = svc.clone().oneshot(req("a")).await.unwrap();
    assert!(res.body().holds_slot());
    assert_eq!(layer.in_flight(&Key::global()), 1);
    assert_eq!(
        svc.clone().oneshot(req("b")).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    drop(res);
    assert_eq!(layer.in_flight(&Key::global()), 0);

    let res = svc.clone().oneshot(req("c")).await.unwrap();
    assert_eq!(res.into_body().collect().await.unwrap().to_bytes(), "done");
    assert_eq!(layer.in_flight(&Key::global()), 0);
}

#[tokio::test]
async fn counts_per_key() {
    let layer = ConcurrencyLimitLayer::builder(1)
        .key(HeaderKey::new("x-id").unwrap())
        .build()
        .unwrap();
    let svc = ok_service(layer.clone(), Default::default());
    let a = svc.clone().oneshot(req("a")).await.unwrap();
    let b = svc.clone().oneshot(req("b")).await.unwrap();
    assert_eq!((a.status(), b.status()), (StatusCode::OK, StatusCode::OK));
    let again = svc.clone().oneshot(req("a")).await.unwrap();
    assert_eq!(again.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// Lets spawned tasks run until they block (paused time: no timer fires).
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn queued_requests_get_slots_first_come_first_served() {
    let layer = ConcurrencyLimitLayer::builder(1)
        .queue(Duration::from_secs(60), 3)
        .build()
        .unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let svc = ok_service(layer.clone(), Arc::clone(&order));
    let held = svc.clone().oneshot(req("a")).await.unwrap();
    let mut waiting = Vec::new();
    for id in ["b", "c", "d"] {
        let svc = svc.clone();
        waiting.push(tokio::spawn(async move {
            // The body is dropped as soon as the status is read: the next one goes.
            svc.oneshot(req(id)).await.unwrap().status()
        }));
        settle().await;
    }
    // The queue holds 3: a fifth request is refused at once.
    let refused = svc.clone().oneshot(req("e")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(*order.lock().unwrap(), ["a"]);

    drop(held);
    for w in waiting {
        assert_eq!(w.await.unwrap(), StatusCode::OK);
    }
    assert_eq!(*order.lock().unwrap(), ["a", "b", "c", "d"]);
    assert_eq!(layer.in_flight(&Key::global()), 0);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_leaves_the_queue_and_the_next_one_gets_the_slot() {
    let layer = ConcurrencyLimitLayer::builder(1)
        .queue(Duration::from_secs(60), 2)
        .build()
        .unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let svc = ok_service(layer.clone(), Arc::clone(&order));
    let held = svc.clone().oneshot(req("a")).await.unwrap();
    let spawn = |id: &'static str| {
        let svc = svc.clone();
        tokio::spawn(async move { svc.oneshot(req(id)).await.unwrap().status() })
    };
    let b = spawn("b");
    settle().await;
    let c = spawn("c");
    settle().await;
    // Full queue: refused.
    assert_eq!(
        svc.clone().oneshot(req("x")).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    b.abort(); // b's client goes away while waiting
    settle().await;
    // b's place is free again.
    let d = spawn("d");
    settle().await;
    drop(held);
    assert_eq!(c.await.unwrap(), StatusCode::OK);
    assert_eq!(d.await.unwrap(), StatusCode::OK);
    assert_eq!(*order.lock().unwrap(), ["a", "c", "d"]);
    assert_eq!(layer.in_flight(&Key::global()), 0);
}

#[tokio::test(start_paused = true)]
async fn a_request_waits_at_most_max_wait() {
    let layer = ConcurrencyLimitLayer::builder(1)
        .name("reports")
        .queue(Duration::from_secs(2), 4)
        .build()
        .unwrap();
    let svc = ok_service(layer.clone(), Default::default());
    let _held = svc.clone().oneshot(req("a")).await.unwrap();
    let start = tokio::time::Instant::now();
    let res = svc.clone().oneshot(req("b")).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["policy"], "reports");
    assert!(
        json["detail"].as_str().unwrap().contains("2000 ms"),
        "{json}"
    );
    assert_eq!(layer.in_flight(&Key::global()), 1);
}

#[tokio::test]
async fn missing_keys_follow_the_missing_key_policy() {
    // PeerIp with no peer address recorded: a misconfigured server.
    let refuse = ConcurrencyLimitLayer::builder(1)
        .key(PeerIp::new())
        .build()
        .unwrap();
    let res = ok_service(refuse, Default::default())
        .oneshot(req("a"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(res.headers()["content-type"], "application/problem+json");

    let skip = ConcurrencyLimitLayer::builder(1)
        .key(HeaderKey::new("x-tenant").unwrap())
        .on_missing_key(MissingKey::Skip)
        .build()
        .unwrap();
    let svc = ok_service(skip, Default::default());
    let a = svc.clone().oneshot(req("a")).await.unwrap();
    let b = svc.clone().oneshot(req("b")).await.unwrap();
    assert_eq!((a.status(), b.status()), (StatusCode::OK, StatusCode::OK));
    assert!(!a.body().holds_slot());
}

#[tokio::test]
async fn grpc_calls_get_resource_exhausted() {
    let layer = ConcurrencyLimitLayer::builder(1).build().unwrap();
    let svc = ok_service(layer, Default::default());
    let _held = svc.clone().oneshot(req("a")).await.unwrap();
    let grpc = Request::post("/pkg.Svc/Call")
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    let res = svc.clone().oneshot(grpc).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["grpc-status"], "8");
}

#[test]
fn invalid_configuration_fails_at_build_time() {
    let field =
        |b: tollgate::concurrency::ConcurrencyLimitLayerBuilder| b.build().unwrap_err().field();
    assert_eq!(field(ConcurrencyLimitLayer::builder(0)), "max_in_flight");
    assert_eq!(
        field(ConcurrencyLimitLayer::builder(1).max_keys(0)),
        "max_keys"
    );
    assert_eq!(
        field(ConcurrencyLimitLayer::builder(1).queue(Duration::ZERO, 4)),
        "queue.max_wait"
    );
    assert_eq!(
        field(ConcurrencyLimitLayer::builder(1).queue(Duration::MAX, 4)),
        "queue.max_wait"
    );
    assert_eq!(
        field(ConcurrencyLimitLayer::builder(1).queue(Duration::from_secs(1), 0)),
        "queue.max_queued"
    );
}

#[allow(dead_code)]
fn streaming_is_a_body(_: Streaming) {}
