//! The Docker case: an image imported from a root file system made here (no registry), a
//! static CPython in it and our binary beside it. From the host: `dump` (exact stacks,
//! version, ids) and `attach` (cpu/split.py's hot lines, their split and source) of a
//! container's Python; inside a container started with `--cap-add SYS_PTRACE`: `dump 1`
//! gives the exact stacks; inside one without it: `dump 1` fails with the permission
//! message (exit 5). Containers run with `--network none` (no bridge needed). The same root
//! file system also runs without Docker (tests/containers.rs, `own_root_file_system`).

use super::*;

fn docker(args: &[&str]) -> Result<String, String> {
    let o = Command::new("docker")
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(format!(
            "docker {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// The static interpreter of the matrix, if there is one (a root file system for it is a
/// handful of files: no libpython to carry).
pub fn static_interpreter() -> Option<Interpreter> {
    common::interpreters()
        .into_iter()
        .find(|i| shared_lib(i).is_none() && i.root.is_none())
}

/// Why no Docker engine can run a container here, if none can.
pub fn engine_missing() -> Option<String> {
    match Command::new("docker").arg("info").output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr);
            let first = err.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
            Some(format!(
                "`docker info` fails, no Docker engine answers (tools/docker.sh starts one): {}",
                first.trim()
            ))
        }
        Err(e) => Some(format!(
            "no docker command ({e}); tools/docker.sh installs and starts Docker"
        )),
    }
}

/// Where our binary is in the root file system.
pub const BIN_INSIDE: &str = "/usr/local/bin/scalene-rs";

/// Makes `<d>/rootfs`, a root file system like a container image's: the static
/// interpreter at its own path, its standard library, the shared libraries it and its
/// extension modules need, the fixtures in /app, and our binary (with its libraries) at
/// [`BIN_INSIDE`].
pub fn build_rootfs(interp: &Interpreter, d: &Scratch) -> PathBuf {
    let (maj, min) = interp.version();
    let root = d.path("rootfs");
    // The interpreter, its standard library and the shared libraries it needs.
    // (Extension modules' libraries too: ctypes, which the fixture uses to name its
    // threads, needs libffi.)
    let stdlib = format!("/usr/lib/python{maj}.{min}");
    let mut files = vec![interp.path.to_string_lossy().into_owned()];
    let mut binaries = vec![interp.path.clone(), PathBuf::from(BIN)];
    if let Ok(dir) = std::fs::read_dir(format!("{stdlib}/lib-dynload")) {
        binaries.extend(dir.flatten().map(|e| e.path()));
    }
    for b in &binaries {
        let ldd = Command::new("ldd").arg(b).output().unwrap();
        for l in String::from_utf8_lossy(&ldd.stdout).lines() {
            if let Some(p) = l.split_whitespace().find(|w| w.starts_with('/')) {
                if !files.iter().any(|f| f == p) {
                    files.push(p.to_string());
                }
            }
        }
    }
    for f in &files {
        let dst = root.join(f.trim_start_matches('/'));
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::copy(f, &dst).unwrap();
    }
    let ours = root.join(BIN_INSIDE.trim_start_matches('/'));
    std::fs::create_dir_all(ours.parent().unwrap()).unwrap();
    std::fs::copy(BIN, ours).unwrap();
    std::fs::create_dir_all(root.join("usr/lib")).unwrap();
    let status = Command::new("cp")
        .args(["-a", &stdlib])
        .arg(root.join(format!("usr/lib/python{maj}.{min}")))
        .status()
        .unwrap();
    assert!(status.success());
    let app = root.join("app");
    std::fs::create_dir_all(&app).unwrap();
    for f in [
        "dump_shapes.py",
        "dump_support.py",
        "cpu/split.py",
        "native/spin.py",
    ] {
        let name = Path::new(f).file_name().unwrap();
        std::fs::copy(common::fixture(f), app.join(name)).unwrap();
    }
    root
}

/// An image imported from a root file system; removed when dropped.
struct Image(String);

impl Drop for Image {
    fn drop(&mut self) {
        let _ = docker(&["rmi", "-f", &self.0]);
    }
}

