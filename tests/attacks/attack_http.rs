//! The HTTP attack suite (issue 7): a real axum server on 127.0.0.1, a real client (reqwest, or a
//! raw `TcpStream` for bytes no client would send) and the memory store on a manual clock, so
//! budgets never refill during a test. Each test states its bound and asserts it:
//!
//! - forging forwarding headers never changes the attacker's key (no fresh budget by forgery);
//! - huge and malformed headers get a clear 4xx or are keyed like any other bytes, never a panic
//!   or a 5xx, and the server keeps serving;
//! - hostile limit names are refused at build time or stay well-formed in problem+json and
//!   header fields;
//! - hostile keys are bounded in memory.
//!
//! The distinct-key flood against a victim's budget lives with the memory store's eviction
//! tests. Every request here goes to loopback and each test sends at most a few hundred.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use reqwest::StatusCode;
use tollgate::clock::ManualClock;
use tollgate::key::{ClientIp, ForwardedHeader, HeaderKey, PeerIp};
use tollgate::store::{memory::MemoryBackend, memory::MemoryStore};
use tollgate::{Limit, Quota, RateLimitLayer};

use crate::harness::http_server::serve;

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// A layer with one limit of `quota` keyed by `key`, on a memory store whose clock never moves.
fn layer(limit: Limit) -> RateLimitLayer<MemoryStore<ManualClock>> {
    RateLimitLayer::builder()
        .backend(MemoryBackend::new().clock(ManualClock::new()))
        .limit(limit)
        .ietf_headers(true)
        .build()
        .unwrap()
}

async fn server_with(layer: &RateLimitLayer<MemoryStore<ManualClock>>) -> SocketAddr {
    serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer.clone()),
    )
    .await
}

fn remaining(res: &reqwest::Response) -> Option<u64> {
    res.headers()
        .get("x-ratelimit-remaining")?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// Every response header value is a valid field value: no CR, LF or NUL.
fn assert_headers_well_formed(res: &reqwest::Response) {
    for (name, value) in res.headers() {
        assert!(
            !value
                .as_bytes()
                .iter()
                .any(|&b| matches!(b, b'\r' | b'\n' | 0)),
            "{name}: {value:?}"
        );
    }
}

/// Sends raw request bytes and returns the status code of the response.
fn raw_status(addr: SocketAddr, request: &[u8]) -> u16 {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    // The status line is all we need; read until it is complete or the server closes.
    while !buf.windows(2).any(|w| w == b"\r\n") {
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => panic!("no response: {e}"),
        }
    }
    let line = String::from_utf8_lossy(&buf);
    assert!(
        line.starts_with("HTTP/1.1 "),
        "not an HTTP response: {line:?}"
    );
    line[9..12].parse().unwrap()
}

/// Forged forwarding values: spoofed addresses in every syntax, garbage, and many hops.
fn forgeries() -> Vec<(&'static str, String)> {
    let many_hops = (0..2000)
        .map(|i| format!("198.18.{}.{}", i / 250, i % 250))
        .collect::<Vec<_>>()
        .join(", ");
    vec![
        ("x-forwarded-for", "6.6.6.6".into()),
        ("x-forwarded-for", "6.6.6.7, 6.6.6.8".into()),
        ("x-forwarded-for", "[2001:db8::66]:443".into()),
        ("x-forwarded-for", "::ffff:6.6.6.9".into()),
        ("x-forwarded-for", "unknown, _hidden, 999.1.1.1, ,,".into()),
        ("x-forwarded-for", many_hops),
        ("forwarded", "for=6.6.6.10;proto=https".into()),
        (
            "forwarded",
            r#"for="[2001:db8::67]:80", for=6.6.6.11"#.into(),
        ),
        ("forwarded", r#"for="6.6.6.12, for=6.6.6.13"#.into()),
        ("x-real-ip", "6.6.6.14".into()),
        ("x-real-ip", "64:ff9b::6.6.6.15".into()),
    ]
}

/// From an untrusted peer, no forwarding header in any form changes the key: the peer's budget
/// of 5 is spent by the first 5 requests whatever each one claims, and only one key is stored.
#[tokio::test]
async fn forged_forwarding_headers_from_an_untrusted_peer_change_nothing() {
    let client_ip = ClientIp::trusting(["10.0.0.0/8"])
        .unwrap()
        .headers([
            ForwardedHeader::XForwardedFor,
            ForwardedHeader::Forwarded,
            ForwardedHeader::XRealIp,
        ])
        .unwrap();
    let layer = layer(Limit::new("per-client", Quota::per_hour(5)).key(client_ip));
    let addr = server_with(&layer).await;
    let http = client();
    let mut allowed = 0;
    for (i, (name, value)) in forgeries().into_iter().enumerate() {
        // Each forgery also arrives as a duplicate header line.
        let res = http
            .get(format!("http://{addr}/"))
            .header(name, value.as_str())
            .header(name, "6.6.6.99")
            .send()
            .await
            .unwrap();
        assert_headers_well_formed(&res);
        if res.status() == StatusCode::OK {
            allowed += 1;
            assert_eq!(remaining(&res), Some(4 - i as u64), "{name}: {value:.60}");
        } else {
            assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "{name}");
        }
    }
    assert_eq!(allowed, 5, "the peer's budget is 5, forged headers or not");
    assert_eq!(layer.store().len(), 1, "one key: the peer's");
}

