#!/usr/bin/env bash
# The rate-limit layer's HTTP throughput loss, measured as benches/README.md ("HTTP
# overhead") describes. A manual benchmark: not run by CI or by `cargo test`.
#
#   cargo build --release -p bookshelf -p bucket4rs-http-benches
#   benches/http/scripts/overhead.sh [ROUNDS] [BINARY] [BASELINE_BINARY]
#   benches/http/scripts/overhead.sh --help     # this text
#
# Two servers of the same binary run pinned to core 0 with one tokio worker: one with the
# layer (bench plan, never exhausted, so every request takes the full allowed path) and one
# with `--no-limit`. In each round, `wrk` (pinned to core 1) drives each side for 2 s, in an
# order rotated every round; the loss of the round is 1 - with/without. Prints every round,
# then the median and quartiles of the loss, the median req/s and server CPU per request of
# each side, and the load before and after. With BASELINE_BINARY (e.g. an older build), a
# third server runs that binary with the layer in the same rounds, compared with the same
# `without` side. With FLOOR=path (target/release/header_floor: the key read and the two headers
# with constant values, no rate limiting), a fourth server runs it in the same rounds: the
# cost of sending the headers at all.
#
# Needs: wrk, taskset, nice -n -15 (root, or drop NICE below), ports 18080-18082 free.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
# shellcheck source=common.sh
. "$(dirname "$0")/common.sh"
usage_if_asked "$@"
[ $# -le 3 ] || usage_error "at most three arguments: [ROUNDS] [BINARY] [BASELINE_BINARY]"
ROUNDS=${1:-16}
whole_number ROUNDS "$ROUNDS"
BIN=${2:-${CARGO_TARGET_DIR:-$ROOT/target}/release/bookshelf}
BASE=${3:-}
FLOOR=${FLOOR:-}
PLANS=${PLANS:-$ROOT/benches/http/bench-plans.toml}
DURATION=${DURATION:-2s}
NICE=${NICE:-nice -n -15}
TICKS=$(getconf CLK_TCK)

[ -x "$BIN" ] || { echo "no binary at $BIN (cargo build --release -p bookshelf)" >&2; exit 1; }
command -v wrk > /dev/null || { echo "wrk is not installed" >&2; exit 1; }

PIDS=()
trap stop_servers EXIT

start() { # name binary port args...
    local name=$1 bin=$2 port=$3
    shift 3
    TOKIO_WORKER_THREADS=1 $NICE taskset -c 0 "$bin" --addr "127.0.0.1:$port" "$@" \
        > "/tmp/overhead-$name.log" 2>&1 &
    PIDS+=($!)
    eval "PID_$name=$!"
    wait_for_server "$port" "/tmp/overhead-$name.log"
}

cpu_ticks() { # pid: utime + stime
    awk '{print $14 + $15}' "/proc/$1/stat"
}

run() { # name port -> "req/s cpu_us_per_request"
    local name=$1 port=$2 pid before after out reqs rps
    pid=$(eval "echo \$PID_$name")
    before=$(cpu_ticks "$pid")
    out=$($NICE taskset -c 1 wrk -t1 -c32 -d"$DURATION" -H 'X-API-Key: bench-key' \
        "http://127.0.0.1:$port$URL_PATH")
    after=$(cpu_ticks "$pid")
    reqs=$(echo "$out" | awk '/requests in/ {print $1}')
    rps=$(echo "$out" | awk '/^Requests\/sec/ {print $2}')
    if echo "$out" | grep -q 'Non-2xx'; then
        echo "non-2xx responses from $name" >&2
        exit 1
    fi
    awk -v r="$rps" -v n="$reqs" -v t="$((after - before))" -v hz="$TICKS" \
        'BEGIN { printf "%.0f %.2f\n", r, t / hz * 1e6 / n }'
}

echo "load before: $(uptime)"
start with "$BIN" 18080 --plans "$PLANS"
start without "$BIN" 18081 --no-limit
SIDES=(with without)
if [ -n "$BASE" ]; then
    start base "$BASE" 18082 --plans "$PLANS"
    SIDES+=(base)
fi
if [ -n "$FLOOR" ]; then
    start floor "$FLOOR" 18083
    SIDES+=(floor)
fi
declare -A PORT=([with]=18080 [without]=18081 [base]=18082 [floor]=18083)
# warm-up
for s in "${SIDES[@]}"; do
    $NICE taskset -c 1 wrk -t1 -c32 -d1s -H 'X-API-Key: bench-key' \
        "http://127.0.0.1:${PORT[$s]}$URL_PATH" > /dev/null
done

RES=$(mktemp)
for r in $(seq "$ROUNDS"); do
    n=${#SIDES[@]}
    declare -A RPS=() CPU=()
    for i in $(seq 0 $((n - 1))); do
        s=${SIDES[$(((i + r) % n))]}
        read -r RPS[$s] CPU[$s] < <(run "$s" "${PORT[$s]}")
    done
    line="round $r:"
    for s in "${SIDES[@]}"; do line="$line $s ${RPS[$s]} req/s ${CPU[$s]} us/req;"; done
    loss=$(awk -v a="${RPS[with]}" -v b="${RPS[without]}" 'BEGIN { printf "%.2f", (1 - a / b) * 100 }')
    line="$line loss $loss %"
    echo "with ${RPS[with]} ${CPU[with]} without ${RPS[without]} ${CPU[without]} loss $loss" >> "$RES"
    if [ -n "$BASE" ]; then
        bloss=$(awk -v a="${RPS[base]}" -v b="${RPS[without]}" 'BEGIN { printf "%.2f", (1 - a / b) * 100 }')
        line="$line baseline loss $bloss %"
        echo "base ${RPS[base]} ${CPU[base]} baseloss $bloss" >> "$RES"
    fi
    if [ -n "$FLOOR" ]; then
        floss=$(awk -v a="${RPS[floor]}" -v b="${RPS[without]}" 'BEGIN { printf "%.2f", (1 - a / b) * 100 }')
        line="$line floor loss $floss %"
        echo "floor ${RPS[floor]} ${CPU[floor]} floorloss $floss" >> "$RES"
    fi
    echo "$line"
done

echo "rounds: $ROUNDS of $DURATION per side"
echo "loss (with layer vs --no-limit), %: $(awk '$1 == "with" {print $8}' "$RES" | stats)"
echo "req/s with: $(awk '$1 == "with" {print $2}' "$RES" | stats), without: $(awk '$1 == "with" {print $5}' "$RES" | stats)"
echo "server CPU us/request with: $(awk '$1 == "with" {print $3}' "$RES" | stats), without: $(awk '$1 == "with" {print $6}' "$RES" | stats)"
if [ -n "$BASE" ]; then
    echo "baseline loss, %: $(awk '$1 == "base" {print $5}' "$RES" | stats)"
    echo "baseline req/s: $(awk '$1 == "base" {print $2}' "$RES" | stats), CPU us/request: $(awk '$1 == "base" {print $3}' "$RES" | stats)"
fi
if [ -n "$FLOOR" ]; then
    echo "header floor loss, %: $(awk '$1 == "floor" {print $5}' "$RES" | stats)"
    echo "header floor req/s: $(awk '$1 == "floor" {print $2}' "$RES" | stats), CPU us/request: $(awk '$1 == "floor" {print $3}' "$RES" | stats)"
fi
echo "load after: $(uptime)"
rm -f "$RES"
