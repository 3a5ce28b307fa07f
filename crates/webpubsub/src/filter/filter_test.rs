use std::collections::HashSet;

use proptest::prelude::*;

use super::*;

fn groups(names: &[&str]) -> HashSet<String> {
    names.iter().map(|g| g.to_string()).collect()
}

fn check(filter: &str, user: Option<&str>, conn: &str, in_groups: &[&str]) -> bool {
    let g = groups(in_groups);
    Filter::parse(filter)
        .unwrap_or_else(|e| panic!("{filter}: {e}"))
        .matches(&Conn {
            connection_id: conn,
            user_id: user,
            groups: &g,
        })
}

fn error(filter: &str) -> String {
    Filter::parse(filter).unwrap_err().message()
}

#[test]
fn the_sdk_examples() {
    assert!(check("userId eq null", None, "c", &[]));
    assert!(!check("userId eq null", Some("u"), "c", &[]));
    assert!(check("userId ne null", Some("u"), "c", &[]));
    let f = "'groupA' in groups and not('groupB' in groups)";
    assert!(check(f, None, "c", &["groupA"]));
    assert!(!check(f, None, "c", &["groupA", "groupB"]));
    assert!(!check(f, None, "c", &[]));
    assert!(check("connectionId ne 'x'", None, "y", &[]));
    assert!(!check("connectionId ne 'x'", None, "x", &[]));
    assert!(
        check("userId ne 'user1'", None, "c", &[]),
        "null ne 'user1'"
    );
    assert!(check(
        "startswith(userId, 'listener-')",
        Some("listener-7"),
        "c",
        &[]
    ));
    assert!(!check("startswith(userId, 'listener-')", None, "c", &[]));
}

#[test]
fn the_documented_examples() {
    let f = "'group1' in groups or 'group2' in groups or 'group3' in groups";
    assert!(check(f, None, "c", &["group3"]));
    assert!(!check(f, None, "c", &["group4"]));
    let f = "userId in ('user1', 'user2', 'user3') and 'group1' in groups";
    assert!(check(f, Some("user2"), "c", &["group1"]));
    assert!(!check(f, Some("user4"), "c", &["group1"]));
    assert!(check(
        "userId eq 'user1' and connectionId ne '123'",
        Some("user1"),
        "1",
        &[]
    ));
    assert!(check(
        "userId eq 'user1' and (not ('group1' in groups))",
        Some("user1"),
        "c",
        &[]
    ));
    assert!(check("userId eq 'user''1'", Some("user'1"), "c", &[]));
    assert!(check(
        "length(userId) le 10 and length(userId) gt 3",
        Some("abcd"),
        "c",
        &[]
    ));
    assert!(check("not endswith(userId, 'milk')", Some("tea"), "c", &[]));
    assert!(check("tolower(userId) eq 'user1'", Some("USER1"), "c", &[]));
    assert!(check("toupper(userId) eq 'USER1'", Some("user1"), "c", &[]));
    assert!(check("trim(userId) eq 'user1'", Some(" user1 "), "c", &[]));
    assert!(check(
        "substring(userId,5,2) eq 'ab'",
        Some("user-ab-de"),
        "c",
        &[]
    ));
    assert!(check(
        "substring(userId,5) eq 'ab-de'",
        Some("user-ab-de"),
        "c",
        &[]
    ));
    assert!(check(
        "indexof(userId,'-ab-') ge 0",
        Some("user-ab-de"),
        "c",
        &[]
    ));
    assert!(check(
        "indexof(userId,'zz') eq -1",
        Some("user-ab-de"),
        "c",
        &[]
    ));
    assert!(check("length(groups) gt 1", None, "c", &["a", "b"]));
    assert!(check(
        "contains(concat(userId, 'x'), 'rx')",
        Some("ur"),
        "c",
        &[]
    ));
    assert!(check(
        "userId eq 'user1' or (not (startswith(userId,'user2')))",
        Some("other"),
        "c",
        &[]
    ));
}

