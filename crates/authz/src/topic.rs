//! MQTT topic filters: matching a topic, checking syntax, and deciding whether one
//! filter covers another (every topic the second matches, the first matches too).

/// Whether `filter` matches `topic` (MQTT 5 section 4.7). Topics starting with `$` are
/// not matched by a filter starting with a wildcard [MQTT-4.7.2-1].
pub fn matches(filter: &str, topic: &str) -> bool {
    if topic.starts_with('$') && starts_with_wildcard(filter) {
        return false;
    }
    let mut f = filter.split('/');
    let mut t = topic.split('/');
    loop {
        match (f.next(), t.next()) {
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// Whether every topic `filter` matches is matched by `grant`: a subscription to
/// `filter` can then never deliver a message on a topic outside `grant`.
pub fn covers(grant: &str, filter: &str) -> bool {
    if filter.starts_with('$') && starts_with_wildcard(grant) {
        return false;
    }
    // Every topic has a first level, so `+/#` matches all that `#` does.
    if filter == "#" && grant == "+/#" {
        return true;
    }
    let mut g = grant.split('/');
    let mut f = filter.split('/');
    loop {
        match (g.next(), f.next()) {
            // `a/#` matches `a` too, so it also covers a filter that ends here.
            (Some("#"), _) => return true,
            (Some(_), Some("#")) => return false,
            (Some("+"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

fn starts_with_wildcard(filter: &str) -> bool {
    filter.starts_with('+') || filter.starts_with('#')
}

/// Whether `filter` contains a wildcard.
pub fn has_wildcard(filter: &str) -> bool {
    filter.contains(['+', '#'])
}

/// Checks a topic filter's syntax: not empty, `#` only as the whole last level, `+` only
/// as a whole level, no U+0000.
pub fn check_filter(filter: &str) -> Result<(), &'static str> {
    if filter.is_empty() {
        return Err("an empty topic filter");
    }
    if filter.contains('\0') {
        return Err("U+0000 in a topic filter");
    }
    let mut levels = filter.split('/').peekable();
    while let Some(level) = levels.next() {
        if level.contains('#') && (level != "#" || levels.peek().is_some()) {
            return Err("'#' must be the whole last level of a topic filter");
        }
        if level.contains('+') && level != "+" {
            return Err("'+' must be a whole topic level");
        }
    }
    Ok(())
}

/// Splits `$share/{group}/{filter}` into its group and filter.
pub fn split_shared(filter: &str) -> (Option<&str>, &str) {
    if let Some((group, f)) = filter
        .strip_prefix("$share/")
        .and_then(|rest| rest.split_once('/'))
    {
        return (Some(group), f);
    }
    (None, filter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covering() {
        let yes = [
            ("#", "a/b"),
            ("#", "#"),
            ("a/#", "a"),
            ("a/#", "a/+/c"),
            ("a/+", "a/b"),
            ("a/+", "a/+"),
            ("+/+", "a/+"),
            ("a/b", "a/b"),
            ("$SYS/#", "$SYS/x"),
            ("+/#", "#"),
            ("a/+/#", "a/+"),
        ];
        for (g, f) in yes {
            assert!(covers(g, f), "{g} should cover {f}");
        }
        let no = [
            ("a/+", "a/#"),
            ("a/+", "a"),
            ("a/b", "a/+"),
            ("a/+/#", "a/#"),
            ("a/+/c", "a/b/#"),
            ("#", "$SYS/x"),
            ("+/x", "$SYS/x"),
            ("a", "a/b"),
            ("a/b", "a"),
            ("$SYS/#", "#"),
            ("a/+/#", "a/#"),
            ("+/+/#", "#"),
        ];
        for (g, f) in no {
            assert!(!covers(g, f), "{g} should not cover {f}");
        }
    }

    #[test]
    fn wildcards_do_not_match_dollar_topics() {
        assert!(!matches("#", "$SYS/x"));
        assert!(!matches("+/x", "$SYS/x"));
        assert!(matches("$SYS/#", "$SYS/x"));
    }

    #[test]
    fn filter_syntax() {
        for ok in ["a", "#", "+", "a/+/b", "a/#", "/", "+/+"] {
            assert_eq!(check_filter(ok), Ok(()), "{ok}");
        }
        for bad in ["", "a#", "a/#/b", "a+", "a/b+/c", "a\0"] {
            assert!(check_filter(bad).is_err(), "{bad:?}");
        }
    }
}
