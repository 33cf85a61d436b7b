#!/usr/bin/env bash
# Start a single-node Apache Kafka broker (KRaft, combined broker+controller)
# on 127.0.0.1 in the background, and wait until it answers.
#
# Env (or the matching flags):
#   KAFKA_PORT             --port N             client port (default 19092)
#   KAFKA_CONTROLLER_PORT  --controller-port N  KRaft controller port (default KAFKA_PORT+1)
#   KAFKA_DATA_DIR         --data-dir DIR       config, logs, data, pid
#                                               (default ${TMPDIR:-/tmp}/streamdedup-kafka-$KAFKA_PORT)
#   KAFKA_START_TIMEOUT    seconds to wait for the broker (default 90)
#   KAFKA_HEAP_OPTS        JVM heap (default "-Xms128m -Xmx512m")
#   KAFKA_CACHE_DIR        jar cache, see fetch.sh
#
# Storage is formatted only once, so stop.sh + start.sh keeps topics and data.
# On success prints the bootstrap address (127.0.0.1:PORT) on stdout.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

while [[ $# -gt 0 ]]; do
  case "$1" in
    --port) KAFKA_PORT="$2"; shift 2 ;;
    --controller-port) KAFKA_CONTROLLER_PORT="$2"; shift 2 ;;
    --data-dir) KAFKA_DATA_DIR="$2"; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "start.sh: unknown argument: $1" >&2; exit 2 ;;
  esac
done

port="${KAFKA_PORT:-19092}"
cport="${KAFKA_CONTROLLER_PORT:-$((port + 1))}"
data="${KAFKA_DATA_DIR:-${TMPDIR:-/tmp}/streamdedup-kafka-$port}"
wait_s="${KAFKA_START_TIMEOUT:-90}"
heap="${KAFKA_HEAP_OPTS:--Xms128m -Xmx512m}"

log() { echo "start.sh: $*" >&2; }

mkdir -p "$data"
data="$(cd "$data" && pwd)"
props="$data/server.properties"
pidfile="$data/broker.pid"
logdir="$data/logs"        # broker's own log4j output
kafkalogs="$data/kraft"    # log.dirs: topic partitions + metadata log

# True if PID exists and is not a zombie (an unreaped dead process).
alive() {
  kill -0 "$1" 2>/dev/null && [[ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]]
}

# True if PID is alive and is the broker started from this data dir.
is_our_broker() {
  local pid="$1"
  [[ -n "$pid" ]] && alive "$pid" &&
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "kafka.Kafka $props"
}

# True if something accepts TCP connections on 127.0.0.1:$1.
port_open() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# True if a Kafka broker answers an ApiVersions (v0) request on 127.0.0.1:$1:
# the reply must echo our correlation id. Pure bash, no client library needed.
kafka_answers() {
  local reply
  # shellcheck disable=SC2016  # $1 expands in the inner bash
  reply="$(timeout 5 bash -c '
    exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
    # size=15 | api_key=18 (ApiVersions) | version=0 | correlation_id=0x5d5d | client_id="probe"
    printf "\x00\x00\x00\x0f\x00\x12\x00\x00\x00\x00\x5d\x5d\x00\x05probe" >&3
    head -c 8 <&3 | od -An -tx1
  ' _ "$1" 2>/dev/null)" || return 1
  reply="$(tr -s ' \n' ' ' <<<"$reply")"
  [[ "$reply" == *"00 00 5d 5d"* ]]
}

if [[ -f "$pidfile" ]]; then
  oldpid="$(cat "$pidfile")"
  if is_our_broker "$oldpid"; then
    log "broker already running (pid $oldpid, data dir $data)"
    echo "127.0.0.1:$port"
    exit 0
  fi
  rm -f "$pidfile"   # stale
fi

for p in "$port" "$cport"; do
  if port_open "$p"; then
    log "port $p on 127.0.0.1 is already in use by another process"
    exit 1
  fi
done

lib="$("$here/fetch.sh")"
cp="$lib/*"

# Config is rewritten on every start; data in $kafkalogs is kept.
cat >"$props" <<EOF
# Written by streamdedup deploy/kafka/start.sh; rewritten on every start.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$kafkalogs