#[test]
fn precedence_and_case() {
    let f = "length(userId) gt 0 and length(userId) lt 3 or length(userId) gt 7 and length(userId) lt 10";
    let g = "((length(userId) gt 0) and (length(userId) lt 3)) or ((length(userId) gt 7) and (length(userId) lt 10))";
    for user in ["", "ab", "abcd", "abcdefgh", "abcdefghijk"] {
        assert_eq!(
            check(f, Some(user), "c", &[]),
            check(g, Some(user), "c", &[])
        );
    }
    assert!(check("USERID EQ 'a' AND TRUE", Some("a"), "c", &[]));
    assert!(check("StartsWith(UserId, 'a')", Some("ab"), "c", &[]));
    assert!(check("'a' in (groups)", None, "c", &["a"]));
    assert!(check("userId eq 'a' or false", Some("a"), "c", &[]));
}

#[test]
fn nulls() {
    assert!(!check("length(userId) gt 5", None, "c", &[]));
    assert!(!check("length(userId) le 5", None, "c", &[]));
    assert!(check("length(userId) eq null", None, "c", &[]));
    assert!(check("tolower(userId) eq null", None, "c", &[]));
    assert!(!check("userId in ('a', 'b')", None, "c", &[]));
    assert!(check("userId in ('a', null)", None, "c", &[]));
    assert!(!check("userId in groups", None, "c", &["a"]));
}

#[test]
fn the_service_error_message() {
    assert_eq!(
        error("invalid filter"),
        "Invalid syntax for 'invalid filter': Syntax error at position 14 in 'invalid filter'. (Parameter 'filter')"
    );
}

#[test]
fn syntax_errors() {
    let pos = |f: &str| match Filter::parse(f).unwrap_err().detail() {
        Detail::Syntax(p) => *p,
        other => panic!("{f}: {other:?}"),
    };
    assert_eq!(pos(""), 0);
    assert_eq!(pos("userId eq"), 9);
    assert_eq!(pos("userId foo 'x'"), 7);
    assert_eq!(pos("(userId eq 'a'"), 14);
    assert_eq!(pos("userId eq 'a"), 12);
    assert_eq!(pos("userId eq 'a' )"), 14);
    assert_eq!(pos("userId eq #"), 10);
    assert_eq!(pos("length(userId, 'a') eq 1"), 0);
    assert_eq!(pos("userId eq 99999999999999999999"), 10);
}

#[test]
fn binding_errors() {
    assert!(matches!(
        Filter::parse("user eq 'a'").unwrap_err().detail(),
        Detail::UnknownIdentifier(n, 0) if n == "user"
    ));
    assert!(matches!(
        Filter::parse("upper(userId) eq 'a'").unwrap_err().detail(),
        Detail::UnknownFunction(n, 0) if n == "upper"
    ));
    assert_eq!(
        error("not length(userId) gt 5"),
        "Invalid syntax for 'not length(userId) gt 5': Type 'int', expect 'bool'. (Parameter 'filter')"
    );
    for bad in [
        "userId",
        "userId eq 1",
        "length(userId) gt 'a'",
        "true gt false",
        "groups eq 'a'",
        "1 in groups",
        "userId and true",
        "startswith(userId, 1)",
    ] {
        assert!(
            matches!(
                Filter::parse(bad).unwrap_err().detail(),
                Detail::Type { .. }
            ),
            "{bad}"
        );
    }
}

#[test]
fn limits() {
    let deep = format!("{}true{}", "(".repeat(100), ")".repeat(100));
    assert_eq!(
        Filter::parse(&deep).unwrap_err().detail(),
        &Detail::TooComplex
    );
    let nots = format!("{}true", "not ".repeat(100));
    assert_eq!(
        Filter::parse(&nots).unwrap_err().detail(),
        &Detail::TooComplex
    );
    let long = vec!["true"; 2000].join(" or ");
    assert_eq!(
        Filter::parse(&long).unwrap_err().detail(),
        &Detail::TooComplex
    );
    let wide = vec!["true"; 1000].join(" or ");
    assert!(
        check(&wide, None, "c", &[]),
        "long flat chains cost no depth"
    );
}

