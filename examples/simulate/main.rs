//! The algorithm simulator: one request stream through all six limiters, with the real code.
//!
//! ```sh
//! cargo run --example simulate -- --scenario edge --out edge.svg
//! cargo run --example simulate -- --scenario burst --limit "10/s burst 20"
//! cargo run --example simulate -- --scenario replay requests.log --limit 100/min
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --features redis --example simulate -- --scenario edge --store redis
//! cargo run --example simulate -- --serve            # lab page on 127.0.0.1:$PORT (default 3000)
//! ```
//!
//! Every decision comes from tollgate's own store (`MemoryStore`, or `RedisBackend` with
//! `--store redis`) on a manual clock set to each request's time. The table gives, per
//! algorithm, the requests offered and admitted, the most admitted in any window of the limit's
//! period (exact, over every window position), the bound the docs promise, whether it held, and
//! how many decisions an exact count of the last period would have made the other way; under it,
//! what to look for in the scenario, the bound each algorithm promises explained, and which
//! algorithms decided every request alike (and why).

mod engine;
mod lab;
#[cfg(feature = "redis")]
mod redis_store;
mod run;
mod svg;

use std::process::ExitCode;

use engine::{render_table, Scenario};
use run::{parse_limit, simulate};

const USAGE: &str = "\
usage: simulate --scenario NAME [--limit 5/10s] [--store memory|redis] [--out FILE.svg]
       simulate --scenario replay FILE [...]      (one request per line: SECONDS [KEY [COST]])
       simulate --scenario steady [--windows 20] [--seed 12] [--rate 2]   (Poisson; default 0.8x, 1x, 2x)
       simulate --serve [--port N]                (lab page; default port $PORT or 3000)
scenarios: edge, burst, steady, seam-attack, replay";

