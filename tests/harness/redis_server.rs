//! Real `redis-server` processes for the Redis tests: started on free loopback ports with no
//! persistence, in a temporary directory, and killed, paused (SIGSTOP) and restarted at will.
//!
//! Each server runs under a small shell watchdog that kills it (and removes its directory) when
//! the test process exits, even if the process dies without running destructors, so shared
//! servers in `static`s never outlive the tests.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Panics with the package to install when a Redis binary is missing.
pub fn require(binary: &str) {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {binary}"))
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(
        found,
        "`{binary}` is not on PATH: the Redis tests start their own servers; install the Debian \
         package `redis-server` (sudo apt-get install -y redis-server redis-tools)"
    );
}

/// A port that is free on 127.0.0.1, and so is port + 10000 (the Cluster bus). Both lie below
/// Linux's ephemeral range (32768 and up), so no outgoing connection's local port, nor a listener
/// bound to port 0, can take one between this check and the server binding it.
pub fn free_port() -> u16 {
    let seed = std::process::id()
        .wrapping_mul(2_654_435_761)
        .wrapping_add(COUNTER.fetch_add(1, Ordering::SeqCst).wrapping_mul(7_919))
        .wrapping_add(Instant::now().elapsed().subsec_nanos());
    let mut x = seed as u64 | 1;
    for _ in 0..1000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let port = 10_000 + (x % 10_000) as u16;
        let a = TcpListener::bind(("127.0.0.1", port));
        let b = TcpListener::bind(("127.0.0.1", port + 10_000));
        if a.is_ok() && b.is_ok() {
            return port;
        }
    }
    panic!("no free loopback port pair found");
}

/// One `redis-server` process.
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    /// A configuration file's text, written to the server's directory and read first (a
    /// Sentinel needs one it can rewrite).
    config: Option<String>,
    watchdog: Option<Child>,
    pid: u32,
}

impl RedisServer {
    /// Starts a server on a free port.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments.
    /// A port can still be taken between the check and the bind (by another process choosing
    /// ports itself): the server then fails to start, and the next free port is tried.
    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_configured(None, extra)
    }

    /// Starts a server that reads `config` (a configuration file's text) before `extra`, e.g. a
    /// Sentinel (`extra` = `["--sentinel"]`).
    pub fn start_configured(config: Option<&str>, extra: &[&str]) -> Self {
        require("redis-server");
        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = free_port();
            let n = COUNTER.fetch_add(1, Ordering::SeqCst);
            let dir = std::env::temp_dir()
                .join(format!("tollgate-redis-{}-{n}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("create the temp dir");
            let mut server = Self {
                port,
                dir,
                extra: extra.iter().map(|s| s.to_string()).collect(),
                config: config.map(str::to_owned),
                watchdog: None,
                pid: 0,
            };
            match server.try_spawn() {
                Ok(()) => return server,
                Err(log) if attempt < 5 && log.contains("Address already in use") => continue,
                Err(log) => panic!("redis-server on port {port} did not answer PING:\n{log}"),
            }
        }
    }

    fn spawn(&mut self) {
        if let Err(log) = self.try_spawn() {
            panic!(
                "redis-server on port {} did not answer PING:\n{log}",
                self.port
            );
        }
    }

    /// Starts the process and waits for its PING; on failure, its log.
    fn try_spawn(&mut self) -> Result<(), String> {
        let pidfile = self.dir.join("redis.pid");
        let _ = std::fs::remove_file(&pidfile);
        let mut args = Vec::new();
        if let Some(config) = &self.config {
            let path = self.dir.join("server.conf");
            std::fs::write(&path, config).map_err(|e| format!("write {path:?}: {e}"))?;
            args.push(path.display().to_string());
        }
        args.extend([
            "--port".to_string(),
            self.port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--save".into(),
            "".into(),
            "--appendonly".into(),
            "no".into(),
            "--dir".into(),
            self.dir.display().to_string(),
            "--logfile".into(),
            self.dir.join("redis.log").display().to_string(),
            "--protected-mode".into(),
            "no".into(),
            // DEBUG SLEEP simulates a slow server in the fault tests.
            "--enable-debug-command".into(),
            "yes".into(),
        ]);
        args.extend(self.extra.iter().cloned());
        let quoted: Vec<String> = args
            .iter()
            .map(|a| format!("'{}'", a.replace('\'', "'\\''")))
            .collect();
        // The watchdog: start redis, record its pid, kill it and clean up when the test process
        // is gone.
        let script = format!(
            "redis-server {args} & rpid=$!\n\
             echo $rpid > '{pidfile}'\n\
             while kill -0 {test} 2>/dev/null; do sleep 0.5; done\n\
             kill -9 $rpid 2>/dev/null\n\
             rm -rf '{dir}'\n",
            args = quoted.join(" "),
            pidfile = pidfile.display(),
            test = std::process::id(),
            dir = self.dir.display(),
        );
        let child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the redis-server watchdog");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(text) = std::fs::read_to_string(&pidfile)
                && let Ok(pid) = text.trim().parse()
            {
                self.pid = pid;
                break;
            }
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(5));
        }
        self.watchdog = Some(child);
        self.wait_ready()
    }

    fn wait_ready(&self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if ping(self.port) {
                return Ok(());
            }
            if !process_alive(self.pid) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Err(std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default())
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A plain synchronous connection, for inspecting and corrupting state.
    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(2))
            .expect("connect to the test redis-server")
    }

    /// Runs a command and returns its reply.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut c = redis::cmd(args[0]);
        for a in &args[1..] {
            c.arg(*a);
        }
        c.query(&mut self.conn())
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    /// SIGKILL: the server dies without closing anything.
    pub fn kill(&mut self) {
        signal(self.pid, "KILL");
        let deadline = Instant::now() + Duration::from_secs(5);
        while ping(self.port) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Starts the server again on the same port (empty: it had no persistence).
    pub fn restart(&mut self) {
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
        std::fs::create_dir_all(&self.dir).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while TcpListener::bind(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "port {} stayed busy", self.port);
            std::thread::sleep(Duration::from_millis(10));
        }
        self.spawn();
    }

    /// SIGSTOP: the server keeps its connections open but answers nothing.
    pub fn pause(&self) {
        signal(self.pid, "STOP");
    }

    /// SIGCONT.
    pub fn resume(&self) {
        signal(self.pid, "CONT");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        signal(self.pid, "CONT");
        signal(self.pid, "KILL");
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn signal(pid: u32, sig: &str) {
    if pid != 0 {
        let _ = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(pid.to_string())
            .stderr(Stdio::null())
            .status();
    }
}

fn ping(port: u16) -> bool {
    let Ok(mut s) =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200))
    else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    matches!(s.read_exact(&mut buf), Ok(())) && &buf == b"+PONG\r\n"
}

/// Whether process `pid` is running (not exited, not a zombie waiting to be reaped).
fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        // Without /proc, assume it runs: the deadline still ends the wait.
        Err(_) => !std::path::Path::new("/proc/self").exists(),
    }
}
