//! Running one test alone in a child process of its own test binary.
//!
//! The tests of a binary run on several threads of one process, so a test that measures the
//! process (its resident set, a process-wide counter) would see the allocations of the tests
//! running alongside. Such a test calls [`run_alone`] first: in the test run, that re-runs this
//! binary with a filter selecting only that test, on one thread, and returns what it printed; in
//! the child, it returns `None` and the test measures.

use std::process::Command;

/// Set in the child process that runs one test alone.
const CHILD: &str = "TOLLGATE_TEST_ALONE";

/// In the test run: runs the test `name` (its full name in this binary, `module::test`) alone in
/// a child process, asserts that it passed and returns its standard output. In that child: `None`
/// (the caller runs the measurement).
pub fn run_alone(name: &str) -> Option<String> {
    if std::env::var_os(CHILD).is_some() {
        return None;
    }
    let exe = std::env::current_exe().expect("the test binary");
    let out = Command::new(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .expect("run the test in a child process");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the child running {name} alone failed:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("1 passed"),
        "the child ran no test named {name}:\n{stdout}"
    );
    // The child's output, for the run's log (`--nocapture`) and for the caller to read.
    print!("{stdout}");
    eprint!("{stderr}");
    Some(stdout)
}