/// A container (detached); removed with what it left when dropped.
struct Container {
    id: String,
}

impl Container {
    fn run(image: &Image, options: &[&str], command: &[&str]) -> Result<Container, String> {
        let mut args = vec![
            "run",
            "-d",
            "--network",
            "none",
            "-e",
            "PYTHONDONTWRITEBYTECODE=1",
        ];
        args.extend_from_slice(options);
        args.push(&image.0);
        args.extend_from_slice(command);
        Ok(Container { id: docker(&args)? })
    }

    /// Its main process's PID in our namespace.
    fn pid(&self) -> Result<i32, String> {
        docker(&["inspect", "-f", "{{.State.Pid}}", &self.id])?
            .parse()
            .map_err(|e| format!("container PID: {e}"))
    }

    fn printed(&self) -> Result<Vec<String>, String> {
        Ok(docker(&["logs", &self.id])?
            .lines()
            .map(String::from)
            .collect())
    }

    /// What it printed before `ready` (waits for it).
    fn wait_ready(&self) -> Result<Vec<String>, String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let printed = self.printed()?;
            if let Some(i) = printed.iter().position(|l| l == "ready") {
                return Ok(printed[..i].to_vec());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the container never printed `ready`; it printed {printed:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs `command` inside it (`docker exec` with `options`): (exit status, stdout,
    /// stderr).
    fn exec(&self, options: &[&str], command: &[&str]) -> (Option<i32>, String, String) {
        let o = Command::new("docker")
            .arg("exec")
            .args(options)
            .arg(&self.id)
            .args(command)
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-f", &self.id]);
    }
}

/// `dump 1 --json` inside container `c` (started with `--cap-add SYS_PTRACE`), whose PID 1
/// is dump_shapes.py and printed `printed`: the exact stacks, the version and executable,
/// and the main thread's id as the container sees it (1).
fn dump_inside(c: &Container, printed: &[String], version: &str, exe: &str) -> Result<(), String> {
    let (code, out, err) = c.exec(&[], &[BIN_INSIDE, "dump", "1", "--json"]);
    if code != Some(0) {
        return Err(format!(
            "`scalene-rs dump 1` inside the container exited {code:?}: {err}"
        ));
    }
    let dump: Value = serde_json::from_str(&out).map_err(|e| format!("{e}: {out}"))?;
    let mut errs = frame_errors(&dump, printed);
    errs.extend(header_errors(&dump, version, exe));
    let main = printed_json(printed, "threads")["main"][0].clone();
    let main_tid = dump["threads"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["thread_id"] == main))
        .map(|t| t["native_id"].clone());
    if main_tid != Some(Value::from(1)) {
        errs.push(format!(
            "main thread's native_id {main_tid:?}, expected 1 (PID 1 of the container)"
        ));
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(format!("dump 1 inside the container: {}", errs.join("\n")))
    }
}

/// `command` (a `dump 1` by our binary, with `exec_options`) inside container `c` must fail
/// with exit 5 and one `error: ` line that contains every one of `wanted`.
fn denied_inside(c: &Container, exec_options: &[&str], wanted: &[&str]) -> Result<String, String> {
    let command = [BIN_INSIDE, "dump", "1"];
    let (code, out, err) = c.exec(exec_options, &command);
    let lines: Vec<&str> = err.lines().collect();
    let line = lines.first().copied().unwrap_or("");
    if code != Some(5)
        || lines.len() != 1
        || !out.is_empty()
        || !line.starts_with("error: ")
        || !wanted.iter().all(|w| line.contains(w))
    {
        return Err(format!(
            "docker exec {exec_options:?} {command:?}: exit {code:?} (5 expected), stdout {:?}, stderr \
             {err:?} (one `error: ` line with {wanted:?} expected)",
            out.chars().take(300).collect::<String>()
        ));
    }
    Ok(line.to_string())
}

/// A seccomp profile that refuses ptrace and process_vm_readv/writev with EPERM and allows
/// the rest: what Docker's default profile did for a container without SYS_PTRACE before
/// 20.10 (and still does on kernels before 4.8); Docker 20.10+ on a newer kernel allows both
/// to any container, whose root then reads its own processes without the capability.
fn ptrace_gated_profile(d: &Scratch) -> String {
    let path = d.s("seccomp-no-ptrace.json");
    let profile = serde_json::json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "syscalls": [{
            "names": ["ptrace", "process_vm_readv", "process_vm_writev"],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": libc::EPERM,
        }],
    });
    std::fs::write(&path, profile.to_string()).unwrap();
    path
}

