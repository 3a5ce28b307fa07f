//! Appending to the stream: consecutive entries of a writer batch go in one script
//! call, which numbers each (`q`, from the counter `{ns}:mqtt:seq`: `lag.rs`).

use redis::Pipeline;

use crate::Keys;

/// `KEYS` the stream, the counter and the retained hash; `ARGV` the stream's length,
/// the number of entries, then for each entry its field count and its fields. Returns
/// the last entry's number. A message's entry (10 fields) is appended without building
/// a table: most entries are messages. A retained message's (12 fields) ends with
/// `rs` (set) or `rc` (clear) and its topic, and its hash write goes with it, so
/// that the hash's last writer is the stream's last change of the topic.
pub(crate) const SCRIPT: &str = r"
local a = ARGV
local n = tonumber(a[2])
local last = redis.call('INCRBY', KEYS[2], n)
local q = last - n
local s = KEYS[1]
local i = 3
while i <= #a do
  q = q + 1
  local k = tonumber(a[i])
  if k == 10 then
    redis.call('XADD', s, 'MAXLEN', '~', a[1], '*', 'q', q, a[i + 1], a[i + 2], a[i + 3],
      a[i + 4], a[i + 5], a[i + 6], a[i + 7], a[i + 8], a[i + 9], a[i + 10])
  else
    local args = {s, 'MAXLEN', '~', a[1], '*', 'q', q}
    for j = 1, k do args[#args + 1] = a[i + j] end
    redis.call('XADD', unpack(args))
    if k == 12 and a[i + 11] == 'rs' then
      redis.call('HSET', KEYS[3], a[i + 12], a[i + 6])
    elseif k == 12 and a[i + 11] == 'rc' then
      redis.call('HDEL', KEYS[3], a[i + 12])
    end
  end
  i = i + k + 1
end
return last
";

/// The SHA1 of [`SCRIPT`], which every writer connection loads first.
pub(crate) fn script_hash() -> &'static str {
    static HASH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HASH.get_or_init(|| redis::Script::new(SCRIPT).get_hash().to_owned())
}

/// Entries waiting to be appended in one call, each its fields.
#[derive(Default)]
pub(crate) struct Appends<'a> {
    entries: Vec<Vec<&'a [u8]>>,
}

impl<'a> Appends<'a> {
    pub(crate) fn push(&mut self, fields: Vec<&'a [u8]>) {
        self.entries.push(fields);
    }

    /// Adds the call appending the waiting entries (if any) to `pipe`.
    pub(crate) fn flush(&mut self, pipe: &mut Pipeline, keys: &Keys, stream_len: u64) {
        if self.entries.is_empty() {
            return;
        }
        pipe.cmd("EVALSHA")
            .arg(script_hash())
            .arg(3)
            .arg(&keys.feed)
            .arg(&keys.seq)
            .arg(&keys.retained)
            .arg(stream_len)
            .arg(self.entries.len());
        for fields in self.entries.drain(..) {
            pipe.arg(fields.len());
            for field in fields {
                pipe.arg(field);
            }
        }
        pipe.ignore();
    }
}
