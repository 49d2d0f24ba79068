# Shared by the overhead scripts (sourced, not run): the request they send, waiting for a
# server, and the statistics they print.

URL_PATH=/books/9781593278281

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
