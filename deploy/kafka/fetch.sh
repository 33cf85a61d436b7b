#!/usr/bin/env bash
# Resolve the Kafka broker jars listed in pom.xml from Maven Central into a
# cache folder, once. Prints the folder holding the jars on stdout (all other
# output goes to stderr), so callers can do: LIB="$(fetch.sh)".
#
# Env:
#   KAFKA_CACHE_DIR  folder for the jars
#                    (default ${XDG_CACHE_HOME:-$HOME/.cache}/streamdedup/kafka-<version>/lib)
#
# A marker file is written after a successful copy; when it is present the
# script does nothing (fast, no network).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
pom="$here/pom.xml"

version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$pom" | head -n1)"
if [[ -z "$version" ]]; then
  echo "fetch.sh: cannot read <kafka.version> from $pom" >&2
  exit 1
fi

lib="${KAFKA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/streamdedup/kafka-$version/lib}"
marker="$lib/.fetched-kafka-$version"

if [[ -f "$marker" ]]; then
  echo "$lib"
  exit 0
fi

# An incomplete earlier attempt is replaced below, but only if it holds
# nothing but jars (KAFKA_CACHE_DIR might point at a folder in use).
if [[ -d "$lib" ]] && find "$lib" -mindepth 1 ! -name '*.jar' | grep -q .; then
  echo "fetch.sh: $lib holds files other than jars; refusing to replace it" >&2
  exit 1
fi

command -v mvn >/dev/null || { echo "fetch.sh: mvn not found on PATH" >&2; exit 1; }

# Copy into a private temp folder, then move it into place, so a concurrent
# run or an interrupted download never leaves a half-filled cache behind.
mkdir -p "$(dirname "$lib")"
tmp="$(mktemp -d "$lib.tmp.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

echo "fetch.sh: resolving Kafka $version jars with mvn into $lib ..." >&2
mvn -q -B -f "$pom" dependency:copy-dependencies \
  -DincludeScope=runtime -DoutputDirectory="$tmp" >&2

if ! compgen -G "$tmp/kafka_2.13-$version.jar" >/dev/null; then
  echo "fetch.sh: mvn finished but kafka_2.13-$version.jar is missing" >&2
  exit 1
fi
date -u +%Y-%m-%dT%H:%M:%SZ >"$tmp/$(basename "$marker")"

# Replace an incomplete earlier attempt; keep a complete one that a
# concurrent run finished meanwhile.
if [[ ! -f "$marker" ]]; then
  rm -rf "$lib"
  mv -T "$tmp" "$lib" 2>/dev/null || [[ -f "$marker" ]]
fi
jars=("$lib"/*.jar)
echo "fetch.sh: ${#jars[@]} jars ready in $lib" >&2
echo "$lib"
