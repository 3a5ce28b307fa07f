use super::{glob_match, Pattern};

fn m(p: &str, k: &str) -> bool {
    glob_match(p.as_bytes(), k.as_bytes())
}

#[test]
fn literals_and_wildcards() {
    assert!(m("key", "key"));
    assert!(!m("key", "key1"));
    assert!(!m("key1", "key"));
    assert!(m("*", "anything"));
    assert!(m("*", ""));
    assert!(m("key*", "key"));
    assert!(m("key*", "key123"));
    assert!(!m("key*", "ke"));
    assert!(m("*1", "key1"));
    assert!(m("k*y*1", "kxxyzz1"));
    assert!(!m("k*y*1", "kxxyzz2"));
    assert!(m("?ey", "key"));
    assert!(!m("?ey", "ey"));
    assert!(m("**a**", "bab"));
}

#[test]
fn classes() {
    assert!(m("key[ab]", "keya"));
    assert!(m("key[ab]", "keyb"));
    assert!(!m("key[ab]", "keyc"));
    assert!(m("key[0-9]", "key7"));
    assert!(!m("key[0-9]", "keyx"));
    assert!(m("key[9-0]", "key5"));
    assert!(m("key[!0-9]", "keyx"));
    assert!(!m("key[!0-9]", "key5"));
    assert!(m("key[a-c0-2]", "key1"));
    assert!(m("key[]]", "key]"));
    assert!(m("key[!]]", "keyx"));
    assert!(!m("key[!]]", "key]"));
    assert!(m("key[a-]", "key-"));
}

#[test]
fn caret_is_not_negation() {
    assert!(m("key[^0-9]", "key^"));
    assert!(m("key[^0-9]", "key5"));
    assert!(!m("key[^0-9]", "keyx"));
}

#[test]
fn backslash_is_literal_and_unclosed_bracket_matches_itself() {
    assert!(m("therm\\setPoint", "therm\\setPoint"));
    assert!(!m("therm\\setPoint", "thermsetPoint"));
    assert!(m("key[", "key["));
    assert!(m("key[ab", "key[ab"));
    assert!(!m("key[ab", "keya"));
}

#[test]
fn binary_bytes() {
    assert!(glob_match(b"\x00*\xff", b"\x00abc\xff"));
    assert!(glob_match(b"[\x00-\x10]", b"\x05"));
}

#[test]
fn classes_edge_members() {
    assert!(m("[-a]", "-"));
    assert!(m("[]-]", "-"));
    assert!(m("[]-]", "]"));
    assert!(!m("[]-]", "a"));
    assert!(m("[!]", "[!]"));
    assert!(m("[]", "[]"));
    assert!(m("a[]b]c", "a]c"));
    assert!(m("[[]", "["));
    assert!(m("[\\]", "\\"));
}

#[test]
fn empty_pattern_and_stars() {
    assert!(m("", ""));
    assert!(!m("", "a"));
    assert!(m("***", ""));
    assert!(m("a***", "a"));
    assert!(!m("?", ""));
}

/// Patterns of more than 63 items take the multi-word path.
#[test]
fn long_patterns() {
    let key = "ab".repeat(100);
    assert!(m(&key, &key));
    assert!(m(&format!("*{}", &key[1..]), &key));
    assert!(!m(&format!("{key}?"), &key));
    assert!(m(&format!("{}*b", "?".repeat(70)), &key));
    assert!(m(&format!("a{}*", "[ab]".repeat(70)), &key));
    assert!(!m(&format!("b{}*", "[ab]".repeat(70)), &key));
}

#[test]
fn pathological_pattern_is_fast() {
    let key = vec![b'a'; 5000];
    let mut pattern = b"*a".repeat(50);
    pattern.push(b'b');
    assert!(!glob_match(&pattern, &key));
}

/// The SCAN: one key of `[` against `*` + 2,000 unclosed `[` + `b`. A backtracking
/// matcher with rescanned classes took 29 s; this is 20,000 steps of 32 words.
#[test]
fn unclosed_brackets_cost_one_step_each() {
    let key = vec![b'['; 20_000];
    let mut pattern = vec![b'*'];
    pattern.extend(std::iter::repeat_n(b'[', 2_000));
    pattern.push(b'b');
    let compiled = Pattern::compile(&pattern);
    assert_eq!(compiled.words(), 32);
    assert!(!compiled.is_match(&key));
    *pattern.last_mut().unwrap() = b'[';
    assert!(Pattern::compile(&pattern).is_match(&key));
}

