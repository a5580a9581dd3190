//! BENCHMARKS.md from the sections: each section's method, tables, plots, notes, machine and
//! command, and a summary of the worst ratio of every comparison against its target. Every
//! figure is copied from a section; nothing here measures or computes a figure beyond picking
//! the worst of the ratios a section recorded. A section with a parent is a subsection of it; an
//! expected section without results that the previous BENCHMARKS.md holds is kept as it was there
//! (its text and its summary rows), so rerunning one bench never blanks the others.

use std::fmt::Write;

use super::model::{Ratio, Section, Table};

/// The sections a full run writes, in report order, and the command that runs each.
pub const EXPECTED: [(&str, &str); 7] = [
    ("memory", "cargo bench --bench memory"),
    ("layer", "cargo bench --bench service"),
    ("http", "cargo bench --bench http"),
    ("shed", "cargo bench --bench shed"),
    ("redis", "cargo bench --features redis --bench redis"),
    ("failover", "cargo bench --features redis --bench failover"),
    ("hybrid", "cargo bench --features redis --bench hybrid"),
];

/// The anchor that starts each section in the document.
const ANCHOR: &str = "\n<a id=\"";

/// What a previous BENCHMARKS.md held per section: its text (from its anchor to the next one)
/// and its rows of the summary table.
#[derive(Debug, Default)]
pub struct Previous {
    blocks: Vec<(String, String)>,
    summary: Vec<(String, String)>,
}

impl Previous {
    /// Splits a document this generator wrote into its sections.
    pub fn parse(doc: &str) -> Self {
        let mut previous = Self::default();
        let starts: Vec<usize> = doc.match_indices(ANCHOR).map(|(i, _)| i + 1).collect();
        for (k, &start) in starts.iter().enumerate() {
            let end = starts.get(k + 1).map_or(doc.len(), |&next| next - 1);
            let block = &doc[start..end];
            if let Some(name) = block["<a id=\"".len()..].split('"').next() {
                previous.blocks.push((name.to_owned(), block.to_owned()));
            }
        }
        let head = starts.first().map_or(doc, |&s| &doc[..s]);
        for line in head.lines().filter(|l| l.starts_with("| [")) {
            if let Some(name) = line
                .split_once("](#")
                .and_then(|(_, rest)| rest.split_once(')'))
                .map(|(name, _)| name)
            {
                previous.summary.push((name.to_owned(), line.to_owned()));
            }
        }
        previous
    }

    fn block(&self, name: &str) -> Option<&str> {
        self.blocks
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, b)| b.as_str())
    }

    fn summary_rows(&self, name: &str) -> impl Iterator<Item = &str> {
        self.summary
            .iter()
            .filter(move |(n, _)| n == name)
            .map(|(_, r)| r.as_str())
    }
}

/// The command that regenerates the whole report.
pub const COMMAND: &str = "benches/report.sh";

/// One cell of a markdown table: pipes escaped, line breaks folded.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace(['\r', '\n'], " ")
}

/// One line of a markdown table.
fn line(cells: impl Iterator<Item = String>) -> String {
    let mut out = String::from("|");
    for c in cells {
        let _ = write!(out, " {c} |");
    }
    out.push('\n');
    out
}

/// A markdown table (heading row, separator, rows). Short rows are padded with empty cells.
pub fn table(columns: &[String], rows: &[Vec<String>]) -> String {
    let mut out = line(columns.iter().map(|c| cell(c)));
    out.push_str(&line(columns.iter().map(|_| "---".to_owned())));
    for row in rows {
        out.push_str(&line(
            (0..columns.len()).map(|i| row.get(i).map_or(String::new(), |c| cell(c))),
        ));
    }
    out
}

/// The worst ratio of one comparison: the one furthest below (or least above) its target,
/// i.e. the smallest ratio / target. A ratio that is not a finite number is the worst of all.
pub fn worst(ratios: &[&Ratio]) -> Option<Ratio> {
    let margin = |r: &Ratio| {
        let m = r.ratio / r.target;
        if m.is_finite() {
            m
        } else {
            f64::NEG_INFINITY
        }
    };
    ratios
        .iter()
        .copied()
        .min_by(|a, b| margin(a).total_cmp(&margin(b)))
        .cloned()
}

/// Whether a ratio meets its target (both "above 1 is better").
pub fn met(r: &Ratio) -> bool {
    r.ratio.is_finite() && r.ratio >= r.target
}

