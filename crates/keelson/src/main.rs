//! The `keelson` binary: runs the controllers, or prints generated manifests.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use keelson::manifests;

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
    /// Print manifests generated from the code.
    Manifests {
        #[command(subcommand)]
        what: ManifestKind,
    },
}

#[derive(Subcommand, Clone, Copy)]
enum ManifestKind {
    /// The CustomResourceDefinitions.
    Crd,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => match keelson::operator::run(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("keelson: {error}");
                ExitCode::FAILURE
            }
        },
        Command::Manifests { what } => {
            let rendered = match what {
                ManifestKind::Crd => manifests::to_yaml_stream(&manifests::crd::all()),
            };
            match rendered {
                Ok(text) => {
                    print!("{text}");
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