# Single node: every internal topic has one replica.
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
default.replication.factor=1
min.insync.replicas=1

# Topics are created explicitly; one partition unless asked otherwise.
auto.create.topics.enable=false
num.partitions=1
group.initial.rebalance.delay.ms=0

# Room for a 10 MB record plus batch/request overhead (16 MiB).
message.max.bytes=16777216
replica.fetch.max.bytes=16777216

# Small machine: fewer threads and internal-topic partitions (defaults 3/8/50/50).
num.network.threads=2
num.io.threads=4
offsets.topic.num.partitions=4
transaction.state.log.num.partitions=4
EOF

cat >"$data/log4j2.properties" <<EOF
# Broker log: INFO to logs/server.log (rolled at 20 MB, 3 files kept).
# No log4j shutdown hook, so the broker's own shutdown is logged to the end.
status = warn
shutdownHook = disable
appender.file.type = RollingFile
appender.file.name = FILE
appender.file.fileName = $logdir/server.log
appender.file.filePattern = $logdir/server-%i.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 20MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 3
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.statechange.name = state.change.logger
logger.statechange.level = WARN
EOF

# One-shot tools (storage format): warnings and errors to the console.
cat >"$data/log4j2-tools.properties" <<EOF
status = warn
appender.console.type = Console
appender.console.name = STDERR
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.console.ref = STDERR
EOF

java_opts=(-Djava.awt.headless=true -XX:+UseG1GC -XX:MaxGCPauseMillis=20
  -XX:+ExitOnOutOfMemoryError
  "-Dlog4j2.configurationFile=$data/log4j2.properties"
  "-Dkafka.logs.dir=$logdir")
# shellcheck disable=SC2206  # KAFKA_HEAP_OPTS is a word list on purpose
heap_opts=($heap)

mkdir -p "$logdir"
# Format the storage once; meta.properties marks a formatted log dir.
if [[ ! -f "$kafkalogs/meta.properties" ]]; then
  # Cluster id: 16 random bytes, base64url without padding (Kafka's Uuid form),
  # not starting with '-' (the CLI would take it for an option).
  cluster_id="-"
  while [[ "$cluster_id" == -* ]]; do
    cluster_id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')"
  done
  log "formatting storage in $kafkalogs (cluster id $cluster_id)"
  java -Xmx256m "-Dlog4j2.configurationFile=$data/log4j2-tools.properties" \
    -cp "$cp" kafka.tools.StorageTool \
    format --ignore-formatted -t "$cluster_id" -c "$props" >"$logdir/format.out" 2>&1 || {
      cat "$logdir/format.out" >&2
      log "storage format failed"
      exit 1
    }
fi

# Keep the previous run's log apart, so the readiness check below only
# sees lines from this run.
[[ -f "$logdir/server.log" ]] && mv -f "$logdir/server.log" "$logdir/previous-server.log"
rm -f "$logdir"/server-*.log

log "starting Kafka broker on 127.0.0.1:$port (controller $cport, data dir $data)"
# setsid + nohup: the broker outlives this shell and its terminal.
setsid nohup java "${heap_opts[@]}" "${java_opts[@]}" -cp "$cp" \
  kafka.Kafka "$props" >"$logdir/broker.out" 2>&1 </dev/null &
pid=$!
echo "$pid" >"$pidfile"

deadline=$((SECONDS + wait_s))
while :; do
  if ! alive "$pid"; then
    log "broker exited during startup; last log lines:"
    tail -n 40 "$logdir/server.log" "$logdir/broker.out" >&2 2>/dev/null || true
    rm -f "$pidfile"
    exit 1
  fi
  if grep -qF "Kafka Server started" "$logdir/server.log" 2>/dev/null && kafka_answers "$port"; then
    break
  fi
  if ((SECONDS >= deadline)); then
    log "broker not ready after ${wait_s}s; last log lines:"
    tail -n 40 "$logdir/server.log" "$logdir/broker.out" >&2 2>/dev/null || true
    KAFKA_DATA_DIR="$data" KAFKA_PORT="$port" "$here/stop.sh" || true
    exit 1
  fi
  sleep 0.5
done

log "broker ready (pid $pid)"
echo "127.0.0.1:$port"