// An independent model of a subset of the language: generated, printed with random
// spelling, parenthesization and spacing, parsed by `Filter`, and evaluated by both.

#[derive(Debug, Clone)]
enum S {
    User,
    Conn,
    Lit(String),
    Null,
    Lower(Box<S>),
}

#[derive(Debug, Clone)]
enum M {
    Bool(bool),
    Or(Vec<M>),
    And(Vec<M>),
    Not(Box<M>),
    StrEq(bool, S, S),
    LenCmp(&'static str, S, i64),
    InGroups(S),
    InList(S, Vec<S>),
    StartsWith(S, S),
}

#[derive(Debug, Clone)]
struct Model {
    user: Option<String>,
    conn: String,
    groups: HashSet<String>,
}

fn s_eval(s: &S, m: &Model) -> Option<String> {
    match s {
        S::User => m.user.clone(),
        S::Conn => Some(m.conn.clone()),
        S::Lit(v) => Some(v.clone()),
        S::Null => None,
        S::Lower(inner) => s_eval(inner, m).map(|v| v.to_lowercase()),
    }
}

fn m_eval(e: &M, m: &Model) -> bool {
    match e {
        M::Bool(b) => *b,
        M::Or(v) => v.iter().any(|x| m_eval(x, m)),
        M::And(v) => v.iter().all(|x| m_eval(x, m)),
        M::Not(x) => !m_eval(x, m),
        M::StrEq(eq, a, b) => (s_eval(a, m) == s_eval(b, m)) == *eq,
        M::LenCmp(op, s, n) => match s_eval(s, m) {
            None => false,
            Some(v) => {
                let len = v.chars().count() as i64;
                match *op {
                    "gt" => len > *n,
                    "ge" => len >= *n,
                    "lt" => len < *n,
                    _ => len <= *n,
                }
            }
        },
        M::InGroups(s) => s_eval(s, m).is_some_and(|v| m.groups.contains(&v)),
        M::InList(s, items) => {
            let v = s_eval(s, m);
            items.iter().any(|i| s_eval(i, m) == v)
        }
        M::StartsWith(a, b) => match (s_eval(a, m), s_eval(b, m)) {
            (Some(a), Some(b)) => a.starts_with(&b),
            _ => false,
        },
    }
}

fn word(w: &str, upper: bool) -> String {
    if upper {
        w.to_uppercase()
    } else {
        w.to_owned()
    }
}

fn s_print(s: &S, up: bool) -> String {
    match s {
        S::User => word("userId", up),
        S::Conn => word("connectionId", up),
        S::Lit(v) => format!("'{}'", v.replace('\'', "''")),
        S::Null => word("null", up),
        S::Lower(inner) => format!("{}( {} )", word("tolower", up), s_print(inner, up)),
    }
}

/// Prints `e`; `tight` asks for an operand that binds at least as tightly as `not`.
fn m_print(e: &M, up: bool, tight: bool) -> String {
    let paren = |s: String| format!("({s})");
    let text = match e {
        M::Bool(b) => return word(if *b { "true" } else { "false" }, up),
        M::StartsWith(a, b) => {
            return format!(
                "{}({},{})",
                word("startswith", up),
                s_print(a, up),
                s_print(b, up)
            )
        }
        M::Or(v) => v
            .iter()
            .map(|x| m_print(x, up, false))
            .collect::<Vec<_>>()
            .join(&format!(" {} ", word("or", up))),
        M::And(v) => v
            .iter()
            .map(|x| match x {
                M::Or(_) => paren(m_print(x, up, false)),
                _ => m_print(x, up, false),
            })
            .collect::<Vec<_>>()
            .join(&format!(" {} ", word("and", up))),
        M::Not(x) => format!("{} {}", word("not", up), m_print(x, up, true)),
        M::StrEq(eq, a, b) => format!(
            "{} {} {}",
            s_print(a, up),
            word(if *eq { "eq" } else { "ne" }, up),
            s_print(b, up)
        ),
        M::LenCmp(op, s, n) => format!(
            "{}({}) {} {n}",
            word("length", up),
            s_print(s, up),
            word(op, up)
        ),
        M::InGroups(s) => format!(
            "{} {} {}",
            s_print(s, up),
            word("in", up),
            word("groups", up)
        ),
        M::InList(s, items) => format!(
            "{} {} ({})",
            s_print(s, up),
            word("in", up),
            items
                .iter()
                .map(|i| s_print(i, up))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let needs = tight && !matches!(e, M::Not(_));
    if needs {
        paren(text)
    } else {
        text
    }
}

fn s_strategy() -> impl Strategy<Value = S> {
    let leaf = prop_oneof![
        Just(S::User),
        Just(S::Conn),
        Just(S::Null),
        "[aAb' ]{0,3}".prop_map(S::Lit),
    ];
    leaf.prop_recursive(2, 4, 1, |inner| inner.prop_map(|s| S::Lower(Box::new(s))))
}

fn m_strategy() -> impl Strategy<Value = M> {
    let leaf = prop_oneof![
        any::<bool>().prop_map(M::Bool),
        (any::<bool>(), s_strategy(), s_strategy()).prop_map(|(e, a, b)| M::StrEq(e, a, b)),
        (
            prop_oneof![Just("gt"), Just("ge"), Just("lt"), Just("le")],
            s_strategy(),
            -1i64..4
        )
            .prop_map(|(o, s, n)| M::LenCmp(o, s, n)),
        s_strategy().prop_map(M::InGroups),
        (s_strategy(), prop::collection::vec(s_strategy(), 1..3))
            .prop_map(|(s, v)| M::InList(s, v)),
        (s_strategy(), s_strategy()).prop_map(|(a, b)| M::StartsWith(a, b)),
    ];
    leaf.prop_recursive(4, 24, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 2..4).prop_map(M::Or),
            prop::collection::vec(inner.clone(), 2..4).prop_map(M::And),
            inner.prop_map(|x| M::Not(Box::new(x))),
        ]
    })
}

