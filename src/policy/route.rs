//! Route patterns of a policy: `"GET /api/*"`, `"POST /login"`, `"/users/*/keys"`.

use http::Method;

use crate::request::RequestView;

/// One pattern: an optional method and a path of segments.
///
/// Segments match the request's raw path (no query) exactly and case-sensitively, as routers
/// do; `*` matches any one non-empty segment; a trailing `/*` matches everything below the
/// prefix (`/api/*` matches `/api/` and `/api/a/b`, not `/api`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RoutePattern {
    method: Option<Method>,
    segments: Vec<Segment>,
    /// Ends in `/*`: any suffix.
    prefix: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(Box<str>),
    Any,
}

impl RoutePattern {
    /// Parses `[METHOD ]PATH`; the error says what to write instead.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let (method, path) = match text.split_once(' ') {
            Some((method, path)) => (Some(method), path.trim_start()),
            None => (None, text),
        };
        let method = match method {
            None => None,
            Some(m) if m.bytes().all(|b| b.is_ascii_uppercase()) && !m.is_empty() => Some(
                Method::from_bytes(m.as_bytes()).map_err(|_| format!("{m:?} is not a method"))?,
            ),
            Some(m) => {
                return Err(format!(
                    "{text:?}: the method {m:?} must be upper case letters (methods are \
                     case-sensitive), e.g. \"GET /api/*\""
                ))
            }
        };
        if !path.starts_with('/') || path.contains(char::is_whitespace) {
            return Err(format!(
                "{text:?}: write [METHOD ]PATH with a path starting with \"/\", e.g. \"GET /api/*\" or \"/login\""
            ));
        }
        if path.contains('?') {
            return Err(format!(
                "{text:?}: a route is matched against the path only; remove the query"
            ));
        }
        let mut segments: Vec<Segment> = path[1..]
            .split('/')
            .map(|s| match s {
                "*" => Ok(Segment::Any),
                s if s.contains('*') => Err(format!(
                    "{text:?}: `*` must be a whole segment (\"/files/*\"), not part of one ({s:?})"
                )),
                s => Ok(Segment::Literal(s.into())),
            })
            .collect::<Result<_, _>>()?;
        let prefix = path.len() > 1 && path.ends_with("/*");
        if prefix {
            segments.pop();
        }
        Ok(Self {
            method,
            segments,
            prefix,
        })
    }

    /// Whether `req` matches.
    pub(crate) fn matches(&self, req: &RequestView<'_>) -> bool {
        if self.method.as_ref().is_some_and(|m| m != req.method()) {
            return false;
        }
        let path = req.uri().path();
        let mut parts = path.strip_prefix('/').unwrap_or(path).split('/');
        for segment in &self.segments {
            match (segment, parts.next()) {
                (Segment::Any, Some(part)) if !part.is_empty() => {}
                (Segment::Literal(lit), Some(part)) if **lit == *part => {}
                _ => return false,
            }
        }
        match parts.next() {
            None => !self.prefix,
            Some(_) => self.prefix,
        }
    }
}

/// A limit's routes: it applies to a request matching any of them.
#[derive(Debug, Clone)]
pub(crate) struct Routes(pub(crate) Vec<RoutePattern>);

impl Routes {
    pub(crate) fn matches(&self, req: &RequestView<'_>) -> bool {
        self.0.iter().any(|r| r.matches(req))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(pattern: &str, method: &str, path: &str) -> bool {
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .body(())
            .unwrap();
        RoutePattern::parse(pattern)
            .unwrap()
            .matches(&RequestView::new(&req))
    }

    #[test]
    fn methods_segments_and_prefixes() {
        assert!(matches("GET /api/*", "GET", "/api/items"));
        assert!(matches("GET /api/*", "GET", "/api/items/7?x=1"));
        assert!(matches("GET /api/*", "GET", "/api/"));
        assert!(!matches("GET /api/*", "GET", "/api"));
        assert!(!matches("GET /api/*", "POST", "/api/items"));
        assert!(!matches("GET /api/*", "GET", "/apix/items"));
        assert!(matches("/api/*", "DELETE", "/api/items"));
        assert!(matches("POST /login", "POST", "/login"));
        assert!(!matches("POST /login", "POST", "/login/"));
        assert!(!matches("POST /login", "POST", "/Login"));
        assert!(matches("/users/*/keys", "GET", "/users/42/keys"));
        assert!(!matches("/users/*/keys", "GET", "/users//keys"));
        assert!(!matches("/users/*/keys", "GET", "/users/42/keys/1"));
        assert!(matches("/*", "GET", "/anything/at/all"));
        assert!(matches("/", "GET", "/"));
        assert!(!matches("/", "GET", "/x"));
    }

    #[test]
    fn bad_patterns_say_what_to_write() {
        for (bad, hint) in [
            ("get /api", "upper case"),
            ("api/*", "starting with \"/\""),
            ("/api/item*", "whole segment"),
            ("/search?q=1", "query"),
            ("", "starting with"),
        ] {
            let err = RoutePattern::parse(bad).unwrap_err();
            assert!(err.contains(hint), "{bad:?}: {err}");
        }
    }
}
