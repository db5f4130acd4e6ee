#!/usr/bin/env bash
# Installs what tests/html.rs drives the HTML report with: Debian's Chromium, node and npm,
# and playwright-core (npm) in $SCALENE_RS_CACHE/browser (default ~/.cache/scalene-rs/browser),
# where the test finds it. Seconds when everything is already there.
set -euo pipefail
cache="${SCALENE_RS_CACHE:-$HOME/.cache/scalene-rs}/browser"
need=()
[ -x /usr/bin/chromium ] || need+=(chromium)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi
mkdir -p "$cache"
if [ ! -f "$cache/node_modules/playwright-core/package.json" ]; then
    [ -f "$cache/package.json" ] || echo '{"private": true}' > "$cache/package.json"
    (cd "$cache" && npm install --no-audit --no-fund --silent playwright-core@1.65.1)
fi
/usr/bin/chromium --version 2>/dev/null
echo "node $(node --version), playwright-core $(node -p "require('$cache/node_modules/playwright-core/package.json').version")"
