//! A PostgreSQL server owned by a test (issue 46's WAL mode needs
//! `wal_level=logical`, which the shared server on 5432 does not have and
//! must not be restarted for): `initdb` into a temp dir and `postgres` on a
//! free loopback port, as the `postgres` user when the tests run as root
//! (PostgreSQL refuses to run as root). Stopped on drop.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The newest server binaries Debian's packages installed.
fn pg_bin() -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL server binaries under /usr/lib/postgresql")
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("initdb").exists())
        .collect();
    dirs.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    dirs.pop()
        .expect("an initdb under /usr/lib/postgresql/*/bin")
}

/// The uid and gid to run the server as: `postgres` when we are root.
fn server_user() -> Option<(u32, u32)> {
    let me = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&me.stdout).trim() != "0" {
        return None;
    }
    let id = |flag: &str| -> Option<u32> {
        let out = Command::new("id").args([flag, "postgres"]).output().ok()?;
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    };
    Some((id("-u")?, id("-g")?))
}

/// A running server; stopped (fast shutdown) on drop.
pub struct PostgresServer {
    pub port: u16,
    pub dir: tempfile::TempDir,
    child: Option<Child>,
}

impl PostgresServer {
    /// A fresh cluster with `wal_level=logical`, serving on a free port.
    pub fn start_logical() -> PostgresServer {
        let dir = tempfile::tempdir().expect("a temp dir for Postgres");
        let user = server_user();
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("chown the data dir");
        }
        let as_user = |c: &mut Command| {
            if let Some((uid, gid)) = user {
                c.uid(uid).gid(gid);
            }
        };
        let mut initdb = Command::new(pg_bin().join("initdb"));
        initdb
            .args(["-A", "trust", "-U", "postgres", "-D"])
            .arg(dir.path().join("data"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        as_user(&mut initdb);
        let out = initdb.output().expect("initdb runs");
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for _ in 0..5 {
            let port = crate::free_port();
            let log = std::fs::File::create(dir.path().join("postgres.log")).expect("log");
            let mut cmd = Command::new(pg_bin().join("postgres"));
            cmd.arg("-D")
                .arg(dir.path().join("data"))
                .args(["-p", &port.to_string(), "-k"])
                .arg(dir.path())
                .args([
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    "wal_level=logical",
                    "-c",
                    "max_replication_slots=8",
                    "-c",
                    "fsync=off",
                ])
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log);
            as_user(&mut cmd);
            let mut child = cmd.spawn().expect("postgres starts");
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if child.try_wait().ok().flatten().is_some() {
                    break; // the port was taken meanwhile: try another
                }
                let ready = Command::new(pg_bin().join("pg_isready"))
                    .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-q"])
                    .status()
                    .is_ok_and(|s| s.success());
                if ready {
                    return PostgresServer {
                        port,
                        dir,
                        child: Some(child),
                    };
                }
                assert!(
                    Instant::now() < deadline,
                    "postgres did not accept connections in 30 s"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        panic!(
            "postgres did not start: {}",
            std::fs::read_to_string(dir.path().join("postgres.log")).unwrap_or_default()
        );
    }

    /// Its maintenance URL (trust auth).
    pub fn admin_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SIGINT: fast shutdown (a SIGKILLed postmaster leaves its
            // backends behind for a while).
            let _ = Command::new("kill")
                .args(["-INT", &c.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
