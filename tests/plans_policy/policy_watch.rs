//! PolicyWatcher: a changed file is applied, a broken one is refused and the old policy keeps
//! serving, through a real layer's reload. The watcher polls every 5 ms of real time; every
//! wait is bounded.
#![cfg(feature = "toml")]

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tokio::sync::mpsc;
use tollgate::policy::{Policy, PolicyWatcher, WatchOutcome};
use tollgate::RateLimitLayer;
use tower::{service_fn, ServiceBuilder, ServiceExt};

fn policy_text(per_minute: u32) -> String {
    format!("[[limit]]\nname = \"global\"\nalgorithm = \"fixed_window\"\nquota = \"{per_minute}/min\"\nkey = \"global\"\n")
}

/// A fresh file in the temp directory, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, text: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("tollgate-{name}-{}.toml", std::process::id()));
        std::fs::write(&path, text).unwrap();
        Self(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The next reload event, within a bound.
async fn next(reloads: &mut mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(Duration::from_secs(10), reloads.recv())
        .await
        .expect("the change was not applied within 10 s")
        .unwrap()
}

#[tokio::test]
async fn changes_are_applied_and_broken_files_refused() {
    let file = TempFile::new("watch", &policy_text(2));
    // What is serving: the quota of the last policy applied.
    let serving = Arc::new(Mutex::new(String::from("2/min")));
    let (applied, mut reloads) = mpsc::unbounded_channel();
    let current = Arc::clone(&serving);
    let watcher = PolicyWatcher::new(&file.0, move |policy: Policy| {
        let limits = policy.limits()?;
        let quota = limits[0].quota().to_string();
        *current.lock().unwrap() = quota.clone();
        applied.send(quota).unwrap();
        Ok(())
    })
    .interval(Duration::from_millis(5));
    let task = watcher.spawn().unwrap();

    std::fs::write(&file.0, policy_text(3)).unwrap();
    assert_eq!(next(&mut reloads).await, "3/min");

    // A broken file, then one that parses but does not compile: neither is applied, and the
    // old policy keeps serving across many polls.
    std::fs::write(&file.0, "[[limit]]\nname = \"global\nquota = ").unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    std::fs::write(&file.0, policy_text(0)).unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert!(reloads.try_recv().is_err());
    assert_eq!(*serving.lock().unwrap(), "3/min");

    // Fixed: applied.
    std::fs::write(&file.0, policy_text(5)).unwrap();
    assert_eq!(next(&mut reloads).await, "5/min");
    task.abort();
}

#[tokio::test]
async fn a_layer_reloads_from_its_file_and_keeps_what_was_spent() {
    let file = TempFile::new("reload", &policy_text(2));
    let policy = Policy::from_toml_file(&file.0).unwrap();
    let layer = RateLimitLayer::builder()
        .limits(policy.limits().unwrap())
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(service_fn(|_: Request<()>| async {
            Ok::<_, Infallible>(Response::new(String::new()))
        }));
    let status = || async {
        svc.clone()
            .oneshot(Request::new(()))
            .await
            .unwrap()
            .status()
    };
    let (applied, mut reloads) = mpsc::unbounded_channel();
    let watcher = PolicyWatcher::new(&file.0, move |policy: Policy| {
        let event = layer.reload(policy.limits()?, policy.source_name())?;
        applied.send(event.to_string()).unwrap();
        Ok(())
    })
    .interval(Duration::from_millis(5));
    let task = watcher.spawn().unwrap();
    assert_eq!(status().await, StatusCode::OK);
    assert_eq!(status().await, StatusCode::OK);
    assert_eq!(status().await, StatusCode::TOO_MANY_REQUESTS);
    std::fs::write(&file.0, policy_text(3)).unwrap();
    let event = next(&mut reloads).await;
    assert!(event.contains("2/min -> 3/min"), "{event}");
    assert_eq!(status().await, StatusCode::OK);
    assert_eq!(status().await, StatusCode::TOO_MANY_REQUESTS);
    task.abort();
}

#[test]
fn check_reports_why_a_version_was_refused() {
    let file = TempFile::new("check", &policy_text(2));
    let mut watcher = PolicyWatcher::new(&file.0, |_: Policy| Ok(()));
    assert!(
        matches!(watcher.check(), WatchOutcome::Unchanged),
        "the baseline is not re-applied"
    );
    std::fs::write(&file.0, format!("{}qouta = 1\n", policy_text(2))).unwrap();
    let WatchOutcome::Refused(error) = watcher.check() else {
        panic!("a broken file was applied")
    };
    let text = error.to_string();
    assert!(
        text.starts_with(&format!(
            "{}:6:1: limit \"global\": qouta: unknown field",
            file.0.display()
        )),
        "{text}"
    );
    // Not retried until the file changes again.
    assert!(matches!(watcher.check(), WatchOutcome::Unchanged));
    std::fs::write(&file.0, policy_text(4)).unwrap();
    assert!(matches!(watcher.check(), WatchOutcome::Applied));
    // A refusal by `apply` is reported the same way.
    let mut refusing = PolicyWatcher::new(&file.0, |_: Policy| Err("no thanks".into()));
    std::fs::write(&file.0, policy_text(6)).unwrap();
    let WatchOutcome::Refused(error) = refusing.check() else {
        panic!()
    };
    assert_eq!(error.to_string(), "no thanks");
    // An unreadable file is reported and does not count as seen.
    std::fs::remove_file(&file.0).unwrap();
    assert!(matches!(refusing.check(), WatchOutcome::Refused(_)));
}

/// An invalid interval does not break the builder chain: `spawn` refuses it, names the field
/// and says what to pass instead, and spawns nothing.
#[tokio::test]
async fn a_zero_interval_is_refused_when_spawning() {
    let file = TempFile::new("zero", &policy_text(2));
    let err = PolicyWatcher::new(&file.0, |_: Policy| Ok(()))
        .interval(Duration::ZERO)
        .spawn()
        .unwrap_err();
    assert_eq!(err.field(), "policy_watcher.interval");
    assert!(err.message().contains("busy loop"), "{err}");
    assert!(err.message().contains("PolicyWatcher::interval"), "{err}");
    // The last interval set counts: a zero one replaced by a valid one spawns.
    let task = PolicyWatcher::new(&file.0, |_: Policy| Ok(()))
        .interval(Duration::ZERO)
        .interval(Duration::from_millis(5))
        .spawn()
        .unwrap();
    task.abort();
}
