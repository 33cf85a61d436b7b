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
#   KAFKA_SECURE=1         --secure             the client port speaks TLS and asks for SASL
#                                               (SCRAM-SHA-512 or PLAIN), and the authorizer is on
#   KAFKA_MTLS_PORT        --mtls-port N        --secure: a second client port that speaks TLS and
#                                               asks for a client certificate instead (mutual TLS;
#                                               default KAFKA_PORT+2)
#
# --secure (decided when the data dir is first used; it cannot be switched
# later): certificates are made with keytool, and users and passwords once,
# in DATA_DIR/secure/ (see the README.md there): ca.pem (the CA clients trust),
# admin.password (the super user "admin"), streamdedup.password (the user
# "streamdedup", who has no rights until ACLs grant them), and, where openssl
# is installed, the user "streamdedup"'s client certificate for the mutual-TLS
# port (streamdedup.pem, streamdedup.key: the same user, the same ACLs).
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
    --secure) KAFKA_SECURE=1; shift ;;
    --mtls-port) KAFKA_MTLS_PORT="$2"; shift 2 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "start.sh: unknown argument: $1" >&2; exit 2 ;;
  esac
done

port="${KAFKA_PORT:-19092}"
cport="${KAFKA_CONTROLLER_PORT:-$((port + 1))}"
data="${KAFKA_DATA_DIR:-${TMPDIR:-/tmp}/streamdedup-kafka-$port}"
wait_s="${KAFKA_START_TIMEOUT:-90}"
heap="${KAFKA_HEAP_OPTS:--Xms128m -Xmx512m}"
secure="${KAFKA_SECURE:-0}"
mport="${KAFKA_MTLS_PORT:-$((port + 2))}"

log() { echo "start.sh: $*" >&2; }

mkdir -p "$data"
data="$(cd "$data" && pwd)"
props="$data/server.properties"
pidfile="$data/broker.pid"
logdir="$data/logs"        # broker's own log4j output
kafkalogs="$data/kraft"    # log.dirs: topic partitions + metadata log
secrets="$data/secure"     # --secure: certificates, key stores, passwords

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

