//! The Docker case: an image imported from a root file system made here (no registry), a
//! static CPython in it, dumped from outside. The same root file system also runs without
//! Docker (tests/containers.rs, `own_root_file_system`).

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

/// Makes `<d>/rootfs`, a root file system like a container image's: the static
/// interpreter at its own path, its standard library, the shared libraries it and its
/// extension modules need, and the dump fixtures in /app.
pub fn build_rootfs(interp: &Interpreter, d: &Scratch) -> PathBuf {
    let (maj, min) = interp.version();
    let root = d.path("rootfs");
    // The interpreter, its standard library and the shared libraries it needs.
    // (Extension modules' libraries too: ctypes, which the fixture uses to name its
    // threads, needs libffi.)
    let stdlib = format!("/usr/lib/python{maj}.{min}");
    let mut files = vec![interp.path.to_string_lossy().into_owned()];
    let mut binaries = vec![interp.path.clone()];
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
    std::fs::create_dir_all(root.join("usr/lib")).unwrap();
    let status = Command::new("cp")
        .args(["-a", &stdlib])
        .arg(root.join(format!("usr/lib/python{maj}.{min}")))
        .status()
        .unwrap();
    assert!(status.success());
    let app = root.join("app");
    std::fs::create_dir_all(&app).unwrap();
    for f in ["dump_shapes.py", "dump_support.py"] {
        std::fs::copy(common::fixture(f), app.join(f)).unwrap();
    }
    root
}

pub fn dump_in_container() {
    let Some(interp) = static_interpreter() else {
        println!("docker: SKIPPED: no static CPython build to put in an image");
        return;
    };
    let d = Scratch::new("docker");
    let root = build_rootfs(&interp, &d);
    let tag = format!("scalene-rs-test-py:{}", std::process::id());
    let tar = d.s("rootfs.tar");
    assert!(Command::new("tar")
        .args(["-C", &root.to_string_lossy(), "-cf", &tar, "."])
        .status()
        .unwrap()
        .success());
    docker(&["import", &tar, &tag]).unwrap();
    let exe = interp.path.to_string_lossy().into_owned();
    let id = docker(&[
        "run",
        "-d",
        "--rm",
        "-e",
        "PYTHONDONTWRITEBYTECODE=1",
        &tag,
        &exe,
        "/app/dump_shapes.py",
    ]);
    let result = id.clone().and_then(|id| {
        let deadline = Instant::now() + READY_TIMEOUT;
        while !docker(&["logs", &id])?.lines().any(|l| l == "ready") {
            if Instant::now() > deadline {
                return Err("the container never printed `ready`".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let pid: i32 = docker(&["inspect", "-f", "{{.State.Pid}}", &id])?
            .parse()
            .map_err(|e| format!("container PID: {e}"))?;
        // The same checks as for the namespaces made by hand: exact stacks, version, ids.
        let printed: Vec<String> = docker(&["logs", &id])?.lines().map(String::from).collect();
        check_dumps(pid, &printed, &full_version(&interp), &exe)?;
        Ok(())
    });
    if let Ok(id) = &id {
        let _ = docker(&["kill", id]);
    }
    let _ = docker(&["rmi", "-f", &tag]);
    result.unwrap();
}
