//! Production Redis: an ACL user holding exactly the commands and keys the store needs (the line
//! docs/guide/redis.md documents), credentials that never appear in `Debug` output, errors or
//! logs, servers that rename or forbid administrative commands (as managed services do), and TLS
//! (`rediss://`, with the `redis-tls` feature) with certificates the test makes.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tollgate::algorithm::AlgorithmKind;
use tollgate::key::Key;
use tollgate::store::redis::{RedisBackend, RedisStore};
use tollgate::store::{Backend, LimitCheck, LimitSpec};
use tollgate::Quota;

use crate::harness::redis_server::RedisServer;
use crate::harness::stores::{decide, one, spec};

const PASSWORD: &str = "pw-3c9f1e7a-never-printed";

/// The `ACL SETUSER` line of the guide's "ACLs" section, with the test's password.
fn documented_acl_line() -> Vec<String> {
    let guide =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/guide/redis.md"))
            .unwrap();
    let line = guide
        .lines()
        .find(|l| l.starts_with("ACL SETUSER tollgate "))
        .expect("docs/guide/redis.md documents the ACL SETUSER line");
    line.split_whitespace()
        .map(|w| {
            if w == ">CHANGE-ME" {
                format!(">{PASSWORD}")
            } else {
                w.to_owned()
            }
        })
        .collect()
}

/// Runs `args` on `server` as its `default` user.
fn admin(conn: &mut redis::Connection, args: &[String]) {
    let mut cmd = redis::cmd(&args[0]);
    for a in &args[1..] {
        cmd.arg(a);
    }
    cmd.query::<()>(conn)
        .unwrap_or_else(|e| panic!("{:?}: {e}", &args[..2]));
}

/// Every algorithm, so that every command of every script runs under the ACL.
fn all_algorithms() -> Vec<LimitSpec> {
    [
        ("tb", AlgorithmKind::TokenBucket),
        ("gcra", AlgorithmKind::Gcra),
        ("fw", AlgorithmKind::FixedWindow),
        ("sw", AlgorithmKind::SlidingWindow),
        ("log", AlgorithmKind::SlidingLog),
        ("leaky", AlgorithmKind::LeakyBucket),
    ]
    .into_iter()
    .map(|(name, algorithm)| spec(name, Quota::per_hour(3), algorithm))
    .collect()
}

/// Each limit allows exactly 3 of 5 requests of one client; every limit decided by Redis.
async fn three_of_five_each(store: &RedisStore, limits: usize) {
    for limit in 0..limits {
        let mut allowed = 0;
        for _ in 0..5 {
            let checks = [LimitCheck::new(limit, Key::string("client-1"), 1)];
            let d = decide(store, &checks)
                .await
                .unwrap_or_else(|e| panic!("limit {limit}: {e}"));
            allowed += usize::from(d.allowed());
        }
        assert_eq!(allowed, 3, "limit {limit}: {:?}", store.stats());
    }
    assert_eq!(store.stats().errors(), 0, "{:?}", store.stats());
}

