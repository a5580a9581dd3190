//! The sections the benches wrote (benches/common/report.rs), read back from their JSON.

use serde_json::Value;

/// A table of already formatted cells.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    pub title: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

/// A line plot: named series of (x, y) points.
#[derive(Debug, Clone, PartialEq)]
pub struct Plot {
    pub file: String,
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log_x: bool,
    pub series: Vec<(String, Vec<(f64, f64)>)>,
}

/// One comparison's ratio against its target (above 1 is better for both).
#[derive(Debug, Clone, PartialEq)]
pub struct Ratio {
    pub what: String,
    pub case: String,
    pub ratio: f64,
    pub target: f64,
}

/// One bench's results.
#[derive(Debug, Clone, PartialEq)]
pub struct Section {
    pub name: String,
    pub title: String,
    pub command: String,
    pub method: String,
    pub tables: Vec<Table>,
    pub plots: Vec<Plot>,
    pub ratios: Vec<Ratio>,
    pub notes: Vec<String>,
    pub machine: String,
    /// The section this one is a subsection of (its name), if any.
    pub parent: Option<String>,
}

fn text(v: &Value, field: &str) -> Result<String, String> {
    v.get(field)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| format!("missing text field `{field}`"))
}

fn list<'a>(v: &'a Value, field: &str) -> Result<&'a [Value], String> {
    match v.get(field) {
        None => Ok(&[]),
        Some(Value::Array(a)) => Ok(a),
        Some(_) => Err(format!("`{field}` is not a list")),
    }
}

fn texts(v: &Value, what: &str) -> Result<Vec<String>, String> {
    v.as_array()
        .ok_or_else(|| format!("`{what}` is not a list"))?
        .iter()
        .map(|c| {
            c.as_str()
                .map(str::to_owned)
                .ok_or_else(|| format!("`{what}` holds a non-text cell"))
        })
        .collect()
}

fn number(v: &Value, field: &str) -> Result<f64, String> {
    // serde_json writes NaN and infinities as null: read them back as NaN (never "met").
    match v.get(field) {
        Some(Value::Null) => Ok(f64::NAN),
        Some(n) => n
            .as_f64()
            .ok_or_else(|| format!("`{field}` is not a number")),
        None => Err(format!("missing number `{field}`")),
    }
}

impl Section {
    /// Parses one section file's JSON.
    pub fn parse(json: &str) -> Result<Self, String> {
        let v: Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
        let tables = list(&v, "tables")?
            .iter()
            .map(|t| {
                let columns = texts(t.get("columns").unwrap_or(&Value::Null), "columns")?;
                let rows = list(t, "rows")?
                    .iter()
                    .map(|r| texts(r, "rows"))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Table {
                    title: text(t, "title")?,
                    columns,
                    rows,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let plots = list(&v, "plots")?
            .iter()
            .map(|p| {
                let series = list(p, "series")?
                    .iter()
                    .map(|s| {
                        let points = list(s, "points")?
                            .iter()
                            .map(|pt| match pt.as_array().map(Vec::as_slice) {
                                Some([x, y]) => match (x.as_f64(), y.as_f64()) {
                                    (Some(x), Some(y)) => Ok((x, y)),
                                    _ => Err("a point is not two numbers".to_owned()),
                                },
                                _ => Err("a point is not [x, y]".to_owned()),
                            })
                            .collect::<Result<Vec<_>, String>>()?;
                        Ok((text(s, "name")?, points))
                    })
                    .collect::<Result<Vec<_>, String>>()?;
                Ok(Plot {
                    file: text(p, "file")?,
                    title: text(p, "title")?,
                    x_label: text(p, "x_label")?,
                    y_label: text(p, "y_label")?,
                    log_x: p.get("log_x").and_then(Value::as_bool).unwrap_or(false),
                    series,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let ratios = list(&v, "ratios")?
            .iter()
            .map(|r| {
                Ok(Ratio {
                    what: text(r, "what")?,
                    case: text(r, "case")?,
                    ratio: number(r, "ratio")?,
                    target: number(r, "target")?,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let notes = list(&v, "notes")?
            .iter()
            .map(|n| n.as_str().map(str::to_owned).ok_or("a note is not text"))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Section {
            name: text(&v, "name")?,
            title: text(&v, "title")?,
            command: text(&v, "command")?,
            method: text(&v, "method")?,
            tables,
            plots,
            ratios,
            notes,
            machine: text(&v, "machine").unwrap_or_else(|_| "not recorded".to_owned()),
            parent: v.get("parent").and_then(Value::as_str).map(str::to_owned),
        })
    }
}
