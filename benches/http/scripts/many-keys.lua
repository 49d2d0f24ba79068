-- wrk script for the overhead scripts' KEYS mode: each request carries the next of $KEYS
-- client keys (k1, k2, ... in turn), so the server keeps one bucket per key and every key
-- comes back only after all the others: the map, the plan table and the buckets are read
-- cold, as with many clients. The requests are formatted once, in init.
local n = tonumber(os.getenv("KEYS") or "10000")
local requests = {}
local i = 0

function init(args)
    for k = 1, n do
        requests[k] = wrk.format(nil, nil, { ["X-API-Key"] = "k" .. k })
    end
end

function request()
    i = i % n + 1
    return requests[i]
end
