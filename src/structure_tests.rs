//! Checks on the crate's structure (ARCHITECTURE.md), read from `src/`: a module imports only
//! from the floors below it, so the code reads bottom-up and no change to a shared part can
//! depend on a middleware; every file the code cites exists; a public item has one public
//! path; no file holds more than 800 lines before its tests.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

/// Top-level modules from the bottom floor up. A module may import only the ones before it.
const FLOORS: &[&str] = &[
    // Vocabulary: shared types with no behaviour of their own.
    "error",
    "request",
    "clock",
    "quota",
    "decision",
    "metrics",
    // Parts: pure transitions, response writing, extractors and costs.
    "algorithm",
    "headers",
    "key",
    "cost",
    "response",
    // State: where counters live.
    "store",
    // Choice: which quota applies to a request.
    "plan",
    // Middlewares, none importing another.
    "concurrency",
    "load_shed",
    "outbound",
    "rate_limit",
    // Front-ends: limits as data.
    "policy",
    // Test and fuzzing entry points may reach anything.
    "fuzzing",
    // Documentation: the guides, prose with no items.
    "guide",
];

fn rank(module: &str) -> Option<usize> {
    FLOORS.iter().position(|m| *m == module)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module a `crate::` path reaches: its first segment, or for a crate-root re-export
/// (`crate::Quota`, `crate::{Decision, Quota}`) the module the root re-exports it from.
fn targets(rest: &str, root_exports: &HashMap<String, String>) -> Vec<String> {
    let names: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
        let group = group.split('}').next().unwrap_or("");
        group.split(',').map(str::trim).collect()
    } else {
        vec![rest]
    };
    names
        .into_iter()
        .filter_map(|name| {
            let first: String = name
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if first.is_empty() {
                None
            } else if let Some(module) = root_exports.get(&first) {
                Some(module.clone())
            } else if first.starts_with(|c: char| c.is_ascii_lowercase()) {
                Some(first)
            } else {
                None
            }
        })
        .collect()
}

#[test]
fn no_module_imports_from_a_floor_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = fs::read_to_string(src.join("lib.rs")).unwrap();
    // `pub use module::{A, B};` and `pub use module::A;` at the crate root.
    let mut root_exports = HashMap::new();
    for line in lib.lines().filter(|l| l.starts_with("pub use ")) {
        let body = line.trim_start_matches("pub use ").trim_end_matches(';');
        let Some((module, items)) = body.split_once("::") else {
            continue;
        };
        for item in items.trim_matches(|c| c == '{' || c == '}').split(',') {
            root_exports.insert(item.trim().to_string(), module.to_string());
        }
    }

    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut violations = Vec::new();
    for file in files {
        let relative = file.strip_prefix(&src).unwrap();
        let top = relative
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        if top == "lib" || top == "structure_tests" {
            continue;
        }
        let Some(own) = rank(&top) else {
            violations.push(format!(
                "{}: top-level module `{top}` has no floor in FLOORS",
                relative.display()
            ));
            continue;
        };
        let text = fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for (at, _) in code.match_indices("crate::") {
                for target in targets(&code[at + "crate::".len()..], &root_exports) {
                    if target == top {
                        continue;
                    }
                    match rank(&target) {
                        Some(r) if r < own => {}
                        _ => violations.push(format!(
                            "{}:{}: `{top}` imports `{target}`, which is not on a floor below it",
                            relative.display(),
                            n + 1
                        )),
                    }
                }
            }
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn the_floor_check_reads_grouped_and_root_paths() {
    let root: HashMap<String, String> = [("Quota".to_string(), "quota".to_string())].into();
    assert_eq!(targets("store::Decisions;", &root), ["store"]);
    assert_eq!(targets("Quota::per_second(1)", &root), ["quota"]);
    assert_eq!(targets("{Quota, key::Key};", &root), ["quota", "key"]);
}

/// Every file `src/` cites exists in the repository: a path (`docs/internals/redis-script.md`,
/// or `store/redis/keys.rs` from `src/`: some file's path ends with it), a repository page
/// (`BENCHMARKS.md`) or a script (`driver.lua`). Example names in docs (`policy.toml`) and
/// absolute paths are not citations.
#[test]
fn every_file_the_code_cites_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut names = std::collections::HashSet::new();
    let mut all = Vec::new();
    for dir in ["src", "docs", "tests", "examples", "benches", "fuzz", ".ci"] {
        if root.join(dir).is_dir() {
            every_file(&root.join(dir), &mut all);
        }
    }
    for entry in fs::read_dir(root).unwrap() {
        all.push(entry.unwrap().path());
    }
    let mut paths = Vec::new();
    for path in &all {
        if let Some(name) = path.file_name() {
            names.insert(name.to_string_lossy().into_owned());
        }
        paths.push(path.to_string_lossy().replace('\\', "/"));
    }
    let mut sources = Vec::new();
    every_file(&root.join("src"), &mut sources);
    let mut missing = Vec::new();
    for file in sources {
        if file.ends_with("structure_tests.rs") {
            continue;
        }
        let Ok(text) = fs::read_to_string(&file) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            for cited in cited_files(line) {
                let found = if cited.starts_with('/') {
                    true
                } else if cited.contains('/') {
                    let suffix = format!("/{}", cited.trim_start_matches("./"));
                    paths.iter().any(|p| p.ends_with(&suffix))
                } else if cited.ends_with(".lua")
                    || (cited.ends_with(".md")
                        && cited[..cited.len() - 3]
                            .chars()
                            .all(|c| c.is_ascii_uppercase() || c == '_'))
                {
                    names.contains(cited)
                } else {
                    true
                };
                if !found {
                    missing.push(format!(
                        "{}:{}: cites `{cited}`, which does not exist",
                        file.strip_prefix(root).unwrap().display(),
                        n + 1
                    ));
                }
            }
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

fn every_file(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if !path.ends_with("target") && !path.ends_with("corpus") {
                every_file(&path, out);
            }
        } else {
            out.push(path);
        }
    }
}

