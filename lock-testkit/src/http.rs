//! Plain HTTP GETs of a server's own endpoints (etcd's `/metrics`), over
//! hyper's HTTP/1 client.

use std::io;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

/// How long one GET may take: a member that does not answer in this time
/// is paused or gone, and the caller reports it.
const TIMEOUT: Duration = Duration::from_secs(5);

/// The body of `GET path` from the plain-HTTP server at `host_port`; an
/// error when it does not answer within 5 s or answers other than 2xx.
pub async fn get(host_port: &str, path: &str) -> io::Result<String> {
    tokio::time::timeout(TIMEOUT, fetch(host_port, path))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, format!("GET {host_port}{path}")))?
}

async fn fetch(host_port: &str, path: &str) -> io::Result<String> {
    let stream = tokio::net::TcpStream::connect(host_port).await?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(io::Error::other)?;
    // The connection moves the bytes while the request waits on it; it
    // ends once the response is read and `sender` is dropped.
    tokio::spawn(connection);
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, host_port)
        .body(Empty::<Bytes>::new())
        .map_err(io::Error::other)?;
    let response = sender
        .send_request(request)
        .await
        .map_err(io::Error::other)?;
    let status = response.status();
    if !status.is_success() {
        return Err(io::Error::other(format!("GET {host_port}{path}: {status}")));
    }
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(io::Error::other)?;
    Ok(String::from_utf8_lossy(&body.to_bytes()).into_owned())
}

/// [`get`] for synchronous callers, which may themselves run inside a
/// runtime (where another cannot block): on a thread and a runtime of its own.
pub fn get_blocking(host_port: &str, path: &str) -> io::Result<String> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?
                    .block_on(get(host_port, path))
            })
            .join()
            .map_err(|_| io::Error::other("the GET's thread panicked"))?
    })
}
