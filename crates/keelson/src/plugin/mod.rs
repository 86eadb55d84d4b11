//! `kubectl keelson`: day-two commands for people and scripts. The same
//! binary, installed (or linked) as `kubectl-keelson`; also `keelson ctl`.
//! It acts with the user's kubeconfig and rights, never the operator's, and
//! asks the operator for changes the declarative way (annotations it
//! watches), so everything it does is visible in the objects.

mod actions;
mod report;
mod status;

use std::time::Duration;

use kube::api::Api;
use kube::{Client, ResourceExt};

use crate::api::{MyDatabase, WebApp};

/// How long a command waits for the operator to act.
const OPERATOR_WAIT: Duration = Duration::from_secs(180);

#[derive(clap::Args, Debug)]
pub struct PluginArgs {
    /// The namespace (default: the kubeconfig context's).
    #[arg(short, long, global = true)]
    pub namespace: Option<String>,
    /// table for people; json or yaml for scripts.
    #[arg(short, long, global = true, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    #[command(subcommand)]
    pub command: PluginCommand,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Table,
    Json,
    Yaml,
}

#[derive(clap::Subcommand, Debug)]
pub enum PluginCommand {
    /// A MyDatabase's instances (role, node, timeline, lag), last failover, backups, conditions,
    /// and what is wrong, in words.
    Status { database: String },
    /// A WebApp's phase, replicas and conditions.
    Webapp { webapp: String },
    /// A switchover to INSTANCE; waits for it, or for the operator's refusal and why.
    Promote { database: String, instance: String },
    /// A backup now, as the schedule's would run.
    Backup {
        database: String,
        /// Wait until it is taken and verified.
        #[arg(long)]
        wait: bool,
    },
    /// The backups kept, with time, size and whether each was verified.
    Backups { database: String },
    /// A new MyDatabase NAME restored from a backup of FROM (the newest, or --backup).
    Restore {
        name: String,
        #[arg(long)]
        from: String,
        /// A backup's name, as `backups FROM` lists it (default: the newest).
        #[arg(long)]
        backup: Option<String>,
        /// Instances of the new database.
        #[arg(long, default_value_t = 1)]
        replicas: i32,
        /// Its storage (default: the source's).
        #[arg(long)]
        storage: Option<String>,
    },
    /// psql on the primary (or a replica); arguments after `--` go to psql.
    Psql {
        database: String,
        #[arg(long)]
        replica: bool,
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Stops INSTANCE's PostgreSQL for maintenance (`*`: every instance); its pod stays, not ready.
    /// A fenced primary is not failed over: no writes until it is unfenced.
    Fence { database: String, instance: String },
    /// Starts a fenced INSTANCE's PostgreSQL again (`*`: every fenced instance).
    Unfence { database: String, instance: String },
    /// Keelson stops changing the database's children (no apply, no failover) until resumed.
    Pause { database: String },
    /// Keelson reconciles the database again.
    Resume { database: String },
    /// A support bundle: the objects, Events and recent logs, with every secret value left out.
    Report {
        database: String,
        /// Write it here instead of stdout.
        #[arg(long)]
        file: Option<std::path::PathBuf>,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("cannot reach the cluster (is KUBECONFIG right?): {0}")]
    Connect(#[source] kube::Error),
    #[error("{kind} {name:?} not found in namespace {namespace:?}")]
    NotFound { kind: &'static str, name: String, namespace: String },
    #[error("not allowed to {action}: {message} (your kubeconfig's user needs that right)")]
    Forbidden { action: String, message: String },
    #[error("cannot {action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },
    #[error("{0}")]
    Refused(String),
    #[error(
        "no answer from the operator while waiting for {0}: is it running? \
         (kubectl get pods -A -l app.kubernetes.io/name=keelson)"
    )]
    NoAnswer(String),
    #[error("cannot write {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot print: {0}")]
    Print(String),
}

pub type Result<T, E = PluginError> = std::result::Result<T, E>;

/// Maps an API error to what the user can act on.
fn api_error(action: impl Into<String>) -> impl FnOnce(kube::Error) -> PluginError {
    let action = action.into();
    move |source| match &source {
        kube::Error::Api(status) if status.code == 403 => {
            PluginError::Forbidden { action, message: status.message.clone() }
        }
        _ => PluginError::Kube { action, source },
    }
}

/// The cluster and namespace the user's kubeconfig names.
struct Target {
    client: Client,
    namespace: String,
}

impl Target {
    async fn connect(namespace: Option<String>) -> Result<Self> {
        let client = Client::try_default().await.map_err(PluginError::Connect)?;
        let namespace = namespace.unwrap_or_else(|| client.default_namespace().to_string());
        Ok(Self { client, namespace })
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    async fn database(&self, name: &str) -> Result<MyDatabase> {
        self.api::<MyDatabase>().get_opt(name).await.map_err(api_error(format!("get MyDatabase {name}")))?.ok_or_else(
            || PluginError::NotFound { kind: "MyDatabase", name: name.to_string(), namespace: self.namespace.clone() },
        )
    }

    async fn webapp(&self, name: &str) -> Result<WebApp> {
        self.api::<WebApp>().get_opt(name).await.map_err(api_error(format!("get WebApp {name}")))?.ok_or_else(|| {
            PluginError::NotFound { kind: "WebApp", name: name.to_string(), namespace: self.namespace.clone() }
        })
    }
}

/// Prints `value` as JSON or YAML, or `table` for people.
fn print<T: serde::Serialize>(output: Output, value: &T, table: impl FnOnce() -> String) -> Result<()> {
    let text = match output {
        Output::Table => table(),
        Output::Json => serde_json::to_string_pretty(value).map_err(|e| PluginError::Print(e.to_string()))? + "\n",
        Output::Yaml => serde_yaml::to_string(value).map_err(|e| PluginError::Print(e.to_string()))?,
    };
    use std::io::Write as _;
    // A closed pipe (`| head`) ends the output, not the program with a panic.
    let _ = std::io::stdout().write_all(text.as_bytes());
    Ok(())
}

/// Columns padded to their widest cell.
fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> =
            row.iter().enumerate().map(|(c, s)| format!("{s:<width$}", width = widths[c])).collect();
        out.push_str(cells.join("   ").trim_end());
        out.push('\n');
    }
    out
}

