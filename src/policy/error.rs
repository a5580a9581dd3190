//! [`PolicyError`]: what is wrong with a policy, and where.

use std::fmt;

/// A policy that cannot be read or compiled: names the file, the limit and the field, and for
/// TOML the line and column.
///
/// ```
/// # #[cfg(feature = "toml")] {
/// use tollgate::policy::Policy;
///
/// let text = r#"
/// [[limit]]
/// name = "api"
/// key = "peer_ip"
/// quota = "100/mn"
/// "#;
/// let err = Policy::from_toml_str(text, "policy.toml").unwrap().limits().unwrap_err();
/// assert_eq!(err.source_name(), "policy.toml");
/// assert_eq!(err.limit(), Some("api"));
/// assert_eq!(err.field(), "quota");
/// assert_eq!(err.line_column(), Some((5, 9)));
/// assert!(err.to_string().starts_with("policy.toml:5:9: limit \"api\": quota: "), "{err}");
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError {
    source_name: String,
    limit: Option<String>,
    field: String,
    message: String,
    location: Option<(usize, usize)>,
}

impl PolicyError {
    pub(crate) fn new(
        source_name: impl Into<String>,
        limit: Option<String>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            source_name: source_name.into(),
            limit,
            field: field.into(),
            message: message.into(),
            location: None,
        }
    }

    #[cfg_attr(not(feature = "toml"), allow(dead_code))]
    pub(crate) fn at(mut self, location: Option<(usize, usize)>) -> Self {
        self.location = location;
        self
    }

    /// The policy's source: the file name, or the name given with the text.
    pub fn source_name(&self) -> &str {
        &self.source_name
    }

    /// The limit at fault, when the error is about one (by name, or `#N` for the N-th limit when
    /// it has no readable name).
    pub fn limit(&self) -> Option<&str> {
        self.limit.as_deref()
    }

    /// The field at fault, as a dotted path inside the limit (`plans.free.quota`), or inside the
    /// policy when no limit is named. Empty when the text could not be parsed at all.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// What is wrong and how to fix it.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The 1-based line and column of the fault, when the policy was read from TOML text.
    pub fn line_column(&self) -> Option<(usize, usize)> {
        self.location
    }
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source_name)?;
        if let Some((line, column)) = self.location {
            write!(f, ":{line}:{column}")?;
        }
        f.write_str(": ")?;
        if let Some(limit) = &self.limit {
            write!(f, "limit {limit:?}: ")?;
        }
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for PolicyError {}
