//! Making mount and PID namespaces for a test target, and the target itself: a fixture
//! that is PID 1 of them (see tests/containers.rs).

use super::*;

/// Why namespaces cannot be made here, if they cannot.
pub fn cannot_make_namespaces() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("not running as root (unshare --mount --pid needs CAP_SYS_ADMIN)".into());
    }
    match Command::new("unshare")
        .args(["--mount", "--pid", "--fork", "true"])
        .stderr(Stdio::piped())
        .output()
    {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "`unshare --mount --pid --fork true` failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Some(format!("cannot run unshare: {e}")),
    }
}

macro_rules! require_namespaces {
    ($test:expr) => {
        if let Some(why) = cannot_make_namespaces() {
            return common::skip_or_fail($test, &why);
        }
    };
}

/// A scratch directory of ours, removed when dropped (after the namespace is gone).
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("scalene-rs-ns-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
    pub fn path(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }
    pub fn s(&self, rel: &str) -> String {
        self.path(rel).to_string_lossy().into_owned()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fixture running as PID 1 of new mount and PID namespaces.
pub struct NsTarget {
    pub unshare: Child,
    /// Its PID in our namespace.
    pub pid: i32,
    pub lines: Receiver<String>,
    pub stderr: Option<JoinHandle<String>>,
    /// What the fixture printed before `ready`.
    pub printed: Vec<String>,
}

impl NsTarget {
    /// Runs `script` with `sh -e` inside the namespaces; waits for `ready` when `wait`.
    pub fn start(script: &str, wait: bool) -> Result<NsTarget, String> {
        let mut unshare = Command::new("unshare")
            .args([
                "--mount",
                "--pid",
                "--fork",
                "--kill-child",
                "--propagation",
                "private",
                "sh",
                "-ec",
                script,
            ])
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("LC_ALL", "C.UTF-8")
            .env_remove("PYTHONPATH")
            .env_remove("PYTHONHOME")
            .env_remove("LD_LIBRARY_PATH")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start unshare: {e}"))?;
        let stdout = unshare.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = unshare.stderr.take().map(|mut e| {
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = e.read_to_string(&mut s);
                s
            })
        });
        let mut t = NsTarget {
            pid: 0,
            unshare,
            lines: rx,
            stderr,
            printed: Vec::new(),
        };
        // unshare's one child is PID 1 of the new namespace.
        let uid = t.unshare.id();
        let deadline = Instant::now() + READY_TIMEOUT;
        while t.pid == 0 {
            let children = std::fs::read_to_string(format!("/proc/{uid}/task/{uid}/children"))
                .unwrap_or_default();
            if let Some(p) = children.split_whitespace().next() {
                t.pid = p.parse().unwrap();
            } else if Instant::now() > deadline || t.unshare.try_wait().ok().flatten().is_some() {
                return Err(t.failure("no PID 1 appeared in the namespace"));
            } else {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        if wait {
            t.wait_for("ready")?;
        }
        Ok(t)
    }

    pub fn wait_for(&mut self, want: &str) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) if line == want => return Ok(()),
                Ok(line) => self.printed.push(line),
                Err(_) => return Err(self.failure(&format!("no `{want}` line"))),
            }
        }
    }

    /// The JSON after `prefix ` in what the fixture printed.
    pub fn printed_json(&self, prefix: &str) -> Value {
        printed_json(&self.printed, prefix)
    }

    pub fn failure(&mut self, what: &str) -> String {
        self.kill();
        let err = self.stderr.take().map(|h| h.join().unwrap_or_default());
        format!(
            "namespaced fixture: {what}; stdout {:?}; stderr:\n{}",
            self.printed,
            err.unwrap_or_default()
        )
    }

    pub fn kill(&mut self) {
        if self.pid > 0 {
            // PID 1 of its namespace ignores SIGTERM; SIGKILL ends it and the namespace.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
    }
}

impl Drop for NsTarget {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The JSON after `prefix ` in lines a fixture printed (the dump_support protocol).
pub fn printed_json(printed: &[String], prefix: &str) -> Value {
    let line = printed
        .iter()
        .find_map(|l| l.strip_prefix(prefix)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("the fixture printed no `{prefix}` line"));
    serde_json::from_str(line).unwrap()
}

pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}
