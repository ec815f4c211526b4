//! A userspace TCP proxy in front of each server, so the harness can delay
//! or cut the network between clients and servers without kernel netem.
//!
//! Each direction of each connection is a reader that stamps every chunk
//! with its arrival time and a writer that forwards it `delay` later (the
//! delay in force when the chunk is due), holding everything while the
//! blackhole is on: like a link that drops packets, after which TCP
//! retransmits, bytes arrive late and in order (or the endpoint's own
//! timeouts give up first).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};

/// The network condition a proxy applies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Net {
    /// Added to every chunk, each way.
    pub delay: Duration,
    /// Nothing passes while true.
    pub blackhole: bool,
}

/// A proxy from a free loopback port to `127.0.0.1:upstream`.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    net: watch::Sender<Net>,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Proxy {
    /// Starts listening.
    pub async fn start(upstream: u16) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let port = listener.local_addr()?.port();
        let (net, _) = watch::channel(Net::default());
        let tasks = Arc::new(Mutex::new(Vec::new()));
        let (net_rx, task_list) = (net.subscribe(), tasks.clone());
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let conn = tokio::spawn(connect(client, upstream, net_rx.clone()));
                let mut list = task_list.lock().unwrap_or_else(|p| p.into_inner());
                list.retain(|t: &JoinHandle<()>| !t.is_finished());
                list.push(conn);
            }
        });
        tasks.lock().unwrap_or_else(|p| p.into_inner()).push(accept);
        Ok(Proxy { port, net, tasks })
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Changes the condition for every connection, current and future.
    pub fn set(&self, net: Net) {
        self.net.send_replace(net);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        for task in self
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            task.abort();
        }
    }
}

async fn passable(net: &mut watch::Receiver<Net>) -> Net {
    loop {
        let now = *net.borrow_and_update();
        if !now.blackhole {
            return now;
        }
        if net.changed().await.is_err() {
            return Net::default();
        }
    }
}

async fn connect(client: TcpStream, upstream: u16, mut net: watch::Receiver<Net>) {
    // A blackholed link does not even complete new connections.
    passable(&mut net).await;
    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
        return; // dropping `client` resets it, as a dead server would
    };
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let mut up = tokio::spawn(pump(cr, sw, net.clone()));
    let down = pump(sr, cw, net);
    // When one direction ends (EOF or error), the other is cut too.
    tokio::select! {
        () = down => up.abort(),
        _ = &mut up => {}
    }
}

async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut net: watch::Receiver<Net>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
            }
        }
    };
    let writer = async move {
        while let Some((arrived, chunk)) = rx.recv().await {
            loop {
                let cond = passable(&mut net).await;
                let due = arrived + cond.delay;
                if Instant::now() >= due {
                    break;
                }
                // Wake when due, or re-check if the condition changes.
                tokio::select! {
                    () = sleep_until(due) => {}
                    _ = net.changed() => {}
                }
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}
