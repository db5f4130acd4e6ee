#!/usr/bin/env bash
# Makes the interpreters of the test matrix that the machine image does not carry, and lists
# every one it made in $CACHE/interpreters.txt (one "label<TAB>path<TAB>root" a line: root is
# the directory it runs chrooted in, "/" for none), where the tests and the generators find
# them beside pyenv's and /usr/bin's. Called by .ci/run; usable by hand:
#
#   tools/pythons.sh            make (or reuse) everything, print what is there
#   tools/pythons.sh --list     print the manifest only
#
# What it makes, cached under $CACHE (default ~/.cache/scalene-rs): a second run costs seconds.
#  1. A Debian unstable root (debootstrap) with Debian's own builds of python3.13, 3.14 and
#     3.15: static executables, as Debian builds them. Each is run by a wrapper
#     ($CACHE/bin/debian-pythonX.Y) in a mount namespace of its own, chrooted into the root, so
#     the interpreter's path does not exist on the host, like a container's.
#  2. Shared-libpython interpreters of 3.14 and 3.15: a launcher (Py_BytesMain) linked against
#     Debian's own libpython3.X.so.1.0 of the same root, built here with the root as sysroot
#     ($CACHE/bin/debian-pythonX.Y-shared). Their headers (libpython3.X-dev) feed the
#     generators (tools/gen_bindings.py --sysroot).
#  3. Free-threaded builds (--disable-gil, shared libpython, headers) compiled from CPython's
#     original tarball as carried by Debian's source packages, for every minor version whose
#     tarball the archive serves (3.13t, 3.14t): $CACHE/pythons/<version>t/bin/python3.Yt.
#     A tarball the archive does not serve is reported, not silently skipped.
#  4. Tail-call builds (clang 19+, --with-tail-call-interp, shared libpython, headers) from
#     the same tarballs, for 3.14 and 3.15: $CACHE/pythons/<version>-tailcall/bin/python3.Y,
#     labelled tailcall-<version>. The evaluation loop is then one function per bytecode
#     (_TAIL_CALL_*), each tail-calling the next: what --native must see through.
#
# Needs root (debootstrap, mount namespaces). Every download is checked against the SHA-256
# of Debian's signed indexes (the Release file debootstrap verified).
set -euo pipefail

CACHE="${SCALENE_RS_CACHE:-$HOME/.cache/scalene-rs}"
MIRROR="${SCALENE_RS_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
ROOT="$CACHE/debian-sid"
BIN="$CACHE/bin"
MANIFEST="$CACHE/interpreters.txt"
DEBIAN_MINORS=(13 14 15)
SHARED_MINORS=(14 15)
FREE_THREADED_MINORS=(13 14)
TAILCALL_MINORS=(14 15)
ROOT_STAMP_VERSION=3 # bump when the root's package list or layout changes

log() { printf '[pythons] %s\n' "$*" >&2; }
die() { printf 'tools/pythons.sh: %s\n' "$*" >&2; exit 1; }
# shellcheck source=tools/debian_root.sh
. "$(dirname "$0")/debian_root.sh"

if [ "${1:-}" = "--list" ]; then
    [ -f "$MANIFEST" ] && cat "$MANIFEST"
    exit 0
fi
[ "$(id -u)" = 0 ] || die "needs root (debootstrap and mount namespaces); run it as root"
mkdir -p "$CACHE" "$BIN" "$CACHE/src" "$CACHE/pythons"
: >"$MANIFEST.new"
add() { printf '%s\t%s\t%s\n' "$1" "$2" "${3:-/}" >>"$MANIFEST.new"; }
started=$(date +%s)

