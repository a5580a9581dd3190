//! [`PolicyWatcher`]: re-reads a policy file when it changes and applies it.

use std::error::Error;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::{Policy, PolicyError};
use crate::error::ConfigError;

type ParseFn = dyn Fn(&str, &str) -> Result<Policy, PolicyError> + Send + Sync;
type ApplyFn = dyn Fn(Policy) -> Result<(), Box<dyn Error + Send + Sync>> + Send + Sync;

/// Polls a policy file and applies each new version, typically with
/// [`RateLimitLayer::reload`](crate::RateLimitLayer::reload).
///
/// Every [interval](Self::interval) (default 2 s) the file is read; when its contents differ
/// from the last version seen, it is parsed and handed to the `apply` closure. A version that
/// cannot be read, parsed, compiled or applied is **reported** (`tracing::error!` with the error,
/// which names the file, the limit, the field and the line) and **the old policy keeps serving**;
/// it is not retried until the file changes again. The version present when the watcher is
/// created is the baseline: only later changes are applied (load the file yourself at start-up).
///
/// No file-system notification dependency: one small read per interval. Editors that replace the
/// file (write a temporary, rename) are handled; a half-written file fails to parse, is reported,
/// and the complete one is applied at the next poll.
///
/// ```no_run
/// # #[cfg(feature = "toml")] {
/// use std::time::Duration;
/// use tollgate::policy::{Policy, PolicyWatcher};
/// use tollgate::RateLimitLayer;
///
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// let path = "policy.toml";
/// let layer = RateLimitLayer::builder().limits(Policy::from_toml_file(path)?.limits()?).build()?;
///
/// let reloading = layer.clone();
/// let _watcher = PolicyWatcher::new(path, move |policy: Policy| {
///     let event = reloading.reload(policy.limits()?, policy.source_name())?;
///     println!("{event}");
///     Ok(())
/// })
/// .interval(Duration::from_secs(1))
/// .spawn()?;
/// # Ok(()) }
/// # }
/// ```
///
/// The builder methods cannot fail; [`spawn`](Self::spawn) checks the configuration and says
/// what to fix:
///
/// ```
/// # #[cfg(feature = "toml")] {
/// use std::time::Duration;
/// use tollgate::policy::{Policy, PolicyWatcher};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let err = PolicyWatcher::new("policy.toml", |_: Policy| Ok(()))
///     .interval(Duration::ZERO)
///     .spawn()
///     .unwrap_err();
/// assert_eq!(err.field(), "policy_watcher.interval");
/// # }
/// # }
/// ```
pub struct PolicyWatcher {
    path: PathBuf,
    interval: Duration,
    parse: Arc<ParseFn>,
    apply: Arc<ApplyFn>,
    last: Option<String>,
}

/// What one [`PolicyWatcher::check`] did.
#[derive(Debug)]
#[non_exhaustive]
pub enum WatchOutcome {
    /// The file is as last seen.
    Unchanged,
    /// A new version was parsed and applied.
    Applied,
    /// A new version was refused (unreadable, invalid, or refused by `apply`); the old policy
    /// keeps serving.
    Refused(Box<dyn Error + Send + Sync>),
}

impl PolicyWatcher {
    /// Watches the TOML policy file at `path`, handing each new version to `apply`.
    #[cfg(feature = "toml")]
    pub fn new<F>(path: impl AsRef<Path>, apply: F) -> Self
    where
        F: Fn(Policy) -> Result<(), Box<dyn Error + Send + Sync>> + Send + Sync + 'static,
    {
        Self::with_parser(path, |text, name| Policy::from_toml_str(text, name), apply)
    }

    /// Watches the policy file at `path` read by `parse(text, file_name)` (JSON, YAML, ...),
    /// handing each new version to `apply`.
    pub fn with_parser<P, F>(path: impl AsRef<Path>, parse: P, apply: F) -> Self
    where
        P: Fn(&str, &str) -> Result<Policy, PolicyError> + Send + Sync + 'static,
        F: Fn(Policy) -> Result<(), Box<dyn Error + Send + Sync>> + Send + Sync + 'static,
    {
        let path = path.as_ref().to_path_buf();
        let last = std::fs::read_to_string(&path).ok();
        Self {
            path,
            interval: Duration::from_secs(2),
            parse: Arc::new(parse),
            apply: Arc::new(apply),
            last,
        }
    }

    /// How often the file is read (default 2 s). Must not be zero, which
    /// [`spawn`](Self::spawn) reports.
    #[must_use]
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// The configuration is usable: a zero interval would read the file in a busy loop.
    fn validate(&self) -> Result<(), ConfigError> {
        if self.interval.is_zero() {
            return Err(ConfigError::new(
                "policy_watcher.interval",
                "an interval of zero would read the file in a busy loop: pass a positive \
                 duration to PolicyWatcher::interval, e.g. Duration::from_secs(2) (the default)",
            ));
        }
        Ok(())
    }

    /// The file watched.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the file once and applies it if it changed since the last version seen. Errors are
    /// reported with `tracing::error!` and returned.
    pub fn check(&mut self) -> WatchOutcome {
        let name = self.path.display().to_string();
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) => {
                // Not remembered: the file may be mid-replacement, so the next poll reads again;
                // unreadable files are reported at most once per change of the error.
                let error =
                    PolicyError::new(&name, None, "", format!("cannot read the policy file: {e}"));
                tracing::warn!(policy = %name, error = %error, "policy file unreadable; the old policy keeps serving");
                return WatchOutcome::Refused(Box::new(error));
            }
        };
        if self.last.as_deref() == Some(text.as_str()) {
            return WatchOutcome::Unchanged;
        }
        let result = (self.parse)(&text, &name)
            .map_err(|e| Box::new(e) as Box<dyn Error + Send + Sync>)
            .and_then(|policy| (self.apply)(policy));
        self.last = Some(text);
        match result {
            Ok(()) => {
                tracing::info!(policy = %name, "policy file changed; new policy applied");
                WatchOutcome::Applied
            }
            Err(error) => {
                tracing::error!(policy = %name, error = %error, "policy file changed but was refused; the old policy keeps serving");
                WatchOutcome::Refused(error)
            }
        }
    }

    /// Checks the file every interval on a tokio task, until the returned handle is aborted.
    /// Must be called within a tokio runtime.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field and the fix when the configuration cannot work (a
    /// zero [`interval`](Self::interval)); nothing is spawned then.
    pub fn spawn(mut self) -> Result<tokio::task::JoinHandle<()>, ConfigError> {
        self.validate()?;
        Ok(tokio::spawn(async move {
            let mut ticks = tokio::time::interval(self.interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await; // the first tick is immediate: the baseline was just read
            loop {
                ticks.tick().await;
                self.check();
            }
        }))
    }
}

impl fmt::Debug for PolicyWatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyWatcher")
            .field("path", &self.path)
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}
