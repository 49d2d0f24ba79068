#!/usr/bin/env bash
# The rate-limit layer's cost in the real server, in user-space instructions per request:
# the noise-free complement of overhead.sh (benches/README.md). A manual benchmark:
# not run by CI or by `cargo test`.
#
#   cargo build --release -p bookshelf -p bucket4rs-http-benches
#   benches/http/scripts/overhead-instructions.sh [BINARY] [FLOOR_BINARY]
#   benches/http/scripts/overhead-instructions.sh --help     # this text
#
# Each side runs alone under callgrind with one tokio worker: the server with the layer
# (bench plan, never exhausted), the same binary with `--no-limit`, and the header floor
# (src/bin/header_floor.rs: the key read and the two headers with constant values, no
# rate limiting), and, when built, src/bin/governor_peer.rs (PEER=: the same routes behind
# tower_governor, the closest Rust peer; or another server taking `--addr`, such as
# src/bin/limiter_floor.rs, the bare limiter). `wrk` warms it up, the counters are zeroed,
# `wrk` drives it for $DURATION, and the instructions executed since are divided by the
# requests `wrk` counted.
# Kernel time is not counted, and under valgrind `FastClock` reads the clock through
# `clock_gettime` (about 90 instructions more per request than natively). The counts repeat
# to about 0.1 % whatever else runs on the machine.
#
# With KEEP=DIR the callgrind dumps are kept there. With TOP=N each side's N functions of
# largest own cost per request are printed (callgrind-self.awk), in TOP_EVENT
# (default Ir, or DLmr with CACHE=1: last-level data read misses, where many keys' cost is);
# on a build with line tables (CARGO_PROFILE_RELEASE_DEBUG=line-tables-only) the functions
# inlined into others are named too.
#
# With CACHE=1 callgrind also simulates the caches (`--cache-sim=yes`, the host's L1 sizes)
# and each side's misses per request are printed: L1 instruction misses (I1mr: the 64-byte
# lines of code fetched anew; this server's request path does not fit in a 32 KiB L1i, so
# each line of code a request executes is one miss) and L1 data read and write misses
# (D1mr, D1mw). They track the loss over the network better than instructions do.
#
# With KEYS=N every request carries the next of N client keys (common.sh, `keys_mode`).
# Under valgrind the server answers ~2,000 requests per second, so the 3 s warm-up visits
# every key only for N up to ~6,000; with more, the run also counts the keys' creation.
# CACHE_OPTS adds callgrind options, e.g. CACHE_OPTS=--LL=262144,8,64 for a last level
# smaller than the host's (a key count that fits a simulated run then misses it as many
# keys miss a real L2).
#
# With REFUSED=1 only the layer's side runs, on a plans file giving `bench-key` one token per
# hour, so that every measured request is refused (429 with its problem+json body): the
# instructions per refused request.
#
# Needs: valgrind (callgrind_control), wrk, curl, ports 18090-18093 free.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
# shellcheck source=common.sh
. "$(dirname "$0")/common.sh"
usage_if_asked "$@"
[ $# -le 2 ] || usage_error "at most two arguments: [BINARY] [FLOOR_BINARY]"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${1:-$TARGET/release/bookshelf}
FLOOR=${2:-$TARGET/release/header_floor}
PEER=${PEER:-$TARGET/release/governor_peer}
PLANS=${PLANS:-$ROOT/benches/http/bench-plans.toml}
DURATION=${DURATION:-10s}

for b in "$BIN" "$FLOOR"; do
    [ -x "$b" ] || {
        echo "no binary at $b (cargo build --release -p bookshelf -p bucket4rs-http-benches)" >&2
        exit 1
    }
done
# Absolute: valgrind runs them from the output directory.
BIN=$(realpath "$BIN")
FLOOR=$(realpath "$FLOOR")
if [ -x "$PEER" ]; then
    PEER=$(realpath "$PEER")
else
    echo "no peer at $PEER: left out (cargo build --release -p bookshelf -p bucket4rs-http-benches)" >&2
    PEER=
fi
for c in valgrind callgrind_control callgrind_annotate wrk curl; do
    command -v "$c" > /dev/null || { echo "$c is not installed" >&2; exit 1; }
done

CACHE_SIM=
[ "${CACHE:-0}" = 1 ] && CACHE_SIM="--cache-sim=yes ${CACHE_OPTS:-}"
OUT=${KEEP:-$(mktemp -d)}
mkdir -p "$OUT"
VPID=
cleanup() {
    [ -n "$VPID" ] && kill "$VPID" 2> /dev/null || true
    wait 2> /dev/null || true
    [ -n "${KEEP:-}" ] || rm -rf "$OUT"
    keys_cleanup
}
trap cleanup EXIT
keys_mode

measure() { # name port binary args... -> "instructions_per_request requests [events per request...]"
    local name=$1 port=$2
    shift 2
    (cd "$OUT" && TOKIO_WORKER_THREADS=1 exec valgrind --tool=callgrind $CACHE_SIM \
        --callgrind-out-file="$OUT/$name.out" "$@" --addr "127.0.0.1:$port" \
        > "$OUT/$name.log" 2>&1) &
    VPID=$!
    # valgrind starts slowly
    wait_for_server "$port" "$OUT/$name.log" 400
    local url="http://127.0.0.1:$port$URL_PATH"
    wrk -t1 -c8 -d3s "${WRK_KEY[@]}" "$url" > /dev/null
    callgrind_control -z "$VPID" > /dev/null 2>&1
    local out n
    out=$(wrk -t1 -c8 -d"$DURATION" "${WRK_KEY[@]}" "$url")
    if [ "${REFUSED:-0}" != 1 ] && echo "$out" | grep -q 'Non-2xx'; then
        echo "non-2xx responses from $name" >&2
        exit 1
    fi
    n=$(echo "$out" | awk '/requests in/ {print $1}')
    callgrind_control -d "$VPID" > /dev/null 2>&1
    local dump
    for _ in $(seq 50); do
        dump=$(ls "$OUT/$name.out".* 2> /dev/null | head -1 || true)
        [ -n "$dump" ] && break
        sleep 0.2
    done
    kill -INT "$VPID" 2> /dev/null || true
    wait "$VPID" 2> /dev/null || true
    VPID=
    # The totals line: each event's count followed by its share, e.g. "123 (100.0%) 45 (100.0%)".
    callgrind_annotate "$dump" 2> /dev/null | awk -v n="$n" '/PROGRAM TOTALS/ {
        sub(/ *PROGRAM TOTALS.*/, ""); gsub(/\([^)]*\)/, ""); gsub(",", "")
        printf "%.0f %d", $1 / n, n
        for (i = 2; i <= NF; i++) printf " %.1f", $i / n
        printf "\n"
    }'
}

