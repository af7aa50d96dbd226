//! A TCP proxy for outage tests: between a client under test and a shared server (Redis,
//! PostgreSQL) that must stay up for other tests, switched off and on.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A TCP proxy to `target` that can be switched off and on. Off, it forwards nothing and
/// answers nothing but keeps every connection open, as a hung or partitioned server does:
/// the worst case for a client, which waits for its own timeouts.
pub struct Proxy {
    /// `host:port` to connect to instead of the server.
    pub addr: String,
    up: watch::Sender<bool>,
    held: Arc<Mutex<Vec<TcpStream>>>,
    /// The accept loop (abort it to stop the proxy).
    pub accept: JoinHandle<()>,
}

impl Proxy {
    /// Starts forwarding to `target` (`host:port`).
    pub async fn start(target: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let up = watch::Sender::new(true);
        let held: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (up2, held2) = (up.clone(), held.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if !*up2.borrow() {
                    held2.lock().unwrap().push(client);
                    continue;
                }
                let (mut down, held) = (up2.subscribe(), held2.clone());
                let target = target.clone();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(&target).await else {
                        return;
                    };
                    let cut = tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => false,
                        _ = down.wait_for(|up| !*up) => true,
                    };
                    if cut {
                        held.lock().unwrap().extend([client, server]);
                    }
                });
            }
        });
        Proxy {
            addr,
            up,
            held,
            accept,
        }
    }

    /// The outage starts: nothing is forwarded any more, in either direction.
    pub fn down(&self) {
        self.up.send_replace(false);
    }

    /// The outage ends: the connections it hung are closed, new ones are forwarded.
    pub fn up(&self) {
        self.up.send_replace(true);
        self.held.lock().unwrap().clear();
    }
}

/// `host:port` of a `scheme://user@host:port/...` URL.
pub fn authority(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.split_once('@').map_or(rest, |(_, r)| r);
    rest.split('/').next().unwrap_or(rest).to_owned()
}