/// Words of `line` that name a file: `[\w./-]+\.(rs|md|lua|toml|sh)`, not part of a URL.
fn cited_files(line: &str) -> Vec<&str> {
    const EXTENSIONS: [&str; 5] = [".rs", ".md", ".lua", ".toml", ".sh"];
    line.split(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-' | ':')))
        .filter(|word| !word.contains("://") && !word.contains("::"))
        .map(|word| word.trim_end_matches(['.', ':']))
        .filter(|word| {
            EXTENSIONS.iter().any(|ext| {
                word.len() > ext.len()
                    && word.ends_with(ext)
                    && !word.starts_with(['.', '-'])
                    && !word.contains('*')
            })
        })
        .collect()
}

#[test]
fn cited_file_names_are_read_from_prose_and_paths() {
    assert_eq!(
        cited_files("see `docs/internals/redis-script.md` and driver.lua."),
        ["docs/internals/redis-script.md", "driver.lua"]
    );
    assert!(cited_files("https://example.com/a.md and crate::x.rs::y").is_empty());
    assert_eq!(cited_files("(see REBASE.md)"), ["REBASE.md"]);
}

/// A public item has one public path inside its module tree: a module that is public is not
/// also re-exported from by its parent (`pub mod shaping;` with `pub use shaping::Shape;`
/// would give `Shape` two paths). The crate root is the exception: it re-exports the headline
/// types (its docs list them).
#[test]
fn no_public_module_is_also_re_exported_by_its_parent() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut twice = Vec::new();
    for file in files {
        if file == src.join("lib.rs") {
            continue;
        }
        let text = fs::read_to_string(&file).unwrap();
        let public: Vec<&str> = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("pub mod "))
            .map(|l| l.trim_end_matches(';'))
            .collect();
        for line in text.lines().map(str::trim) {
            let Some(path) = line.strip_prefix("pub use ") else {
                continue;
            };
            let path = path.trim_start_matches("self::");
            if public.iter().any(|m| path.starts_with(&format!("{m}::"))) {
                twice.push(format!(
                    "{}: `{line}` re-exports from a public module",
                    file.strip_prefix(&src).unwrap().display()
                ));
            }
        }
    }
    assert!(twice.is_empty(), "{}", twice.join("\n"));
}

/// No file in `src/` holds more than 800 lines before its `#[cfg(test)]` module: past that, a
/// file holds more than one job.
#[test]
fn no_source_file_is_longer_than_800_lines_before_its_tests() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let long: Vec<String> = files
        .iter()
        .filter_map(|file| {
            let text = fs::read_to_string(file).unwrap();
            let code = text
                .lines()
                .take_while(|l| !l.starts_with("#[cfg(test)]"))
                .count();
            (code > 800).then(|| format!("{}: {code} lines", file.display()))
        })
        .collect();
    assert!(long.is_empty(), "{}", long.join("\n"));
}

