//! The local cluster's API server listens on 127.0.0.1 only; pods on the
//! real node reach it through this forwarder on the node's bridge address,
//! where the `kubernetes` Service's endpoint points (hack/cluster/api-bridge.sh).
//! TLS passes through untouched: pods authenticate as their ServiceAccount.

use std::net::SocketAddr;

use clap::Parser;
use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};

#[derive(Parser)]
#[command(about = "Forwards TCP connections from the node's bridge address to the API server on loopback")]
struct Args {
    /// Where pods connect: the node's address on the bridge and the API server's port.
    #[arg(long)]
    listen: SocketAddr,
    /// The API server's loopback address.
    #[arg(long)]
    to: SocketAddr,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.to.ip().is_loopback(), "--to {} must be a loopback address", args.to);
    let listener = TcpListener::bind(args.listen).await?;
    eprintln!("forwarding {} to {}", args.listen, args.to);
    loop {
        let (mut inbound, peer) = listener.accept().await?;
        let to = args.to;
        tokio::spawn(async move {
            match TcpStream::connect(to).await {
                Ok(mut outbound) => {
                    if let Err(error) = copy_bidirectional(&mut inbound, &mut outbound).await {
                        eprintln!("{peer}: {error}");
                    }
                }
                Err(error) => eprintln!("{peer}: cannot reach {to}: {error}"),
            }
        });
    }
}