if [ "${REFUSED:-0}" = 1 ]; then
    PLANS=$OUT/refused-plans.toml
    {
        echo '[plans.tiny]'
        echo 'limits = [{ id = "tiny", capacity = 1, refill = 1, period = "1h" }]'
        echo '[keys]'
        echo 'bench-key = "tiny"'
    } > "$PLANS"
    read -r REFUSED_I NR _ < <(measure with 18091 "$BIN" --plans "$PLANS")
    echo "user-space instructions per refused request (requests counted: $NR): $REFUSED_I"
    exit 0
fi
read -r WITHOUT NW WO_EV < <(measure without 18090 "$BIN" --no-limit)
read -r WITH NL WI_EV < <(measure with 18091 "$BIN" --plans "$PLANS")
read -r FLOORI NF FL_EV < <(measure floor 18092 "$FLOOR")
PEERI=0 NP=0 PE_EV=
[ -z "$PEER" ] || read -r PEERI NP PE_EV < <(measure peer 18093 "$PEER")

echo "user-space instructions per request (requests counted: $NW, $NL, $NF${PEER:+, $NP}):"
awk -v w="$WITH" -v o="$WITHOUT" -v f="$FLOORI" -v p="$PEERI" -v pn="$(basename "${PEER:-peer}")" 'BEGIN {
    printf "  without the layer (--no-limit): %d\n", o
    printf "  with the layer:                 %d  (+%d, +%.1f %%)\n", w, w - o, (w - o) / o * 100
    printf "  header floor:                   %d  (+%d, +%.1f %%)\n", f, f - o, (f - o) / o * 100
    printf "  the layer beyond the floor:     %d\n", w - f
    if (p > 0) printf "  %-32s%d  (+%d, +%.1f %%)\n", "peer (" pn "):", p, p - o, (p - o) / o * 100
}'
if [ -n "${TOP:-}" ]; then
    ev=${TOP_EVENT:-$([ -n "$CACHE_SIM" ] && echo DLmr || echo Ir)}
    echo "each side's $TOP functions of largest own $ev per request:"
    for side in "without:$NW" "with:$NL" "floor:$NF" ${PEER:+"peer:$NP"}; do
        echo "  ${side%%:*}:"
        dump=$(ls "$OUT/${side%%:*}.out".* | head -1)
        awk -v ev="$ev" -v n="${side#*:}" -f "$(dirname "$0")/callgrind-self.awk" "$dump" |
            sort -rn | awk -v t="$TOP" 'NR <= t { print "    " $0 }'
    done
fi
if [ -n "$CACHE_SIM" ]; then
    # Events after Ir: Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw (per request).
    echo "misses per request (simulated): L1 code lines (I1mr), L1 data reads and writes"
    echo "(D1mr, D1mw), last-level data reads and writes (DLmr, DLmw):"
    for side in "without:$WO_EV" "with:$WI_EV" "floor:$FL_EV" ${PEER:+"peer:$PE_EV"}; do
        echo "${side%%:*} ${side#*:}" | awk '{ printf "  %-8s I1mr %7.1f  D1mr %6.1f  D1mw %6.1f  DLmr %5.1f  DLmw %5.1f\n", $1, $4, $5, $6, $8, $9 }'
    done
fi
