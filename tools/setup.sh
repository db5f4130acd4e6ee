#!/usr/bin/env bash
# Installs and makes everything the test suite needs, so that `cargo nextest run` runs every test
# (the README's test command is `tools/setup.sh && cargo nextest run`; .ci/run calls it too).
# Needs root (apt-get, debootstrap, mount namespaces, a user of its own). Cached under
# ~/.cache/scalene-rs: a second run costs seconds to a minute. What it learns for the tests
# (which interpreters it equipped with numpy, how many interpreters the matrix must have)
# goes to ~/.cache/scalene-rs/setup.env, which tests/common reads when the variables of the
# same names are not set.
#
#   tools/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "tools/setup.sh: needs root (apt-get, debootstrap, namespaces)" >&2; exit 1; }
CACHE="${SCALENE_RS_CACHE:-$HOME/.cache/scalene-rs}"
mkdir -p "$CACHE"
# The interpreters the matrix must have: pyenv's 2.7 and 3.6-3.13, Debian's static
# /usr/bin/python3.11, and tools/pythons.sh's. Raised with every interpreter added.
EXPECTED_PYTHONS=16

echo "== toolchain"
if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo is missing: this machine kind ships Rust; nothing else can fetch it" >&2
    exit 1
fi
for comp in rustfmt clippy; do
    if ! cargo "${comp/rustfmt/fmt}" --version >/dev/null 2>&1; then
        rustup component add "$comp"
    fi
done
# The suite runs under cargo-nextest (.config/nextest.toml). The machine kind ships it; where
# it is missing it is built from crates.io (a few minutes, once).
if ! cargo nextest --version >/dev/null 2>&1; then
    cargo install --locked cargo-nextest
fi
if ! command -v cc >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq gcc
fi
# tests/native.rs and tests/native_debuginfo.rs strip and re-pack the extension they build
# (binutils: strip, objcopy, nm, readelf; xz-utils: xz, for MiniDebugInfo).
for tool in strip:binutils objcopy:binutils nm:binutils readelf:binutils xz:xz-utils; do
    if ! command -v "${tool%%:*}" >/dev/null 2>&1; then
        apt-get update -qq && apt-get install -y -qq "${tool#*:}"
    fi
done
cargo --version
cargo nextest --version | head -1
cc --version | head -1

echo "== interpreters"
# Every interpreter of the matrix must be present: the test matrix must never shrink silently.
# 2.7, 3.6-3.13 from pyenv and Debian's static /usr/bin/python3.11 = 10; tools/pythons.sh
# adds Debian unstable's own 3.13, 3.14, 3.15 (chrooted), shared-libpython 3.14 and 3.15,
# and the free-threaded 3.13t = 16 (cached under ~/.cache/scalene-rs: seconds when warm).
time tools/pythons.sh
ls "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")/versions" || true
ls -l /usr/bin/python3.* 2>/dev/null | grep -v config || true

echo "== wheel (tests/wheel.rs pip installs it into fresh venvs: manylinux2014, glibc 2.17)"
# maturin and zig are cached in ~/.cache/scalene-rs/maturin-venv, cargo's build in target/.
time tools/wheel.sh

echo "== Debian 11 bullseye root (tests/wheel.rs installs the wheel with its python3 3.9)"
time tools/bullseye.sh

echo "== docker (tests/containers.rs runs Python in a container: an engine must answer)"
time tools/docker.sh

echo "== browser (tests/html.rs checks the HTML report in headless Chromium)"
time tools/browser.sh

echo "== unprivileged user (tests/dump_errors.rs's permission tests run the profiler as it)"
tools/test_user.sh