fn model_strategy() -> impl Strategy<Value = Model> {
    (
        prop::option::of("[aAb' ]{0,3}"),
        "[aAb]{1,2}",
        prop::collection::hash_set("[aAb' ]{0,2}", 0..3),
    )
        .prop_map(|(user, conn, groups)| Model { user, conn, groups })
}

proptest! {
    #[test]
    fn parser_and_evaluator_agree_with_the_model(
        e in m_strategy(),
        up in any::<bool>(),
        models in prop::collection::vec(model_strategy(), 1..4),
    ) {
        let text = m_print(&e, up, false);
        let f = Filter::parse(&text).map_err(|err| TestCaseError::fail(format!("{text}: {err}")))?;
        for m in &models {
            let conn = Conn { connection_id: &m.conn, user_id: m.user.as_deref(), groups: &m.groups };
            prop_assert_eq!(f.matches(&conn), m_eval(&e, m), "{} on {:?}", text, m);
        }
    }

    #[test]
    fn never_panics_on_garbage(text in "\\PC{0,64}") {
        let _ = Filter::parse(&text);
    }

    #[test]
    fn never_panics_on_token_soup(words in prop::collection::vec(
        prop_oneof![
            Just("userId"), Just("groups"), Just("eq"), Just("in"), Just("not"), Just("and"),
            Just("or"), Just("("), Just(")"), Just(","), Just("'a'"), Just("1"), Just("null"),
            Just("length"), Just("substring"), Just("true"),
        ], 0..24)) {
        let text = words.join(" ");
        if let Ok(f) = Filter::parse(&text) {
            let g = HashSet::new();
            let _ = f.matches(&Conn { connection_id: "c", user_id: None, groups: &g });
        }
    }
}
