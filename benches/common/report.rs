//! One bench section's results, written as JSON for the report generator (BENCHMARKS.md).
//!
//! Each bench (`memory`, `service`, `http`, `redis`, `failover`, `hybrid`) builds a [`Section`] from the
//! figures it measured in its run and calls [`Section::write`], which puts it at
//! `target/bench-report/<name>.json` (under `CARGO_TARGET_DIR` when set). The report generator
//! reads every section there and writes BENCHMARKS.md and its SVG plots, so a table or plot is
//! always a copy of what one run measured. Include it with
//! `#[path = "common/report.rs"] mod report;`.
#![allow(dead_code)]

use std::path::PathBuf;

use serde_json::{json, Value};

/// The median over the rounds of `a[i] / b[i]`, where `a` and `b` hold one figure per round (in
/// round order) of two things measured in the same rounds: each round's pair is taken seconds
/// apart, so a round in which the machine ran slow for both counts once, as one ratio. With an
/// even number of rounds, the mean of the middle two.
pub fn median_ratio(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "one figure per round on both sides");
    let mut ratios: Vec<f64> = a.iter().zip(b).map(|(a, b)| a / b).collect();
    ratios.sort_by(f64::total_cmp);
    let n = ratios.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => ratios[n / 2],
        _ => (ratios[n / 2 - 1] + ratios[n / 2]) / 2.0,
    }
}

/// A table: a title, its column headings and rows of cells (already formatted text).
#[derive(Debug, Clone)]
pub struct Table {
    title: String,
    columns: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table titled `title` with these column headings.
    pub fn new(title: impl Into<String>, columns: &[&str]) -> Self {
        Self {
            title: title.into(),
            columns: columns.iter().map(|c| c.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row (one cell per column).
    pub fn row<S: ToString>(&mut self, cells: &[S]) -> &mut Self {
        assert_eq!(cells.len(), self.columns.len(), "one cell per column");
        self.rows
            .push(cells.iter().map(|c| c.to_string()).collect());
        self
    }

    fn to_json(&self) -> Value {
        json!({ "title": self.title, "columns": self.columns, "rows": self.rows })
    }
}

/// A line plot: named series of (x, y) points.
#[derive(Debug, Clone)]
pub struct Plot {
    file: String,
    title: String,
    x_label: String,
    y_label: String,
    log_x: bool,
    series: Vec<(String, Vec<(f64, f64)>)>,
}

impl Plot {
    /// A plot drawn to `docs/benchmarks/<file>` (an `.svg` name).
    pub fn new(file: &str, title: &str, x_label: &str, y_label: &str) -> Self {
        Self {
            file: file.to_string(),
            title: title.to_string(),
            x_label: x_label.to_string(),
            y_label: y_label.to_string(),
            log_x: false,
            series: Vec::new(),
        }
    }

    /// Draws the x axis on a logarithmic scale (key counts, concurrency).
    pub fn log_x(mut self) -> Self {
        self.log_x = true;
        self
    }

    /// Adds a series.
    pub fn series(&mut self, name: &str, points: Vec<(f64, f64)>) -> &mut Self {
        self.series.push((name.to_string(), points));
        self
    }

    fn to_json(&self) -> Value {
        let series: Vec<Value> = self
            .series
            .iter()
            .map(|(name, points)| {
                let points: Vec<[f64; 2]> = points.iter().map(|&(x, y)| [x, y]).collect();
                json!({ "name": name, "points": points })
            })
            .collect();
        json!({
            "file": self.file, "title": self.title, "x_label": self.x_label,
            "y_label": self.y_label, "log_x": self.log_x, "series": series,
        })
    }
}

/// One comparison's ratio for the summary: `ratio` = peer's cost / tollgate's cost (or
/// tollgate's throughput / the peer's), so above 1 means tollgate is ahead.
#[derive(Debug, Clone)]
pub struct Ratio {
    what: String,
    ratio: f64,
    target: f64,
    case: String,
}

/// The results of one bench run.
#[derive(Debug, Clone)]
pub struct Section {
    name: String,
    title: String,
    command: String,
    method: String,
    tables: Vec<Table>,
    plots: Vec<Plot>,
    ratios: Vec<Ratio>,
    notes: Vec<String>,
    parent: Option<String>,
}

impl Section {
    /// A section named `name` (the JSON file's stem and the anchor in BENCHMARKS.md), reproduced
    /// by `command` (e.g. `cargo bench --bench memory`), measured as `method` says (markdown).
    pub fn new(name: &str, title: &str, command: &str, method: &str) -> Self {
        Self {
            name: name.to_string(),
            title: title.to_string(),
            command: command.to_string(),
            method: method.to_string(),
            tables: Vec::new(),
            plots: Vec::new(),
            ratios: Vec::new(),
            notes: Vec::new(),
            parent: None,
        }
    }

    /// Makes this section a subsection of section `parent` (its name) in BENCHMARKS.md.
    pub fn parent(&mut self, parent: &str) -> &mut Self {
        self.parent = Some(parent.to_string());
        self
    }

    /// Adds a table.
    pub fn table(&mut self, table: Table) -> &mut Self {
        self.tables.push(table);
        self
    }

    /// Adds a plot.
    pub fn plot(&mut self, plot: Plot) -> &mut Self {
        self.plots.push(plot);
        self
    }

    /// Records one comparison's ratio against its target (both "above 1 is better" figures),
    /// for `case` (e.g. `1 000 keys, 2 threads`). The report lists the worst per `what`.
    pub fn ratio(&mut self, what: &str, case: &str, ratio: f64, target: f64) -> &mut Self {
        self.ratios.push(Ratio {
            what: what.to_string(),
            ratio,
            target,
            case: case.to_string(),
        });
        self
    }

    /// Adds a line of explanation under the tables (markdown).
    pub fn note(&mut self, note: impl Into<String>) -> &mut Self {
        self.notes.push(note.into());
        self
    }

    /// The directory sections are written to: `bench-report` in the workspace's target
    /// directory (the benches are a member of the crate's workspace, whose root is one level up),
    /// where `examples/bench_report` reads them.
    pub fn dir() -> PathBuf {
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target")));
        target.join("bench-report")
    }

    /// Writes the section to `target/bench-report/<name>.json` and says where.
    pub fn write(&self) {
        let ratios: Vec<Value> = self
            .ratios
            .iter()
            .map(
                |r| json!({ "what": r.what, "case": r.case, "ratio": r.ratio, "target": r.target }),
            )
            .collect();
        let value = json!({
            "name": self.name,
            "title": self.title,
            "command": self.command,
            "method": self.method,
            "tables": self.tables.iter().map(Table::to_json).collect::<Vec<_>>(),
            "plots": self.plots.iter().map(Plot::to_json).collect::<Vec<_>>(),
            "ratios": ratios,
            "notes": self.notes,
            "parent": self.parent,
            "machine": machine(),
        });
        let dir = Self::dir();
        std::fs::create_dir_all(&dir).expect("create target/bench-report");
        let path = dir.join(format!("{}.json", self.name));
        let text = serde_json::to_string_pretty(&value).expect("serialise the section");
        std::fs::write(&path, text).expect("write the section");
        println!("bench section written to {}", path.display());
    }
}

/// The machine this ran on: CPU model, cores, kernel (every figure names it).
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".to_string());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|k| k.trim().to_string())
        .unwrap_or_default();
    format!("{cpu}, {cores} cores, Linux {kernel}")
}
