//! A plain HTTP/1.0 GET, for what tests reach on 127.0.0.1 (NodePorts,
//! port-forwards) or on a test host of their own.

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The whole answer (status line, headers, body) to `GET /` at `address`.
pub async fn http_get(address: &str) -> anyhow::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    stream.write_all(b"GET / HTTP/1.0\r\nHost: test\r\n\r\n").await?;
    // Read until the server closes; a reset after the answer (port-forward) ends it too.
    let (mut answer, mut chunk) = (Vec::new(), [0u8; 4096]);
    loop {
        match stream.read(&mut chunk).await {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
            Err(_) if !answer.is_empty() => break,
            Err(error) => return Err(error.into()),
        }
    }
    Ok(String::from_utf8_lossy(&answer).into_owned())
}
