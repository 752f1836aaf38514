//! A Kafka-protocol broker owned by a test (issue 46): tansu (installed by
//! `scripts/setup` into `.tools/tansu`, or `TANSU_BIN`) on a free loopback
//! port, its log in SQLite under a temp dir so that a restart keeps the
//! topic; and an independent consumer, kafka-python (`scripts/setup`
//! installs it into `.tools/venv`), to read back what the product produced
//! with a client that shares no code with the product's producer. (kcat,
//! librdkafka 2.0 from Debian, cannot read tansu 0.6's ApiVersions answer.)

use std::collections::BTreeMap;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The tansu binary: `TANSU_BIN`, else the one `scripts/setup` installs.
pub fn tansu_bin() -> PathBuf {
    std::env::var_os("TANSU_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::repo_root().join(".tools/tansu/bin/tansu"))
}

/// A running broker; killed on drop.
pub struct KafkaBroker {
    pub port: u16,
    pub dir: tempfile::TempDir,
    child: Option<Child>,
}

impl KafkaBroker {
    /// Starts a broker on a free loopback port and waits until it accepts
    /// connections.
    pub fn start() -> KafkaBroker {
        let mut b = KafkaBroker {
            port: crate::free_port(),
            dir: tempfile::tempdir().expect("a temp dir for the broker"),
            child: None,
        };
        b.spawn();
        b
    }

    /// `127.0.0.1:<port>`, as `KAFKA_BROKERS` takes it.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) {
        let bin = tansu_bin();
        assert!(
            bin.exists(),
            "{} missing: scripts/setup installs tansu (or set TANSU_BIN)",
            bin.display()
        );
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("tansu.log"))
            .expect("the broker's log");
        let child = Command::new(bin)
            .arg("broker")
            .arg("--listener-url")
            .arg(&url)
            .arg("--advertised-listener-url")
            .arg(&url)
            // tansu reads the URL's path as relative to its directory.
            .arg("--storage-engine")
            .arg("sqlite://tansu.db")
            .current_dir(self.dir.path())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("tansu starts");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "tansu did not listen on {} within 30 s: {}",
                self.port,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The broker's log so far (for a failing assertion's message).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("tansu.log")).unwrap_or_default()
    }

    /// SIGKILL: the broker goes away mid-whatever, as a crash does.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port and data.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for KafkaBroker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One record as the independent consumer read it.
#[derive(Debug, Clone)]
pub struct Consumed {
    pub partition: i64,
    pub offset: i64,
    pub key: String,
    pub headers: BTreeMap<String, String>,
    pub value: Value,
}

/// Every record of `topic` from the beginning, read by kafka-python
/// (`tests/bin/kafka_consume.py`), sorted by partition, then offset.
pub fn consume_all(addr: &str, topic: &str) -> Vec<Consumed> {
    let python = crate::repo_root().join(".tools/venv/bin/python");
    let out = Command::new(&python)
        .arg(crate::repo_root().join("tests/bin/kafka_consume.py"))
        .args([addr, topic])
        .output()
        .unwrap_or_else(|e| panic!("{} runs (scripts/setup makes it): {e}", python.display()));
    assert!(
        out.status.success(),
        "the consumer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut records: Vec<Consumed> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("consumer line {l}: {e}"));
            Consumed {
                partition: v["partition"].as_i64().unwrap_or(-1),
                offset: v["offset"].as_i64().unwrap_or(-1),
                key: v["key"].as_str().unwrap_or_default().to_string(),
                headers: v["headers"]
                    .as_object()
                    .map(|h| {
                        h.iter()
                            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                            .collect()
                    })
                    .unwrap_or_default(),
                value: v["value"]
                    .as_str()
                    .and_then(|p| serde_json::from_str(p).ok())
                    .unwrap_or(Value::Null),
            }
        })
        .collect();
    records.sort_by_key(|r| (r.partition, r.offset));
    records
}
