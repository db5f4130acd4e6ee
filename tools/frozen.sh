#!/usr/bin/env bash
# Builds fixtures/frozen/app.py into a PyInstaller one-file app for tests/frozen.rs: a
# bootloader (not Python) that unpacks the app and starts it as its child, which loads
# libpython from the unpacked files. Called by tools/setup.sh; usable by hand.
#
# Cached in $CACHE (default ~/.cache/scalene-rs): PyInstaller in pyinstaller-venv (pyenv's
# 3.11, pinned below), the app in frozen/app, built again when the fixture changes (its
# sha256 is kept beside it). Prints the app's path.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${SCALENE_RS_CACHE:-$HOME/.cache/scalene-rs}"
VENV="$CACHE/pyinstaller-venv"
OUT="$CACHE/frozen"
PYINSTALLER=pyinstaller==6.22.3
SRC=fixtures/frozen/app.py

die() { printf 'tools/frozen.sh: %s\n' "$*" >&2; exit 1; }

py="$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")/versions/3.11.7/bin/python3"
[ -x "$py" ] || die "no pyenv 3.11.7 to build the app with ($py)"
if [ "$("$VENV/bin/pyinstaller" --version 2>/dev/null)" != "${PYINSTALLER#*==}" ]; then
    rm -rf "$VENV"
    "$py" -m venv "$VENV"
    "$VENV/bin/pip" install -q "$PYINSTALLER" || die "pip could not install $PYINSTALLER"
fi
sum=$(sha256sum "$SRC" | cut -d' ' -f1)
if [ ! -x "$OUT/app" ] || [ "$(cat "$OUT/app.sha256" 2>/dev/null)" != "$sum" ]; then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "$VENV/bin/pyinstaller" --onefile --log-level WARN --distpath "$work/dist" \
        --workpath "$work/build" --specpath "$work" "$SRC" >&2 \
        || die "pyinstaller failed"
    mkdir -p "$OUT"
    mv "$work/dist/app" "$OUT/app"
    echo "$sum" > "$OUT/app.sha256"
fi
echo "$OUT/app"