/// Behind a trusted proxy (the test client, on 127.0.0.1), the key is the address the proxy
/// appended, whatever the client forged to its left, in each header the proxy may write: the
/// client's budget of 3 holds across forgeries, and another client's budget is untouched.
#[tokio::test]
async fn forged_hops_left_of_a_trusted_proxy_do_not_change_the_key() {
    let cases = [
        (ForwardedHeader::XForwardedFor, "203.0.113.9", "10.0.0.2"),
        (
            ForwardedHeader::Forwarded,
            r#"for="[2001:db8:1:2::9]:4711""#,
            "for=10.0.0.2",
        ),
        (ForwardedHeader::XRealIp, "203.0.113.9", ""),
    ];
    let http = client();
    for (header, real, inner_proxy) in cases {
        let client_ip = ClientIp::trusting(["127.0.0.1", "10.0.0.0/8"])
            .unwrap()
            .headers([header])
            .unwrap();
        let layer = layer(Limit::new("per-client", Quota::per_hour(3)).key(client_ip));
        let addr = server_with(&layer).await;
        let name = header.name();
        let mut allowed = 0;
        for (_, forged) in forgeries() {
            let forged = match header {
                ForwardedHeader::Forwarded => format!("for={forged}"),
                _ => forged,
            };
            let mut req = http
                .get(format!("http://{addr}/"))
                .header(name.clone(), forged.as_str());
            // The proxy appends the address it saw: as a list element (its own line for
            // X-Real-IP), then the inner proxy's hop.
            req = match header {
                ForwardedHeader::XRealIp => req.header(name.clone(), real),
                _ if inner_proxy.is_empty() => req.header(name.clone(), real),
                _ => req.header(name.clone(), format!("{real}, {inner_proxy}")),
            };
            let res = req.send().await.unwrap();
            assert_headers_well_formed(&res);
            match res.status() {
                StatusCode::OK => allowed += 1,
                s => assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "{header:?} {forged:.60}"),
            }
        }
        assert_eq!(allowed, 3, "{header:?}: the real client's budget is 3");
        // Another real client behind the same proxy still has its whole budget.
        let other = match header {
            ForwardedHeader::Forwarded => "for=198.51.100.7",
            _ => "198.51.100.7",
        };
        let res = http
            .get(format!("http://{addr}/"))
            .header(name.clone(), other)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{header:?}");
        assert_eq!(remaining(&res), Some(2), "{header:?}");
        assert_eq!(
            layer.store().len(),
            2,
            "{header:?}: exactly two clients keyed"
        );
    }
}

