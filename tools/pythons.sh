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
ROOT_STAMP_VERSION=3 # bump when the root's package list or layout changes

log() { printf '[pythons] %s\n' "$*" >&2; }
die() { printf 'tools/pythons.sh: %s\n' "$*" >&2; exit 1; }

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
    local want stamp
    want="v$ROOT_STAMP_VERSION $(root_packages)"
    stamp="$ROOT/.scalene-rs-stamp"
    if [ -f "$stamp" ] && [ "$(head -1 "$stamp")" = "$want" ]; then
        log "Debian unstable root: cached ($ROOT)"
        return
    fi
    log "Debian unstable root: debootstrap into $ROOT (a few minutes)"
    rm -rf "$ROOT.tmp"
    local t0
    t0=$(date +%s)
    # minbase: dpkg, apt and the essential set; the interpreters come with --include.
    if ! debootstrap --variant=minbase --include="$(root_packages)" sid "$ROOT.tmp" "$MIRROR" \
        >"$CACHE/debootstrap.log" 2>&1; then
        tail -20 "$CACHE/debootstrap.log" >&2
        die "debootstrap of Debian unstable failed (log: $CACHE/debootstrap.log)"
    fi
    rm -rf "$ROOT"
    mv "$ROOT.tmp" "$ROOT"
    # Nothing runs apt in the root again: drop what apt downloaded.
    rm -rf "$ROOT/var/cache/apt/archives/"*.deb
    { echo "$want"; chroot "$ROOT" dpkg-query -W 'python3.1*' 'libpython3.1*'; } >"$stamp"
    log "Debian unstable root: made in $(($(date +%s) - t0)) s"
}

# A wrapper that runs /usr/bin/<exe> of the root: a mount namespace of its own (private, so
# nothing leaks to the host), /dev (recursively: /dev/shm is a mount of its own), /proc, /tmp
# and the working directory bound at their own paths, then chrooted there. exec all the way:
# the pid the caller started is the interpreter's. Inside the root the same path runs the
# interpreter directly (a program in the root may start sys.executable or this path).
write_wrapper() {
    local name=$1 exe=$2 w="$BIN/$1"
    cat >"$w.tmp" <<EOF
#!/bin/sh
# Generated by tools/pythons.sh: Debian unstable's $exe, chrooted into
# $ROOT in a mount namespace of its own. Extra directories to bind: SCALENE_RS_ROOT_BIND
# (colon-separated absolute paths).
exec unshare --mount --propagation private -- /bin/sh -c '
set -e
R=\$1; shift
mount --rbind /dev "\$R/dev"
mount --rbind /proc "\$R/proc"
mount --rbind /tmp "\$R/tmp"
old_ifs=\$IFS; IFS=:
for d in "\$PWD" \${SCALENE_RS_ROOT_BIND:-}; do
    [ -d "\$d" ] && [ "\$d" != / ] || continue
    mkdir -p "\$R\$d"
    mount --rbind "\$d" "\$R\$d"
done
IFS=\$old_ifs
exec unshare --root="\$R" --wd="\$PWD" "\$@"
' sh "$ROOT" $exe "\$@"
EOF
    chmod 755 "$w.tmp"
    mv "$w.tmp" "$w"
    mkdir -p "$ROOT$BIN"
    printf '#!/bin/sh\nexec %s "$@"\n' "$exe" >"$ROOT$w"
    chmod 755 "$ROOT$w"
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
        cat >"$src" <<'EOF'
/* Generated by tools/pythons.sh: the interpreter's main, linked to the shared libpython. */
#include <Python.h>
int main(int argc, char **argv) { return Py_BytesMain(argc, argv); }
EOF
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

build_free_threaded() {
    local minor=$1 got ver file prefix
    if ! got=$(fetch_tarball "$minor"); then
        log "python3.${minor}t: NOT BUILT: no CPython 3.$minor original tarball listed by Debian's unstable or testing source indexes could be downloaded from $MIRROR"
        return 1
    fi
    read -r ver file <<<"$got"
    prefix="$CACHE/pythons/${ver}t"
    if [ -x "$prefix/bin/python3.${minor}t" ] && [ -f "$prefix/.scalene-rs-built" ]; then
        log "python3.${minor}t $ver: cached ($prefix)"
    else
        log "python3.${minor}t $ver: building from $file (--disable-gil --enable-shared)"
        local t0 build
        t0=$(date +%s)
        build=$(mktemp -d "$CACHE/src/build-${ver}t.XXXXXX")
        tar -C "$build" --strip-components=1 -xJf "$file"
        rm -rf "$prefix"
        (
            cd "$build"
            ./configure --prefix="$prefix" --disable-gil --enable-shared \
                LDFLAGS="-Wl,-rpath,$prefix/lib" >"$build/configure.log" 2>&1 \
                || { tail -20 "$build/configure.log" >&2; exit 1; }
            make -j"$(nproc)" >"$build/make.log" 2>&1 || { tail -30 "$build/make.log" >&2; exit 1; }
            make install >"$build/install.log" 2>&1 || { tail -20 "$build/install.log" >&2; exit 1; }
        ) || die "building python3.${minor}t $ver failed (logs in $build)"
        rm -rf "$build"
        touch "$prefix/.scalene-rs-built"
        log "python3.${minor}t $ver: built in $(($(date +%s) - t0)) s"
    fi
    add "free-threaded-${ver}t" "$prefix/bin/python3.${minor}t"
}

need_tools
make_root
debian_interpreters
shared_interpreters
missing=()
for m in "${FREE_THREADED_MINORS[@]}"; do
    build_free_threaded "$m" || missing+=("3.${m}t")
done
mv "$MANIFEST.new" "$MANIFEST"
log "done in $(($(date +%s) - started)) s; $(wc -l <"$MANIFEST") interpreters in $MANIFEST:"
sed 's/^/    /' "$MANIFEST" >&2
if [ ${#missing[@]} -gt 0 ]; then
    log "not made (see above): ${missing[*]}"
fi