/// `attach` from the host to cpu/split.py in container `c` from shortly after its start
/// until it exits; its profile must charge the hot lines as the fixture measured them.
fn attach_from_host(c: &Container, d: &Scratch) -> Result<String, String> {
    let pid = c.pid()?;
    // Past start-up and calibration (a few tens of ms of CPU).
    std::thread::sleep(Duration::from_millis(1000));
    let out = d.s("attach.json");
    let (code, _, err) = run_bin(&["attach", &pid.to_string(), "-o", &out]);
    if code != Some(0) {
        return Err(format!("attach {pid} exited {code:?}: {err}"));
    }
    let status = docker(&["wait", &c.id])?;
    let printed = c.printed()?;
    if status != "0" {
        return Err(format!("split.py exited {status}; it printed {printed:?}"));
    }
    let truth = printed
        .iter()
        .find(|l| l.starts_with("truth "))
        .ok_or_else(|| format!("split.py printed no truth line: {printed:?}"))?;
    let (lp, ln, quoted) = split_marks();
    check_split_profile(&out, "/app/split.py", truth, (lp, ln), &quoted)
}

/// `dump --native --json` of spin.py in container `c`, from the host and from inside: its
/// frames named from the container's files (native::check_native_spin).
fn native_in_container(c: &Container, interp: &Interpreter, ext: &str) -> Result<String, String> {
    c.wait_ready()?;
    let pid = c.pid()?.to_string();
    let truth = native::SpinTruth {
        ext,
        real: &interp.path,
        decoy: None,
        script: "/app/spin.py",
    };
    let parse = |(code, out, err): (Option<i32>, String, String)| -> Result<Value, String> {
        if code != Some(0) {
            return Err(format!("dump --native exited {code:?}: {err}"));
        }
        serde_json::from_str(&out).map_err(|e| format!("{e}: {out}"))
    };
    let host = native::check_native_spin(
        &|| parse(run_bin(&["dump", "--native", "--json", &pid])),
        &truth,
    )?;
    let inside = native::check_native_spin(
        &|| parse(c.exec(&[], &[BIN_INSIDE, "dump", "--native", "--json", "1"])),
        &truth,
    )
    .map_err(|e| format!("inside: {e}"))?;
    Ok(format!("from the host: {host}; inside: {inside}"))
}

