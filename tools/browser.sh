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
# playwright-core 1.65 needs node 20; Debian bookworm's own node is 18, which 1.49 supports
# (both drive Debian's Chromium 156 through CDP: tests/html.rs passes with either).
if [ "$(node -p 'process.versions.node.split(".")[0]')" -ge 20 ]; then
    version=1.65.1
else
    version=1.49.1
fi
mkdir -p "$cache"
have=$(node -p "try { require('$cache/node_modules/playwright-core/package.json').version } catch (e) { '' }")
if [ "$have" != "$version" ]; then
    [ -f "$cache/package.json" ] || echo '{"private": true}' > "$cache/package.json"
    (cd "$cache" && npm install --no-audit --no-fund --silent "playwright-core@$version")
fi
/usr/bin/chromium --version 2>/dev/null
echo "node $(node --version), playwright-core $(node -p "require('$cache/node_modules/playwright-core/package.json').version")"