/// One row per (section, comparison): the worst case, its ratio and target, met or not.
pub fn summary_rows(sections: &[Section]) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    for s in sections {
        let mut whats: Vec<&str> = Vec::new();
        for r in &s.ratios {
            if !whats.contains(&r.what.as_str()) {
                whats.push(&r.what);
            }
        }
        for what in whats {
            let of: Vec<&Ratio> = s.ratios.iter().filter(|r| r.what == what).collect();
            let Some(w) = worst(&of) else { continue };
            rows.push(vec![
                format!("[{}](#{})", s.title, s.name),
                what.to_owned(),
                w.case.clone(),
                format!("{:.2}", w.ratio),
                format!("{:.2}", w.target),
                if met(&w) { "met" } else { "**not met**" }.to_owned(),
                of.len().to_string(),
            ]);
        }
    }
    rows
}

fn section_table(t: &Table) -> String {
    let mut out = String::new();
    if !t.title.is_empty() {
        let _ = writeln!(out, "**{}**\n", t.title);
    }
    out.push_str(&table(&t.columns, &t.rows));
    out
}

/// One section as markdown: `##` headings, or `###` for a subsection.
fn render(s: &Section, plot_dir: &str) -> String {
    let mut out = String::new();
    let (h, sub) = if s.parent.is_some() {
        ("###", "####")
    } else {
        ("##", "###")
    };
    let _ = write!(out, "\n<a id=\"{}\"></a>\n{h} {}\n\n", s.name, s.title);
    let _ = writeln!(out, "- Command: `{}`", s.command);
    let _ = writeln!(out, "- Machine: {}\n", s.machine);
    let _ = write!(out, "{sub} Method\n\n");
    out.push_str(s.method.trim_end());
    let _ = write!(out, "\n\n{sub} Results\n\n");
    for t in &s.tables {
        out.push_str(&section_table(t));
        out.push('\n');
    }
    for p in &s.plots {
        let _ = writeln!(out, "![{}]({plot_dir}/{})\n", p.title, p.file);
    }
    if !s.ratios.is_empty() {
        let rows: Vec<Vec<String>> = s
            .ratios
            .iter()
            .map(|r| {
                vec![
                    r.what.clone(),
                    r.case.clone(),
                    format!("{:.2}", r.ratio),
                    format!("{:.2}", r.target),
                    if met(r) { "met" } else { "**not met**" }.to_owned(),
                ]
            })
            .collect();
        let columns = ["Comparison", "Case", "Ratio", "Target", ""].map(String::from);
        out.push_str("**Ratios**\n\n");
        out.push_str(&table(&columns, &rows));
        out.push('\n');
    }
    for n in &s.notes {
        let _ = writeln!(out, "- {}", n.trim_end());
    }
    out
}

