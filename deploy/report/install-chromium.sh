#!/usr/bin/env bash
# Headless Chromium for the report test (tests/test_report.py renders report.html in it).
# Debian's own package, from the distribution's archive; nothing happens when a chromium is already installed.
# Needs root (apt-get) the first time; prints what to do otherwise.
set -euo pipefail

if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-chromium: no apt-get here; install Chromium with your system's package manager" \
         "(the report test is skipped without it)" >&2
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "install-chromium: run as root (or: sudo apt-get install chromium) to let the report test run" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
chromium --version
