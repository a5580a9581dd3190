//! Reading a [`Policy`] from TOML, with line and column in errors.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::compile::{path_text, Seg};
use super::{Policy, PolicyError};

impl Policy {
    /// Reads a policy from TOML `text`; `source_name` (a file name) is named in errors.
    ///
    /// Syntax errors, unknown fields and wrong types are reported here; the values themselves
    /// (quotas, routes, keys) by [`Policy::limits`]. Both carry the line and column.
    ///
    /// ```
    /// use tollgate::policy::Policy;
    ///
    /// let err = Policy::from_toml_str("[[limit]]\nname = \"api\"\nqouta = \"1/s\"\n", "p.toml").unwrap_err();
    /// assert_eq!(err.line_column(), Some((3, 1)));
    /// assert_eq!(err.limit(), Some("api"));
    /// assert_eq!(err.field(), "qouta");
    /// assert!(err.message().contains("unknown field"), "{err}");
    /// ```
    pub fn from_toml_str(text: &str, source_name: impl AsRef<str>) -> Result<Self, PolicyError> {
        let name = source_name.as_ref();
        match toml::from_str::<Policy>(text) {
            Ok(policy) => {
                let mut policy = policy.with_source_name(name);
                policy.source.toml = Some(Arc::from(text));
                Ok(policy)
            }
            Err(e) => Err(deserialize_error(text, name, &e)),
        }
    }

    /// Reads a policy from the TOML file at `path`, named by its path in errors.
    pub fn from_toml_file(path: impl AsRef<Path>) -> Result<Self, PolicyError> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| {
            PolicyError::new(&name, None, "", format!("cannot read the policy file: {e}"))
        })?;
        Self::from_toml_str(&text, name)
    }
}

/// 1-based line and column (in characters) of byte `offset`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let mut end = offset;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let before = &text[..end];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

fn deserialize_error(text: &str, name: &str, e: &toml::de::Error) -> PolicyError {
    let message = friendlier(e.message());
    let Some(span) = e.span() else {
        return PolicyError::new(name, None, "", message);
    };
    let location = Some(line_column(text, span.start));
    let Ok(root) = DeTable::parse(text) else {
        // A syntax error: no structure to name a limit or field in.
        return PolicyError::new(name, None, "", message).at(location);
    };
    let mut path = Vec::new();
    deepest_table(root.get_ref(), span.start, &mut path);
    let (limit, field) = match path.as_slice() {
        [Seg::Key(k), Seg::Index(i), rest @ ..] if k == "limit" || k == "limits" => {
            let name = limit_table(root.get_ref(), k, *i)
                .and_then(|t| value(t, "name"))
                .and_then(|v| v.get_ref().as_str().map(str::to_owned))
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| format!("#{}", i + 1));
            (Some(name), path_text(rest))
        }
        _ => (None, path_text(&path)),
    };
    PolicyError::new(name, limit, field, message).at(location)
}

/// Serde's messages for the untagged enums, rewritten to say what to write.
fn friendlier(message: &str) -> String {
    let message = message.trim();
    if message.contains("untagged enum KeyDoc") {
        return String::from("write key = \"peer_ip\", \"global\", \"principal\", { header = \"x-api-key\" } or { client_ip = { trusted_proxies = [\"10.0.0.0/8\"] } }");
    }
    if message.contains("untagged enum PlanDoc") {
        return String::from("write a plan as \"5/min\" or { quota = \"5/min\", link = \"https://example.com/upgrade\" }");
    }
    if message.contains("untagged enum StatusOrWord") {
        return String::from(
            "write a status such as 401, or a word such as \"skip\" or \"default\"",
        );
    }
    message.to_owned()
}

fn value<'a, 'i>(table: &'a DeTable<'i>, key: &str) -> Option<&'a Spanned<DeValue<'i>>> {
    table
        .iter()
        .find(|(k, _)| k.get_ref() == key)
        .map(|(_, v)| v)
}

fn limit_table<'a, 'i>(root: &'a DeTable<'i>, key: &str, i: usize) -> Option<&'a DeTable<'i>> {
    value(root, key)?
        .get_ref()
        .as_array()?
        .get(i)?
        .get_ref()
        .as_table()
}