pub fn dump_in_container() {
    let Some(interp) = static_interpreter() else {
        return common::skip_or_fail("docker", "no static CPython build to put in an image");
    };
    let started = Instant::now();
    let d = Scratch::new("docker");
    let root = build_rootfs(&interp, &d);
    // The C extension of `dump --native`'s case, in /app/ext (a path we do not have).
    let (built, ext) = common::spinext::build_ext(&interp, false).unwrap();
    std::fs::create_dir_all(root.join("app/ext")).unwrap();
    std::fs::copy(built.join(&ext), root.join("app/ext").join(&ext)).unwrap();
    let _ = std::fs::remove_dir_all(&built);
    let tar = d.s("rootfs.tar");
    assert!(Command::new("tar")
        .args(["-C", &root.to_string_lossy(), "-cf", &tar, "."])
        .status()
        .unwrap()
        .success());
    let image = Image(format!("scalene-rs-test-py:{}", std::process::id()));
    docker(&["import", &tar, &image.0]).unwrap();
    let imported = started.elapsed();
    let exe = interp.path.to_string_lossy().into_owned();
    let version = full_version(&interp);
    let mut failures = Vec::new();
    let mut notes = Vec::new();

    // Containers of dump_shapes.py: with CAP_SYS_PTRACE; without it, under a profile that
    // refuses ptrace to a container without it (see ptrace_gated_profile); without it,
    // under the engine's own default profile.
    let shapes = [&exe[..], "/app/dump_shapes.py"];
    let with_cap = Container::run(&image, &["--cap-add", "SYS_PTRACE"], &shapes);
    let seccomp = format!("seccomp={}", ptrace_gated_profile(&d));
    let gated = Container::run(&image, &["--security-opt", &seccomp], &shapes);
    let engine_default = Container::run(&image, &[], &shapes);
    match with_cap.and_then(|c| {
        let printed = c.wait_ready()?;
        // From the host: the same checks as for the namespaces made by hand.
        check_dumps(c.pid()?, &printed, &version, &exe)?;
        dump_inside(&c, &printed, &version, &exe)?;
        // Another user in the container (no capabilities) is refused by the kernel itself.
        denied_inside(
            &c,
            &["--user", "65534"],
            &["CAP_SYS_PTRACE", "uid 0", "uid 65534"],
        )
    }) {
        Ok(line) => notes.push(format!(
            "with SYS_PTRACE: dump from the host and dump 1 inside exact; as uid 65534 \
             inside: {line}"
        )),
        Err(e) => failures.push(format!("with SYS_PTRACE: {e}")),
    }
    match gated.and_then(|c| {
        c.wait_ready()?;
        let wanted = [
            "without CAP_SYS_PTRACE",
            "--cap-add SYS_PTRACE",
            "from the host",
        ];
        let line = denied_inside(&c, &[], &wanted)?;
        if line.contains("sudo") {
            return Err(format!("we are root already; `sudo` is no fix: {line:?}"));
        }
        Ok(line)
    }) {
        Ok(line) => notes.push(format!("without SYS_PTRACE, ptrace refused: {line}")),
        Err(e) => failures.push(format!("without SYS_PTRACE, ptrace refused: {e}")),
    }
    // The engine's own profile decides (see ptrace_gated_profile): either the stacks are
    // exact or the refusal is the one above; anything else (another message, a wrong
    // stack, a panic) fails.
    match engine_default.and_then(|c| {
        let printed = c.wait_ready()?;
        match dump_inside(&c, &printed, &version, &exe) {
            Ok(()) => Ok("the engine allows it: dump 1 exact".to_string()),
            Err(dump_err) => {
                denied_inside(&c, &[], &["without CAP_SYS_PTRACE", "--cap-add SYS_PTRACE"])
                    .map_err(|e| format!("{dump_err}\nand not the refusal either: {e}"))
            }
        }
    }) {
        Ok(what) => notes.push(format!("without SYS_PTRACE, engine's profile: {what}")),
        Err(e) => failures.push(format!("without SYS_PTRACE, engine's profile: {e}")),
    }
    // `dump --native` of spin.py, from the host and inside (where, without CAP_SYS_ADMIN,
    // the files are opened through /proc/1/root, not map_files).
    let spin = Container::run(
        &image,
        &["--cap-add", "SYS_PTRACE"],
        &[&exe[..], "/app/spin.py", "/app/ext"],
    );
    match spin.and_then(|c| native_in_container(&c, &interp, &ext)) {
        Ok(summary) => notes.push(format!("dump --native: {summary}")),
        Err(e) => failures.push(format!("dump --native: {e}")),
    }
    // cpu/split.py, attached to from the host.
    let split = Container::run(&image, &[], &[&exe[..], "/app/split.py", RUN_SECONDS]);
    match split.and_then(|c| attach_from_host(&c, &d)) {
        Ok(summary) => notes.push(format!("attach from the host: {summary}")),
        Err(e) => failures.push(format!("attach from the host: {e}")),
    }
    drop(image);
    common::say(&format!(
        "docker: image imported in {:.1} s, all done in {:.1} s\n  {}",
        imported.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        notes.join("\n  ")
    ));
    assert!(failures.is_empty(), "docker: {}", failures.join("\n"));
}