# Ready: a plaintext broker answers ApiVersions; a --secure one (TLS, which bash
# cannot speak) accepts connections once its log says it started.
listener_ready() {
  if [[ "$secure" == 1 ]]; then port_open "$port"; else kafka_answers "$port"; fi
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

ports=("$port" "$cport")
[[ "$secure" == 1 ]] && ports+=("$mport")
for p in "${ports[@]}"; do
  if port_open "$p"; then
    log "port $p on 127.0.0.1 is already in use by another process"
    exit 1
  fi
done

# A data dir formatted in one mode stays in it: the users and ACLs live in its metadata.
if [[ -f "$kafkalogs/meta.properties" ]]; then
  if [[ -d "$secrets" && "$secure" != 1 ]]; then
    log "$data holds a --secure broker; start it with --secure (or KAFKA_SECURE=1), or wipe it (stop.sh --wipe)"
    exit 1
  elif [[ ! -d "$secrets" && "$secure" == 1 ]]; then
    log "$data holds a plaintext broker; start it without --secure, or wipe it first (stop.sh --wipe)"
    exit 1
  fi
fi

lib="$("$here/fetch.sh")"
cp="$lib/*"

# A random secret: 24 hex digits (no quoting trouble in properties, JAAS or the CLI).
new_secret() {
  head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n'
}

# --secure, first start: a CA, the broker's certificate signed by it (for
# 127.0.0.1 and localhost), and the passwords. keytool ships with the JDK
# that runs the broker; nothing is fetched.
make_secrets() {
  command -v keytool >/dev/null || { log "keytool not found on PATH (it comes with the JDK)"; exit 1; }
  local tmp store_pass
  tmp="$(mktemp -d "$data/secure.tmp.XXXXXX")"
  chmod 700 "$tmp"
  store_pass="$(new_secret)"
  local kt=(keytool -noprompt -storetype PKCS12 -storepass "$store_pass")
  local days=3650 san="SAN=IP:127.0.0.1,DNS:localhost"
  {
    "${kt[@]}" -genkeypair -alias ca -keyalg RSA -keysize 2048 -validity "$days" \
      -dname "CN=streamdedup local test CA" -ext bc:c -ext KU=keyCertSign,cRLSign -keystore "$tmp/ca.p12"
    "${kt[@]}" -exportcert -rfc -alias ca -keystore "$tmp/ca.p12" -file "$tmp/ca.pem"
    "${kt[@]}" -genkeypair -alias broker -keyalg RSA -keysize 2048 -validity "$days" \
      -dname "CN=127.0.0.1" -ext "$san" -keystore "$tmp/broker.p12"
    "${kt[@]}" -certreq -alias broker -keystore "$tmp/broker.p12" -file "$tmp/broker.csr"
    "${kt[@]}" -gencert -rfc -alias ca -keystore "$tmp/ca.p12" -validity "$days" -infile "$tmp/broker.csr" \
      -outfile "$tmp/broker.pem" -ext "$san" -ext KU=digitalSignature,keyEncipherment -ext EKU=serverAuth,clientAuth
    "${kt[@]}" -importcert -alias ca -file "$tmp/ca.pem" -keystore "$tmp/broker.p12"
    "${kt[@]}" -importcert -alias broker -file "$tmp/broker.pem" -keystore "$tmp/broker.p12"
    "${kt[@]}" -importcert -alias ca -file "$tmp/ca.pem" -keystore "$tmp/truststore.p12"
  } >"$tmp/keytool.out" 2>&1 || { cat "$tmp/keytool.out" >&2; log "keytool failed"; rm -rf "$tmp"; exit 1; }
  rm -f "$tmp/broker.csr" "$tmp/keytool.out"
  (umask 077
   echo "$store_pass" >"$tmp/store.password"
   new_secret >"$tmp/admin.password"
   new_secret >"$tmp/streamdedup.password")
  cat >"$tmp/README.md" <<'EOT'
Made by deploy/kafka/start.sh --secure on first start (a test broker's secrets):

- ca.pem: the CA that signed the broker's certificate; clients trust it (kafka.ssl_cafile).
- broker.p12, truststore.p12, ca.p12: the broker's key store, its trust store, and the CA's
  key (PKCS12; their password is in store.password).
- admin.password: the super user "admin" (SASL/SCRAM-SHA-512 and SASL/PLAIN).
- streamdedup.password: the user "streamdedup" (SCRAM-SHA-512 and PLAIN); no rights until
  ACLs grant them.
- streamdedup.pem, streamdedup.key: the same user's client certificate and key for the
  mutual-TLS port (kafka.ssl_certfile, kafka.ssl_keyfile), signed by the CA.
EOT
  mv -T "$tmp" "$secrets"
}

# --secure: the user "streamdedup"'s client certificate (CN=streamdedup, the principal
# User:streamdedup on the mutual-TLS port), as PEM files kafka-python reads. keytool makes and
# signs it; openssl turns the key store into PEM (keytool cannot write a private key out).
make_client_cert() {
  if ! command -v openssl >/dev/null; then
    log "openssl not found on PATH: no client certificate for the mutual-TLS port"
    return
  fi
  local tmp store_pass
  tmp="$(mktemp -d "$secrets/client.tmp.XXXXXX")"
  store_pass="$(cat "$secrets/store.password")"
  local kt=(keytool -noprompt -storetype PKCS12 -storepass "$store_pass")
  {
    "${kt[@]}" -genkeypair -alias client -keyalg RSA -keysize 2048 -validity 3650 -dname "CN=streamdedup" \
      -keystore "$tmp/client.p12"
    "${kt[@]}" -certreq -alias client -keystore "$tmp/client.p12" -file "$tmp/client.csr"
    "${kt[@]}" -gencert -rfc -alias ca -keystore "$secrets/ca.p12" -validity 3650 -infile "$tmp/client.csr" \
      -outfile "$tmp/client.pem" -ext KU=digitalSignature,keyEncipherment -ext EKU=clientAuth
    "${kt[@]}" -importcert -alias ca -file "$secrets/ca.pem" -keystore "$tmp/client.p12"
    "${kt[@]}" -importcert -alias client -file "$tmp/client.pem" -keystore "$tmp/client.p12"
    (umask 077; openssl pkcs12 -in "$tmp/client.p12" -passin "pass:$store_pass" -nocerts -nodes \
      | openssl pkey -out "$tmp/streamdedup.key")
    cp "$tmp/client.pem" "$tmp/streamdedup.pem"
  } >"$tmp/out" 2>&1 || { cat "$tmp/out" >&2; log "making the client certificate failed"; rm -rf "$tmp"; exit 1; }
  mv "$tmp/streamdedup.key" "$tmp/streamdedup.pem" "$secrets/"
  rm -rf "$tmp"
}

listener_config() {
  local client=PLAINTEXT controller=PLAINTEXT
  if [[ "$secure" == 1 ]]; then
    client=SASL_SSL controller=SASL_PLAINTEXT
  fi
  if [[ "$secure" != 1 ]]; then
    cat <<EOT
listeners=$client://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=$client://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=$client
listener.security.protocol.map=$client:$client,CONTROLLER:$controller
EOT
    return
  fi
  cat <<EOT
listeners=$client://127.0.0.1:$port,MTLS://127.0.0.1:$mport,CONTROLLER://127.0.0.1:$cport
advertised.listeners=$client://127.0.0.1:$port,MTLS://127.0.0.1:$mport
controller.listener.names=CONTROLLER
inter.broker.listener.name=$client
listener.security.protocol.map=$client:$client,MTLS:SSL,CONTROLLER:$controller
EOT
  local admin_pw user_pw store_pass
  admin_pw="$(cat "$secrets/admin.password")"
  user_pw="$(cat "$secrets/streamdedup.password")"
  store_pass="$(cat "$secrets/store.password")"
  cat <<EOT
# --secure: clients speak TLS and SASL (SCRAM-SHA-512 or PLAIN) on the client port;
# the controller port takes SASL/PLAIN from the admin only (this node talks to itself there).
sasl.enabled.mechanisms=SCRAM-SHA-512,PLAIN
sasl.mechanism.inter.broker.protocol=PLAIN
sasl.mechanism.controller.protocol=PLAIN
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="$admin_pw" user_admin="$admin_pw" user_streamdedup="$user_pw";
listener.name.controller.sasl.enabled.mechanisms=PLAIN
listener.name.controller.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="$admin_pw" user_admin="$admin_pw";
ssl.keystore.type=PKCS12
ssl.keystore.location=$secrets/broker.p12
ssl.keystore.password=$store_pass
ssl.key.password=$store_pass
ssl.truststore.type=PKCS12
ssl.truststore.location=$secrets/truststore.p12
ssl.truststore.password=$store_pass
ssl.client.auth=none
# The mutual-TLS port: a client certificate is required, and its CN is the user (CN=streamdedup: User:streamdedup).
listener.name.mtls.ssl.client.auth=required
ssl.principal.mapping.rules=RULE:^CN=([^,]*)\$/\$1/,DEFAULT

# Least privilege: nothing is allowed that an ACL does not grant, except to the admin.
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:admin
EOT
}

# The SCRAM users, as StorageTool arguments: written into the metadata log when the storage is formatted.
scram_users() {
  local name
  for name in admin streamdedup; do
    printf -- '--add-scram\nSCRAM-SHA-512=[name=%s,password=%s]\n' "$name" "$(cat "$secrets/$name.password")"
  done
}

if [[ "$secure" == 1 && ! -d "$secrets" ]]; then
  make_secrets
fi
if [[ "$secure" == 1 && ! -f "$secrets/streamdedup.pem" ]]; then
  make_client_cert  # also for a data dir made before the mutual-TLS port existed
fi

# Config is rewritten on every start; data in $kafkalogs is kept. A --secure one holds passwords.
(umask 077; : >"$props")
cat >"$props" <<EOF
# Written by streamdedup deploy/kafka/start.sh; rewritten on every start.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
$(listener_config)
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
  scram=()
  if [[ "$secure" == 1 ]]; then mapfile -t scram < <(scram_users); fi
  java -Xmx256m "-Dlog4j2.configurationFile=$data/log4j2-tools.properties" \
    -cp "$cp" kafka.tools.StorageTool \
    format --ignore-formatted -t "$cluster_id" -c "$props" "${scram[@]}" >"$logdir/format.out" 2>&1 || {
      cat "$logdir/format.out" >&2
      log "storage format failed"
      exit 1
    }
fi

# Keep the previous run's log apart, so the readiness check below only
# sees lines from this run.
[[ -f "$logdir/server.log" ]] && mv -f "$logdir/server.log" "$logdir/previous-server.log"
rm -f "$logdir"/server-*.log

log "starting Kafka broker on 127.0.0.1:$port ($([[ "$secure" == 1 ]] && echo "TLS + SASL, ACLs on; mutual TLS on $mport" || echo plaintext); controller $cport, data dir $data)"
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
  if grep -qF "Kafka Server started" "$logdir/server.log" 2>/dev/null && listener_ready; then
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
