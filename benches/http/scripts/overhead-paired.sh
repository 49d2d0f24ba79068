#!/usr/bin/env bash
# The rate-limit layer's HTTP throughput loss, measured in pairs run at the same time: the
# method for a machine whose speed drifts from second to second (benches/README.md,
# "HTTP overhead"). A manual benchmark: not run by CI or by `cargo test`.
#
#   cargo build --release -p bookshelf -p bucket4rs-http-benches
#   benches/http/scripts/overhead-paired.sh [ROUNDS] [BINARY] [BASELINE_BINARY]
#   benches/http/scripts/overhead-paired.sh --help     # this text
#
# Every server runs on core 0 with one tokio worker; a pair of servers is driven at the
# same time by two `wrk` (core 1), so both see the same machine, and the scheduler gives
# the two servers equal CPU time: the one that needs more CPU per request serves fewer
# requests. In each round every pair runs for $DURATION, the two `wrk` started in an order
# that alternates between rounds; the loss of a pair is 1 - a/b. The pairs, each against
# `--no-limit`:
#   with   the layer (bench plan, never exhausted: every request takes the allowed path)
#   floor  header_floor (src/bin/header_floor.rs): the key read and the two headers with constant values
#   base   BASELINE_BINARY with the layer (e.g. an older build), if given
#   peer   governor_peer (PEER=, default under the target directory), when built:
#          the same routes behind tower_governor, the closest Rust peer, for a side-by-side
#          figure; or any server of the same routes taking `--addr`, such as limiter_floor
#          (the bare limiter: the floor plus a bucket per key, nothing else)
#   a/a    `--no-limit` against itself: the method's own bias and spread
# Prints every round, then the median and quartiles of each pair's loss (and, with a
# baseline or the peer, of the per-round difference between it and this build).
#
# The equal sharing is an assumption: each round also reads every server's CPU time (the sum
# of its threads' /proc/PID/task/TID/schedstat, in ns) around the run, and prints the CPU
# per request of both sides and the loss it implies at equal CPU, 1 - cpu_b/cpu_a (the
# `cpu` figures), beside the share of the core each side got (`share`, a's part in %).
# The shares stray from 50 % by a few points from round to round, and the requests-based
# loss with them; the CPU-based one is the steadier figure. Its last summary subtracts each
# round's a/a figure (the bias of the method, e.g. the `--no-limit` server that runs in
# every pair against a fresh one) from each pair's.
#
# Every server is started afresh every RESTART rounds (default 1: each round). A server
# process carries a bias of its own for its whole life, of a few percent either way (likely
# where its memory landed in the caches): two `--no-limit` processes of one binary differed
# by 3.0 % at equal CPU over all 30 rounds of one run, and two builds compared with one
# process each came out 2-3 points apart one way in one run and 1-5 the other way in the
# next. Fresh processes every round turn that bias into round-to-round spread, which the
# medians average over.
#
# With KEYS=N every request carries the next of N client keys in turn (many-keys.lua,
# and a plans file made for them in a temporary file): one bucket per key, each read
# cold, as with many clients. Without it every request carries the one key `bench-key`.
#
# Needs: wrk, taskset, nice -n -15 (root, or drop NICE below), ports 18084-18089 free.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
# shellcheck source=common.sh
. "$(dirname "$0")/common.sh"
usage_if_asked "$@"
[ $# -le 3 ] || usage_error "at most three arguments: [ROUNDS] [BINARY] [BASELINE_BINARY]"
ROUNDS=${1:-10}
whole_number ROUNDS "$ROUNDS"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${2:-$TARGET/release/bookshelf}
BASE=${3:-}
FLOOR=${FLOOR:-$TARGET/release/header_floor}
PEER=${PEER:-$TARGET/release/governor_peer}
PLANS=${PLANS:-$ROOT/benches/http/bench-plans.toml}
DURATION=${DURATION:-3s}
RESTART=${RESTART:-1}
whole_number RESTART "$RESTART"
NICE=${NICE:-nice -n -15}

for b in "$BIN" "$FLOOR" ${BASE:+"$BASE"}; do
    [ -x "$b" ] || {
        echo "no binary at $b (cargo build --release -p bookshelf -p bucket4rs-http-benches)" >&2
        exit 1
    }
done
if [ ! -x "$PEER" ]; then
    echo "no peer at $PEER: the peer pair is left out" \
        "(cargo build --release -p bookshelf -p bucket4rs-http-benches)" >&2
    PEER=
fi
command -v wrk > /dev/null || { echo "wrk is not installed" >&2; exit 1; }

keys_mode
PIDS=()
declare -A PID_OF
cleanup() {
    stop_servers
    keys_cleanup
}
trap cleanup EXIT

cpu_ns() { # pid: nanoseconds on a CPU, all threads
    cat /proc/"$1"/task/*/schedstat 2> /dev/null | awk '{ t += $1 } END { printf "%d", t }'
}

start() { # port binary args...
    local port=$1 bin=$2
    shift 2
    TOKIO_WORKER_THREADS=1 $NICE taskset -c 0 "$bin" --addr "127.0.0.1:$port" "$@" \
        > "/tmp/overhead-paired-$port.log" 2>&1 &
    PIDS+=($!)
    PID_OF[$port]=$!
    wait_for_server "$port" "/tmp/overhead-paired-$port.log"
}

PAIRS=("with 18084" "floor 18087" "a/a 18086")
[ -n "$BASE" ] && PAIRS+=("base 18088")
[ -n "$PEER" ] && PAIRS+=("peer 18089")
WITHOUT=18085

drive() { # port duration out
    $NICE taskset -c 1 wrk -t1 -c32 -d"$2" "${WRK_KEY[@]}" \
        "http://127.0.0.1:$1$URL_PATH" > "$3"
}

requests() { # wrk output file
    if grep -q 'Non-2xx' "$1"; then
        echo "non-2xx responses" >&2
        exit 1
    fi
    awk '/requests in/ {print $1}' "$1"
}

A_OUT=$(mktemp)
B_OUT=$(mktemp)
RES=$(mktemp)
CPU_RES=$(mktemp)
# (Re)starts every server, and warms each up.
start_all() {
    stop_servers
    PIDS=()
    start 18084 "$BIN" --plans "$PLANS"
    start 18085 "$BIN" --no-limit
    start 18086 "$BIN" --no-limit
    start 18087 "$FLOOR"
    [ -n "$BASE" ] && start 18088 "$BASE" --plans "$PLANS"
    [ -n "$PEER" ] && start 18089 "$PEER"
    for port in 18084 18085 18086 18087 ${BASE:+18088} ${PEER:+18089}; do
        drive "$port" 1s /dev/null
    done
    [ "$(cpu_ns "${PID_OF[$WITHOUT]}")" -gt 0 ] || {
        echo "no CPU time in /proc/PID/task/TID/schedstat (kernel without schedstats?)" >&2
        exit 1
    }
}

for r in $(seq "$ROUNDS"); do
    [ $(((r - 1) % RESTART)) = 0 ] && start_all
    line="round $r:"
    for pair in "${PAIRS[@]}"; do
        read -r name port <<< "$pair"
        ca0=$(cpu_ns "${PID_OF[$port]}")
        cb0=$(cpu_ns "${PID_OF[$WITHOUT]}")
        if [ $((r % 2)) = 1 ]; then
            drive "$port" "$DURATION" "$A_OUT" &
            p1=$!
            drive "$WITHOUT" "$DURATION" "$B_OUT" &
        else
            drive "$WITHOUT" "$DURATION" "$B_OUT" &
            p1=$!
            drive "$port" "$DURATION" "$A_OUT" &
        fi
        p2=$!
        wait "$p1" "$p2"
        ca=$(($(cpu_ns "${PID_OF[$port]}") - ca0))
        cb=$(($(cpu_ns "${PID_OF[$WITHOUT]}") - cb0))
        a=$(requests "$A_OUT")
        b=$(requests "$B_OUT")
        loss=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", (1 - a / b) * 100 }')
        # CPU per request (ns) of each side, the loss at equal CPU, and a's share of the core.
        read -r pa pb closs share <<< "$(awk -v a="$a" -v b="$b" -v ca="$ca" -v cb="$cb" \
            'BEGIN { pa = ca / a; pb = cb / b;
                     printf "%.0f %.0f %.2f %.1f", pa, pb, (1 - pb / pa) * 100, ca * 100 / (ca + cb) }')"
        echo "$name $loss" >> "$RES"
        echo "$name $closs $r" >> "$CPU_RES"
        line="$line $name $a/$b ${loss} % (cpu $pa/$pb ns ${closs} %, share $share %);"
    done
    echo "$line"
done

echo "rounds: $ROUNDS of $DURATION per pair; loss against --no-limit, %:"
for pair in "${PAIRS[@]}"; do
    read -r name _ <<< "$pair"
    echo "  $name: $(awk -v n="$name" '$1 == n {print $2}' "$RES" | stats)"
done
echo "the same at equal CPU (1 - cpu per request without / with), %:"
for pair in "${PAIRS[@]}"; do
    read -r name _ <<< "$pair"
    echo "  $name: $(awk -v n="$name" '$1 == n {print $2}' "$CPU_RES" | stats)"
done
echo "at equal CPU, less the same round's a/a (the method's bias taken out), %:"
for pair in "${PAIRS[@]}"; do
    read -r name _ <<< "$pair"
    [ "$name" = a/a ] && continue
    echo "  $name: $(awk -v n="$name" '$1 == "a/a" { aa[$3] = $2 } $1 == n { v[$3] = $2 }
        END { for (r in v) print v[r] - aa[r] }' "$CPU_RES" | stats)"
done
# Another side compared with this build round by round: its loss less this build's, at
# equal CPU (positive: this build lost less).
compare() { # name
    local diffs lower
    diffs=$(awk -v n="$1" '$1 == "with" { w[$3] = $2 } $1 == n { b[$3] = $2 }
        END { for (r in b) print b[r] - w[r] }' "$CPU_RES")
    lower=$(echo "$diffs" | awk '$1 > 0 { n++ } END { printf "%d", n }')
    echo "$1 - with, per round at equal CPU (points): $(echo "$diffs" | stats);" \
        "with lost less in $lower of $ROUNDS rounds"
}
if [ -n "$BASE" ]; then compare base; fi
if [ -n "$PEER" ]; then compare peer; fi
rm -f "$A_OUT" "$B_OUT" "$RES" "$CPU_RES"
