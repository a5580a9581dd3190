//! Small text grammars of a policy: windows, durations, statuses, failure policies.

use std::time::Duration;

use http::{Method, StatusCode};

use crate::quota::Quota;
use crate::store::FailurePolicy;

/// `"10/s; 1000/h"`: one quota per window, sorted by period; periods must differ.
pub(crate) fn windows(text: &str) -> Result<Vec<Quota>, String> {
    let mut quotas = text
        .split(';')
        .map(|part| {
            part.trim()
                .parse::<Quota>()
                .map_err(|e| e.message().to_owned())
        })
        .collect::<Result<Vec<_>, _>>()?;
    quotas.sort_by_key(|q| q.period());
    if let Some(pair) = quotas.windows(2).find(|w| w[0].period() == w[1].period()) {
        return Err(format!(
            "{text:?} has two windows of the same period ({} and {}); give each window its own period",
            pair[0], pair[1]
        ));
    }
    Ok(quotas)
}

/// The window's period as a name suffix: `"s"`, `"min"`, `"15min"`, `"d"`.
pub(crate) fn period_suffix(quota: &Quota) -> String {
    let text = Quota::per(quota.period(), 1).to_string();
    text.trim_start_matches("1/").to_owned()
}

/// `"5s"`, `"500ms"`, `"1min"`: the quota grammar's units.
pub(crate) fn duration(text: &str) -> Result<Duration, String> {
    format!("1/{text}")
        .parse::<Quota>()
        .map(|q| q.period())
        .map_err(|_| format!("cannot parse the duration {text:?}: write a number and a unit, e.g. \"5s\" or \"500ms\""))
}

/// `"open"`, `"closed"`, `"closed retry 5s"`, `"local share 0.5"`.
pub(crate) fn failure_policy(text: &str) -> Result<FailurePolicy, String> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let hint = "write \"open\", \"closed\", \"closed retry 5s\" or \"local share 0.5\"";
    match words.as_slice() {
        ["open"] => Ok(FailurePolicy::Open),
        ["closed"] => Ok(FailurePolicy::Closed {
            retry_after: Duration::from_secs(1),
        }),
        ["closed", "retry", after] => Ok(FailurePolicy::Closed {
            retry_after: duration(after)?,
        }),
        ["local", "share", share] => match share.parse::<f64>() {
            Ok(s) if s > 0.0 && s <= 1.0 => Ok(FailurePolicy::Local { share: s }),
            _ => Err(format!(
                "the share {share:?} must be a number above 0 and at most 1 (the fraction of the quota each instance may spend while the store is down)"
            )),
        },
        ["local"] => Err(format!("\"local\" needs a share: {hint}")),
        _ => Err(format!("cannot parse {text:?}: {hint}")),
    }
}

/// A refusal status: 4xx or 5xx.
pub(crate) fn refusal_status(n: u64) -> Result<StatusCode, String> {
    match u16::try_from(n)
        .ok()
        .and_then(|n| StatusCode::from_u16(n).ok())
    {
        Some(s) if s.is_client_error() || s.is_server_error() => Ok(s),
        _ => Err(format!(
            "{n} is not a refusal status: use a 4xx or 5xx status such as 401"
        )),
    }
}

/// One entry of a status list: `401`, `"401"` or a class `"5xx"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StatusMatch {
    Exact(u16),
    Class(u16),
}

impl StatusMatch {
    pub(crate) fn parse_number(n: u64) -> Result<Self, String> {
        match u16::try_from(n) {
            Ok(n @ 100..=599) => Ok(StatusMatch::Exact(n)),
            _ => Err(format!("{n} is not an HTTP status (100 to 599)")),
        }
    }

    pub(crate) fn parse_text(text: &str) -> Result<Self, String> {
        let t = text.trim();
        if let Some(class) = t.strip_suffix("xx").or_else(|| t.strip_suffix("XX"))
            && let Ok(c @ 1..=5) = class.parse::<u16>()
        {
            return Ok(StatusMatch::Class(c));
        }
        match t.parse::<u64>() {
            Ok(n) => Self::parse_number(n),
            Err(_) => Err(format!(
                "cannot parse the status {text:?}: write a status (401) or a class (\"5xx\")"
            )),
        }
    }

