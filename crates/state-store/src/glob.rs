//! The SCAN pattern language, matched on bytes.
//!
//! `*` any run of bytes, `?` one byte, `[abc]` one of, `[a-z]` a range (reversed ranges
//! are swapped), `[!...]` negation. `^` is an ordinary byte, not negation (the notes say
//! so of the real store), and `\` is an ordinary byte, not an escape: keys like
//! `{thermostat}\setPoint` (the protocol page's own example) must be matchable literally.
//! A `]` right after `[` or `[!` is a member, and a `-` first or last in a class is one.
//! These are POSIX shell-glob classes (`fnmatch` without escapes), not Redis's, whose `^`
//! negates and `\` escapes.
//!
//! A `[` with no `]` after it to close it is an ordinary byte: `key[ab` matches exactly
//! the key `key[ab`, as in POSIX globs (Redis instead reads the rest of the pattern as an
//! unclosed class). Whether a `[` is closed is decided once, when the pattern is compiled,
//! from the position of the pattern's last `]`, so a run of unclosed `[` costs one step
//! each, never a rescan of the pattern.
//!
//! Matching never backtracks. A pattern compiles to a nondeterministic automaton with
//! one state per byte-consuming item (`?`, a class or a literal byte), `*` being a loop
//! on the state it follows, and a key is run through all states at once, 64 to a machine
//! word (Shift-And): each key byte costs [`Pattern::words`] word operations, whatever the
//! pattern and key hold, so a match costs `key length × words` at most and stops as soon
//! as no state is alive. A backtracking matcher costs `key length × pattern length` on
//! keys like `[[[[...` against `*[[[...[b` (and this module's earlier one, which also
//! rescanned unclosed classes, a factor of the pattern length more: 29 s for one SCAN).

use smallvec::SmallVec;

/// A compiled SCAN pattern.
#[derive(Debug, Clone)]
pub struct Pattern {
    /// Words of states (`items + 1` bits, state `i` meaning "the first `i` items matched").
    words: usize,
    /// `masks[byte * words..][..words]`: bit `i + 1` is set when item `i` accepts `byte`.
    masks: Vec<u64>,
    /// Bit `i` is set when a `*` follows item `i - 1` (or opens the pattern, for bit 0):
    /// state `i` then stays alive on any byte.
    stars: SmallVec<[u64; 2]>,
    /// The accepting state: every item matched.
    accept: usize,
}

/// One byte-consuming item of a pattern.
enum Item {
    Byte(u8),
    Any,
    Class([u64; 4]),
}

impl Pattern {
    /// Compiles `pattern`; every byte string is a pattern. Costs O(pattern length +
    /// 256 × [`Pattern::words`]).
    pub fn compile(pattern: &[u8]) -> Self {
        let (items, star_after) = parse(pattern);
        let states = items.len() + 1;
        let words = states.div_ceil(64);
        let mut masks = vec![0u64; 256 * words];
        let mut stars: SmallVec<[u64; 2]> = SmallVec::from_elem(0, words);
        for (i, item) in items.iter().enumerate() {
            let state = i + 1;
            let (word, bit) = (state / 64, 1u64 << (state % 64));
            let mut accept = |byte: usize| masks[byte * words + word] |= bit;
            match item {
                Item::Byte(b) => accept(usize::from(*b)),
                Item::Any => (0..256).for_each(accept),
                Item::Class(set) => (0..256)
                    .filter(|&b| set[b / 64] & (1 << (b % 64)) != 0)
                    .for_each(accept),
            }
        }
        for (state, _) in star_after.iter().enumerate().filter(|(_, &s)| s) {
            stars[state / 64] |= 1 << (state % 64);
        }
        Self {
            words,
            masks,
            stars,
            accept: items.len(),
        }
    }

    /// Machine words per key byte a match costs: one per 64 items of the pattern.
    pub fn words(&self) -> usize {
        self.words
    }

