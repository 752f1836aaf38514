//! Redis over TLS (`rediss://`), as managed Redis services require: the
//! origin verifies the server against the CA bundle in `SSL_CERT_FILE` (the
//! image sets it to its bundle; a private CA is mounted and named there),
//! refuses a server it cannot verify, and sells through it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use origin::ops::workers::Workers;
use tests::{AppOptions, OriginProcess, TestApp, free_port, ring_env, sale_spec};

/// A CA and a server certificate for 127.0.0.1, made with the openssl CLI.
fn certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl on PATH");
        assert!(out.status.success(), "openssl {args:?}: {out:?}");
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "1",
        "-subj",
        "/CN=flashsale test CA",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(dir.join("ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost").unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "1",
        "-extfile",
        "ext",
    ]);
    (
        dir.join("ca.crt"),
        dir.join("server.crt"),
        dir.join("server.key"),
    )
}

struct TlsRedis {
    port: u16,
    child: Child,
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TLS-only Redis on a free loopback port. Redis cannot be handed a bound
/// socket, so the port is picked first; Redis exits at once when it cannot
/// bind it, so once this child answers on its own Unix socket the TLS port
/// is its own. If another process took the port in between, it starts
/// again on another.
fn tls_redis(dir: &Path, cert: &Path, key: &Path, ca: &Path) -> TlsRedis {
    let sock = dir.join("redis.sock");
    for _ in 0..10 {
        let port = free_port();
        let _ = std::fs::remove_file(&sock);
        let child = Command::new("redis-server")
            .args([
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ])
            .arg("--unixsocket")
            .arg(&sock)
            .arg("--tls-cert-file")
            .arg(cert)
            .arg("--tls-key-file")
            .arg(key)
            .arg("--tls-ca-cert-file")
            .arg(ca)
            .args([
                "--tls-auth-clients",
                "no",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server on PATH");
        let mut server = TlsRedis { port, child };
        let me = format!("process_id:{}", server.child.id());
        for _ in 0..200 {
            if let Ok(Some(_)) = server.child.try_wait() {
                break; // its port was taken: another one
            }
            let info = Command::new("redis-cli")
                .arg("-s")
                .arg(&sock)
                .args(["INFO", "server"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            if info.lines().any(|l| l.trim() == me) {
                return server;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        drop(server);
    }
    panic!("no loopback port a TLS redis-server could keep in 10 tries");
}

fn config_check(redis_url: &str, cert_file: Option<&Path>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_origin"));
    cmd.args(["config", "check", "--connect"])
        .env_clear()
        .env("REDIS_URL", redis_url)
        .env("USER_TOKEN_KEYS", ring_env("usr1"))
        .env("ADMISSION_TOKEN_KEYS", ring_env("adm1"));
    if let Some(f) = cert_file {
        cmd.env("SSL_CERT_FILE", f);
    }
    cmd.output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_origin_sells_through_a_verified_tls_redis() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = certificates(dir.path());
    let redis = tls_redis(dir.path(), &cert, &key, &ca);
    let url = format!("rediss://127.0.0.1:{}", redis.port);

    let trusted = config_check(&url, Some(&ca));
    let out = String::from_utf8_lossy(&trusted.stdout);
    assert!(out.contains("redis: ok"), "{out}");
    // Verification is on: with only the system's roots the server is refused.
    let untrusted = config_check(&url, Some(Path::new("/etc/ssl/certs/ca-certificates.crt")));
    let out = String::from_utf8_lossy(&untrusted.stdout);
    assert!(out.contains("redis: FAILED"), "{out}");
    assert_eq!(untrusted.status.code(), Some(1));

    // The test's handle is on Postgres only (its in-process origin uses the
    // plain local Redis and no workers); everything on the TLS Redis goes
    // through the binary, which verifies the server against the CA.
    let app = TestApp::spawn_with(AppOptions {
        workers: Workers::NONE,
        ..AppOptions::default()
    })
    .await;
    let ca_path = ca.to_string_lossy().to_string();
    let env = [
        ("REDIS_URL", url.as_str()),
        ("SSL_CERT_FILE", ca_path.as_str()),
    ];
    let cli = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_origin"))
            .args(args)
            .env_clear()
            .env("DATABASE_URL", &app.db.url)
            .env("REDIS_KEY_PREFIX", &app.prefix)
            .envs(env)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let spec = sale_spec("tls", 10, 2, 2);
    cli(&[
        "sale",
        "create",
        "--sale",
        "tls",
        "--name",
        &spec.name,
        "--units",
        "10",
        "--per-user-limit",
        "2",
        "--shards",
        "2",
        "--starts-at",
        "now",
    ]);
    let origin = OriginProcess::start(Path::new(env!("CARGO_BIN_EXE_origin")), &app, &env).await;
    let (status, body) = origin
        .reserve("tls", &app.admit("alice", "tls"), "k1")
        .await;
    assert_eq!(status, 202, "{}", origin.log());
    let id = body["reservation_id"].as_str().unwrap().to_string();
    for _ in 0..100 {
        let status: Option<String> =
            sqlx::query_scalar("SELECT status FROM reservations WHERE id = $1")
                .bind(&id)
                .fetch_optional(&app.state.pool)
                .await
                .unwrap();
        if status.as_deref() == Some("settled") {
            let shown = cli(&["sale", "show", "--sale", "tls"]);
            assert_eq!(shown["redis"]["holds"], 1);
            assert_eq!(shown["redis"]["available"], 9);
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "the hold never settled through TLS Redis:\n{}",
        origin.log()
    );
}
