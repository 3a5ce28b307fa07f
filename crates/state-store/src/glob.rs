//! The SCAN pattern language, matched on bytes.
//!
//! `*` any run of bytes, `?` one byte, `[abc]` one of, `[a-z]` a range (reversed ranges
//! are swapped), `[!...]` negation. `^` is an ordinary byte, not negation, and `\` is an
//! ordinary byte, not an escape: keys like `{thermostat}\setPoint` must be matchable
//! literally. A `]` right after `[` or `[!` is a member; a `[` with no closing `]` matches
//! itself. Matching backtracks only to the last `*`, so it runs in O(pattern × key).

/// Whether `key` matches `pattern` entirely.
pub fn glob_match(pattern: &[u8], key: &[u8]) -> bool {
    let (mut p, mut k) = (0, 0);
    // Where the last `*` was and which key position it is currently made to absorb up to.
    let mut star: Option<(usize, usize)> = None;
    while k < key.len() {
        if let Some(&c) = pattern.get(p) {
            let step = match c {
                b'*' => {
                    star = Some((p, k));
                    p += 1;
                    continue;
                }
                b'?' => Some(p + 1),
                b'[' => match class(pattern, p, key[k]) {
                    Some((true, next)) => Some(next),
                    Some((false, _)) => None,
                    None => (key[k] == b'[').then_some(p + 1),
                },
                _ => (key[k] == c).then_some(p + 1),
            };
            if let Some(next) = step {
                p = next;
                k += 1;
                continue;
            }
        }
        match star {
            Some((sp, sk)) => {
                p = sp + 1;
                k = sk + 1;
                star = Some((sp, sk + 1));
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// Matches `byte` against the class opening at `pattern[open]`; returns whether it
/// matched and where the pattern continues, or `None` if the class is never closed.
fn class(pattern: &[u8], open: usize, byte: u8) -> Option<(bool, usize)> {
    let mut i = open + 1;
    let negate = pattern.get(i) == Some(&b'!');
    if negate {
        i += 1;
    }
    let mut matched = false;
    let mut first = true;
    loop {
        let c = *pattern.get(i)?;
        if c == b']' && !first {
            return Some((matched != negate, i + 1));
        }
        first = false;
        match (pattern.get(i + 1), pattern.get(i + 2)) {
            (Some(b'-'), Some(&hi)) if hi != b']' => {
                let (lo, hi) = if c <= hi { (c, hi) } else { (hi, c) };
                matched |= (lo..=hi).contains(&byte);
                i += 3;
            }
            _ => {
                matched |= c == byte;
                i += 1;
            }
        }
    }
}

#[cfg(test)]
#[path = "glob_test.rs"]
mod tests;
