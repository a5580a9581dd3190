//! Writes BENCHMARKS.md and its plots (docs/benchmarks/*.svg) from the results the benches left
//! in `target/bench-report/*.json` (see benches/common/report.rs). It copies figures, it never
//! measures: run the benches first, or everything at once with `benches/report.sh`. A section
//! without results there that BENCHMARKS.md already holds is kept as it was.
//!
//! ```text
//! cargo run --example bench_report
//! ```

mod markdown;
mod model;
mod plot;

use std::path::{Path, PathBuf};

use model::Section;

const PLOT_DIR: &str = "docs/benchmarks";

fn results_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("bench-report")
}

/// The sections found, in report order: the expected ones first, then any other by name.
fn load(dir: &Path) -> Result<Vec<Section>, String> {
    let mut sections = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(sections),
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    };
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        sections.push(Section::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?);
    }
    let rank = |s: &Section| {
        markdown::EXPECTED
            .iter()
            .position(|(n, _)| *n == s.name)
            .unwrap_or(usize::MAX)
    };
    sections.sort_by(|a, b| rank(a).cmp(&rank(b)).then_with(|| a.name.cmp(&b.name)));
    Ok(sections)
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = results_dir();
    let sections = match load(&dir) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("bench_report: {e}");
            std::process::exit(1);
        }
    };
    let plots = root.join(PLOT_DIR);
    std::fs::create_dir_all(&plots).expect("create docs/benchmarks");
    for s in &sections {
        for p in &s.plots {
            match plot::svg(p) {
                Ok(svg) => {
                    std::fs::write(plots.join(&p.file), svg).expect("write a plot");
                    println!("wrote {PLOT_DIR}/{}", p.file);
                }
                Err(e) => eprintln!("bench_report: section {}: {e}", s.name),
            }
        }
    }
    let previous = std::fs::read_to_string(root.join("BENCHMARKS.md"))
        .map(|doc| markdown::Previous::parse(&doc))
        .unwrap_or_default();
    let doc = markdown::document(&sections, PLOT_DIR, &previous);
    std::fs::write(root.join("BENCHMARKS.md"), doc).expect("write BENCHMARKS.md");
    let names: Vec<&str> = sections.iter().map(|s| s.name.as_str()).collect();
    println!(
        "wrote BENCHMARKS.md from {} ({})",
        dir.display(),
        if names.is_empty() {
            "no sections".to_owned()
        } else {
            names.join(", ")
        }
    );
}
