//! Real PostgreSQL servers on 127.0.0.1 for testing Keelson's database scripts.
//!
//! Debian's `postgresql-15` binaries, run as the `postgres` user (PostgreSQL
//! refuses root). Each server lives in its own temporary folder and is stopped
//! on drop.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Context as _, bail};
use rand::Rng;

/// Where Debian puts the server binaries.
pub fn bindir() -> PathBuf {
    let major = std::env::var("KEELSON_PG_MAJOR").unwrap_or_else(|_| "15".into());
    PathBuf::from(format!("/usr/lib/postgresql/{major}/bin"))
}

/// True when PostgreSQL can be used; under CI (or `KEELSON_REQUIRE_POSTGRES=1`)
/// its absence is a failure rather than a skip.
pub fn available() -> bool {
    let ok = bindir().join("initdb").exists()
        && Command::new("id").arg("postgres").output().is_ok_and(|o| o.status.success());
    if !ok {
        let message = format!(
            "PostgreSQL server binaries not found in {} (run `hack/postgres.sh ensure-installed`)",
            bindir().display()
        );
        if std::env::var("CI").is_ok_and(|v| v == "true")
            || std::env::var("KEELSON_REQUIRE_POSTGRES").is_ok_and(|v| v == "1")
        {
            panic!("{message}");
        }
        eprintln!("SKIPPING PostgreSQL test: {message}");
    }
    ok
}

/// A folder owned by `postgres`, removed on drop.
pub struct Scratch {
    pub path: PathBuf,
}

impl Scratch {
    pub fn new(label: &str) -> anyhow::Result<Self> {
        let suffix: String = rand::rng().sample_iter(rand::distr::Alphanumeric).take(8).map(char::from).collect();
        let path = std::env::temp_dir().join(format!("keelson-pg-{label}-{suffix}"));
        std::fs::create_dir_all(&path)?;
        chown_postgres(&path)?;
        Ok(Self { path })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

pub fn chown_postgres(path: &Path) -> anyhow::Result<()> {
    let status = Command::new("chown").args(["-R", "postgres:postgres"]).arg(path).status()?;
    if !status.success() {
        bail!("chown postgres {} failed", path.display());
    }
    Ok(())
}

/// Where [`free_port`] looks: below the kernel's ephemeral ports (32768 and up by
/// default), which every outgoing connection takes its local port from, above
/// the local cluster's own (10000-19999, `hack/cluster/lib.sh`: a component
/// restarted by a test must find its port again), below the NodePorts (30000).
const PORTS: std::ops::Range<u16> = 20000..30000;

/// A TCP port on 127.0.0.1 that is free now and that no other caller in this
/// process was given. A port from the ephemeral range (`bind(":0")`) could be
/// taken by any outgoing connection between this check and the server's own
/// bind; these cannot. Other processes start elsewhere in the range (by pid).
pub fn free_port() -> anyhow::Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static GIVEN: AtomicU32 = AtomicU32::new(0);
    let span = u32::from(PORTS.end - PORTS.start);
    let start = std::process::id().wrapping_mul(97) % span;
    for _ in 0..span {
        let offset = (start + GIVEN.fetch_add(1, Ordering::Relaxed)) % span;
        let port = PORTS.start + u16::try_from(offset).unwrap_or_default();
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    bail!("no free port on 127.0.0.1 in {PORTS:?}")
}

/// Runs `program args` as the `postgres` user with `env`.
pub fn as_postgres(program: &Path, args: &[&str], env: &[(&str, String)]) -> anyhow::Result<Output> {
    let mut command = Command::new("runuser");
    command.args(["-u", "postgres", "--", "env"]);
    for (key, value) in env {
        command.arg(format!("{key}={value}"));
    }
    command.arg(program).args(args).current_dir("/tmp");
    command.output().with_context(|| format!("cannot run {} as postgres", program.display()))
}

/// A running server started with `pg_ctl`, listening on 127.0.0.1 only.
pub struct Server {
    pub data: PathBuf,
    pub port: u16,
    socket_dir: PathBuf,
}

impl Server {
    /// Starts the cluster in `data` (already initialised) on a free port.
    pub fn start(data: &Path, socket_dir: &Path) -> anyhow::Result<Self> {
        Self::start_with(data, socket_dir, "")
    }

    /// Like [`Server::start`], with more server options (`-c name=value ...`).
    pub fn start_with(data: &Path, socket_dir: &Path, extra_options: &str) -> anyhow::Result<Self> {
        let port = free_port()?;
        let options = format!("-p {port} -c listen_addresses=127.0.0.1 -k {} {extra_options}", socket_dir.display());
        let log = data.with_extension("log");
        let out = as_postgres(
            &bindir().join("pg_ctl"),
            &["-D", &data.to_string_lossy(), "-l", &log.to_string_lossy(), "-o", &options, "-w", "-t", "60", "start"],
            &[],
        )?;
        if !out.status.success() {
            let server_log = std::fs::read_to_string(&log).unwrap_or_default();
            bail!("pg_ctl start failed: {}\n{server_log}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(Self { data: data.to_path_buf(), port, socket_dir: socket_dir.to_path_buf() })
    }

    /// Runs SQL through psql over TCP as `user` and returns unaligned, tuples-only output.
    pub fn psql(&self, user: &str, password: &str, database: &str, sql: &str) -> anyhow::Result<String> {
        let out = Command::new(bindir().join("psql"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", user, "-d", database])
            .args(["-v", "ON_ERROR_STOP=1", "-At", "-c", sql])
            .env("PGPASSWORD", password)
            .output()?;
        if !out.status.success() {
            bail!("psql failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Runs SQL as the `postgres` superuser through the Unix socket (local trust).
    pub fn psql_superuser(&self, database: &str, sql: &str) -> anyhow::Result<String> {
        let port = self.port.to_string();
        let socket = self.socket_dir.to_string_lossy().into_owned();
        let args =
            ["-h", &socket, "-p", &port, "-U", "postgres", "-d", database, "-v", "ON_ERROR_STOP=1", "-At", "-c", sql];
        let out = as_postgres(&bindir().join("psql"), &args, &[])?;
        if !out.status.success() {
            bail!("psql failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = as_postgres(
            &bindir().join("pg_ctl"),
            &["-D", &self.data.to_string_lossy(), "-m", "immediate", "-w", "stop"],
            &[],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct_outside_the_ephemeral_range_and_bindable() {
        let ports: Vec<u16> = (0..50).map(|_| free_port().expect("a port")).collect();
        let mut distinct = ports.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
        for port in ports {
            assert!(PORTS.contains(&port), "{port}");
            TcpListener::bind(("127.0.0.1", port)).expect("still free");
        }
    }
}