/// Captures the tracing output of the current thread (a current-thread runtime's tasks too).
#[derive(Clone, Default)]
pub(crate) struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    pub(crate) fn install(&self) -> tracing::subscriber::DefaultGuard {
        let logs = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || logs.clone())
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Waits until `done` holds (the store's warm-up runs in the background), for at most 5 s.
async fn eventually(mut done: impl FnMut() -> bool) -> bool {
    for _ in 0..500 {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test]
async fn an_acl_user_with_the_documented_permissions_decides_every_algorithm() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    admin(&mut conn, &documented_acl_line());
    admin(
        &mut conn,
        &["ACL", "SETUSER", "default", "off"].map(String::from),
    );
    let logs = Logs::default();
    let _guard = logs.install();
    let limits = all_algorithms();
    // The password in the URL ...
    let url = format!("redis://tollgate:{PASSWORD}@127.0.0.1:{}", server.port());
    let store = RedisBackend::new(url)
        .timeout(Duration::from_secs(3))
        .build(&limits)
        .unwrap();
    three_of_five_each(&store, limits.len()).await;
    // `CONFIG GET` is in the line: the eviction policy is read.
    assert!(eventually(|| store.stats().maxmemory_policy() == Some("noeviction")).await);
    // ... or from the builder, which overrides the URL's.
    let store = RedisBackend::new(format!("redis://nobody:wrong@127.0.0.1:{}", server.port()))
        .credentials("tollgate", PASSWORD)
        .timeout(Duration::from_secs(3))
        .build(&limits)
        .unwrap();
    let d = decide(&store, &[LimitCheck::new(2, Key::string("client-2"), 1)])
        .await
        .unwrap();
    assert!(d.allowed(), "{:?}", store.stats());
    // The user reaches only the store's keys: nothing else, and no administrative command.
    let mut user = redis::Client::open(format!(
        "redis://tollgate:{PASSWORD}@127.0.0.1:{}",
        server.port()
    ))
    .unwrap()
    .get_connection()
    .unwrap();
    for forbidden in [
        &["GET", "other:key"][..],
        &["KEYS", "*"],
        &["FLUSHALL"],
        &["SCRIPT", "FLUSH"],
        &["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"],
    ] {
        let mut cmd = redis::cmd(forbidden[0]);
        for a in &forbidden[1..] {
            cmd.arg(*a);
        }
        let err = cmd.query::<redis::Value>(&mut user).unwrap_err();
        assert!(
            err.to_string().to_lowercase().contains("noperm"),
            "{forbidden:?}: {err}"
        );
    }
    assert!(!logs.text().contains(PASSWORD));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_acl_user_decides_on_a_cluster() {
    let cluster = crate::harness::redis_cluster::RedisCluster::start();
    for node in &cluster.nodes {
        let mut conn = node.conn();
        admin(&mut conn, &documented_acl_line());
        admin(
            &mut conn,
            &["ACL", "SETUSER", "default", "off"].map(String::from),
        );
    }
    let limits = all_algorithms();
    let store = RedisBackend::cluster(cluster.urls())
        .credentials("tollgate", PASSWORD)
        .timeout(Duration::from_secs(3))
        .build(&limits)
        .unwrap();
    // Batches of many clients (keys of every master, as one call per master) and one client's
    // limits together: the ACL covers `CLUSTER SLOTS` and the keys a master's batch passes as
    // arguments.
    let n = limits.len();
    let decisions = futures_util::future::join_all((0..30).map(|i| {
        let store = &store;
        async move {
            let key = Key::string(format!("client-{i}"));
            let checks: Vec<_> = (0..n).map(|l| LimitCheck::new(l, key.clone(), 1)).collect();
            decide(store, &checks).await
        }
    }))
    .await;
    for d in decisions {
        assert!(d.unwrap().allowed(), "{:?}", store.stats());
    }
    assert_eq!(store.stats().errors(), 0, "{:?}", store.stats());
}

#[test]
fn the_documented_acl_line_names_every_command_the_scripts_send() {
    let line = documented_acl_line().join(" ").to_lowercase();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/store/redis/scripts");
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let code = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for call in code.split("redis.").skip(1) {
            let Some(rest) = call
                .strip_prefix("call('")
                .or_else(|| call.strip_prefix("pcall('"))
            else {
                continue;
            };
            let command = rest.split('\'').next().unwrap().to_lowercase();
            assert!(
                line.contains(&format!(" +{command} ")) || line.ends_with(&format!(" +{command}")),
                "the ACL line lacks +{command}"
            );
            seen += 1;
        }
    }
    assert!(seen > 10, "the scripts were read ({seen} calls)");
}

#[tokio::test]
async fn a_user_lacking_a_permission_gets_an_error_that_names_it() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    // The documented user without EVALSHA and EVAL: it cannot run the script.
    let mut line = documented_acl_line();
    line.retain(|w| w != "+evalsha" && w != "+eval");
    admin(&mut conn, &line);
    let logs = Logs::default();
    let _guard = logs.install();
    let store = RedisBackend::new(format!("redis://127.0.0.1:{}", server.port()))
        .credentials("tollgate", PASSWORD)
        .timeout(Duration::from_secs(3))
        .build(&[spec("fw", Quota::per_hour(3), AlgorithmKind::FixedWindow)])
        .unwrap();
    let _ = one(&store, "client", 1).await;
    assert_eq!(store.stats().fail_closed(), 1, "{:?}", store.stats());
    let text = logs.text();
    assert!(
        text.contains("NoPerm") && text.contains("'evalsha'"),
        "the log names the missing permission:\n{text}"
    );
}

