//! One simulation end to end: scenario and limit in, decisions, table and picture out. The CLI
//! and the lab page both call [`simulate`], so they show the same thing for the same inputs.

use tollgate::Quota;

use super::engine::{
    analyse, decide_memory, describe, promise, rows, same_notes, table_note, Outcome, Scenario,
    Stream,
};
use super::svg;

/// Everything one simulation produced.
#[derive(Debug, Clone)]
pub struct Simulation {
    /// The stream that ran.
    pub stream: Stream,
    /// Each algorithm's decisions, in `AlgorithmKind::ALL` order.
    pub decisions: Vec<Vec<bool>>,
    /// What they amount to.
    pub outcomes: Vec<Outcome>,
    /// The table rows (as printed by the CLI).
    pub rows: Vec<[String; 7]>,
    /// The title of the picture and the table.
    pub title: String,
    /// What the traffic is and what to look for ([`Scenario::caption`]).
    pub caption: String,
    /// What the table's last column counts.
    pub note: String,
    /// Each algorithm's promise explained in one line, in `AlgorithmKind::ALL` order.
    pub promises: Vec<String>,
    /// One sentence per algorithm that decided exactly as an earlier one did.
    pub same: Vec<String>,
}

/// Parses a `--limit` value such as `5/10s` or `10/s burst 20`.
pub fn parse_limit(text: &str) -> Result<Quota, String> {
    text.parse::<Quota>().map_err(|e| format!("--limit: {e}"))
}

/// Runs `scenario` against `quota` through the in-memory store.
pub fn simulate(scenario: &Scenario, quota: &Quota) -> Result<Simulation, String> {
    let stream = scenario.stream(quota)?;
    let decisions = decide_memory(&stream, quota)?;
    Ok(finish(scenario, quota, stream, decisions))
}

/// Analyses decisions made by any store.
pub fn finish(
    scenario: &Scenario,
    quota: &Quota,
    stream: Stream,
    decisions: Vec<Vec<bool>>,
) -> Simulation {
    let outcomes = analyse(&stream, quota, &decisions);
    Simulation {
        rows: rows(&outcomes),
        caption: scenario.caption(quota, &stream),
        note: table_note(quota),
        promises: outcomes
            .iter()
            .map(|o| format!("{}: {}", o.kind, promise(o.kind, quota)))
            .collect(),
        same: same_notes(&outcomes),
        title: format!(
            "scenario {}: {} requests, limit {}",
            scenario.name(),
            stream.requests.len(),
            describe(quota)
        ),
        stream,
        decisions,
        outcomes,
    }
}

impl Simulation {
    /// The picture, as an SVG document.
    pub fn svg(&self, quota: &Quota) -> Result<String, String> {
        svg::render(
            &self.title,
            &self.stream,
            quota,
            &self.decisions,
            &self.outcomes,
        )
    }
}