/// The reference: the pattern read at match time, a memo over (pattern position, key
/// position) pairs. Slow (a class is re-read at every use) but plainly correct.
fn reference(pattern: &[u8], key: &[u8]) -> bool {
    fn class(p: &[u8], open: usize, byte: u8) -> Option<(bool, usize)> {
        let mut i = open + 1;
        let negate = p.get(i) == Some(&b'!');
        if negate {
            i += 1;
        }
        let (mut matched, mut first) = (false, true);
        loop {
            let c = *p.get(i)?;
            if c == b']' && !first {
                return Some((matched != negate, i + 1));
            }
            first = false;
            if p.get(i + 1) == Some(&b'-') && p.get(i + 2).is_some_and(|&h| h != b']') {
                let (a, b) = (c.min(p[i + 2]), c.max(p[i + 2]));
                matched |= (a..=b).contains(&byte);
                i += 3;
            } else {
                matched |= c == byte;
                i += 1;
            }
        }
    }
    fn go(p: &[u8], k: &[u8], pi: usize, ki: usize, memo: &mut Vec<Option<bool>>) -> bool {
        let slot = pi * (k.len() + 1) + ki;
        if let Some(done) = memo[slot] {
            return done;
        }
        let result = match p.get(pi) {
            None => ki == k.len(),
            Some(b'*') => {
                go(p, k, pi + 1, ki, memo) || (ki < k.len() && go(p, k, pi, ki + 1, memo))
            }
            Some(&c) => match k.get(ki) {
                None => false,
                Some(&byte) => {
                    let next = match c {
                        b'?' => Some(pi + 1),
                        b'[' => match class(p, pi, byte) {
                            Some((true, next)) => Some(next),
                            Some((false, _)) => None,
                            None => (byte == b'[').then_some(pi + 1),
                        },
                        _ => (byte == c).then_some(pi + 1),
                    };
                    next.is_some_and(|next| go(p, k, next, ki + 1, memo))
                }
            },
        };
        memo[slot] = Some(result);
        result
    }
    let mut memo = vec![None; (pattern.len() + 1) * (key.len() + 1)];
    go(pattern, key, 0, 0, &mut memo)
}

/// One piece of a pattern: a byte, a wildcard, a class or a lone `[`.
fn piece() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
    use proptest::prelude::*;
    let byte = || proptest::sample::select(&b"ab[]-!^"[..]);
    let member = prop_oneof![
        byte().prop_map(|b| vec![b]),
        (byte(), byte()).prop_map(|(lo, hi)| vec![lo, b'-', hi]),
    ];
    prop_oneof![
        byte().prop_map(|b| vec![b]),
        Just(b"*".to_vec()),
        Just(b"?".to_vec()),
        Just(b"[".to_vec()),
        (any::<bool>(), proptest::collection::vec(member, 1..4)).prop_map(|(negate, members)| {
            let mut class = vec![b'['];
            if negate {
                class.push(b'!');
            }
            class.extend(members.concat());
            class.push(b']');
            class
        }),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2_000))]

    /// The compiled matcher agrees with the reference on patterns and keys over a small
    /// alphabet rich in the language's special bytes, short and long (multi-word).
    #[test]
    fn matches_like_the_reference(
        pattern in proptest::collection::vec(proptest::sample::select(&b"ab*?[]!-^\\"[..]), 0..90),
        key in proptest::collection::vec(proptest::sample::select(&b"ab[]-!^"[..]), 0..90),
    ) {
        proptest::prop_assert_eq!(
            Pattern::compile(&pattern).is_match(&key),
            reference(&pattern, &key),
            "pattern {} key {}", pattern.escape_ascii(), key.escape_ascii()
        );
    }

    /// Patterns assembled from the language's pieces (classes with ranges and negation,
    /// unclosed `[`), which uniform bytes rarely form.
    #[test]
    fn pieces_match_like_the_reference(
        pieces in proptest::collection::vec(piece(), 0..12),
        key in proptest::collection::vec(proptest::sample::select(&b"ab[]-!^"[..]), 0..30),
    ) {
        let pattern = pieces.concat();
        proptest::prop_assert_eq!(
            Pattern::compile(&pattern).is_match(&key),
            reference(&pattern, &key),
            "pattern {} key {}", pattern.escape_ascii(), key.escape_ascii()
        );
    }

    /// Keys built to match (the pattern's own bytes with its wildcards filled in) match
    /// both ways, so the property above is not only exercised on mismatches.
    #[test]
    fn filled_in_patterns_match(
        pattern in proptest::collection::vec(proptest::sample::select(&b"ab*?[]!-"[..]), 0..90),
        fill in proptest::collection::vec(proptest::sample::select(&b"ab[]-"[..]), 0..4),
    ) {
        let key: Vec<u8> = pattern.iter().flat_map(|&c| match c {
            b'*' => fill.clone(),
            b'?' => vec![b'a'],
            _ => vec![c],
        }).collect();
        proptest::prop_assert_eq!(
            Pattern::compile(&pattern).is_match(&key),
            reference(&pattern, &key)
        );
    }
}