echo "== numpy (tests/memory_accuracy.rs's native-allocation fixture)"
# Every interpreter that can get a numpy wheel must have numpy, and the test is told which
# (SCALENE_RS_NUMPY_PYTHONS, labels as tests/common names them): it fails for one of them
# without numpy, and when it ran on none. pip takes the newest numpy that has a wheel for
# the interpreter (--only-binary: never a source build); Debian's python3-numpy serves
# /usr/bin/python3.11. Debian unstable's chrooted 3.13-3.15 are not equipped (their root
# is debootstrap's minimal one plus the interpreters): the test says so for each.
numpy_labels=()
numpy_pip() { # label python
    if ! "$2" -c 'import numpy' 2>/dev/null; then
        "$2" -m pip --version >/dev/null 2>&1 || "$2" -m ensurepip -q >/dev/null 2>&1 \
            || { echo "$1: no pip to install numpy with ($2)" >&2; exit 1; }
        # An old pip may not know the wheel tags numpy publishes for its Python: a pip
        # new enough for them (the newest that supports that Python) is installed first.
        "$2" -m pip install -q --only-binary=:all: numpy \
            || { "$2" -m pip install -q --upgrade pip \
                 && "$2" -m pip install -q --only-binary=:all: numpy; } \
            || { echo "$1: pip could not install a numpy wheel ($2)" >&2; exit 1; }
        "$2" -c 'import numpy' || { echo "$1: numpy installed but does not import ($2)" >&2; exit 1; }
    fi
    echo "$1: numpy $("$2" -c 'import numpy; print(numpy.__version__)')"
    numpy_labels+=("$1")
}
for py in "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/*/bin/python?.*[0-9]; do
    [ -x "$py" ] || continue
    numpy_pip "pyenv-$(basename "$(dirname "$(dirname "$py")")")" "$py"
done
# tools/pythons.sh's interpreters that run on this root (not chrooted): the free-threaded builds.
while IFS=$'\t' read -r label path root; do
    [ "$root" = / ] && numpy_pip "$label" "$path"
done < <(tools/pythons.sh --list)
if [ -x /usr/bin/python3.11 ]; then
    if ! /usr/bin/python3.11 -c 'import numpy' 2>/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-numpy
        /usr/bin/python3.11 -c 'import numpy' || { echo "python3-numpy did not install" >&2; exit 1; }
    fi
    numpy_labels+=(system-3.11)
fi
numpy_pythons=$(IFS=,; echo "${numpy_labels[*]}")
echo "numpy equipped: $numpy_pythons"

echo "== go (tests/pprof.rs reads the pprof output back with Go's own reader, go tool pprof)"
if ! command -v go >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go
fi
go version

echo "== OTLP receiver (tests/push_otlp.rs decodes pushed windows with PyPI's generated code)"
# opentelemetry-proto 1.45.2 is generated from opentelemetry-proto v1.10.0, the revision the
# opentelemetry-proto crate (Cargo.toml) sends; grpcio serves the gRPC side. Pinned: bump
# together with the crate, after checking both are generated from one tag.
OTLP_VENV="$CACHE/otlp-venv"
OTLP_PKGS=(opentelemetry-proto==1.45.2 protobuf==7.36.2 grpcio==1.85.3)
if ! "$OTLP_VENV/bin/python" -c 'import grpc, opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2_grpc' 2>/dev/null \
   || [ "$("$OTLP_VENV/bin/pip" freeze 2>/dev/null | grep -ciE '^(opentelemetry-proto==1.45.2|protobuf==7.36.2|grpcio==1.85.3)$')" != 3 ]; then
    rm -rf "$OTLP_VENV"
    /usr/bin/python3 -m venv "$OTLP_VENV"
    "$OTLP_VENV/bin/pip" install -q --only-binary=:all: "${OTLP_PKGS[@]}"
fi
"$OTLP_VENV/bin/pip" freeze | grep -iE '^(opentelemetry-proto|protobuf|grpcio)=='

echo "== the tests' settings ($CACHE/setup.env)"
cat >"$CACHE/setup.env.new" <<EOF_ENV
# Written by tools/setup.sh $(date -u +%Y-%m-%dT%H:%M:%SZ); read by tests/common when unset.
SCALENE_RS_MIN_PYTHONS=$EXPECTED_PYTHONS
SCALENE_RS_NUMPY_PYTHONS=$numpy_pythons
EOF_ENV
mv "$CACHE/setup.env.new" "$CACHE/setup.env"
cat "$CACHE/setup.env"
