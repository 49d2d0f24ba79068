# Shared by the overhead scripts (sourced, not run): their argument checks, the request they
# send, waiting for a server, and the statistics they print.

URL_PATH=/books/9781593278281

# With -h or --help as the first argument: prints the calling script's header comment (its
# usage) and exits.
usage_if_asked() { # "$@"
    case "${1:-}" in
        -h | --help)
            awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
            exit 0
            ;;
    esac
}

# Exits with `message` and a pointer to --help (status 2, a usage error).
usage_error() { # message
    echo "$(basename "$0"): $1 (--help for the usage)" >&2
    exit 2
}

# Exits unless `value` is a whole number, 1 or more (`name` names it in the message).
whole_number() { # name value
    [[ "$2" =~ ^[1-9][0-9]*$ ]] || usage_error "$1 must be a whole number, 1 or more (got \"$2\")"
}

# The client keys `wrk` sends (the array WRK_KEY, its arguments) and the plans file of the
# layer's side (PLANS, preset by the caller): the one key `bench-key` of
# benches/http/bench-plans.toml, or with KEYS=N the next of N keys in turn
# (many-keys.lua beside this file) and a plans file made for them in a temporary file (replacing
# PLANS), which `keys_cleanup` removes.
keys_mode() {
    WRK_KEY=(-H 'X-API-Key: bench-key')
    [ -n "${KEYS:-}" ] || return 0
    PLANS=$(mktemp --suffix .toml)
    # Never exhausted, and refilled so slowly that no key's bucket is full again (and so
    # expires) while the run lasts, however seldom each key comes back.
    {
        echo '[plans.unmetered]'
        echo 'limits = [{ id = "bench", capacity = 1_000_000_000_000, refill = 1, period = "1h" }]'
        echo '[keys]'
        echo 'bench-key = "unmetered"'
        for k in $(seq "$KEYS"); do echo "k$k = \"unmetered\""; done
    } > "$PLANS"
    WRK_KEY=(-s "$(dirname "${BASH_SOURCE[0]}")/many-keys.lua")
    export KEYS
}

keys_cleanup() {
    if [ -n "${KEYS:-}" ]; then rm -f "$PLANS"; fi
}

# Waits until the server on `port` answers the bench request; exits when it does not
# within `tries` tenths of a second (names `log` for the reason).
wait_for_server() { # port log [tries]
    local port=$1 log=$2 tries=${3:-100}
    for _ in $(seq "$tries"); do
        if curl -s -o /dev/null -H 'X-API-Key: bench-key' "http://127.0.0.1:$port$URL_PATH"; then
            return
        fi
        sleep 0.1
    done
    echo "the server on port $port did not start (see $log)" >&2
    exit 1
}

# Stops the servers whose pids are in the array PIDS (for `trap stop_servers EXIT`).
stop_servers() {
    for p in "${PIDS[@]}"; do kill "$p" 2> /dev/null || true; done
    wait 2> /dev/null || true
}

# The median and quartiles (linear interpolation) of the numbers on stdin.
stats() {
    sort -g | awk '{ v[NR] = $1 }
        function q(p,   h, i) { h = (NR - 1) * p + 1; i = int(h);
            return i >= NR ? v[NR] : v[i] + (h - i) * (v[i + 1] - v[i]) }
        END { printf "%.1f (quartiles %.1f-%.1f)", q(0.5), q(0.25), q(0.75) }'
}
