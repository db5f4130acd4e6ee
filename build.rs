//! Builds the preload library (`preload/`) so the profiler can embed it: a separate cargo
//! invocation with its own target directory, always optimised and with panic = "abort"
//! (a panic must never unwind through the program's malloc). The path of the built file
//! reaches the code as `SCALENE_RS_PRELOAD_SO`.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo"));
    let target_dir = out.join("preload-target");
    for p in ["preload/src", "preload/Cargo.toml"] {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args(["build", "--release", "--locked", "-p", "scalene-preload"])
        .arg("--target-dir")
        .arg(&target_dir)
        .args(["--config", "profile.release.panic=\"abort\""])
        .args(["--config", "profile.release.debug=0"]);
    // What the outer cargo set for our own compilation must not leak into this one
    // (clippy's wrapper, coverage flags, the outer target directory). The linker settings
    // do pass through, on purpose: under `maturin build --zig` (tools/wheel.sh) the
    // environment's CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER is zig's, for glibc 2.17, and
    // it applies to this host build too, so the embedded library is as portable as the
    // executable (tools/wheel.sh checks both files' GLIBC_ symbol versions).
    for var in [
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_WRAPPER",
        "CLIPPY_ARGS",
        "CARGO_TARGET_DIR",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "CARGO_BUILD_TARGET_DIR",
        "CARGO_PRIMARY_PACKAGE",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd
        .status()
        .expect("running cargo to build the preload library");
    assert!(status.success(), "building the preload library failed");
    let so = target_dir.join("release").join("libscalene_preload.so");
    assert!(so.is_file(), "{} was not built", so.display());
    println!("cargo:rustc-env=SCALENE_RS_PRELOAD_SO={}", so.display());
}
