//! The `keelson` binary: runs the controllers, or prints generated manifests.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use keelson::manifests;

/// jemalloc, as kube-rs's controller-rs and Linkerd's controllers use, tuned
/// below to hand freed pages back (at N=1000 RSS at rest went 38.5 → 35.0 MB
/// with the LTO build, in runs disturbed by a stray operator: a modest gain).
#[cfg(all(target_os = "linux", not(target_env = "msvc")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read before `main`: two arenas (the runtime has two
/// workers by default on small nodes, and more arenas hold more idle pages),
/// and freed pages handed back to the system within a second by a background
/// thread, so that an initial list's peak does not stay resident.
#[cfg(all(target_os = "linux", not(target_env = "msvc")))]
#[unsafe(export_name = "_rjem_malloc_conf")]
#[allow(non_upper_case_globals)]
pub static malloc_conf: &u8 = &b"narenas:2,background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0"[0];

#[derive(Parser)]
#[command(name = "keelson", version, about = "Kubernetes operator for WebApps and PostgreSQL databases")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the WebApp and MyDatabase controllers against the current cluster.
    Run(keelson::operator::RunArgs),
    /// Day-two commands (`kubectl keelson …` when installed as `kubectl-keelson`).
    Ctl(keelson::plugin::PluginArgs),
    /// The instance manager of a MyDatabase pod (the operator starts it there).
    Instance {
        #[command(subcommand)]
        what: InstanceCommand,
    },
    /// Print manifests generated from the code.
    Manifests {
        #[command(subcommand)]
        what: ManifestKind,
        /// The operator's image in `all` (the instance manager follows it); `make deploy IMG=…`.
        #[arg(long, global = true, default_value = manifests::deploy::IMAGE)]
        image: String,
    },
}

#[derive(Subcommand)]
enum InstanceCommand {
    /// Report the local PostgreSQL's role, version and positions on this pod.
    Run(keelson::instance::RunArgs),
    /// Copy this binary to PATH (an init container's job, or an in-place upgrade's).
    Install {
        path: std::path::PathBuf,
        /// The image this binary comes from, recorded beside it for the manager to report.
        #[arg(long)]
        image: Option<String>,
    },
    /// Print the SCRAM-SHA-256 verifier of the password read from stdin (what
    /// `ALTER ROLE … PASSWORD` is given, so the password never reaches the server).
    ScramVerifier,
}

#[derive(Subcommand, Clone)]
enum ManifestKind {
    /// Print the CustomResourceDefinitions.
    Crd,
    /// Print the ClusterRole and the leader-election Role.
    Rbac,
    /// Print everything `make deploy` applies (CRDs, RBAC, namespace, manager).
    All,
    /// Write every generated file under `<root>/config/`.
    Write {
        /// Repository root.
        #[arg(long, default_value = ".")]
        root: std::path::PathBuf,
    },
}

/// Stack of each runtime thread. A MyDatabase reconcile polled in a debug build
/// (`make run`) can need more than the 2 MiB default: its future is ~120 KB and
/// unoptimised poll frames keep every temporary. Only touched pages cost memory.
const THREAD_STACK: usize = 8 << 20;

fn main() -> ExitCode {
    match tokio::runtime::Builder::new_multi_thread().enable_all().thread_stack_size(THREAD_STACK).build() {
        Ok(runtime) => runtime.block_on(run()),
        Err(error) => {
            eprintln!("keelson: cannot start the async runtime: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Installed as `kubectl-keelson`, the binary is the kubectl plugin: `kubectl keelson status db`
/// runs `kubectl-keelson status db`, which means `keelson ctl status db`.
fn arguments() -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let invoked_as = args.first().and_then(|a| std::path::Path::new(a).file_name()).map(|n| n.to_os_string());
    if invoked_as.is_some_and(|name| name.to_string_lossy().starts_with("kubectl-keelson")) {
        args.insert(1, "ctl".into());
    }
    args
}

async fn run() -> ExitCode {
    let cli = Cli::parse_from(arguments());
    match cli.command {
        Command::Run(args) => match keelson::operator::run(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("keelson: {error}");
                ExitCode::FAILURE
            }
        },
        Command::Ctl(args) => match keelson::plugin::run(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("kubectl keelson: {error}");
                ExitCode::FAILURE
            }
        },
        Command::Instance { what } => {
            let outcome = match what {
                InstanceCommand::Run(args) => {
                    tracing_subscriber::fmt().with_writer(std::io::stderr).with_target(false).init();
                    keelson::instance::run(args).await
                }
                InstanceCommand::Install { path, image } => keelson::instance::install(&path, image.as_deref()),
                InstanceCommand::ScramVerifier => keelson::instance::print_scram_verifier(),
            };
            match outcome {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("keelson instance: {error}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Manifests { what, image } => {
            let rendered = match what {
                ManifestKind::Crd => manifests::to_yaml_stream(&manifests::crd::all()),
                ManifestKind::Rbac => manifests::to_yaml_stream(&[manifests::rbac::cluster_role()]).and_then(|role| {
                    let ns = manifests::deploy::NAMESPACE;
                    Ok(role + &manifests::to_yaml_stream(&[manifests::rbac::leader_election_role(ns)])?)
                }),
                ManifestKind::All => manifests::install_stream(&image),
                ManifestKind::Write { root } => match manifests::files() {
                    Ok(files) => {
                        for (path, content) in files {
                            let target = root.join(&path);
                            let written = target
                                .parent()
                                .map_or(Ok(()), std::fs::create_dir_all)
                                .and_then(|()| std::fs::write(&target, content));
                            if let Err(error) = written {
                                eprintln!("keelson: cannot write {}: {error}", target.display());
                                return ExitCode::FAILURE;
                            }
                            eprintln!("wrote {path}");
                        }
                        Ok(String::new())
                    }
                    Err(error) => Err(error),
                },
            };
            match rendered {
                Ok(text) => {
                    // A closed pipe (`| head`) ends the output, not the program with a panic.
                    use std::io::Write as _;
                    let _ = std::io::stdout().write_all(text.as_bytes());
                    ExitCode::SUCCESS
                }
                Err(error) => {
                    eprintln!("keelson: {error}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
