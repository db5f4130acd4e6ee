#!/usr/bin/env bash
# Creates the unprivileged user that tests/dump_errors.rs's permission tests run the
# profiler as (through setpriv), so that the kernel's own EPERM and our message for it are
# exercised: SCALENE_RS_TEST_USER, default scalene-rs-test. A system user with no home and
# no login shell. Called by .ci/run; idempotent (nothing to do when the user exists).
set -euo pipefail

NAME="${SCALENE_RS_TEST_USER:-scalene-rs-test}"

die() { printf 'tools/test_user.sh: %s\n' "$*" >&2; exit 1; }

if uid=$(id -u "$NAME" 2>/dev/null); then
    [ "$uid" != 0 ] || die "user $NAME exists with uid 0: it must be unprivileged"
    echo "[test-user] $NAME exists (uid $uid)" >&2
    exit 0
fi
[ "$(id -u)" = 0 ] || die "creating user $NAME needs root"
command -v useradd >/dev/null || die "no useradd (Debian: the passwd package)"
useradd --system --user-group --no-create-home --home-dir /nonexistent \
    --shell /usr/sbin/nologin "$NAME"
echo "[test-user] created $NAME (uid $(id -u "$NAME"))" >&2