/// The guides (`docs/guide/*.md`) read on GitHub and as the modules of `tollgate::guide`:
/// every guide is one of those modules; their links are reference links (an inline relative
/// link would point next to the module's page in rustdoc) whose definitions name files that
/// exist and headings that exist, and every label has its rustdoc definition in `src/guide.rs`.
#[test]
fn every_guide_link_works_on_github_and_in_rustdoc() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let guides = root.join("docs/guide");
    let module = fs::read_to_string(root.join("src/guide.rs")).unwrap();
    let rustdoc_links: Vec<(&str, &str)> = module
        .lines()
        .map(|l| l.trim_start_matches("        \""))
        .filter_map(|l| l.strip_prefix('[')?.split_once("]: "))
        .collect();
    let rustdoc_labels: Vec<&str> = rustdoc_links.iter().map(|(label, _)| *label).collect();
    let mut problems = Vec::new();
    // A guide's label leads to that guide's module, at the same heading.
    for (label, target) in &rustdoc_links {
        let (file, fragment) = label.split_once('#').unwrap_or((label, ""));
        if let Some(stem) = file
            .strip_suffix(".md")
            .filter(|_| guides.join(file).is_file())
        {
            let mut expected = format!("crate::guide::{}", stem.replace('-', "_"));
            if !fragment.is_empty() {
                expected = format!("{expected}#{fragment}");
            }
            if *target != expected {
                problems.push(format!(
                    "src/guide.rs: `{label}` leads to `{target}`, not `{expected}`"
                ));
            }
        }
    }
    for entry in fs::read_dir(&guides).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.ends_with(".md") {
            continue;
        }
        if !module.contains(&format!("include_str!(\"../docs/guide/{name}\")")) {
            problems.push(format!("{name}: not a module of src/guide.rs"));
        }
        let text = fs::read_to_string(&path).unwrap();
        let mut in_code = false;
        let mut previous = "";
        for (n, line) in text.lines().enumerate() {
            let after = std::mem::replace(&mut previous, line);
            if line.starts_with("```") {
                in_code = !in_code;
            }
            if in_code {
                continue;
            }
            for (at, _) in line.match_indices("](") {
                let target = &line[at + 2..];
                if !(target.starts_with("http://")
                    || target.starts_with("https://")
                    || target.starts_with('#'))
                {
                    problems.push(format!(
                        "{name}:{}: an inline relative link; write it as a reference link",
                        n + 1
                    ));
                }
            }
            let Some((label, target)) = line.strip_prefix('[').and_then(|l| l.split_once("]: "))
            else {
                continue;
            };
            // A definition cannot interrupt a paragraph: it would be read as text.
            if !(after.trim().is_empty() || after.starts_with('[') && after.contains("]: ")) {
                problems.push(format!(
                    "{name}:{}: a link definition needs a blank line before it",
                    n + 1
                ));
            }
            if !rustdoc_labels.contains(&label) {
                problems.push(format!(
                    "{name}:{}: label `{label}` has no definition in src/guide.rs",
                    n + 1
                ));
            }
            if target.starts_with("http") || target.starts_with("<http") {
                continue;
            }
            let (file, fragment) = target.split_once('#').unwrap_or((target, ""));
            let Ok(linked) = fs::read_to_string(guides.join(file)) else {
                problems.push(format!("{name}:{}: `{file}` does not exist", n + 1));
                continue;
            };
            if !fragment.is_empty()
                && !linked
                    .lines()
                    .filter(|l| l.starts_with('#'))
                    .any(|l| heading_id(l) == fragment)
            {
                problems.push(format!(
                    "{name}:{}: `{file}` has no heading `#{fragment}`",
                    n + 1
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The anchor GitHub and rustdoc give a Markdown heading: lower case, spaces as `-`, other
/// punctuation dropped.
fn heading_id(heading: &str) -> String {
    heading
        .trim_start_matches('#')
        .trim()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}

#[test]
fn heading_ids_follow_github_and_rustdoc() {
    assert_eq!(
        heading_id("## See them: the simulator"),
        "see-them-the-simulator"
    );
    assert_eq!(
        heading_id("## Memory, eviction and `maxmemory-policy`"),
        "memory-eviction-and-maxmemory-policy"
    );
}
