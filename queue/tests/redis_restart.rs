//! Redis restart tolerance, on a private redis-server (the shared one is never restarted):
//! while the server is down operations fail with typed errors; once it is back (empty, as
//! it runs without persistence) the same broker works again without being rebuilt.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tidal_queue::{Broker, BrokerConfig, Job, QueueError, RedisBroker, ResponseEvent};
use uuid::Uuid;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A private redis-server, killed (by its own pid) when dropped, even if the test fails.
struct Server(Child);

impl Server {
    fn stop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

fn start_server(port: u16, dir: &std::path::Path) -> Server {
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args(["--appendonly", "no", "--dir"])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server starts");
    Server(child)
}

async fn wait_up(url: &str) {
    let client = redis::Client::open(url).unwrap();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        if let Ok(mut c) = client.get_multiplexed_async_connection().await {
            if redis::cmd("PING")
                .query_async::<String>(&mut c)
                .await
                .is_ok()
            {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("private redis on {url} did not come up");
}

fn job(model: &str) -> Job {
    Job {
        id: Uuid::now_v7(),
        tenant: "acme".into(),
        model: model.into(),
        body: serde_json::json!({"prompt": "hi"}),
        enqueued_at_ms: 0,
        deadline_ms: 0,
        resume: None,
    }
}

/// Retries `f` until it succeeds or 10 s pass.
async fn eventually<T, F, Fut>(mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, QueueError>>,
{
    let t = Instant::now();
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) if t.elapsed() < Duration::from_secs(10) => {
                tracing::debug!("retrying after {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("broker did not recover: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_recovers_after_a_redis_restart() {
    if Command::new("redis-server")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: no redis-server binary");
        return;
    }
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let dir = std::env::temp_dir().join(format!("tidal-queue-restart-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut server = start_server(port, &dir);
    wait_up(&url).await;

    let b = RedisBroker::connect(&url, BrokerConfig::default())
        .await
        .unwrap();
    let m = "ns/restart";
    b.enqueue(&job(m)).await.unwrap();
    assert_eq!(b.claim(m, "w1", 1, Duration::ZERO).await.unwrap().len(), 1);

    server.stop();
    assert!(matches!(
        b.enqueue(&job(m)).await,
        Err(QueueError::Redis(_))
    ));
    assert!(b.claim(m, "w1", 1, Duration::ZERO).await.is_err());

    let restarted = start_server(port, &dir);
    wait_up(&url).await;
    let j = job(m);
    eventually(|| b.enqueue(&j)).await;
    // The consumer group vanished with the data; claiming recreates it.
    let got = eventually(|| b.claim(m, "w1", 1, Duration::from_millis(100))).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].job.id, j.id);
    let ev = ResponseEvent::delta(1, "a", vec![1]);
    b.append_response(j.id, &ev).await.unwrap();
    assert_eq!(
        b.read_responses(j.id, 0, 10, Duration::from_millis(100))
            .await
            .unwrap(),
        vec![ev]
    );
    b.ack(&got[0]).await.unwrap();
    assert_eq!(b.depth(m).await.unwrap().in_flight, 0);

    drop(restarted);
    let _ = std::fs::remove_dir_all(&dir);
}
