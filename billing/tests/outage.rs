//! Database outage while events flow: nothing is lost.
//!
//! The shared PostgreSQL server is never stopped. The outage is simulated at the connection
//! level: the ledger reaches PostgreSQL through a TCP proxy in this test, which cuts every
//! open connection and refuses new ones for a while, then lets them through again.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{TimeZone, Utc};
use common::Kind;
use tidal_billing::consumer::{self, ConsumerConfig};
use tidal_billing::memory_source::MemoryStream;
use tidal_billing::{CapacityType, Ledger, LedgerOptions, Month, Prices, Principal, UsageRecord};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A TCP proxy to PostgreSQL that can be cut and restored.
struct Proxy {
    port: u16,
    down: Arc<AtomicBool>,
    links: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let down = Arc::new(AtomicBool::new(false));
        let links: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let (d, l) = (down.clone(), links.clone());
        let accept = tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    continue;
                };
                if d.load(Ordering::SeqCst) {
                    drop(client); // refused: the database is "down"
                    continue;
                }
                let upstream = upstream.clone();
                let link = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                l.lock().unwrap().push(link);
            }
        });
        Proxy {
            port,
            down,
            links,
            accept,
        }
    }

    /// Cuts every open connection and refuses new ones.
    fn cut(&self) {
        self.down.store(true, Ordering::SeqCst);
        for link in self.links.lock().unwrap().drain(..) {
            link.abort();
        }
    }

    fn restore(&self) {
        self.down.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}

fn event(i: usize) -> UsageRecord {
    let end = Utc.with_ymd_and_hms(2026, 11, 10, 0, 0, 0).unwrap()
        + chrono::Duration::milliseconds(i as i64);
    UsageRecord {
        request_id: format!("req-{i}"),
        segment: 0,
        tenant: format!("t{}", i % 3),
        model: "m".into(),
        prompt_tokens: (i % 1000) as u64 + 1,
        cached_prompt_tokens: 0,
        completion_tokens: (i % 100) as u64,
        worker: "w".into(),
        capacity: CapacityType::Spot,
        started_at: end,
        ended_at: end,
        last: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outage_loses_nothing() {
    let (db, direct) = common::ledger(Kind::Postgres, "outage").await;
    direct
        .set_price(
            "m",
            Utc.with_ymd_and_hms(2026, 11, 1, 0, 0, 0).unwrap(),
            Prices {
                input_per_m: 1_000_000,
                cached_input_per_m: 0,
                output_per_m: 1_000_000,
            },
            Utc::now(),
        )
        .await
        .unwrap();

    let server = common::server_url();
    let authority = server.rsplit('@').next().unwrap().to_string();
    let proxy = Proxy::start(authority).await;
    let via_proxy = db.url.replacen(
        &server,
        &format!("postgres://postgres@127.0.0.1:{}", proxy.port),
        1,
    );
    assert_ne!(via_proxy, db.url);
    let opts = LedgerOptions {
        max_connections: 4,
        acquire_timeout: Duration::from_millis(500),
    };
    let ledger = Ledger::connect_with(&via_proxy, &opts).await.unwrap();

    let stream = MemoryStream::new();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let cfg = ConsumerConfig {
        max_batch: 200,
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(200),
    };
    let (l, s, c) = (ledger.clone(), stream.clone(), cfg.clone());
    let consumer = tokio::spawn(async move {
        let mut source = s.consumer();
        consumer::run(&l, &mut source, &c, async {
            let _ = stop_rx.await;
        })
        .await
    });

    // Events flow before, during and after the outage.
    const N: usize = 20_000;
    for i in 0..N {
        stream.push(event(i));
        if i % 500 == 499 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if i == 6_000 {
            proxy.cut();
        }
        if i == 14_000 {
            // Everything pushed while cut is still in the stream: none of it was acked.
            assert!(stream.pending_len() + stream.new_len() > 0);
            tokio::time::sleep(Duration::from_millis(1500)).await;
            proxy.restore();
        }
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !stream.is_drained() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "stream not drained: {} new, {} pending",
            stream.new_len(),
            stream.pending_len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop_tx.send(());
    let stats = consumer.await.unwrap().unwrap();
    assert!(stats.write_retries > 0, "the outage was felt: {stats:?}");

    let op = Principal::operator();
    assert_eq!(direct.event_count(&op).await.unwrap(), N as i64);
    let rows = direct
        .usage_rows(&op, None, Month::parse("2026-11").unwrap().period())
        .await
        .unwrap();
    let input: i64 = rows.iter().map(|r| r.totals.input_tokens).sum();
    let output: i64 = rows.iter().map(|r| r.totals.output_tokens).sum();
    let exp_in: i64 = (0..N).map(|i| (i % 1000) as i64 + 1).sum();
    let exp_out: i64 = (0..N).map(|i| (i % 100) as i64).sum();
    assert_eq!((input, output), (exp_in, exp_out));
    ledger.close().await;
    drop(proxy);
    direct.close().await;
    db.drop_db().await.unwrap();
}
