#!/usr/bin/env bash
# Builds the binary wheel (`pip install target/wheels/scalene_rs-*.whl` puts the scalene-rs
# command on the environment's PATH) for manylinux2014: both the profiler and the preload
# library embedded in it need at most glibc 2.17. maturin links with zig (the ziglang
# package), which links against glibc 2.17's symbols; build.rs's inner cargo build of the
# preload library inherits maturin's linker settings from the environment, and this script
# checks that it did. Called by .ci/run; usable by hand. Leaves exactly one wheel in
# target/wheels/ and prints its name.
#
# Cached: the build tools in $CACHE/maturin-venv (default ~/.cache/scalene-rs), cargo's
# build in target/ (maturin's own target/x86_64-unknown-linux-gnu/, apart from cargo
# build's target/release/). Checks after the build:
#  - maturin's own auditwheel check (--compatibility manylinux2014 fails the build when a
#    library or a symbol version is newer than the policy allows);
#  - auditwheel show on the wheel;
#  - the GLIBC_ symbol versions both ELF files need (readelf), the highest ≤ 2.17. The
#    preload library checked is the file of the build that is byte for byte inside the
#    wheel's executable (the one embedded).
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${SCALENE_RS_CACHE:-$HOME/.cache/scalene-rs}"
VENV="$CACHE/maturin-venv"
# The versions this was made and checked with; bump deliberately.
TOOLS=(maturin==1.16.0 ziglang==0.17.1 auditwheel==6.8.2)
MAX_GLIBC=2.17
OUT=target/wheels

log() { printf '[wheel] %s\n' "$*" >&2; }
die() { printf 'tools/wheel.sh: %s\n' "$*" >&2; exit 1; }

t0=$(date +%s)
command -v readelf >/dev/null || die "readelf is missing (apt-get install binutils)"
want="${TOOLS[*]}"
if [ ! -x "$VENV/bin/maturin" ] || [ "$(cat "$VENV/.scalene-rs-tools" 2>/dev/null)" != "$want" ]; then
    py=""
    for c in python3.11 python3.12 python3.13 python3; do
        if command -v "$c" >/dev/null && "$c" -c 'import venv, ensurepip' 2>/dev/null; then py=$(command -v "$c"); break; fi
    done
    [ -n "$py" ] || die "no python3 with venv and ensurepip to install maturin with"
    log "installing ${TOOLS[*]} into $VENV (with $py)"
    rm -rf "$VENV"
    "$py" -m venv "$VENV" || die "$py -m venv $VENV failed"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${TOOLS[@]}" \
        || die "pip could not install ${TOOLS[*]} from PyPI"
    echo "$want" >"$VENV/.scalene-rs-tools"
fi
export PATH="$VENV/bin:$PATH"

rm -f "$OUT"/scalene_rs-*.whl
log "maturin build --release --zig --compatibility manylinux2014"
maturin build --release --locked --zig --compatibility manylinux2014 -o "$OUT" >&2 \
    || die "maturin build failed (see above)"
wheels=("$OUT"/scalene_rs-*.whl)
if [ ${#wheels[@]} -ne 1 ] || [ ! -f "${wheels[0]}" ]; then
    die "expected one wheel in $OUT, found: ${wheels[*]}"
fi
wheel=${wheels[0]}
case "$wheel" in
    *manylinux2014_x86_64*|*manylinux_2_17_x86_64*) ;;
    *) die "$wheel is not tagged manylinux2014 / manylinux_2_17" ;;
esac

log "auditwheel show"
auditwheel show "$wheel" >&2 || die "auditwheel show $wheel failed"

# The executable out of the wheel, and the preload library embedded in it.
check=$(mktemp -d)
trap 'rm -rf "$check"' EXIT
"$VENV/bin/python" - "$wheel" "$check" "${CARGO_TARGET_DIR:-target}" <<'EOF' || die "cannot find the executable and its embedded preload library"
import glob, sys, zipfile
wheel, out, target = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    exe = [n for n in z.namelist() if n.endswith(".data/scripts/scalene-rs")]
    if len(exe) != 1:
        sys.exit("the wheel holds %r, not one .data/scripts/scalene-rs" % exe)
    binary = z.read(exe[0])
open(out + "/scalene-rs", "wb").write(binary)
candidates = glob.glob(target + "/x86_64-unknown-linux-gnu/release/build/scalene-rs-*/out/preload-target/release/libscalene_preload.so")
inside = [c for c in candidates if open(c, "rb").read() in binary]
if len(inside) != 1:
    sys.exit("of the built preload libraries %r, %d are inside the wheel's executable" % (candidates, len(inside)))
open(out + "/libscalene_preload.so", "wb").write(open(inside[0], "rb").read())
EOF
for f in scalene-rs libscalene_preload.so; do
    max=$(readelf --dyn-syms --wide "$check/$f" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -u -V | tail -1)
    [ -n "$max" ] || die "$f: readelf shows no GLIBC_ symbol version"
    [ "$(printf '%s\n%s\n' "$max" "$MAX_GLIBC" | sort -V | tail -1)" = "$MAX_GLIBC" ] \
        || die "$f needs GLIBC_$max, newer than manylinux2014's $MAX_GLIBC"
    log "$f: highest GLIBC_ symbol version $max (≤ $MAX_GLIBC)"
done
log "built in $(($(date +%s) - t0)) s: $wheel"
echo "$wheel"