/// Huge and malformed headers: a 64 KiB API key, thousands of hops, non-UTF-8 bytes, empty
/// values, 200 duplicate lines. Each gets a 2xx, 4xx or 429, never a 5xx; the server keeps
/// serving; the store holds at most one bounded key per accepted request.
#[tokio::test]
async fn huge_and_malformed_headers_get_4xx_or_a_key_never_a_panic() {
    let by_api_key = layer(
        Limit::new("per-api-key", Quota::per_hour(1000)).key(HeaderKey::new("x-api-key").unwrap()),
    );
    let by_client = layer(
        Limit::new("per-client", Quota::per_hour(1000)).key(
            ClientIp::trusting(["127.0.0.1"])
                .unwrap()
                .headers([
                    ForwardedHeader::XForwardedFor,
                    ForwardedHeader::Forwarded,
                    ForwardedHeader::XRealIp,
                ])
                .unwrap(),
        ),
    );
    let app = Router::new()
        .route("/key", get(|| async { "ok" }).layer(by_api_key.clone()))
        .route("/ip", get(|| async { "ok" }).layer(by_client.clone()));
    let addr = serve(app).await;

    let huge = "k".repeat(64 * 1024);
    let hops = (0..4000)
        .map(|i| format!("198.18.{}.{}", i / 250, i % 250))
        .collect::<Vec<_>>()
        .join(",");
    let mut requests: Vec<Vec<u8>> = vec![
        format!("GET /key HTTP/1.1\r\nhost: x\r\nx-api-key: {huge}\r\n\r\n").into_bytes(),
        b"GET /key HTTP/1.1\r\nhost: x\r\nx-api-key: \xff\xfe\x80\r\n\r\n".to_vec(),
        b"GET /key HTTP/1.1\r\nhost: x\r\nx-api-key:\r\n\r\n".to_vec(),
        b"GET /key HTTP/1.1\r\nhost: x\r\nx-api-key: a\r\nx-api-key: b\r\n\r\n".to_vec(),
        b"GET /key HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(),
        format!("GET /ip HTTP/1.1\r\nhost: x\r\nx-forwarded-for: {hops}\r\n\r\n").into_bytes(),
        b"GET /ip HTTP/1.1\r\nhost: x\r\nx-forwarded-for: \xff\xfe, 1.2.3.4\x80\r\n\r\n".to_vec(),
        b"GET /ip HTTP/1.1\r\nhost: x\r\nforwarded: for=\"\xc3\x28\r\n\r\n".to_vec(),
        b"GET /ip HTTP/1.1\r\nhost: x\r\nx-real-ip: \r\n\r\n".to_vec(),
        b"GET /ip HTTP/1.1\r\nhost: x\r\nx-forwarded-for: ,,,\t, \r\n\r\n".to_vec(),
        b"GET /ip HTTP/1.1\r\nhost: x\r\nforwarded: for=\"[::1\r\n\r\n".to_vec(),
    ];
    let mut dup = b"GET /ip HTTP/1.1\r\nhost: x\r\n".to_vec();
    for i in 0..200 {
        dup.extend_from_slice(
            format!("x-forwarded-for: 6.6.{}.{}\r\n", i / 200, i % 200).as_bytes(),
        );
    }
    dup.extend_from_slice(b"\r\n");
    requests.push(dup);

    let mut statuses = Vec::new();
    for request in &requests {
        let status = tokio::task::spawn_blocking({
            let request = request.clone();
            move || raw_status(addr, &request)
        })
        .await
        .unwrap();
        assert!(
            (200..500).contains(&status),
            "status {status} for {:.80}",
            String::from_utf8_lossy(request)
        );
        statuses.push(status);
    }
    // The 64 KiB key is over HeaderKey's 256-byte bound, and an empty, repeated or missing key
    // has no key: 400 with the reason. Non-UTF-8 bytes are a key like any other. Every
    // forwarding chain, however broken, resolves to a key (the last good hop): 200. 200 header
    // lines exceed the server's header count: 431 from hyper, before the layer.
    assert_eq!(
        statuses,
        [400, 200, 400, 400, 400, 200, 200, 200, 200, 200, 200, 431]
    );
    // Still serving, and what was stored is bounded.
    let http = client();
    for path in ["key", "ip"] {
        let res = http
            .get(format!("http://{addr}/{path}"))
            .header("x-api-key", "after")
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{path}");
    }
    assert!(by_api_key.store().len() <= requests.len() + 1);
    assert!(by_client.store().len() <= requests.len() + 1);
    for (name, store) in [
        ("api key", by_api_key.store()),
        ("client ip", by_client.store()),
    ] {
        assert!(
            store.memory_usage() < 256 * 1024,
            "{name}: {} bytes for a dozen keys",
            store.memory_usage()
        );
    }
}

