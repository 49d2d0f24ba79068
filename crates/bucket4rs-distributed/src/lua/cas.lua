-- bucket4rs: compare-and-set of a bucket record (the exact path; see docs/distributed.md).
-- KEYS[1] the key; ARGV[1] '0' expect absent, '1' expect ARGV[2]; ARGV[3] new record;
-- ARGV[4] TTL in milliseconds ('' : no expiry); ARGV[5] the caller's deadline in microseconds
-- of this server's clock ('' : none).
-- Exactness: the only arithmetic is TIME in microseconds (below 2^53 until the year 2255)
-- against the deadline, which the client caps at 2^53 - 1: exact in doubles (op.lua).
-- Returns 1 when written, 0 on conflict, -1 wrong type, -2 past the deadline (nothing read or
-- written).
if redis.replicate_commands then redis.replicate_commands() end
if ARGV[5] ~= '' then
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000000 + tonumber(t[2]) > tonumber(ARGV[5]) then return -2 end
end
local key = KEYS[1]
local ok, cur = pcall(redis.call, 'GET', key)
if not ok then return -1 end
if ARGV[1] == '0' then
  if cur then return 0 end
elseif cur ~= ARGV[2] then
  return 0
end
if ARGV[4] == '' then
  redis.call('SET', key, ARGV[3])
else
  redis.call('SET', key, ARGV[3], 'PX', ARGV[4])
end
return 1
