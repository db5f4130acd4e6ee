#!/usr/bin/env bash
# Makes (or reuses) a Debian 11 "bullseye" root, where the wheel is proved on an older
# distribution than the build machine's (glibc 2.31, Python 3.9): tests/wheel.rs creates a venv
# with bullseye's own python3 there, pip installs the wheel and profiles that python3 with the
# installed command. Called by .ci/run; usable by hand. Cached under $CACHE (default
# ~/.cache/scalene-rs): a second run costs about a second.
#
#   $CACHE/bullseye           the root: debootstrap's minbase plus python3 and python3-venv
#   $CACHE/bin/bullseye-sh    runs the root's /bin/sh chrooted into it, in a mount namespace
#                             of its own with /dev, /proc, /tmp and the working directory
#                             bound (tools/debian_root.sh), e.g.
#                             bullseye-sh -c 'python3 -m venv /tmp/v && /tmp/v/bin/pip --version'
#
# Needs root (debootstrap, mount namespaces).
set -euo pipefail

CACHE="${SCALENE_RS_CACHE:-$HOME/.cache/scalene-rs}"
MIRROR="${SCALENE_RS_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
ROOT="$CACHE/bullseye"
BIN="$CACHE/bin"
PACKAGES=python3,python3-venv
STAMP_VERSION=1 # bump when the package list or layout changes

log() { printf '[bullseye] %s\n' "$*" >&2; }
die() { printf 'tools/bullseye.sh: %s\n' "$*" >&2; exit 1; }
# shellcheck source=tools/debian_root.sh
. "$(dirname "$0")/debian_root.sh"

[ "$(id -u)" = 0 ] || die "needs root (debootstrap and mount namespaces); run it as root"
if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; } \
        || die "cannot install debootstrap with apt-get"
fi
mkdir -p "$CACHE" "$BIN"
t0=$(date +%s)
debian_root "$ROOT" bullseye "$MIRROR" "v$STAMP_VERSION $PACKAGES" "$PACKAGES" \
    "$CACHE/debootstrap-bullseye.log" 'python3*' libc6
debian_wrapper "$ROOT" "$BIN" bullseye-sh /bin/sh "Debian 11 bullseye"
# The wrapper must work: the root's python3 runs and has what `python3 -m venv` needs (the
# venv itself, with pip, is made by tests/wheel.rs).
got=$("$BIN/bullseye-sh" -c 'python3 -c "import ensurepip, platform, sys, venv; print(sys.version.split()[0], *platform.libc_ver())"') \
    || die "the root's python3 does not run, or lacks venv / ensurepip ($BIN/bullseye-sh)"
log "ready in $(($(date +%s) - t0)) s: python3 $got ($BIN/bullseye-sh)"