fn contains(span: &Range<usize>, offset: usize) -> bool {
    span.start <= offset && offset < span.end.max(span.start + 1)
}

/// Whether `value` or anything inside it spans `offset` (dotted keys make tables whose own
/// span does not cover their members).
fn holds(value: &Spanned<DeValue<'_>>, offset: usize) -> bool {
    contains(&value.span(), offset)
        || match value.get_ref() {
            DeValue::Table(t) => t
                .iter()
                .any(|(k, v)| contains(&k.span(), offset) || holds(v, offset)),
            _ => false,
        }
}

/// The path of the deepest key whose key or value holds `offset`.
fn deepest_table(table: &DeTable<'_>, offset: usize, path: &mut Vec<Seg>) {
    for (k, v) in table.iter() {
        if contains(&k.span(), offset) || holds(v, offset) {
            path.push(Seg::Key(k.get_ref().to_string()));
            deepest_value(v, offset, path);
            return;
        }
    }
    // `[[limit]]` tables: their span may be the header only; pick the one whose keys start
    // last before `offset`.
    for (k, v) in table.iter() {
        if let Some(array) = v.get_ref().as_array() {
            let start = |t: &Spanned<DeValue<'_>>| {
                t.get_ref()
                    .as_table()
                    .and_then(|t| t.iter().map(|(k, _)| k.span().start).min())
                    .unwrap_or(t.span().start)
            };
            let found = array
                .iter()
                .enumerate()
                .rfind(|(_, t)| t.get_ref().is_table() && start(t) <= offset);
            if let Some((i, t)) = found {
                path.push(Seg::Key(k.get_ref().to_string()));
                path.push(Seg::Index(i));
                if let Some(t) = t.get_ref().as_table() {
                    deepest_table(t, offset, path);
                }
                return;
            }
        }
    }
}

fn deepest_value(value: &Spanned<DeValue<'_>>, offset: usize, path: &mut Vec<Seg>) {
    match value.get_ref() {
        DeValue::Table(t) => deepest_table(t, offset, path),
        DeValue::Array(a) => {
            if let Some((i, v)) = a
                .iter()
                .enumerate()
                .find(|(_, v)| contains(&v.span(), offset))
            {
                path.push(Seg::Index(i));
                deepest_value(v, offset, path);
            } else {
                // Tables declared with `[[..]]` headers: find the one whose keys hold `offset`.
                for (i, v) in a.iter().enumerate() {
                    if let Some(t) = v.get_ref().as_table() {
                        let start = t.iter().map(|(k, _)| k.span().start).min();
                        let end = t.iter().map(|(_, v)| v.span().end).max();
                        if let (Some(s), Some(e)) = (start, end)
                            && s <= offset
                            && offset < e
                        {
                            path.push(Seg::Index(i));
                            deepest_table(t, offset, path);
                            return;
                        }
                    }
                }
            }
        }
        _ => {}
    }
}

/// The line and column of the value at `path` in limit `limit`, or of the deepest part of the
/// path that exists (a missing field points at its limit).
pub(crate) fn locate(text: &str, limit: usize, path: &[Seg]) -> Option<(usize, usize)> {
    let root = DeTable::parse(text).ok()?;
    let (key, _) = root
        .get_ref()
        .iter()
        .find(|(k, _)| *k.get_ref() == "limit" || *k.get_ref() == "limits")?;
    let table = limit_table(root.get_ref(), key.get_ref(), limit)?;
    let mut span = table
        .iter()
        .map(|(k, _)| k.span())
        .min_by_key(|s| s.start)?;
    let mut current: Option<&Spanned<DeValue<'_>>> = None;
    for seg in path {
        let next = match (seg, current.map(|v| v.get_ref())) {
            (Seg::Key(k), None) => value(table, k),
            (Seg::Key(k), Some(DeValue::Table(t))) => value(t, k),
            (Seg::Index(i), Some(DeValue::Array(a))) => a.get(*i),
            _ => None,
        };
        match next {
            Some(v) => {
                span = v.span();
                current = Some(v);
            }
            None => break,
        }
    }
    Some(line_column(text, span.start))
}
