//! A real `redis-server` for tests (feature `test-server`): started on a free loopback
//! port with its own temporary directory, killed when dropped. It can be killed and
//! started again on the same port and directory, to test what happens while Redis is
//! down and after it returns. Persistence is an append-only file written on every
//! command, so what was acknowledged before a kill is there after the restart. A
//! replica of another one ([`RedisServer::start_replica_of`]) tests replication.

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a started server may take to accept connections (a loaded machine is slow).
const READY: Duration = Duration::from_secs(30);

/// A running `redis-server`.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    /// Arguments besides the common ones (`--replicaof`).
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts one. Panics if `redis-server` is not installed (`scripts/install-test-deps.sh`
    /// installs it) or does not come up.
    pub fn start() -> Self {
        Self::start_with(Vec::new())
    }

    /// Starts a replica of `primary` (it answers at once; [`RedisServer::wait_in_sync`]
    /// waits until it has the primary's data).
    pub fn start_replica_of(primary: &RedisServer) -> Self {
        Self::start_with(vec![
            "--replicaof".to_owned(),
            "127.0.0.1".to_owned(),
            primary.port.to_string(),
        ])
    }

    /// Waits (at most 30 s) until this replica's link to its primary is up.
    pub fn wait_in_sync(&self) {
        let deadline = Instant::now() + READY;
        while !command(self.port, "INFO replication").contains("master_link_status:up") {
            assert!(Instant::now() < deadline, "the replica did not sync");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn start_with(extra: Vec<String>) -> Self {
        let mut dir = tempfile::tempdir().expect("temporary directory for redis-server");
        for _ in 0..5 {
            let port = free_port();
            let mut server = Self {
                child: None,
                port,
                dir,
                extra: extra.clone(),
            };
            if server.spawn() {
                return server;
            }
            // Another test took the port between our probe and the server's bind.
            dir = server.take_dir();
        }
        panic!("redis-server did not start on a free port");
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Runs one command (every argument a plain string) on a connection of its own,
    /// as `redis-cli` would. A status, error or integer reply comes back as its line
    /// (`+OK\r\n`, `:1\r\n`, ...); a bulk string (`CLIENT LIST`, `GET`) as its content
    /// whole, which can span lines.
    pub fn command(&self, args: &[&str]) -> String {
        use std::io::{BufRead, BufReader, Read, Write};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.port))
            .expect("connect to the test redis-server");
        let mut request = format!("*{}\r\n", args.len());
        for a in args {
            request.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        stream
            .write_all(request.as_bytes())
            .expect("write to the test redis-server");
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        reader
            .read_line(&mut line)
            .expect("read from the test redis-server");
        let Some(len) = line
            .strip_prefix('$')
            .and_then(|n| n.trim_end().parse::<usize>().ok())
        else {
            return line;
        };
        let mut body = vec![0u8; len + 2];
        reader
            .read_exact(&mut body)
            .expect("read a bulk reply from the test redis-server");
        body.truncate(len);
        String::from_utf8_lossy(&body).into_owned()
    }

    /// Kills it (SIGKILL) and waits until it is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and directory (after [`RedisServer::kill`]).
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + READY;
        while !self.spawn() {
            assert!(Instant::now() < deadline, "redis-server did not restart");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn take_dir(self) -> tempfile::TempDir {
        let mut this = self;
        this.kill();
        std::mem::replace(
            &mut this.dir,
            tempfile::tempdir().expect("temporary directory"),
        )
    }

    /// Starts the process and waits until it answers; `false` if it exited first, or
    /// if the server answering on the port is another one (another test's, which
    /// took the port between our probe and our server's bind: ours then fails to bind
    /// but may still be starting when that one answers, and two tests sharing one
    /// Redis see each other's keys).
    fn spawn(&mut self) -> bool {
        let child = Command::new("redis-server")
            .args(args(self.port, self.dir.path()))
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot run redis-server: run scripts/install-test-deps.sh");
        let child = self.child.insert(child);
        let pid = format!("process_id:{}\r\n", child.id());
        let deadline = Instant::now() + READY;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                self.child = None;
                return false;
            }
            if ping(self.port) {
                if command(self.port, "INFO server").contains(&pid) {
                    return true;
                }
                self.kill();
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn args(port: u16, dir: &Path) -> Vec<String> {
    [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--dir",
        &dir.display().to_string(),
        "--save",
        "",
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--daemonize",
        "no",
        "--logfile",
        "",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local address").port()
}

/// Whether a server on `port` answers `PING`.
fn ping(port: u16) -> bool {
    command(port, "PING") == "+PONG\r\n"
}

/// An inline command's reply (what one read returns; empty if it failed).
fn command(port: u16, inline: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    let mut reply = vec![0u8; 16 << 10];
    if stream
        .write_all(format!("{inline}\r\n").as_bytes())
        .is_err()
    {
        return String::new();
    }
    let n = stream.read(&mut reply).unwrap_or(0);
    String::from_utf8_lossy(&reply[..n]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::RedisServer;

    /// Two tests that probed the same free port: the second one's server does not
    /// take the first one's for its own.
    #[test]
    fn a_port_another_server_answers_on_is_not_taken_for_ours() {
        let first = RedisServer::start();
        let mut second = RedisServer {
            child: None,
            port: first.port(),
            dir: tempfile::tempdir().unwrap(),
            extra: Vec::new(),
        };
        assert!(
            !second.spawn(),
            "the first test's server passed for the second's"
        );
        assert!(RedisServer::start().port() != first.port());
    }
}