#[tokio::test]
async fn credentials_never_appear_in_debug_output_errors_or_logs() {
    let server = RedisServer::start();
    let logs = Logs::default();
    let _guard = logs.install();
    #[cfg(feature = "metrics")]
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    #[cfg(feature = "metrics")]
    let _metrics = metrics::set_default_local_recorder(&recorder);
    let limits = [spec("fw", Quota::per_hour(3), AlgorithmKind::FixedWindow)];
    // A wrong password, in the URL and in the builder.
    let url = format!("redis://tollgate:{PASSWORD}@127.0.0.1:{}", server.port());
    let backend = RedisBackend::new(url.clone())
        .timeout(Duration::from_secs(1))
        .breaker_threshold(2);
    let stats = backend.stats();
    let backend_debug = format!("{backend:?}");
    assert!(backend_debug.contains("***@127.0.0.1"), "{backend_debug}");
    let store = backend.build(&limits).unwrap();
    for _ in 0..3 {
        let _ = one(&store, "client", 1).await;
    }
    let other = RedisBackend::new(format!("redis://127.0.0.1:{}", server.port()))
        .credentials("admin", PASSWORD);
    let cluster = RedisBackend::cluster([url.clone()]).credentials("admin", PASSWORD);
    let texts = [
        backend_debug,
        format!("{other:?}"),
        format!("{cluster:?}"),
        format!("{:?}", cluster.build(&limits).unwrap()),
        format!("{store:?}"),
        format!("{stats:?}"),
        // A URL that does not parse is named in the error, without its credentials.
        RedisBackend::new(format!("redis://user:{PASSWORD}@127.0.0.1:notaport"))
            .build(&limits)
            .unwrap_err()
            .to_string(),
        RedisBackend::cluster([format!("redis://user:{PASSWORD}@[::1")])
            .build(&limits)
            .unwrap_err()
            .to_string(),
        logs.text(),
        // Every metric's name, labels and value.
        #[cfg(feature = "metrics")]
        format!("{:?}", recorder.snapshotter().snapshot().into_vec()),
    ];
    assert!(stats.fail_closed() >= 3 && stats.errors() >= 2, "{stats:?}");
    let log = logs.text();
    assert!(
        log.contains("WRONGPASS") || log.contains("AuthenticationFailed"),
        "the log says why:\n{log}"
    );
    #[cfg(feature = "metrics")]
    assert!(
        texts.last().unwrap().contains("tollgate_store_errors"),
        "{}",
        texts.last().unwrap()
    );
    for text in texts {
        assert!(!text.contains(PASSWORD), "{text}");
    }
}

#[tokio::test]
async fn renamed_or_forbidden_admin_commands_leave_decisions_working_with_a_warning() {
    // As on managed services: CONFIG, DEBUG, MONITOR and KEYS are renamed away, and the ACL
    // user is denied CONFIG and SCRIPT FLUSH too.
    let server = RedisServer::start_with(&[
        "--rename-command",
        "CONFIG",
        "",
        "--rename-command",
        "DEBUG",
        "",
        "--rename-command",
        "MONITOR",
        "",
        "--rename-command",
        "KEYS",
        "",
    ]);
    let mut conn = server.conn();
    let mut line = documented_acl_line();
    line.retain(|w| w != "+config|get");
    admin(&mut conn, &line);
    let logs = Logs::default();
    let _guard = logs.install();
    let limits = all_algorithms();
    for credentials in [false, true] {
        logs.0.lock().unwrap().clear();
        let backend = RedisBackend::new(format!("redis://127.0.0.1:{}", server.port()))
            .prefix(if credentials { "tollgate" } else { "managed" })
            .timeout(Duration::from_secs(3));
        let backend = if credentials {
            backend.credentials("tollgate", PASSWORD)
        } else {
            backend
        };
        let store = backend.build(&limits).unwrap();
        three_of_five_each(&store, limits.len()).await;
        assert!(
            eventually(|| logs.text().contains("could not read maxmemory-policy")).await,
            "a warning says the policy is unknown:\n{}",
            logs.text()
        );
        assert_eq!(store.stats().maxmemory_policy(), None);
    }
    assert!(logs.text().contains(" WARN "), "{}", logs.text());
}

/// TLS: a CA, a server and a client certificate made with `openssl`, and a server with a TLS
/// port (its plain port is only the harness's readiness check).
#[cfg(feature = "redis-tls")]
pub(crate) mod tls {
    use std::path::{Path, PathBuf};
    use std::process::Command;

    use super::*;
    use crate::harness::redis_server::free_port;

    /// Why TLS cannot be tested here, if it cannot.
    fn unsupported() -> Option<String> {
        if Command::new("openssl").arg("version").output().is_err() {
            return Some("the openssl CLI is missing".into());
        }
        let out = Command::new("timeout")
            .args(["5", "redis-server", "--tls-port", "1", "--port", "0"])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        // Built with TLS, it asks for a certificate; built without, it refuses the directive.
        (!text.contains("tls-cert-file"))
            .then(|| format!("this redis-server was not built with TLS:\n{text}"))
    }