#[derive(Debug)]
struct Args {
    scenario: String,
    replay: Option<String>,
    limit: String,
    store: String,
    out: Option<String>,
    serve: bool,
    port: Option<u16>,
    windows: Option<u64>,
    seed: Option<u64>,
    rate: Option<f64>,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut parsed = Args {
        scenario: "edge".into(),
        replay: None,
        limit: "5/10s".into(),
        store: "memory".into(),
        out: None,
        serve: false,
        port: None,
        windows: None,
        seed: None,
        rate: None,
    };
    let number = |flag: &str, v: String| {
        v.parse::<u64>()
            .map_err(|_| format!("{flag} takes a whole number, not {v:?}"))
    };
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| args.next().ok_or_else(|| format!("{flag} needs a value"));
        match arg.as_str() {
            "--scenario" => {
                parsed.scenario = value("--scenario")?;
                if parsed.scenario == "replay" {
                    parsed.replay = Some(value("--scenario replay")?);
                }
            }
            "--limit" => parsed.limit = value("--limit")?,
            "--store" => parsed.store = value("--store")?,
            "--out" => parsed.out = Some(value("--out")?),
            "--serve" => parsed.serve = true,
            "--port" => {
                let v = value("--port")?;
                parsed.port = Some(v.parse().map_err(|_| format!("--port: bad port {v:?}"))?);
            }
            "--windows" => parsed.windows = Some(number("--windows", value("--windows")?)?),
            "--seed" => parsed.seed = Some(number("--seed", value("--seed")?)?),
            "--rate" => {
                let v = value("--rate")?;
                parsed.rate = Some(
                    v.parse::<f64>()
                        .ok()
                        .filter(|r| r.is_finite() && *r > 0.0 && *r <= 1000.0)
                        .ok_or_else(|| {
                            format!("--rate takes a multiple of the rate in (0, 1000], not {v:?}")
                        })?,
                );
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(parsed)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("error: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(if e.is_empty() { 0 } else { 2 });
        }
    };
    match run_cli(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run_cli(args: Args) -> Result<ExitCode, String> {
    if args.serve {
        let port = match args.port {
            Some(p) => p,
            None => match std::env::var("PORT") {
                Ok(p) => p.parse().map_err(|_| format!("PORT: bad port {p:?}"))?,
                Err(_) => 3000,
            },
        };
        lab::serve(port)
            .await
            .map_err(|e| format!("serving on port {port}: {e}"))?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut scenario = Scenario::parse(&args.scenario, args.replay.as_deref())?;
    if let Scenario::Steady {
        windows,
        seed,
        rate,
    } = &mut scenario
    {
        *windows = args.windows.unwrap_or(*windows).max(1);
        *seed = args.seed.unwrap_or(*seed);
        *rate = args.rate;
    } else if args.windows.is_some() || args.seed.is_some() || args.rate.is_some() {
        return Err("--windows, --seed and --rate apply to --scenario steady only".into());
    }
    let quota = parse_limit(&args.limit)?;
    let sim = simulate(&scenario, &quota)?;
    let mut failed = false;
    let sim = match args.store.as_str() {
        "memory" => sim,
        "redis" => {
            let (redis_sim, identical) = redis_compare(&scenario, &quota, sim).await?;
            failed |= !identical;
            redis_sim
        }
        other => return Err(format!("--store {other:?}: use memory or redis")),
    };
    println!("{}\n", sim.title);
    println!("{}\n", wrap(&sim.caption));
    print!("{}", render_table(&sim.rows));
    println!("\n{}", wrap(&sim.note));
    println!("\npromised:");
    for line in &sim.promises {
        println!("  {line}");
    }
    for line in &sim.same {
        println!("\n{}", wrap(line));
    }
    for o in sim.outcomes.iter().filter(|o| !o.held()) {
        failed = true;
        println!(
            "\n{}: {} admitted in one window, above the promised {}",
            o.kind, o.worst.units, o.bound
        );
    }
    if let Some(out) = &args.out {
        std::fs::write(out, sim.svg(&quota)?).map_err(|e| format!("writing {out:?}: {e}"))?;
        println!("\nwrote {out}");
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// `text` wrapped at 100 columns.
fn wrap(text: &str) -> String {
    let mut out = String::new();
    let mut width = 0;
    for word in text.split_whitespace() {
        if width > 0 && width + 1 + word.chars().count() > 100 {
            out.push('\n');
            width = 0;
        } else if width > 0 {
            out.push(' ');
            width += 1;
        }
        out.push_str(word);
        width += word.chars().count();
    }
    out
}

/// Runs the stream through Redis too; returns the Redis simulation and whether every decision
/// matched the memory store's.
#[cfg(feature = "redis")]
async fn redis_compare(
    scenario: &Scenario,
    quota: &tollgate::Quota,
    memory: run::Simulation,
) -> Result<(run::Simulation, bool), String> {
    let url = std::env::var("REDIS_URL")
        .map_err(|_| "--store redis needs REDIS_URL, e.g. redis://127.0.0.1:6379".to_owned())?;
    let decisions = redis_store::decide_redis(&memory.stream, quota, &url).await?;
    let diffs = redis_store::differences(&memory.decisions, &decisions);
    let sim = run::finish(scenario, quota, memory.stream.clone(), decisions);
    println!("redis ({url}) against memory, decision by decision:");
    for (o, d) in sim.outcomes.iter().zip(&diffs) {
        println!(
            "  {:<15} {} decisions, {}",
            o.kind.as_str(),
            o.offered,
            if *d == 0 {
                "identical".to_owned()
            } else {
                format!("{d} DIFFER")
            }
        );
    }
    println!();
    Ok((sim, diffs.iter().all(|&d| d == 0)))
}

#[cfg(not(feature = "redis"))]
async fn redis_compare(
    _: &Scenario,
    _: &tollgate::Quota,
    _: run::Simulation,
) -> Result<(run::Simulation, bool), String> {
    Err("this build has no Redis support: run it as `cargo run --features redis --example simulate -- ... --store redis`".into())
}
