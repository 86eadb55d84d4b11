//! Running the real `keelson` binary as a separate process, as a user (or a
//! pod) would: its own kubeconfig, its loopback ports, its log file.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::postgres::free_port;

/// Writes a kubeconfig that acts as `system:serviceaccount:<ns>:<sa>`
/// through impersonation, from the admin kubeconfig `KUBECONFIG` names.
pub fn service_account_kubeconfig(namespace: &str, sa: &str, dir: &Path) -> anyhow::Result<PathBuf> {
    let admin = std::env::var("KUBECONFIG").context("KUBECONFIG is not set")?;
    let text = std::fs::read_to_string(&admin)?;
    let mut config: serde_yaml::Value = serde_yaml::from_str(&text)?;
    let users = config.get_mut("users").and_then(|u| u.as_sequence_mut()).context("kubeconfig has no users")?;
    for user in users {
        if let Some(map) = user.get_mut("user").and_then(|u| u.as_mapping_mut()) {
            map.insert("as".into(), format!("system:serviceaccount:{namespace}:{sa}").into());
            map.insert(
                "as-groups".into(),
                serde_yaml::Value::Sequence(vec![
                    "system:serviceaccounts".into(),
                    format!("system:serviceaccounts:{namespace}").into(),
                    "system:authenticated".into(),
                ]),
            );
        }
    }
    let path = dir.join(format!("kubeconfig-{namespace}-{sa}"));
    std::fs::write(&path, serde_yaml::to_string(&config)?)?;
    Ok(path)
}

/// A running `keelson run` process.
pub struct OperatorProcess {
    pub identity: String,
    pub metrics_port: u16,
    pub health_port: u16,
    pub log: PathBuf,
    child: Child,
}

impl OperatorProcess {
    /// Starts `binary run <args>` with `kubeconfig`, on free loopback ports.
    pub fn start(
        binary: &Path,
        kubeconfig: &Path,
        identity: &str,
        args: &[&str],
        log_dir: &Path,
    ) -> anyhow::Result<Self> {
        let metrics_port = free_port()?;
        let health_port = free_port()?;
        let log = log_dir.join(format!("{identity}.log"));
        let file = std::fs::File::create(&log)?;
        let mut command = Command::new(binary);
        // The operator dies with this test process, also when it is killed (no Drop runs then):
        // a stray one would go on loading the API server for every later test.
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            command.pre_exec(|| match libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            });
        }
        let child = command
            .arg("run")
            .args(["--metrics-addr", &format!("127.0.0.1:{metrics_port}")])
            .args(["--health-addr", &format!("127.0.0.1:{health_port}")])
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .env("POD_NAME", identity)
            .stdout(Stdio::from(file.try_clone()?))
            .stderr(Stdio::from(file))
            .spawn()
            .with_context(|| format!("cannot start {}", binary.display()))?;
        Ok(Self { identity: identity.to_string(), metrics_port, health_port, log, child })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal (`TERM`, `KILL`) to this process only, by pid.
    pub fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let status = Command::new("kill").arg(format!("-{signal}")).arg(self.pid().to_string()).status()?;
        if !status.success() {
            bail!("kill -{signal} {} failed", self.pid());
        }
        Ok(())
    }

    /// Waits for the process to exit.
    pub async fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if tokio::time::Instant::now() > deadline {
                bail!("{} did not exit within {timeout:?}; log:\n{}", self.identity, self.log_text());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// GET `path` on the health port: (status code, body).
    pub async fn health(&self, path: &str) -> anyhow::Result<(u16, String)> {
        http_get(self.health_port, path).await
    }

    /// The Prometheus text from `/metrics`.
    pub async fn metrics(&self) -> anyhow::Result<String> {
        let (code, body) = http_get(self.metrics_port, "/metrics").await?;
        if code != 200 {
            bail!("/metrics answered {code}");
        }
        Ok(body)
    }

    /// Sum of a metric's series (0 when absent or the endpoint is down).
    pub async fn metric(&self, name: &str) -> f64 {
        let Ok(text) = self.metrics().await else { return 0.0 };
        metric_sum(&text, name)
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Sum of every series of metric `name` in Prometheus text (0 when absent).
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A minimal HTTP/1.0 GET to 127.0.0.1:`port`.
pub async fn http_get(port: u16, path: &str) -> anyhow::Result<(u16, String)> {
    let mut stream = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(("127.0.0.1", port))).await??;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).await?;
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut response)).await??;
    let code = response.split_whitespace().nth(1).and_then(|c| c.parse().ok()).context("malformed HTTP response")?;
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Ok((code, body))
}