/// Runs one command.
pub async fn run(args: PluginArgs) -> Result<()> {
    let target = Target::connect(args.namespace).await?;
    let output = args.output;
    match args.command {
        PluginCommand::Status { database } => status::database(&target, &database, output).await,
        PluginCommand::Webapp { webapp } => status::webapp(&target, &webapp, output).await,
        PluginCommand::Backups { database } => status::backups(&target, &database, output).await,
        PluginCommand::Promote { database, instance } => actions::promote(&target, &database, &instance).await,
        PluginCommand::Backup { database, wait } => actions::backup(&target, &database, wait).await,
        PluginCommand::Restore { name, from, backup, replicas, storage } => {
            actions::restore(&target, &name, &from, backup, replicas, storage).await
        }
        PluginCommand::Psql { database, replica, args } => actions::psql(&target, &database, replica, &args).await,
        PluginCommand::Fence { database, instance } => actions::fence(&target, &database, &instance, true).await,
        PluginCommand::Unfence { database, instance } => actions::fence(&target, &database, &instance, false).await,
        PluginCommand::Pause { database } => actions::pause(&target, &database, true).await,
        PluginCommand::Resume { database } => actions::pause(&target, &database, false).await,
        PluginCommand::Report { database, file } => report::write(&target, &database, file.as_deref()).await,
    }
}

/// The database's instance pods, by name.
async fn instance_pods(target: &Target, db: &MyDatabase) -> Result<Vec<k8s_openapi::api::core::v1::Pod>> {
    use crate::mydatabase::names;
    let selector = names::pod_selector(db).iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
    let mut pods = target
        .api::<k8s_openapi::api::core::v1::Pod>()
        .list(&kube::api::ListParams::default().labels(&selector))
        .await
        .map_err(api_error(format!("list the pods of MyDatabase {}", db.name_any())))?
        .items;
    pods.sort_by_key(|p| p.name_any());
    Ok(pods)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_their_columns() {
        let rows = vec![vec!["NAME".to_string(), "ROLE".into()], vec!["production-db-0".into(), "primary".into()]];
        assert_eq!(table(&rows), "NAME              ROLE\nproduction-db-0   primary\n");
    }
}