need_tools() {
    local missing=()
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    command -v xz >/dev/null || missing+=(xz-utils)
    command -v curl >/dev/null || missing+=(curl)
    command -v make >/dev/null || missing+=(make)
    command -v cc >/dev/null || missing+=(gcc)
    # CPython's optional modules the fixtures use (zlib in split.py, ctypes, lzma, bz2).
    for dev in zlib1g-dev libffi-dev liblzma-dev libbz2-dev pkg-config; do
        dpkg -s "$dev" >/dev/null 2>&1 || missing+=("$dev")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing ${missing[*]}"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

# ---- 1. The Debian unstable root ------------------------------------------------------------
root_packages() {
    local p=(libc6-dev)
    for m in "${DEBIAN_MINORS[@]}"; do p+=("python3.$m"); done
    for m in "${SHARED_MINORS[@]}"; do p+=("libpython3.$m" "libpython3.$m-dev"); done
    local IFS=,
    echo "${p[*]}"
}

make_root() {
    debian_root "$ROOT" sid "$MIRROR" "v$ROOT_STAMP_VERSION $(root_packages)" "$(root_packages)" \
        "$CACHE/debootstrap.log" 'python3.1*' 'libpython3.1*'
}

# Each interpreter runs through a wrapper ($BIN/debian-pythonX.Y, tools/debian_root.sh): in a
# mount namespace of its own, chrooted into the root, so the interpreter's path does not exist
# on the host. Inside the root the same path runs the interpreter directly (a program in the
# root may start sys.executable or this path).
write_wrapper() {
    debian_wrapper "$ROOT" "$BIN" "$1" "$2" "Debian unstable"
}

debian_interpreters() {
    for m in "${DEBIAN_MINORS[@]}"; do
        [ -x "$ROOT/usr/bin/python3.$m" ] || die "the root has no /usr/bin/python3.$m"
        write_wrapper "debian-python3.$m" "/usr/bin/python3.$m"
        add "debian-3.$m" "$BIN/debian-python3.$m" "$ROOT"
    done
}

# ---- 2. Shared-libpython launchers ----------------------------------------------------------
shared_interpreters() {
    local m exe src
    for m in "${SHARED_MINORS[@]}"; do
        exe="$ROOT/usr/bin/python3.$m-shared"
        src="$CACHE/src/launcher.c"
        # Rewritten only when it changes: its time decides whether the launchers are linked again.
        cat >"$src.new" <<'EOF'
/* Generated by tools/pythons.sh: the interpreter's main, linked to the shared libpython. */
#include <Python.h>
int main(int argc, char **argv) { return Py_BytesMain(argc, argv); }
EOF
        if cmp -s "$src.new" "$src"; then rm -f "$src.new"; else mv "$src.new" "$src"; fi
        if [ ! -x "$exe" ] || [ "$src" -nt "$exe" ] || [ "$ROOT/.scalene-rs-stamp" -nt "$exe" ]; then
            log "linking python3.$m-shared against the root's libpython3.$m.so"
            cc --sysroot="$ROOT" -O2 -o "$exe" "$src" \
                -I"$ROOT/usr/include/python3.$m" \
                -L"$ROOT/usr/lib/x86_64-linux-gnu" -lpython3.$m \
                || die "cannot link a launcher against the root's libpython3.$m"
        fi
        write_wrapper "debian-python3.$m-shared" "/usr/bin/python3.$m-shared"
        add "debian-3.$m-shared" "$BIN/debian-python3.$m-shared" "$ROOT"
    done
}

# ---- 3. Free-threaded builds from CPython's original tarball --------------------------------
# Prints "version sha256 url" of every CPython 3.<minor> original tarball that Debian's
# unstable and testing source indexes list, newest first.
tarballs() {
    local minor=$1 suite
    for suite in sid forky; do
        local idx="$CACHE/src/Sources-$suite.xz"
        if [ ! -f "$idx" ] || [ -n "$(find "$idx" -mmin +1440)" ]; then
            curl -fsS -o "$idx.tmp" "$MIRROR/dists/$suite/main/source/Sources.xz" && mv "$idx.tmp" "$idx" || continue
        fi
        xz -dc "$idx" | awk -v pkg="python3.$minor" -v mirror="$MIRROR" '
            /^Package: / { inpkg = ($2 == pkg) }
            /^Directory: / && inpkg { dir = $2 }
            /^Checksums-Sha256:/ { insha = 1; next }
            /^[^ ]/ { insha = 0 }
            /^$/ { if (inpkg && tar != "") print ver, sha, mirror "/" dir "/" tar; inpkg = 0; tar = ""; sha = ""; dir = "" }
            insha && inpkg && $3 ~ /\.orig\.tar\.xz$/ { sha = $1; tar = $3; ver = $3; sub(/^python3\.[0-9]+_/, "", ver); sub(/\.orig\.tar\.xz$/, "", ver) }'
    done | sort -u -k1,1 -V -r
}

fetch_tarball() {
    local minor=$1 ver sha url file
    while read -r ver sha url; do
        file="$CACHE/src/python3.${minor}_$ver.orig.tar.xz"
        if [ -f "$file" ] && echo "$sha  $file" | sha256sum -c --quiet - 2>/dev/null; then
            echo "$ver $file"
            return 0
        fi
        if curl -fsS -o "$file.tmp" "$url" 2>/dev/null; then
            if echo "$sha  $file.tmp" | sha256sum -c --quiet - 2>/dev/null; then
                mv "$file.tmp" "$file"
                echo "$ver $file"
                return 0
            fi
            log "$url: SHA-256 does not match Debian's index; not used"
        fi
        rm -f "$file.tmp"
        log "python3.$minor $ver: the archive does not serve $url"
    done < <(tarballs "$minor")
    return 1
}

# The C compiler of the tail-call builds: clang 19 or newer (CPython's configure refuses
# --with-tail-call-interp with anything older); Debian 12 carries clang-19.
TAILCALL_CC="${SCALENE_RS_TAILCALL_CC:-clang-19}"

need_clang() {
    command -v "$TAILCALL_CC" >/dev/null && return 0
    [ "$TAILCALL_CC" = clang-19 ] || die "$TAILCALL_CC (SCALENE_RS_TAILCALL_CC) not found"
    log "installing clang-19 (the tail-call builds)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang-19 >/dev/null \
        || die "cannot install clang-19"
}

# One build from CPython's original tarball, shared libpython with headers:
#   build_from_tarball MINOR free-threaded   --disable-gil: $CACHE/pythons/<version>t/bin/python3.Yt
#   build_from_tarball MINOR tailcall        clang, --with-tail-call-interp (3.14+): every
#       bytecode its own _TAIL_CALL_* function; $CACHE/pythons/<version>-tailcall/bin/python3.Y
# No PGO or LTO: the build stays a few minutes on two cores.
build_from_tarball() {
    local minor=$1 flavor=$2 got ver file prefix exe label
    local -a env_args=() conf_args=()
    if ! got=$(fetch_tarball "$minor"); then
        log "python3.$minor ($flavor): NOT BUILT: no CPython 3.$minor original tarball listed by Debian's unstable or testing source indexes could be downloaded from $MIRROR"
        return 1
    fi
    read -r ver file <<<"$got"
    case "$flavor" in
        free-threaded)
            prefix="$CACHE/pythons/${ver}t" exe="python3.${minor}t" label="free-threaded-${ver}t"
            conf_args=(--disable-gil)
            ;;
        tailcall)
            prefix="$CACHE/pythons/${ver}-tailcall" exe="python3.$minor" label="tailcall-$ver"
            conf_args=(--with-tail-call-interp)
            env_args=(CC="$TAILCALL_CC")
            ;;
        *) die "unknown build $flavor" ;;
    esac
    if [ -x "$prefix/bin/$exe" ] && [ -f "$prefix/.scalene-rs-built" ]; then
        log "$label: cached ($prefix)"
    else
        [ "$flavor" = tailcall ] && need_clang
        log "$label: building from $file (${conf_args[*]} --enable-shared)"
        local t0 build
        t0=$(date +%s)
        build=$(mktemp -d "$CACHE/src/build-$label.XXXXXX")
        tar -C "$build" --strip-components=1 -xJf "$file"
        rm -rf "$prefix"
        (
            cd "$build"
            env "${env_args[@]}" ./configure --prefix="$prefix" "${conf_args[@]}" --enable-shared \
                LDFLAGS="-Wl,-rpath,$prefix/lib" >"$build/configure.log" 2>&1 \
                || { tail -20 "$build/configure.log" >&2; exit 1; }
            make -j"$(nproc)" >"$build/make.log" 2>&1 || { tail -30 "$build/make.log" >&2; exit 1; }
            make install >"$build/install.log" 2>&1 || { tail -20 "$build/install.log" >&2; exit 1; }
        ) || die "building $label failed (logs in $build)"
        if [ "$flavor" = tailcall ]; then
            # configure only warns about an option it does not know: check that the loop
            # really is made of handler functions.
            local handlers
            handlers=$(nm "$prefix/lib/libpython3.$minor.so.1.0" 2>/dev/null | grep -c ' _TAIL_CALL_' || true)
            [ "$handlers" -gt 0 ] || die "$label: libpython3.$minor.so.1.0 has no _TAIL_CALL_ handler (logs in $build)"
            log "$label: $handlers _TAIL_CALL_ handlers in libpython3.$minor.so.1.0"
        fi
        rm -rf "$build"
        touch "$prefix/.scalene-rs-built"
        log "$label: built in $(($(date +%s) - t0)) s"
    fi
    add "$label" "$prefix/bin/$exe"
}

need_tools
make_root
debian_interpreters
shared_interpreters
missing=()
for m in "${FREE_THREADED_MINORS[@]}"; do
    build_from_tarball "$m" free-threaded || missing+=("3.${m}t")
done
for m in "${TAILCALL_MINORS[@]}"; do
    build_from_tarball "$m" tailcall || missing+=("3.$m (tail-call)")
done
mv "$MANIFEST.new" "$MANIFEST"
log "done in $(($(date +%s) - started)) s; $(wc -l <"$MANIFEST") interpreters in $MANIFEST:"
sed 's/^/    /' "$MANIFEST" >&2
if [ ${#missing[@]} -gt 0 ]; then
    log "not made (see above): ${missing[*]}"
fi