/// Hostile limit names: unprintable ones (CR, LF, NUL, unicode) are refused when the layer is
/// built, with an error naming the field, and so is a 4 KiB one; printable ones full of quotes,
/// backslashes and JSON/structured-field syntax, and one of the longest length allowed, come back
/// intact in problem+json and as valid header fields.
#[tokio::test]
async fn hostile_limit_names_are_refused_or_stay_well_formed() {
    for name in ["a\r\nx-injected: 1", "nul\0", "límite", "tab\there", ""] {
        let err = RateLimitLayer::builder()
            .limit(Limit::new(name, Quota::per_hour(1)).key(PeerIp::new()))
            .build()
            .unwrap_err();
        assert_eq!(err.field(), "limit.name", "{name:?}: {err}");
    }
    // A name longer than Name::MAX_LEN is refused too, with the field and the bound.
    let long = "n".repeat(4096);
    let err = RateLimitLayer::builder()
        .limit(Limit::new(long.as_str(), Quota::per_hour(1)).key(PeerIp::new()))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "limit.name", "{err}");
    assert!(err.to_string().contains("47 bytes"), "{err}");
    let longest = "n".repeat(tollgate::Name::MAX_LEN);
    let names = [
        r#"quote"name"#,
        r#"back\slash\"#,
        r#"{"json":"inject"}"#,
        r#"";q=999;w=1, "x"#,
        "<script>alert(1)</script>",
        longest.as_str(),
    ];
    let http = client();
    for name in names {
        let layer = layer(Limit::new(name, Quota::per_hour(1)).key(PeerIp::new()));
        let addr = server_with(&layer).await;
        let first = http.get(format!("http://{addr}/")).send().await.unwrap();
        assert_eq!(first.status(), StatusCode::OK, "{name:.40}");
        assert_headers_well_formed(&first);
        let res = http.get(format!("http://{addr}/")).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "{name:.40}");
        assert_headers_well_formed(&res);
        assert_eq!(
            res.headers()["content-type"],
            "application/problem+json",
            "{name:.40}"
        );
        // The structured field carries the name escaped: exactly one string item.
        let policy = res.headers()["ratelimit-policy"]
            .to_str()
            .unwrap()
            .to_owned();
        let escaped = name.replace('\\', "\\\\").replace('"', "\\\"");
        assert!(
            policy.starts_with(&format!("\"{escaped}\";")),
            "{policy:.80}"
        );
        let body: serde_json::Value = res.json().await.unwrap();
        assert_eq!(
            body["policy"], name,
            "problem+json must carry the name intact"
        );
        assert_eq!(body["status"], 429);
    }
}

/// Hostile keys: 300 distinct API keys of 200 bytes of binary each (under HeaderKey's bound)
/// are stored as keys, bounded: the store stays within a fixed budget per key.
#[tokio::test]
async fn hostile_binary_keys_are_bounded_in_memory() {
    let layer = layer(
        Limit::new("per-api-key", Quota::per_hour(10)).key(HeaderKey::new("x-api-key").unwrap()),
    );
    let addr = server_with(&layer).await;
    let empty = layer.store().memory_usage();
    for i in 0..300u32 {
        let mut request = b"GET / HTTP/1.1\r\nhost: x\r\nx-api-key: ".to_vec();
        request.extend((0..200u32).map(|j| 0x80 + ((i * 7 + j) % 0x7f) as u8));
        request.extend_from_slice(format!("{i:04}\r\n\r\n").as_bytes());
        let status = tokio::task::spawn_blocking(move || raw_status(addr, &request))
            .await
            .unwrap();
        assert_eq!(status, 200, "key {i}");
    }
    assert_eq!(layer.store().len(), 300);
    let used = layer.store().memory_usage() - empty;
    assert!(
        used <= 300 * 1024,
        "{used} bytes for 300 keys of 204 bytes: more than 1 KiB per key"
    );
}