    fn openssl(dir: &Path, args: &[&str]) {
        let out = Command::new("openssl")
            .current_dir(dir)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Writes ca.crt, server.{crt,key} (for 127.0.0.1) and client.{crt,key} into `dir`.
    fn make_certificates(dir: &Path) {
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca = vec![
            "req",
            "-x509",
            "-days",
            "2",
            "-subj",
            "/CN=tollgate test CA",
        ];
        ca.extend(ec);
        ca.extend(["-keyout", "ca.key", "-out", "ca.crt"]);
        openssl(dir, &ca);
        for (name, ext) in [
            ("server", "subjectAltName=IP:127.0.0.1"),
            ("client", "extendedKeyUsage=clientAuth"),
        ] {
            let (key, csr, crt) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.crt"),
            );
            let subject = format!("/CN={name}");
            let mut req = vec!["req", "-new", "-subj", &subject];
            req.extend(ec);
            req.extend(["-keyout", &key, "-out", &csr]);
            openssl(dir, &req);
            std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
            let extfile = format!("{name}.ext");
            openssl(
                dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca.crt",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-days",
                    "2",
                    "-extfile",
                    &extfile,
                    "-out",
                    &crt,
                ],
            );
        }
    }

    /// A CA, a server and a client certificate ([`make_certificates`]) in a temporary directory
    /// of their own, removed on drop.
    pub(crate) struct TestCertificates {
        dir: PathBuf,
    }

    impl TestCertificates {
        /// The certificates for `test`, or `None` (saying why on stderr) where TLS cannot be
        /// tested.
        pub(crate) fn make(test: &str) -> Option<Self> {
            if let Some(reason) = unsupported() {
                eprintln!("skipping {test}: {reason}");
                return None;
            }
            let dir = std::env::temp_dir().join(format!(
                "tollgate-{test}-{}-{}",
                std::process::id(),
                free_port()
            ));
            std::fs::create_dir_all(&dir).unwrap();
            make_certificates(&dir);
            Some(Self { dir })
        }

        /// The contents of `name` (`ca.crt`, `client.crt`, `client.key`, ...).
        pub(crate) fn read(&self, name: &str) -> Vec<u8> {
            std::fs::read(self.dir.join(name)).unwrap()
        }

        /// `redis-server` arguments serving TLS on `port` with the server certificate, trusting
        /// the CA for client certificates.
        pub(crate) fn server_args(&self, port: &str) -> Vec<String> {
            let file = |name: &str| self.dir.join(name).display().to_string();
            vec![
                "--tls-port".into(),
                port.into(),
                "--tls-cert-file".into(),
                file("server.crt"),
                "--tls-key-file".into(),
                file("server.key"),
                "--tls-ca-cert-file".into(),
                file("ca.crt"),
            ]
        }
    }

    impl Drop for TestCertificates {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    #[tokio::test]
    async fn rediss_urls_decide_over_tls_and_check_the_servers_certificate() {
        let Some(certs) = TestCertificates::make("tls") else {
            return;
        };
        let read = |name: &str| certs.read(name);
        let tls_port = free_port().to_string();
        let args = certs.server_args(&tls_port);
        let server = RedisServer::start_with(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let mut conn = server.conn();
        admin(&mut conn, &documented_acl_line());
        let logs = Logs::default();
        let _guard = logs.install();
        let url = format!("rediss://127.0.0.1:{tls_port}");
        let limits = [spec("fw", Quota::per_hour(3), AlgorithmKind::FixedWindow)];
        // The server trusts the client's certificate (tls-auth-clients yes, the default); the
        // client trusts the test's CA, and authenticates as the ACL user.
        let store = RedisBackend::new(url.clone())
            .credentials("tollgate", PASSWORD)
            .tls_root_certificate(read("ca.crt"))
            .tls_client_certificate(read("client.crt"), read("client.key"))
            .timeout(Duration::from_secs(3))
            .build(&limits)
            .unwrap();
        three_of_five_each(&store, 1).await;
        assert!(format!("{store:?}").contains("RedisStore"));
        // Without the CA, the server's certificate is not trusted: nothing is decided by Redis.
        let untrusted = RedisBackend::new(url.clone())
            .tls_client_certificate(read("client.crt"), read("client.key"))
            .timeout(Duration::from_secs(1))
            .build(&limits)
            .unwrap();
        let _ = one(&untrusted, "client", 1).await;
        assert_eq!(untrusted.stats().fail_closed(), 1);
        let text = logs.text();
        assert!(
            text.to_lowercase().contains("certificate"),
            "the log names the certificate error:\n{text}"
        );
        assert!(!text.contains(PASSWORD));
    }

    #[test]
    fn certificates_for_a_plain_url_are_a_config_error() {
        let limits = [spec("fw", Quota::per_hour(3), AlgorithmKind::FixedWindow)];
        let err = RedisBackend::new("redis://127.0.0.1:6379")
            .tls_root_certificate(b"-----BEGIN CERTIFICATE-----".to_vec())
            .build(&limits)
            .unwrap_err();
        assert_eq!(err.field(), "redis.url");
        assert!(err.message().contains("rediss://"), "{err}");
    }
}
