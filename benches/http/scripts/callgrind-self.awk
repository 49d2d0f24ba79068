# Each function's own (exclusive) cost of one event in a callgrind dump, per request:
#   awk -v ev=DLmr -v n=REQUESTS -f callgrind-self.awk DUMP | sort -rn | head
# Prints "cost-per-request function" lines. Reads the dump's own format: `fn=(id) name`
# names a function (ids are shared with `cfn=`), a cost line after `calls=` is the inclusive
# cost of that call (skipped), every other cost line is the current function's own.
# (callgrind_annotate 3.19 attributes everything to the thread's entry point in dumps taken
# with `callgrind_control -d` after `-z`, which is how overhead-instructions.sh takes them.)
/^events:/ {
    for (i = 2; i <= NF; i++) if ($i == ev) col = i
    if (!col) { print "no event " ev " in the dump" > "/dev/stderr"; exit 1 }
    next
}
/^c?fn=/ {
    line = $0
    sub(/^c?fn=/, "", line)
    if (match(line, /^\([0-9]+\)/)) {
        id = substr(line, 1, RLENGTH)
        rest = substr(line, RLENGTH + 1)
        sub(/^ /, "", rest)
        if (rest != "") name[id] = rest
        if ($0 ~ /^fn=/) cur = name[id]
    } else if ($0 ~ /^fn=/) {
        cur = line
    }
    next
}
/^calls=/ { skip = 1; next }
/^[0-9+*-]/ {
    if (skip) { skip = 0; next }
    if (cur != "" && NF >= col) self[cur] += $col
    next
}
END {
    for (f in self) if (self[f] > 0) printf "%.3f %s\n", self[f] / n, f
}
