use super::glob_match;

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
fn pathological_pattern_is_fast() {
    let key = vec![b'a'; 5000];
    let mut pattern = b"*a".repeat(50);
    pattern.push(b'b');
    assert!(!glob_match(&pattern, &key));
}
