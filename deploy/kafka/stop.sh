#!/usr/bin/env bash
# Stop the broker that start.sh started from KAFKA_DATA_DIR: SIGTERM, wait up
# to KAFKA_STOP_TIMEOUT seconds (default 30), then SIGKILL. Exits 0 if nothing
# was running.
#
# Env (or flags): KAFKA_PORT / --port, KAFKA_DATA_DIR / --data-dir, same
# defaults as start.sh.
#   --wipe   also delete the data dir (topics, offsets, logs)
set -euo pipefail

wipe=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --wipe) wipe=1; shift ;;
    --port) KAFKA_PORT="$2"; shift 2 ;;
    --data-dir) KAFKA_DATA_DIR="$2"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "stop.sh: unknown argument: $1" >&2; exit 2 ;;
  esac
done

port="${KAFKA_PORT:-19092}"
data="${KAFKA_DATA_DIR:-${TMPDIR:-/tmp}/streamdedup-kafka-$port}"
grace="${KAFKA_STOP_TIMEOUT:-30}"
props="$data/server.properties"
pidfile="$data/broker.pid"

log() { echo "stop.sh: $*" >&2; }

if [[ -d "$data" ]]; then
  data="$(cd "$data" && pwd)"
  props="$data/server.properties"
  pidfile="$data/broker.pid"
fi

# True if PID exists and is not a zombie (an unreaped dead process).
alive() {
  kill -0 "$1" 2>/dev/null && [[ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]]
}

# Only signal a PID that is the broker of this data dir (PIDs get reused).
is_our_broker() {
  local pid="$1"
  [[ -n "$pid" ]] && alive "$pid" &&
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "kafka.Kafka $props"
}

pid="$(cat "$pidfile" 2>/dev/null || true)"
if is_our_broker "$pid"; then
  log "stopping broker (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  deadline=$((SECONDS + grace))
  while alive "$pid" && ((SECONDS < deadline)); do
    sleep 0.2
  done
  if alive "$pid"; then
    log "broker did not stop within ${grace}s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    while alive "$pid"; do sleep 0.1; done
  fi
  log "broker stopped"
else
  log "no broker running for $data"
fi
rm -f "$pidfile"

if ((wipe)) && [[ -d "$data" ]]; then
  # Refuse to delete a folder that start.sh did not create.
  if [[ -f "$props" ]] && grep -q "streamdedup deploy/kafka/start.sh" "$props"; then
    rm -rf "$data"
    log "wiped $data"
  elif rmdir "$data" 2>/dev/null; then
    log "removed empty $data"
  else
    log "not wiping $data: it has no server.properties written by start.sh"
    exit 1
  fi
fi
