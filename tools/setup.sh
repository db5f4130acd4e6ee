#!/usr/bin/env bash
# Installs and makes everything the test suite needs, so that `cargo nextest run` runs every test
# (the README's test command is `tools/setup.sh && cargo nextest run`; .ci/run calls it too).
# Needs root (apt-get, debootstrap, mount namespaces, a user of its own). Cached under
# ~/.cache/scalene-rs: a second run costs seconds to a minute. What it learns for the tests
# (which interpreters it equipped with numpy and gevent, how many interpreters the matrix must have)
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
# (binutils: strip, objcopy, nm, readelf; xz-utils: xz, for MiniDebugInfo). tests/dump_core.rs
# takes cores with gdb's gcore and compresses them as systemd does (zstd, lz4, gzip, xz).
for tool in strip:binutils objcopy:binutils nm:binutils readelf:binutils xz:xz-utils \
    gcore:gdb zstd:zstd lz4:lz4 gzip:gzip; do
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

echo "== gevent (tests/greenlets.rs: dump shows every greenlet's stack)"
# Every interpreter that can get a gevent wheel has gevent, pinned per Python version (the
# newest gevent, and the greenlet it takes, with a wheel for that version; --only-binary:
# never a source build), and the test is told which (SCALENE_RS_GEVENT_PYTHONS): it fails
# for one of them without gevent. Debian's python3-gevent (22.10.2, greenlet 2.0.2) serves
# /usr/bin/python3.11 (its pip is the system's: PEP 668). Debian unstable's chrooted
# 3.13-3.15 get the wheels through this machine's pip (`--target` in the root: the root has
# no pip of its own). Not equipped, said here and by the test: the free-threaded 3.13t
# (PyPI has no gevent wheel for it; its greenlets would not be read: no collector lists).
gevent_labels=()
gevent_pins() { # X.Y -> the pinned requirements
    case "$1" in
        2.7|3.6) echo "gevent==22.10.2 greenlet==2.0.2" ;;
        3.7) echo "gevent==22.10.2 greenlet==3.1.1" ;;
        3.8) echo "gevent==24.2.1 greenlet==3.1.1" ;;
        3.9) echo "gevent==25.9.1 greenlet==3.2.5" ;;
        *) echo "gevent==26.9.0 greenlet==3.5.6" ;;
    esac
}
gevent_pip() { # label python
    local v pins
    v=$("$2" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    pins=$(gevent_pins "$v")
    if ! "$2" -c 'import gevent' 2>/dev/null; then
        "$2" -m pip --version >/dev/null 2>&1 || "$2" -m ensurepip -q >/dev/null 2>&1 \
            || { echo "$1: no pip to install gevent with ($2)" >&2; exit 1; }
        # shellcheck disable=SC2086 # the pins are words
        "$2" -m pip install -q --only-binary=:all: $pins \
            || { "$2" -m pip install -q --upgrade "pip<22" && "$2" -m pip install -q --only-binary=:all: $pins; } \
            || { echo "$1: pip could not install gevent's wheels ($pins, $2)" >&2; exit 1; }
        "$2" -c 'import gevent' || { echo "$1: gevent installed but does not import ($2)" >&2; exit 1; }
    fi
    echo "$1: gevent $("$2" -c 'import gevent, greenlet; print("%s greenlet %s" % (gevent.__version__, greenlet.__version__))')"
    gevent_labels+=("$1")
}
for py in "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/*/bin/python?.*[0-9]; do
    [ -x "$py" ] || continue
    gevent_pip "pyenv-$(basename "$(dirname "$(dirname "$py")")")" "$py"
done
if [ -x /usr/bin/python3.11 ]; then
    if ! /usr/bin/python3.11 -c 'import gevent' 2>/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-gevent
        /usr/bin/python3.11 -c 'import gevent' || { echo "python3-gevent did not install" >&2; exit 1; }
    fi
    gevent_labels+=(system-3.11)
fi
while IFS=$'\t' read -r label path root; do
    case "$label" in debian-3.1[345]*) ;; *) continue ;; esac
    v=${label#debian-}; v=${v%-shared}
    if ! "$path" -c 'import gevent' 2>/dev/null; then
        # shellcheck disable=SC2046 # the pins are words
        python3 -m pip install -q --root-user-action=ignore --no-warn-script-location \
            --target "$root/usr/local/lib/python$v/dist-packages" --only-binary=:all: \
            --python-version "$v" --implementation cp --abi "cp${v/./}" \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
            --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
            $(gevent_pins "$v") \
            || { echo "$label: pip could not put gevent's wheels in its root" >&2; exit 1; }
        "$path" -c 'import gevent' || { echo "$label: gevent does not import in its root" >&2; exit 1; }
    fi
    gevent_labels+=("$label")
done < <(tools/pythons.sh --list)
gevent_pythons=$(IFS=,; echo "${gevent_labels[*]}")
echo "gevent equipped: $gevent_pythons"

echo "== PyInstaller one-file app (tests/frozen.rs: a bootloader that starts Python as its child)"
time tools/frozen.sh

echo "== uWSGI (tests/uwsgi.rs: Python embedded, workers forked without PyOS_AfterFork_Child)"
if ! uwsgi --plugin python3 --version >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq uwsgi-core uwsgi-plugin-python3
fi
echo "uwsgi $(uwsgi --plugin python3 --version)"

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
SCALENE_RS_GEVENT_PYTHONS=$gevent_pythons
EOF_ENV
mv "$CACHE/setup.env.new" "$CACHE/setup.env"
cat "$CACHE/setup.env"
