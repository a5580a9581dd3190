//! Examples run as the user runs them: the built binary (`target/<profile>/examples/<name>`,
//! built first when missing or older than its source) started on a free loopback port, killed
//! when the [`ExampleProcess`] is dropped.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

/// The example binary `name` next to this test's, built with `features` when stale.
pub fn example_binary(name: &str, features: &[&str]) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    let bin = profile_dir.join("examples").join(name);
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(format!("{name}.rs"));
    let stale = match (std::fs::metadata(&bin), std::fs::metadata(&source)) {
        (Ok(b), Ok(s)) => b.modified().unwrap() < s.modified().unwrap(),
        _ => true,
    };
    if stale {
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "--example", name]);
        if !features.is_empty() {
            cmd.args(["--features", &features.join(",")]);
        }
        let status = cmd
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .unwrap_or_else(|e| panic!("run cargo build --example {name}: {e}"));
        assert!(status.success(), "building the example {name} failed");
    }
    bin
}

/// A free loopback port (free when asked: the example binds it right after).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running example, killed on drop, with the lines it printed after its first.
pub struct ExampleProcess {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Drop for ExampleProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ExampleProcess {
    /// Starts `bin` with `PORT=port` and `env`, and waits until it prints
    /// `listening on http://127.0.0.1:<port>` as its first line.
    pub fn start(bin: &PathBuf, port: u16, env: &[(&str, &str)]) -> Self {
        let mut cmd = Command::new(bin);
        cmd.env("PORT", port.to_string());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the example");
        let stdout = child.stdout.take().unwrap();
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), format!("listening on http://127.0.0.1:{port}"));
        // Keep reading its output: a closed pipe would kill it at its next line.
        let lines = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&lines);
        std::thread::spawn(move || {
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                kept.lock().unwrap().push(line.trim_end().to_owned());
                line.clear();
            }
        });
        Self { child, lines }
    }

    /// The lines it printed after `listening on ..`, so far.
    pub fn output(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}
