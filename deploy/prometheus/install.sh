#!/usr/bin/env bash
# Installs Prometheus and promtool (Debian's `prometheus` package) for the tests and for
# checking the alert rules here. Does nothing when both are already on PATH. The package's
# own service is never started: a policy-rc.d that refuses service starts is put in place
# for the install when the machine has none (containers usually have one already).
set -euo pipefail

if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    echo "deploy/prometheus/install.sh: no apt-get here; install Prometheus >= 2.37 (prometheus and" \
         "promtool on PATH) from https://prometheus.io/download/ and run the tests again" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    SUDO="sudo"
fi
POLICY=/usr/sbin/policy-rc.d
ADDED_POLICY=""
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
    $SUDO chmod +x "$POLICY"
    ADDED_POLICY=1
fi
cleanup() { if [ -n "$ADDED_POLICY" ]; then $SUDO rm -f "$POLICY"; fi; }
trap cleanup EXIT
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
command -v prometheus >/dev/null && command -v promtool >/dev/null