    /// Whether `key` matches the whole pattern.
    pub fn is_match(&self, key: &[u8]) -> bool {
        if self.words == 1 {
            return self.is_match_narrow(key);
        }
        let mut alive: SmallVec<[u64; 4]> = SmallVec::from_elem(0, self.words);
        alive[0] = 1;
        for &byte in key {
            let mask = &self.masks[usize::from(byte) * self.words..][..self.words];
            // In place, low word first: `carry` is the top bit of the previous word as
            // it was before this byte.
            let (mut carry, mut any) = (0, 0);
            for ((state, &mask), &star) in alive.iter_mut().zip(mask).zip(&self.stars) {
                let old = *state;
                *state = (((old << 1) | carry) & mask) | (old & star);
                carry = old >> 63;
                any |= *state;
            }
            if any == 0 {
                return false;
            }
        }
        alive[self.accept / 64] & (1 << (self.accept % 64)) != 0
    }

    /// [`Pattern::is_match`] for patterns of at most 63 items, in one register.
    fn is_match_narrow(&self, key: &[u8]) -> bool {
        let star = self.stars[0];
        let mut alive = 1u64;
        for &byte in key {
            alive = ((alive << 1) & self.masks[usize::from(byte)]) | (alive & star);
            if alive == 0 {
                return false;
            }
        }
        alive & (1 << self.accept) != 0
    }
}

/// Whether `key` matches `pattern` entirely (compiles the pattern each call).
pub fn glob_match(pattern: &[u8], key: &[u8]) -> bool {
    Pattern::compile(pattern).is_match(key)
}

/// The items of `pattern`, and for each state (`items + 1` of them) whether a `*` loops
/// on it. Consecutive `*` are one.
fn parse(pattern: &[u8]) -> (Vec<Item>, Vec<bool>) {
    let last_close = memchr::memrchr(b']', pattern);
    let mut items = Vec::new();
    let mut star_after = vec![false];
    let mut i = 0;
    while let Some(&c) = pattern.get(i) {
        let (item, next) = match c {
            b'*' => {
                if let Some(star) = star_after.last_mut() {
                    *star = true;
                }
                i += 1;
                continue;
            }
            b'?' => (Item::Any, i + 1),
            b'[' => match class(pattern, i, last_close) {
                Some((set, next)) => (Item::Class(set), next),
                None => (Item::Byte(b'['), i + 1),
            },
            _ => (Item::Byte(c), i + 1),
        };
        items.push(item);
        star_after.push(false);
        i = next;
    }
    (items, star_after)
}

/// The class opening at `pattern[open]` as a set of bytes, and where the pattern goes on
/// after it; `None` if no `]` closes it, known from `last_close` (the position of the
/// pattern's last `]`) without reading the class.
fn class(pattern: &[u8], open: usize, last_close: Option<usize>) -> Option<([u64; 4], usize)> {
    let mut i = open + 1;
    let negate = pattern.get(i) == Some(&b'!');
    if negate {
        i += 1;
    }
    // The first member may be `]`, so the closing one is at `i + 1` or later. Any `]`
    // there closes the class when the walk below reaches it: a range's upper end is never
    // `]`, and the byte after a member is either the next member or a range's `-`.
    if last_close.is_none_or(|close| close <= i) {
        return None;
    }
    let mut set = [0u64; 4];
    let mut add = |byte: u8| set[usize::from(byte / 64)] |= 1 << (byte % 64);
    let mut first = true;
    loop {
        let c = *pattern.get(i)?;
        if c == b']' && !first {
            break;
        }
        first = false;
        match (pattern.get(i + 1), pattern.get(i + 2)) {
            (Some(b'-'), Some(&hi)) if hi != b']' => {
                let (lo, hi) = if c <= hi { (c, hi) } else { (hi, c) };
                (lo..=hi).for_each(&mut add);
                i += 3;
            }
            _ => {
                add(c);
                i += 1;
            }
        }
    }
    if negate {
        set = set.map(|word| !word);
    }
    Some((set, i + 1))
}

#[cfg(test)]
#[path = "glob_test.rs"]
mod tests;
