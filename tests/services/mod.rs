//! Private Redis and PostgreSQL servers for tests that stop and restart them: each on a free
//! port in its own temporary directory, stopped and removed on drop (also when a test
//! panics). The machine's shared servers are never touched.
//!
//! `start` returns `Err(reason)` when a server cannot run here (binary or `postgres` user
//! missing), so that a test can skip with that reason.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{eventually, free_port};

/// Sends `kill -SIG` (a name: `TERM`, `INT`, `QUIT`, `KILL`) to `pid`.
fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status();
}

/// Whether `child` exits within `limit`.
fn exits_within(child: &mut Child, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if !matches!(child.try_wait(), Ok(None)) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Stops `child` with `sig`, or SIGKILL if it is still running after `grace`.
fn stop_child(child: &mut Child, sig: &str, grace: Duration) {
    signal(child.id(), sig);
    if !exits_within(child, grace) {
        let _ = child.kill();
    }
    let _ = child.wait();
}

/// `name` on `PATH`.
fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn log_file(path: &Path) -> Stdio {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap()
        .into()
}

/// The last `n` lines of the file at `path`.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A `redis-server` of our own; with `persistent`, an append-only file fsynced on every write
/// (how a production Redis that must not lose queued work runs), so a restart keeps every
/// acknowledged write.
pub struct PrivateRedis {
    pub url: String,
    port: u16,
    persistent: bool,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl PrivateRedis {
    pub async fn start(persistent: bool) -> Result<Self, String> {
        if on_path("redis-server").is_none() {
            return Err("redis-server is not installed".into());
        }
        let port = free_port();
        let mut redis = PrivateRedis {
            url: format!("redis://127.0.0.1:{port}"),
            port,
            persistent,
            child: None,
            dir: tempfile::tempdir().unwrap(),
        };
        redis.start_again().await;
        Ok(redis)
    }

    /// Starts the server (again, on the same port and data) and waits until it answers
    /// PING (with persistence, after it has loaded its append-only file).
    pub async fn start_again(&mut self) {
        assert!(self.child.is_none(), "redis is running");
        let dir = self.dir.path();
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--protected-mode", "no", "--save", ""])
            .arg("--dir")
            .arg(dir);
        if self.persistent {
            cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
        } else {
            cmd.args(["--appendonly", "no"]);
        }
        self.child = Some(
            cmd.stdout(log_file(&dir.join("redis.log")))
                .stderr(log_file(&dir.join("redis.log")))
                .spawn()
                .unwrap(),
        );
        let url = self.url.clone();
        eventually("the private redis up", Duration::from_secs(30), || {
            let url = url.clone();
            async move {
                let mut c = redis::Client::open(url).ok()?.get_connection().ok()?;
                redis::cmd("PING").query::<String>(&mut c).ok()
            }
        })
        .await;
    }

    /// Stops it as a restart does (SIGTERM: a clean shutdown that flushes the append-only
    /// file) and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child, "TERM", Duration::from_secs(20));
        }
    }

    pub fn log_tail(&self, n: usize) -> String {
        tail(&self.dir.path().join("redis.log"), n)
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A PostgreSQL cluster of our own (`initdb` in a temporary directory, trust auth, no fsync:
/// a test needs no durability across a machine crash, only across a clean stop). As root it
/// runs as the `postgres` user, since postgres refuses to run as root.
pub struct PrivatePostgres {
    /// `postgres://` URL of its `postgres` database.
    pub url: String,
    bin: PathBuf,
    psql: PathBuf,
    port: u16,
    /// (uid, gid) to run as, when we are root.
    user: Option<(u32, u32)>,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

/// The folder of `initdb`, `postgres` and `psql`: on `PATH`, else the newest Debian-style
/// `/usr/lib/postgresql/N/bin`.
fn postgres_bin() -> Option<PathBuf> {
    if let Some(initdb) = on_path("initdb") {
        // Often a link to the versioned folder, which holds the other tools too.
        let initdb = std::fs::canonicalize(initdb).ok()?;
        return initdb.parent().map(Path::to_owned);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

fn id(args: &[&str]) -> Option<u32> {
    let out = Command::new("id").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8(out.stdout).ok()?.trim().parse().ok()
}

impl PrivatePostgres {
    pub async fn start() -> Result<Self, String> {
        let bin = postgres_bin().ok_or("PostgreSQL (initdb, postgres) is not installed")?;
        let psql = if bin.join("psql").is_file() {
            bin.join("psql")
        } else {
            on_path("psql").ok_or("psql is not installed")?
        };
        let user = match id(&["-u"]) {
            Some(0) => Some((
                id(&["-u", "postgres"]).ok_or("running as root and there is no postgres user")?,
                id(&["-g", "postgres"]).ok_or("running as root and there is no postgres user")?,
            )),
            _ => None,
        };
        let dir = tempfile::tempdir().unwrap();
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).unwrap();
        }
        let port = free_port();
        let pg = PrivatePostgres {
            url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
            bin,
            psql,
            port,
            user,
            child: None,
            dir,
        };
        let out = pg
            .command("initdb")
            .arg("-D")
            .arg(pg.data())
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"])
            .arg("--locale=C")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut pg = pg;
        pg.start_again().await;
        Ok(pg)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// A command of the PostgreSQL folder, as the server's user.
    fn command(&self, name: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(name));
        if let Some((uid, gid)) = self.user {
            use std::os::unix::process::CommandExt;
            cmd.uid(uid).gid(gid);
        }
        cmd
    }

    /// Starts the server (again, same port and data) and waits until it takes queries.
    pub async fn start_again(&mut self) {
        assert!(self.child.is_none(), "postgres is running");
        let log = self.dir.path().join("postgres.log");
        let child = self
            .command("postgres")
            .arg("-D")
            .arg(self.data())
            .args(["-p", &self.port.to_string(), "-k"])
            .arg(self.dir.path())
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
            .stdout(log_file(&log))
            .stderr(log_file(&log))
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = Command::new(&self.psql)
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
                .args(["-U", "postgres", "-d", "postgres", "-Atc", "SELECT 1"])
                .output()
                .unwrap();
            if ready.status.success() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the private postgres did not start: {}\n{}",
                String::from_utf8_lossy(&ready.stderr),
                self.log_tail(20)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops it as `pg_ctl stop -m fast` does (SIGINT: sessions are ended, a clean
    /// shutdown) and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child, "INT", Duration::from_secs(30));
        }
    }

    /// Runs `sql` with psql; its unaligned, `|`-separated rows.
    pub fn query(&self, sql: &str) -> Vec<Vec<String>> {
        let out = Command::new(&self.psql)
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", "postgres", "-v", "ON_ERROR_STOP=1"])
            .args(["-At", "-F", "|", "-c", sql])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| l.split('|').map(str::to_owned).collect())
            .collect()
    }

    pub fn log_tail(&self, n: usize) -> String {
        tail(&self.dir.path().join("postgres.log"), n)
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        // SIGQUIT: immediate shutdown, which also ends the server's children.
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child, "QUIT", Duration::from_secs(10));
        }
    }
}