/// What the document shows for one section name.
enum Part<'a> {
    Measured(&'a Section),
    Kept(&'a str),
}

/// The whole document. `plot_dir` is where the SVGs are, relative to BENCHMARKS.md; `previous`
/// is what BENCHMARKS.md held before, whose sections without results here are kept.
pub fn document(sections: &[Section], plot_dir: &str, previous: &Previous) -> String {
    let mut parts: Vec<(&str, Part)> = Vec::new();
    for (name, _) in EXPECTED {
        if let Some(s) = sections.iter().find(|s| s.name == name) {
            parts.push((name, Part::Measured(s)));
        } else if let Some(block) = previous.block(name) {
            parts.push((name, Part::Kept(block)));
        }
    }
    for s in sections {
        if !EXPECTED.iter().any(|(n, _)| *n == s.name) {
            parts.push((&s.name, Part::Measured(s)));
        }
    }
    let mut out = String::new();
    out.push_str("# Benchmarks\n\n");
    let _ = writeln!(
        out,
        "Generated from the benches' own results (`target/bench-report/*.json`) by \
         `examples/bench_report`; do not edit by hand. To reproduce every figure below, run \
         from the repository root:\n\n```sh\n{COMMAND}\n```\n\n\
         It runs each bench in turn, then writes this file and the plots in `{plot_dir}/`. \
         `{COMMAND} NAME...` reruns only the named benches and keeps the others' results; \
         `cargo run --example bench_report` only rewrites this file from the results there. \
         Each section names its own command and the machine it ran on. Every comparison runs the \
         peers side by side in the same process and run, alternating rounds, and reports medians."
    );
    out.push_str("\n## Summary: the worst ratio of each comparison\n\n");
    out.push_str(
        "A ratio above 1 means tollgate is ahead (the peer's cost / tollgate's, or tollgate's \
         throughput / the peer's). Each row is the worst case the section measured (the smallest \
         ratio against its target) out of the cases counted in the last column.\n\n",
    );
    let mut rows: Vec<String> = Vec::new();
    for (name, part) in &parts {
        match part {
            Part::Measured(s) => rows.extend(
                summary_rows(std::slice::from_ref(*s))
                    .iter()
                    .map(|r| line(r.iter().map(|c| cell(c)))),
            ),
            Part::Kept(_) => rows.extend(previous.summary_rows(name).map(|r| format!("{r}\n"))),
        }
    }
    if rows.is_empty() {
        out.push_str("No section recorded a ratio.\n");
    } else {
        let columns = [
            "Section",
            "Comparison",
            "Worst case",
            "Ratio",
            "Target",
            "",
            "Cases",
        ]
        .map(String::from);
        out.push_str(&table(&columns, &[]));
        out.extend(rows);
    }
    let missing: Vec<&(&str, &str)> = EXPECTED
        .iter()
        .filter(|(name, _)| !parts.iter().any(|(n, _)| n == name))
        .collect();
    if !missing.is_empty() {
        out.push_str("\n**Not run** (no results in this report):\n\n");
        for (name, command) in missing {
            let _ = writeln!(out, "- `{name}`: `{command}`");
        }
    }
    let kept: Vec<String> = parts
        .iter()
        .filter(|(_, p)| matches!(p, Part::Kept(_)))
        .map(|(n, _)| format!("`{n}`"))
        .collect();
    if !kept.is_empty() {
        let _ = writeln!(
            out,
            "\n**Kept from the previous report** (not rerun for this one): {}.",
            kept.join(", ")
        );
    }
    for (_, part) in &parts {
        match part {
            Part::Measured(s) => out.push_str(&render(s, plot_dir)),
            Part::Kept(block) => {
                out.push('\n');
                out.push_str(block);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ratio(what: &str, case: &str, ratio: f64, target: f64) -> Ratio {
        Ratio {
            what: what.into(),
            case: case.into(),
            ratio,
            target,
        }
    }

    fn section(name: &str, ratios: Vec<Ratio>) -> Section {
        Section {
            name: name.into(),
            title: format!("The {name} bench"),
            command: format!("cargo bench --bench {name}"),
            method: "Alternating rounds.".into(),
            tables: vec![Table {
                title: "Req/s".into(),
                columns: vec!["server".into(), "req/s".into()],
                rows: vec![vec!["a|b".into(), "1 000".into()], vec!["short".into()]],
            }],
            plots: vec![],
            ratios,
            notes: vec!["a note".into()],
            machine: "test CPU, 2 cores".into(),
            parent: None,
        }
    }

    #[test]
    fn tables_escape_pipes_and_pad_short_rows() {
        let t = table(
            &["a".into(), "b".into()],
            &[vec!["x|y".into(), "line\nbreak".into()], vec!["z".into()]],
        );
        assert_eq!(
            t,
            "| a | b |\n| --- | --- |\n| x\\|y | line break |\n| z |  |\n"
        );
    }

    #[test]
    fn the_worst_is_the_smallest_ratio_against_its_target() {
        let a = ratio("rps", "64", 1.2, 1.0); // margin 1.2
        let b = ratio("rps", "256", 1.6, 1.5); // margin 1.07: worse although its ratio is higher
        let c = ratio("rps", "1", 1.1, 1.0); // margin 1.1
        assert_eq!(worst(&[&a, &b, &c]).unwrap().case, "256");
        let nan = ratio("rps", "broken", f64::NAN, 1.0);
        assert_eq!(worst(&[&a, &nan, &b]).unwrap().case, "broken");
        assert!(worst(&[]).is_none());
        assert!(met(&a) && met(&b));
        assert!(!met(&ratio("x", "y", 0.96, 0.97)));
        assert!(!met(&nan));
        assert!(
            met(&ratio("x", "y", 0.97, 0.97)),
            "equal to the target meets it"
        );
    }

    #[test]
    fn the_summary_has_one_row_per_comparison_with_its_worst_case() {
        let s = section(
            "http",
            vec![
                ratio("tollgate / plain req/s", "round 1", 0.99, 0.97),
                ratio("tollgate / plain req/s", "round 2", 0.95, 0.97),
                ratio("latency", "p99", 1.3, 1.0),
            ],
        );
        let rows = summary_rows(&[s]);
        assert_eq!(rows.len(), 2);
        assert_eq!(
            rows[0],
            [
                "[The http bench](#http)",
                "tollgate / plain req/s",
                "round 2",
                "0.95",
                "0.97",
                "**not met**",
                "2"
            ]
        );
        assert_eq!(rows[1][2..6], ["p99", "1.30", "1.00", "met"]);
    }

    #[test]
    fn the_document_lists_missing_sections_and_copies_each_section() {
        let doc = document(
            &[section("http", vec![ratio("r", "c", 1.0, 0.97)])],
            "docs/benchmarks",
            &Previous::default(),
        );
        assert!(doc.contains("```sh\nbenches/report.sh\n```"));
        assert!(doc.contains("- `memory`: `cargo bench --bench memory`"));
        assert!(doc.contains("- `redis`: `cargo bench --features redis --bench redis`"));
        assert!(!doc.contains("- `http`: "), "http ran");
        assert!(doc.contains("## The http bench"));
        assert!(doc.contains("- Machine: test CPU, 2 cores"));
        assert!(doc.contains("| a\\|b | 1 000 |"));
        assert!(doc.contains("- a note"));
    }

    #[test]
    fn a_section_with_a_parent_is_a_subsection_after_it() {
        let mut failover = section("failover", vec![]);
        failover.parent = Some("redis".into());
        let doc = document(
            &[
                failover,
                section("redis", vec![]),
                section("hybrid", vec![]),
            ],
            "docs/benchmarks",
            &Previous::default(),
        );
        let at = |s: &str| doc.find(s).unwrap_or_else(|| panic!("{s} missing"));
        assert!(at("## The redis bench") < at("### The failover bench"));
        assert!(at("### The failover bench") < at("#### Method"));
        assert!(at("#### Results") < at("## The hybrid bench"));
        assert!(!doc.contains("- `failover`: "), "failover ran");
    }

    #[test]
    fn rerunning_one_bench_keeps_the_others_sections_as_they_were() {
        let dir = "docs/benchmarks";
        let memory = section("memory", vec![ratio("m", "c", 2.0, 1.0)]);
        let http = section("http", vec![ratio("h", "c", 1.0, 0.97)]);
        let full = document(&[memory, http.clone()], dir, &Previous::default());
        let rerun = document(&[http], dir, &Previous::parse(&full));
        let kept = "\n**Kept from the previous report** (not rerun for this one): `memory`.\n";
        assert!(rerun.contains(kept), "{rerun}");
        assert_eq!(
            rerun.replace(kept, ""),
            full,
            "the memory section and its summary row kept"
        );
        assert!(!rerun.contains("- `memory`: "), "kept, not missing");
        // With results for a section, the previous text of it is not used.
        let mut newer = section("memory", vec![ratio("m", "c", 3.0, 1.0)]);
        newer.machine = "newer CPU".into();
        let doc = document(&[newer], dir, &Previous::parse(&full));
        assert!(doc.contains("newer CPU") && !doc.contains("| m | c | 2.00 |"));
        assert!(doc.contains("Kept from the previous report** (not rerun for this one): `http`."));
    }

    #[test]
    fn sections_round_trip_through_the_benches_json() {
        let json = r#"{"name":"redis","title":"Redis","command":"cargo bench","method":"m",
            "tables":[{"title":"t","columns":["a"],"rows":[["1"]]}],
            "plots":[{"file":"redis.svg","title":"p","x_label":"x","y_label":"y","log_x":true,
                      "series":[{"name":"s","points":[[1.0,2.0],[64.0,3.5]]}]}],
            "ratios":[{"what":"w","case":"c","ratio":null,"target":1.0}],
            "notes":["n"],"machine":"m1","parent":"redis"}"#;
        let s = Section::parse(json).unwrap();
        assert_eq!(s.parent.as_deref(), Some("redis"));
        assert_eq!(s.plots[0].series[0].1, [(1.0, 2.0), (64.0, 3.5)]);
        assert!(s.plots[0].log_x);
        assert!(
            s.ratios[0].ratio.is_nan(),
            "null (NaN in the bench) reads as NaN"
        );
        assert_eq!(s.tables[0].rows, [["1"]]);
        assert!(Section::parse(r#"{"name":"x"}"#).is_err());
        assert!(Section::parse("not json").is_err());
    }
}
