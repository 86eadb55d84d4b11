//! Stopping and starting one component of the local dev cluster, and the
//! faults of its real nodes, for failure tests (`hack/cluster.sh stop|start
//! NAME`, `partition|heal|poweroff|poweron NODE`).

use std::path::PathBuf;
use std::process::Command;

use anyhow::Context as _;

/// The dev cluster `KUBECONFIG` belongs to, when it is one `make cluster-up` made.
pub struct ControlPlane {
    dir: PathBuf,
    script: PathBuf,
}

impl ControlPlane {
    /// The cluster whose folder holds the kubeconfig in use; None for a cluster of one's own.
    pub fn of_kubeconfig() -> Option<Self> {
        let kubeconfig = PathBuf::from(std::env::var("KUBECONFIG").ok()?);
        let dir = kubeconfig.parent()?.to_path_buf();
        dir.join("ports")
            .is_file()
            .then(|| Self { dir, script: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../hack/cluster.sh") })
    }

    fn run(&self, verb: &str, target: &str) -> anyhow::Result<()> {
        let output = Command::new("bash")
            .arg(&self.script)
            .args([verb, target])
            .env("KEELSON_CLUSTER_DIR", &self.dir)
            .output()
            .with_context(|| format!("cannot run {}", self.script.display()))?;
        anyhow::ensure!(
            output.status.success(),
            "cluster.sh {verb} {target} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(())
    }

    /// The API server's audit log.
    pub fn audit_log(&self) -> PathBuf {
        self.dir.join("audit.log")
    }

    /// Every audit log file, oldest first: the rotated ones (`audit-<time>.log`), then the current.
    pub fn audit_logs(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.path())
            .filter(|path| {
                path.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("audit-") && n.ends_with(".log"))
            })
            .collect();
        files.sort();
        files.push(self.audit_log());
        files
    }

    /// Stops `component` (e.g. `kube-apiserver`).
    pub fn stop(&self, component: &str) -> anyhow::Result<()> {
        self.run("stop", component)
    }

    /// Starts `component` again and waits until it serves.
    pub fn start(&self, component: &str) -> anyhow::Result<()> {
        self.run("start", component)
    }

    /// Cuts `node`'s network (kubelet, kube-proxy and pods reach nothing off it).
    pub fn partition(&self, node: &str) -> anyhow::Result<()> {
        self.run("partition", node)
    }

    /// Plugs `node` back in.
    pub fn heal(&self, node: &str) -> anyhow::Result<()> {
        self.run("heal", node)
    }

    /// Stops `node` as a power cut would (its disks are kept).
    pub fn power_off(&self, node: &str) -> anyhow::Result<()> {
        self.run("poweroff", node)
    }

    /// Boots `node` again; returns once it is Ready.
    pub fn power_on(&self, node: &str) -> anyhow::Result<()> {
        self.run("poweron", node)
    }
}
