-- bucket4rs: one operation on one bucket record, atomically (see docs/distributed.md).
--
-- KEYS[1]  the bucket key
-- ARGV[1]  command code (0: none, just return the record for the client to compute)
-- ARGV[2]  tokens / limit (-1: no limit)        ARGV[3]  max wait (reserve)
-- ARGV[4]  now high 32 bits, ARGV[5] now low 32 bits (both '' : use TIME)
-- ARGV[6]  TTL margin, whole milliseconds (at most 4e15), ARGV[7] the margin's nanoseconds
--          below a millisecond
-- ARGV[8]  the caller's deadline in microseconds of this server's clock ('' : none): past
--          it the script writes nothing and answers status 4
-- ARGV[9]  the operation's owner (8 bytes; '' : no operation id, the ledger is kept as it is)
-- ARGV[10] its sequence number, ARGV[11] the owner's floor, ARGV[12] the entry's lifetime
--          (units of 2^20 ns)
-- A batch (ARGV[1] = 11): ARGV[13..] holds (command code, tokens, max wait) triples, applied
-- in order on the record at one instant; written once at the end, or not at all when any
-- of them cannot be computed exactly here (status 2: the client computes the whole batch).
-- Code 12 is a lease: this process's share (the triple's third field: how many processes
-- share it) of what every bandwidth has, up to `tokens`, while the ledger holds fewer than 24
-- leases of other managers (the manager's leasing, manager/lease/).
--
-- The ledger (format version 2, ledger.rs): a write forgets expired entries, refuses an
-- operation already recorded (status 5, nothing written), forgets the owner's entries below
-- its floor (tombstones stay), clamps every give-back to the room below capacity after the
-- refill (and after add_tokens / reset), and records what this operation took. Settlements
-- are computed by the client (code 0).
--
-- Returns {status, now_hi, now_lo, time_s, time_us [, pre-image [, post-image]]}, time_* being
-- this server's TIME when the script ran:
--   0 absent (nothing written), 1 done (post-image present iff written),
--   2 not computed here (exactness not guaranteed, a record this script does not fully
--     validate, or code 0): nothing written, the client decodes with the Rust core (which
--     rejects a bad record with a typed error) and compare-and-sets,
--   3 wrong type (pre-image slot holds the type name), 4 past the deadline (nothing read or
--     written), 5 the operation is in the ledger already (applied or settled: not run again).
--
-- Validation: the fast path runs only on a record the client's decoder accepts: magic,
-- version, header flags, bandwidth count, block flags and padding, refill kind, every field's
-- range, the tail (initial tokens, first refill, ids), the exact length and the FNV-1a
-- checksum. Anything else goes to the client (status 2), so such a record is never rewritten
-- and its TTL never reset.
--
-- Exactness: Lua numbers are IEEE doubles, exact for integers up to 2^53 in magnitude. Every
-- value this script keeps, compares or writes is an integer within +-(2^53 - 1): the client
-- sends only arguments below 2^53 (larger ones go to the client path, code 0; a reserve's
-- maximum wait and the deadline are capped at 2^53 - 1, which no wait or reading here
-- reaches, so no answer changes); 64-bit fields are read as two 32-bit halves and combined
-- only when the value is within that range (`small`, `minus_now`); clock readings stay as
-- (hi, lo) pairs. Remainders use math.fmod (exact) and quotients (a - fmod(a, b)) / b
-- (exact). A sum or product of such values is compared with a bound that is itself exact
-- (+-2^53, or a capacity below it) before it is used: when the true value is at or past the
-- bound, the rounded double is too (rounding is monotone), so the check catches it; a value
-- that passes is below 2^53 in magnitude, hence exact, and only then kept.
-- Whenever a check fails, the script returns status 2 instead of guessing, and the client
-- computes with the Rust core: the answer is never computed inexactly.
--
-- Expiry: the TTL runs to the moment a record recreated from the configuration would answer
-- every later request exactly as this one (the core's BucketState::forgettable_at), plus the
-- margin; a state for which no such moment exists is stored without expiry.

-- Replicate the writes, not the script (it reads TIME); the default from Redis 5 on.
if redis.replicate_commands then redis.replicate_commands() end

-- Redis runs this whole body for every call: the library functions it uses are looked up
-- once, here.
local sunpack, spack, byte, sub = struct.unpack, struct.pack, string.byte, string.sub
local bxor, floor, fmod = bit.bxor, math.floor, math.fmod
local P32 = 4294967296
local LIM = 9007199254740992 -- 2^53
local key = KEYS[1]

local t = redis.call('TIME')
local ts, tus = tonumber(t[1]), tonumber(t[2])
if ARGV[8] ~= '' and ts * 1000000 + tus > tonumber(ARGV[8]) then
  return {4, 0, 0, ts, tus}
end

local nh, nl
if ARGV[4] == '' then
  local s, us = ts, tus
  local sh = floor(s / 65536)
  local sl = s - sh * 65536
  local x = sh * 1000000000              -- < 2^45; the value is x * 2^16
  local xh = floor(x / 65536)
  local xl = (x - xh * 65536) * 65536
  local y = sl * 1000000000 + us * 1000  -- < 2^47
  local yh = floor(y / P32)
  nl = xl + (y - yh * P32)
  nh = xh + yh
  if nl >= P32 then nl = nl - P32; nh = nh + 1 end
else
  nh, nl = tonumber(ARGV[4]), tonumber(ARGV[5])
end

local ok, rec = pcall(redis.call, 'GET', key)
if not ok then
  return {3, 0, 0, ts, tus, redis.call('TYPE', key)['ok']}
end
if not rec then return {0, nh, nl, ts, tus} end
local function client() return {2, nh, nl, ts, tus, rec} end
local cmds = {}
if ARGV[1] == '11' then
  for j = 13, #ARGV - 2, 3 do cmds[#cmds + 1] = {tonumber(ARGV[j]), ARGV[j + 1], ARGV[j + 2]} end
else
  cmds[1] = {tonumber(ARGV[1]), ARGV[2], ARGV[3]}
end
for j = 1, #cmds do
  if cmds[j][1] == 0 then return client() end
end
if #rec < 12 or sub(rec, 1, 6) ~= 'b4rs\2\0' then return client() end
local n = sunpack('>I2', rec, 7)
if n < 1 or n > 16 or #rec < 12 + 56 * n then return client() end

-- (h, l), the halves of a signed 64-bit field, as an exact number, or nil outside
-- +-(2^53 - 1): h * 2^32 + l is exact for -2^21 <= h < 2^21 (at most 2^53 in magnitude), and
-- -2^53 itself is refused
local function small(h, l)
  if h >= 2097152 or h < -2097152 then return nil end
  local v = h * P32 + l
  if v <= -LIM then return nil end
  return v
end

-- FNV-1a (32 bits) of the record's bytes i..j from hash `h`, any number congruent to it mod
-- 2^32 within +-2^51; the result is such a number too (take it % 2^32). bit.bxor works on its
-- arguments mod 2^32 (exactly within +-2^51) and answers a signed 32-bit number x; then
-- h * 0x01000193 = (x mod 2^8) * 2^24 + x * 403 mod 2^32, below 2^41 in magnitude: exact, and
-- reduced by the next bxor. The bytes are fetched 256 at a time: one call per slice rather
-- than one per byte.
local function fnv(h, i, j)
  while i <= j do
    local e = i + 255
    if e > j then e = j end
    local b = {byte(rec, i, e)}
    for k = 1, #b do
      h = bxor(h, b[k])
      h = h % 256 * 16777216 + h * 403
    end
    i = e + 1
  end
  return h
end

-- Everything the client's decoder checks (format.rs `decode`), before anything is computed:
-- a record it would reject goes to the client untouched. B[i] holds bandwidth i: its kind,
-- capacity c, refill tokens t and period p, whether it has explicit initial tokens (fi) and
-- their value (init, nil when 2^53 or more), and its stored state (lh, ll: last refill as
-- halves; s, e: tokens and remainder; the same as stored in lh0, ll0, s0, e0). Each block is
-- read with one unpack. TAIL_END is where the ledger starts.
local B = {}
local TAIL_END
do
  local pos = 13 + 56 * n
  local sum = fnv(2166136261, 1, 8)
  local ids = {}
  for i = 1, n do
    local base = 13 + 56 * (i - 1)
    local kind, flags, pad, ch, cl, th, tl, ph, pl, lh, ll, sh, sl, eh, el =
      sunpack('>BBc6i4I4i4I4i4I4i4I4i4I4i4I4', rec, base)
    if pad ~= '\0\0\0\0\0\0' or flags > 7 or kind > 2 then return client() end
    local fi, fa, fid = flags % 2, floor(flags / 2) % 2, floor(flags / 4)
    if fa == 1 and (kind ~= 2 or fi == 1) then return client() end
    local c, t, p = small(ch, cl), small(th, tl), small(ph, pl)
    if not (c and t and p) or c < 1 or t < 1 or p < 1 or t > p then return client() end
    local s, e = small(sh, sl), small(eh, el)
    if not (s and e) or e < 0 or e >= p or (kind ~= 0 and e ~= 0) then return client() end
    sum = fnv(sum, base, base + 31)
    local b = {kind = kind, c = c, t = t, p = p, fi = fi, lh = lh, ll = ll, s = s, e = e,
      lh0 = lh, ll0 = ll, s0 = s, e0 = e}
    if fi == 1 then
      if pos + 7 > #rec then return client() end
      local h, l = sunpack('>i4I4', rec, pos)
      if h < 0 then return client() end
      b.init = small(h, l)
      pos = pos + 8
    end
    if kind == 2 then
      if pos + 7 > #rec then return client() end
      local f = small(sunpack('>i4I4', rec, pos))
      if f == nil or f < 0 or fmod(f, 1000000) ~= 0 then return client() end
      pos = pos + 8
    end
    if fid == 1 then
      if pos + 1 > #rec then return client() end
      local len = sunpack('>I2', rec, pos)
      local id = sub(rec, pos + 2, pos + 1 + len)
      -- ASCII ids only here (valid UTF-8 for certain); others go to the client
      if #id ~= len or string.find(id, '[\128-\255]') or ids[id] then return client() end
      ids[id] = true
      pos = pos + 2 + len
    end
    B[i] = b
  end
  TAIL_END = pos
  sum = fnv(sum, 13 + 56 * n, TAIL_END - 1)
  if sum % P32 ~= sunpack('>I4', rec, 9) then return client() end
end

-- L - now, exact, or nil when it may not fit within +-(2^53 - 1): with |dh| < 2^21, dh * 2^32
-- is within +-(2^53 - 2^32) and ll - nl within +-(2^32 - 1), so the sum is within
-- +-(2^53 - 1). (dh = -2^21 used to be let through: L - now down to -2^53 - 2^32 + 1, rounded,
-- and the refill charged for a state the client then rejected.) Nil when dh >= 2^21 means L
-- is ahead of now by more than 2^53 - 2^32; nil when dh <= -2^21, behind by more.
local function minus_now(lh, ll)
  local dh = lh - nh
  if dh >= 2097152 or dh <= -2097152 then return nil end
  return dh * P32 + (ll - nl)
end

-- refill to now (SEMANTICS 4.1); xt, xr: the refill before the cap, for the ledger's levels
-- (x_plus in ledger.rs; nil: no refill, false: 2^53 or more)
for i = 1, n do
  local b = B[i]
  local c, t, p, lh, ll, s, e = b.c, b.t, b.p, b.lh, b.ll, b.s, b.e
  local el = minus_now(lh, ll)
  if el == nil then
    if lh - nh < 0 then return client() end -- now far ahead of L: too long a gap
    el = -1                                 -- L far ahead of now: no refill
  else
    el = -el
  end
  if el > 0 then
    local d = el
    if b.kind ~= 0 then d = el - fmod(el, p) end
    if d > 0 then
      local dH = floor(d / P32)
      ll = ll + (d - dH * P32)
      lh = lh + dH
      if ll >= P32 then ll = ll - P32; lh = lh + 1 end
      if s < c then
        local td = t * d
        if td >= LIM then return client() end
        local v = td + e
        if v >= LIM then return client() end
        local r = fmod(v, p)
        local add = (v - r) / p
        local xt = s + add
        if xt >= LIM then xt = false end
        b.xt, b.xr = xt, r
        if s + add >= c then s = c; e = 0 else s = s + add; e = r end
      end
    end
  end
  b.lh, b.ll, b.s, b.e, b.rs, b.re = lh, ll, s, e, s, e
end

-- wait until `deficit` more tokens (SEMANTICS 5.1); nil when not exact here. `deficit` may
-- come from a difference checked only here (capacity - tokens: up to 2^54).
local function wait_for(b, deficit)
  if deficit >= LIM then return nil end
  local lmn = minus_now(b.lh, b.ll)
  if lmn == nil then return nil end
  if b.kind ~= 0 then
    local r = fmod(deficit, b.t)
    local q = (deficit - r) / b.t
    if r > 0 then q = q + 1 end
    local w = (q - 1) * b.p
    if w >= LIM then return nil end
    w = w + b.p                 -- both below 2^53
    if w >= LIM then return nil end
    w = w + lmn                 -- 0 < w < 2^53, |lmn| < 2^53: above -2^53
    if w >= LIM then return nil end
    if w < 0 then w = 0 end
    return w
  end
  local gap = lmn
  if gap < 0 then gap = 0 end
  -- ceil((P * deficit - e) / T) without forming P * deficit: with P = T * qp + rp it is
  -- qp * deficit + ceil((rp * deficit - e) / T), each term checked below 2^53.
  local rp = fmod(b.p, b.t)
  local qp = (b.p - rp) / b.t
  local whole, part = qp * deficit, rp * deficit
  if whole >= LIM or part >= LIM then return nil end
  local x = part - b.e
  local r = fmod(x, b.t)
  local q = (x - r) / b.t
  if r > 0 then q = q + 1 end
  q = whole + q
  if q >= LIM then return nil end
  local w = gap + q
  if w >= LIM then return nil end
  return w
end

-- non-strict request wait (SEMANTICS 5.2)
local function request_wait(tokens)
  local W = 0
  for i = 1, n do
    local b = B[i]
    if tokens > b.s then
      local deficit = tokens - b.s
      if deficit >= LIM then return nil end
      local w = wait_for(b, deficit)
      if w == nil then return nil end
      if w > W then W = w end
    end
  end
  return W
end

-- The ledger after the tail, into BASE, E and T, checked as the decoder checks it; false when
-- it is not one (the client decodes it and reports the error). Parsed only by a write (a read
-- returns the record to the client, which decodes it all). BASE: the base level per
-- bandwidth ({tokens, remainder}); E: the entries ({owner, seq, exp, at = where its bytes
-- are, f = its fields as unpacked}), whose taken amounts (tk) and levels (lv, nil for an
-- infinite one) become tables only when a write changes them (`load`); T: the tombstones
-- ({owner, seq, exp, at}). An entry or tombstone left as it was is written back as the bytes
-- it was read from.
local ENTRY = 24 + 32 * n
local BASE, E, T = {}, {}, {}
-- whether a (tokens, remainder) pair, given as the high halves th, rh and the low half rl
-- of its two fields, is one of a bandwidth of period p: 0 <= tokens < 2^53 and
-- 0 <= remainder < p (for a field's halves (h, l), 0 <= v < 2^53 is 0 <= h < 2^21: see small)
local function valid(p, th, rh, rl)
  return th >= 0 and th < 2097152 and rh >= 0 and rh < 2097152 and rh * P32 + rl < p
end
local function parse_ledger()
  local pos = TAIL_END
  local len = #rec
  if pos + 1 > len then return false end
  local m = sunpack('>I2', rec, pos)
  pos = pos + 2
  if m > 0 then
    if pos + 16 * n - 1 > len then return false end
    for i = 1, n do
      local th, tl, rh, rl = sunpack('>i4I4i4I4', rec, pos)
      if not valid(B[i].p, th, rh, rl) then return false end
      BASE[i] = {th * P32 + tl, rh * P32 + rl}
      pos = pos + 16
    end
  end
  if pos + m * ENTRY - 1 > len then return false end
  local fmt = '>c8i4I4i4I4' .. string.rep('i4I4i4I4i4I4i4I4', n)
  for k = 1, m do
    local f = {sunpack(fmt, rec, pos)}
    local seq, exp = small(f[2], f[3]), small(f[4], f[5])
    if seq == nil or exp == nil then return false end
    -- per bandwidth: what it took, then its level (which may be {-1, 0}: infinite)
    for i = 1, n do
      local j, p = 6 + 8 * (i - 1), B[i].p
      if not valid(p, f[j], f[j + 2], f[j + 3]) then return false end
      if not valid(p, f[j + 4], f[j + 6], f[j + 7])
          and not (f[j + 4] == -1 and f[j + 5] == P32 - 1 and f[j + 6] == 0 and f[j + 7] == 0) then
        return false
      end
    end
    E[k] = {owner = f[1], seq = seq, exp = exp, at = pos, f = f}
    pos = pos + ENTRY
  end
  if pos + 1 > len then return false end
  local kt = sunpack('>I2', rec, pos)
  pos = pos + 2
  if pos + 24 * kt ~= len + 1 then return false end
  for k = 1, kt do
    local owner, sh, sl, eh, el = sunpack('>c8i4I4i4I4', rec, pos)
    local seq, exp = small(sh, sl), small(eh, el)
    if seq == nil or exp == nil then return false end
    T[k] = {owner = owner, seq = seq, exp = exp, at = pos}
    pos = pos + 24
  end
  return true
end

-- The ledger, parsed once (by a lease, or by the write).
local parsed = nil
local function ledger_parsed()
  if parsed == nil then parsed = parse_ledger() end
  return parsed
end

-- A lease (code 12) is taken only while the key holds fewer than LEASE_ROOM leases of other
-- owners: entries marked by LEASE_BIT in their sequence number that have not expired
-- (ledger.rs `lease_room`). The ledger is parsed for it before the operations (a write
-- parses it anyway).
local LEASE_ROOM, LEASE_BIT = 24, 4503599627370496 -- 2^52
local room = nil
for j = 1, #cmds do
  if cmds[j][1] == 12 and room == nil then
    if not ledger_parsed() then return client() end
    local nowq = nh * 4096 + floor(nl / 1048576)
    local leases = 0
    for k = 1, #E do
      local x = E[k]
      if x.exp > nowq and x.seq >= LEASE_BIT and x.owner ~= ARGV[9] then leases = leases + 1 end
    end
    room = leases < LEASE_ROOM
  end
end

local wrote = false
local gives, added = false, 0
for j = 1, #cmds do
  local cmd, arg, maxw = cmds[j][1], tonumber(cmds[j][2]), tonumber(cmds[j][3])
  local a = B[1].s
  for i = 2, n do if B[i].s < a then a = B[i].s end end
  local mutate = nil -- 'consume', 'add', 'force', 'reset'
  local amount = 0
  if cmd == 1 or cmd == 2 then
    if arg <= a then mutate = 'consume'; amount = arg end
  elseif cmd == 4 then
    if a > 0 then
      amount = a
      if arg >= 0 and arg < a then amount = arg end
      mutate = 'consume'
    end
  elseif cmd == 12 then
    -- a lease (the third field: how many processes share what there is), while the ledger
    -- has room: floor(a / processes), at most the size; none without room
    if room and a > 0 and maxw >= 1 then
      amount = floor(a / maxw)
      if arg < amount then amount = arg end
      if amount > 0 then mutate = 'consume' end
    end
  elseif cmd == 5 then mutate = 'add'; amount = arg; gives = true; added = added + arg
  elseif cmd == 6 then mutate = 'force'; amount = arg; gives = true
  elseif cmd == 7 then mutate = 'reset'; gives = true
  elseif cmd == 9 or cmd == 10 then
    local W = request_wait(arg)
    if W == nil then return client() end
    if cmd == 9 or W <= maxw then mutate = 'consume'; amount = arg end
  elseif cmd ~= 3 and cmd ~= 8 then
    return client()
  end

  if mutate ~= nil then
    wrote = true
    for i = 1, n do
      local b = B[i]
      if mutate == 'consume' then
        b.s = b.s - amount
        if b.s <= -LIM then return client() end
      elseif mutate == 'add' then
        if b.s + amount >= b.c then b.s = b.c; b.e = 0 else b.s = b.s + amount end
      elseif mutate == 'force' then
        b.s = b.s + amount
        if b.s >= LIM then return client() end
      else
        b.s = b.c; b.e = 0
      end
    end
  end
end

if not wrote then return {1, nh, nl, ts, tus, rec} end
-- A mutation that left every field as it was (add_tokens on a full bucket) writes nothing, as
-- the client does: the record, its ledger and its TTL stay.
do
  local same = true
  for i = 1, n do
    local b = B[i]
    if b.lh0 ~= b.lh or b.ll0 ~= b.ll or b.s0 ~= b.s or b.e0 ~= b.e then same = false end
  end
  if same then return {1, nh, nl, ts, tus, rec} end
end

-- the ledger (see the header and ledger.rs), serialized into LEDGER
local LEDGER
if not ledger_parsed() then return client() end
if ARGV[9] == nil or ARGV[9] == '' then
  LEDGER = sub(rec, TAIL_END)
else
  local owner, seq, fl = ARGV[9], tonumber(ARGV[10]), tonumber(ARGV[11])
  local nowq = nh * 4096 + floor(nl / 1048576)
  -- an entry's taken amounts and levels as tables (nil: an infinite level), once needed
  local function load(x)
    if x.tk then return end
    x.tk, x.lv = {}, {}
    local f = x.f
    for i = 1, n do
      local j = 6 + 8 * (i - 1)
      x.tk[i] = {f[j] * P32 + f[j + 1], f[j + 2] * P32 + f[j + 3]}
      local lt = f[j + 4] * P32 + f[j + 5]
      if lt ~= -1 then x.lv[i] = {lt, f[j + 6] * P32 + f[j + 7]} end
    end
  end
  local function get(p, i)
    if p == 0 then return BASE[i] end
    load(E[p])
    return E[p].lv[i]
  end
  local function set(p, i, v)
    if p == 0 then BASE[i] = v return end
    load(E[p])
    E[p].lv[i] = v
    E[p].dirty = true
  end
  local function less(a, b) -- a < b, nil being infinite
    if a == nil then return false end
    if b == nil then return true end
    return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2])
  end
  -- forget entry q: its level merges into the one below; forgetting the last entry empties
  -- the ledger (its base goes too), so nothing is merged then
  local function forget(q)
    if #E == 1 then
      E, BASE = {}, {}
      return
    end
    load(E[q])
    for i = 1, n do
      local above = E[q].lv[i]
      if less(above, get(q - 1, i)) then set(q - 1, i, above) end
    end
    table.remove(E, q)
  end
  -- the levels of bandwidth i after its state went towards x_plus = (xt, xr) (before the
  -- cap) from below capacity
  local function capped(i, xt, xr)
    local K = #E
    if K == 0 then return end
    local b = B[i]
    if xt >= b.c then
      local ot = xt - b.c
      for p = 0, K - 1 do
        local v = get(p, i)
        if v ~= nil then
          local t, r = v[1] + ot, v[2] + xr
          if r >= b.p then t, r = t + 1, r - b.p end
          if t >= LIM then return false end
          set(p, i, {t, r})
        end
      end
      set(K, i, {0, 0})
    else
      local rt, rr = b.c - xt, 0
      if xr > 0 then rt, rr = rt - 1, b.p - xr end
      local room = {rt, rr}
      if less(room, get(K, i)) then set(K, i, room) end
    end
    return true
  end
  -- What this write forgets goes first: the expired entries and, once the operation is
  -- known not to be in the ledger already, this owner's answered ones (below its floor).
  -- ledger.rs forgets the answered ones after moving the levels; the result is the same
  -- (a refill or an add adds one amount to the levels below the top and lowers the top one,
  -- and forgetting takes the smaller of two neighbours: the two commute), and the levels of
  -- forgotten entries are then never moved. On a key that only this manager writes, that is
  -- every entry: the ledger is emptied without reading a level.
  local q = 1
  while q <= #E do
    if E[q].exp <= nowq then forget(q) else q = q + 1 end
  end
  if #T > 0 then
    local T2 = {}
    for k = 1, #T do if T[k].exp > nowq then T2[#T2 + 1] = T[k] end end
    T = T2
  end
  for k = 1, #E do
    if E[k].owner == owner and (E[k].seq == seq or E[k].seq == seq + LEASE_BIT) then
      return {5, nh, nl, ts, tus}
    end
  end
  for k = 1, #T do
    if T[k].owner == owner and T[k].seq == seq then return {5, nh, nl, ts, tus} end
  end
  q = 1
  while q <= #E do
    if E[q].owner == owner and E[q].seq < fl then forget(q) else q = q + 1 end
  end
  -- a lease: this owner's earlier leases of the key have ended (what is left of them, the
  -- client returned; the rest was used), and this one's entry is marked (ledger.rs `after`;
  -- forgetting commutes with moving the levels, as above)
  local leasing = room ~= nil
  if leasing then
    q = 1
    while q <= #E do
      if E[q].owner == owner and E[q].seq >= LEASE_BIT then forget(q) else q = q + 1 end
    end
  end
  for i = 1, n do
    local b = B[i]
    if b.xt == false and #E > 0 then return client() end
    if b.xt and capped(i, b.xt, b.xr) == false then return client() end
  end
  if gives then
    for i = 1, n do
      local b = B[i]
      if #cmds == 1 and cmds[1][1] == 5 and b.rs < b.c then
        if b.rs + added >= LIM then return client() end
        if capped(i, b.rs + added, b.re) == false then return client() end
      elseif not (#cmds == 1 and cmds[1][1] == 6) then
        if #E > 0 then for p = 0, #E do set(p, i, {0, 0}) end end
      end
    end
  end
  if not gives then
    local tk, any = {}, false
    for i = 1, n do
      local b = B[i]
      local dt, de = b.rs - b.s, b.re - b.e
      if de < 0 then dt, de = dt - 1, de + b.p end
      if dt < 0 then dt, de = 0, 0 end
      if dt >= LIM then return client() end
      if dt ~= 0 or de ~= 0 then any = true end
      tk[i] = {dt, de}
    end
    if any then
      if #E == 0 then for i = 1, n do BASE[i] = {0, 0} end end
      local mark = seq
      if leasing then mark = seq + LEASE_BIT end
      E[#E + 1] = {owner = owner, seq = mark, exp = nowq + tonumber(ARGV[12]), tk = tk, lv = {},
        dirty = true}
    end
  end
  -- a full ledger forgets its oldest entry, a lease's last (ledger.rs `after`)
  while #E > 32 do
    local q = 1
    for k = 1, #E do
      if E[k].seq < LEASE_BIT then q = k break end
    end
    forget(q)
  end
  -- a {tokens, remainder} pair (nil: infinite, {-1, 0}) as its 16 bytes
  local function pair(v)
    if v == nil then return spack('>i4I4i4I4', -1, P32 - 1, 0, 0) end
    local th, rh = floor(v[1] / P32), floor(v[2] / P32)
    return spack('>i4I4i4I4', th, v[1] - th * P32, rh, v[2] - rh * P32)
  end
  local out = {spack('>I2', #E)}
  if #E > 0 then for i = 1, n do out[#out + 1] = pair(BASE[i]) end end
  for k = 1, #E do
    local x = E[k]
    if x.dirty then
      local sh, eh = floor(x.seq / P32), floor(x.exp / P32)
      out[#out + 1] = spack('>c8i4I4i4I4', x.owner, sh, x.seq - sh * P32, eh, x.exp - eh * P32)
      for i = 1, n do
        out[#out + 1] = pair(x.tk[i])
        out[#out + 1] = pair(x.lv[i])
      end
    else
      out[#out + 1] = sub(rec, x.at, x.at + ENTRY - 1)
    end
  end
  local first = 1
  if #T > 32 then first = #T - 31 end
  out[#out + 1] = spack('>I2', #T - first + 1)
  for k = first, #T do out[#out + 1] = sub(rec, T[k].at, T[k].at + 23) end
  LEDGER = table.concat(out)
end

-- TTL (the core's forgettable_at): per bandwidth, the earliest moment from which a fresh
-- bandwidth would hold exactly what this one holds. A greedy bandwidth starting full: once full
-- again and past its last refill. Never (keep the record): interval refill, initial tokens
-- other than the capacity, tokens above capacity. Aligned refill: the client computes it.
local keep, rel = false, 0
-- i64::MAX - now (the clock's last reading), or nil when 2^53 or more: longer than any wait
-- here. hh * 2^32 + hl with 0 <= hh < 2^21 is below 2^53.
local headroom = nil
do
  local hh = 2147483647 - nh
  if hh < 2097152 then headroom = hh * P32 + (4294967295 - nl) end
end
for i = 1, n do
  local b = B[i]
  if b.s > b.c or (b.s == b.c and b.e ~= 0) or b.kind == 1
      or (b.kind == 0 and b.fi == 1 and b.init ~= b.c) then
    keep = true
  elseif b.kind == 2 then
    if not keep then rel = nil end
  elseif rel ~= nil then
    local w = 0
    if b.s < b.c then w = wait_for(b, b.c - b.s) end
    local lmn = minus_now(b.lh, b.ll)
    if w == nil or lmn == nil then
      rel = nil
    else
      if lmn > w then w = lmn end
      if headroom ~= nil and w > headroom then
        keep = true -- full again only after the clock's last reading: never, as the core says
      elseif w > rel then
        rel = w
      end
    end
  end
end
if not keep and rel == nil then return client() end

local parts = {}
local pos = 1
for i = 1, n do
  local b = B[i]
  local base = 13 + 56 * (i - 1)
  local sh = floor(b.s / P32)
  local eh = floor(b.e / P32)
  parts[#parts + 1] = sub(rec, pos, base + 31)
  parts[#parts + 1] = spack('>i4I4i4I4i4I4', b.lh, b.ll, sh, b.s - sh * P32, eh, b.e - eh * P32)
  pos = base + 56
end
parts[#parts + 1] = sub(rec, pos, TAIL_END - 1)
parts[#parts + 1] = LEDGER
local post = table.concat(parts)

local ttl = nil
if not keep then
  -- ceil((rel + margin) / 1 ms), at least 1, exactly as the client rounds its TTLs
  local v = rel + tonumber(ARGV[7])
  if v >= LIM then return client() end
  local r = fmod(v, 1000000)
  ttl = tonumber(ARGV[6]) + (v - r) / 1000000
  if r > 0 then ttl = ttl + 1 end
  if ttl < 1 then ttl = 1 end
  if ttl >= 4.0e15 then ttl = nil end
end
if ttl then
  redis.call('SET', key, post, 'PX', ttl)
else
  redis.call('SET', key, post)
end
return {1, nh, nl, ts, tus, rec, post}