    pub(crate) fn matches(self, status: StatusCode) -> bool {
        match self {
            StatusMatch::Exact(n) => status.as_u16() == n,
            StatusMatch::Class(c) => status.as_u16() / 100 == c,
        }
    }
}

/// A `costs` entry: `"POST /upload"`, `"/search"` or `"DELETE"`.
pub(crate) enum CostEntry {
    Route(String),
    Method(Method),
    MethodRoute(Method, String),
}

pub(crate) fn cost_entry(text: &str) -> Result<CostEntry, String> {
    let method = |m: &str| -> Result<Method, String> {
        if m.is_empty() || !m.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(format!(
                "{text:?}: write \"METHOD /route\", \"/route\" or \"METHOD\" (methods in upper case)"
            ));
        }
        Method::from_bytes(m.as_bytes()).map_err(|_| format!("{m:?} is not a method"))
    };
    let text = text.trim();
    match text.split_once(' ') {
        Some((m, route)) if route.trim_start().starts_with('/') => Ok(CostEntry::MethodRoute(
            method(m)?,
            route.trim_start().to_owned(),
        )),
        None if text.starts_with('/') => Ok(CostEntry::Route(text.to_owned())),
        None => Ok(CostEntry::Method(method(text)?)),
        Some(_) => Err(format!(
            "{text:?}: write \"METHOD /route\", \"/route\" or \"METHOD\""
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_and_suffixes() {
        let w = windows("1000/h; 10/s;10000/d").unwrap();
        assert_eq!(
            w,
            vec![
                Quota::per_second(10),
                Quota::per_hour(1000),
                Quota::per_day(10000)
            ]
        );
        let names: Vec<String> = w.iter().map(period_suffix).collect();
        assert_eq!(names, ["s", "h", "d"]);
        assert_eq!(period_suffix(&"5/15min".parse().unwrap()), "15min");
        assert!(windows("10/s; 20/s").unwrap_err().contains("same period"));
        assert!(windows("10/s;").is_err());
        assert_eq!(
            windows("10/s burst 50").unwrap(),
            vec![Quota::per_second(10).burst(50)]
        );
    }

    #[test]
    fn failure_policies() {
        assert_eq!(failure_policy("open"), Ok(FailurePolicy::Open));
        assert_eq!(
            failure_policy("closed retry 500ms"),
            Ok(FailurePolicy::Closed {
                retry_after: Duration::from_millis(500)
            })
        );
        assert_eq!(
            failure_policy("closed"),
            Ok(FailurePolicy::Closed {
                retry_after: Duration::from_secs(1)
            })
        );
        assert_eq!(
            failure_policy("local share 0.25"),
            Ok(FailurePolicy::Local { share: 0.25 })
        );
        assert!(failure_policy("local share 2")
            .unwrap_err()
            .contains("at most 1"));
        assert!(failure_policy("local")
            .unwrap_err()
            .contains("needs a share"));
        assert!(failure_policy("closed retry soon")
            .unwrap_err()
            .contains("duration"));
        assert!(failure_policy("fail").unwrap_err().contains("\"open\""));
    }

    #[test]
    fn statuses() {
        let five = StatusMatch::parse_text("5xx").unwrap();
        assert!(five.matches(StatusCode::BAD_GATEWAY));
        assert!(!five.matches(StatusCode::UNAUTHORIZED));
        assert!(StatusMatch::parse_number(401)
            .unwrap()
            .matches(StatusCode::UNAUTHORIZED));
        assert!(StatusMatch::parse_text("401")
            .unwrap()
            .matches(StatusCode::UNAUTHORIZED));
        assert!(StatusMatch::parse_text("6xx").is_err());
        assert!(StatusMatch::parse_number(99).is_err());
        assert!(refusal_status(200).is_err());
        assert_eq!(refusal_status(401), Ok(StatusCode::UNAUTHORIZED));
    }
}
