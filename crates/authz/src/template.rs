//! `{principal.clientId}`, `{principal.username}` and `{principal.attributes.<name>}` in
//! topics, keys and client id patterns, and what makes a substitution safe.
//!
//! A substituted value must never widen a grant. Each place has its own rule:
//!
//! * **topics**: a placeholder is a whole topic level (as the AIO broker requires), and a
//!   value holding `/`, `+`, `#` or U+0000 makes the grant match nothing for that
//!   principal (a user named `+` must not get `users/+/#`), as does a value starting with
//!   `$` in the first level (it would reach the `$` topics a leading wildcard never does);
//! * **glob patterns** (state store keys of type `Pattern`, `Connect` client ids): the
//!   value is matched literally, its `*`, `?`, `[` and `]` each written as a one-member
//!   class (`[*]`), since the pattern language has no escape character; a placeholder
//!   inside a `[...]` class is refused when the rules load.
//!
//! A principal without the value (no username, no such attribute) gets nothing from the
//! grant.

use crate::Principal;

/// A value a rule can substitute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Var {
    ClientId,
    Username,
    Attribute(String),
}

impl Var {
    fn parse(name: &str) -> Option<Var> {
        match name {
            "clientId" => Some(Var::ClientId),
            "username" => Some(Var::Username),
            _ => name
                .strip_prefix("attributes.")
                .filter(|a| !a.is_empty())
                .map(|a| Var::Attribute(a.to_owned())),
        }
    }

    fn value<'a>(&self, who: &Principal<'a>) -> Option<&'a str> {
        match self {
            Var::ClientId => Some(who.client_id),
            Var::Username => who.username,
            Var::Attribute(name) => who.attributes.get(name).map(String::as_str),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Part {
    Text(String),
    Var(Var),
}

/// Text with placeholders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Template {
    parts: Vec<Part>,
}

/// A placeholder that cannot be read or placed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error(
        "unknown placeholder {{principal.{0}}} (expected clientId, username or attributes.<name>)"
    )]
    Unknown(String),
    #[error("a {{principal. placeholder is not closed with }}")]
    Unclosed,
    #[error("a placeholder must be a whole topic level (like clients/{{principal.clientId}}/#)")]
    NotALevel,
    #[error("a placeholder cannot stand inside a [...] class")]
    InClass,
    #[error("placeholders are not allowed here")]
    NotAllowed,
}

const OPEN: &str = "{principal.";

impl Template {
    /// Splits `text` at its `{principal.…}` placeholders; other braces are text.
    pub(crate) fn parse(text: &str) -> Result<Template, TemplateError> {
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(at) = rest.find(OPEN) {
            if at > 0 {
                parts.push(Part::Text(rest[..at].to_owned()));
            }
            let after = &rest[at + OPEN.len()..];
            let end = after.find('}').ok_or(TemplateError::Unclosed)?;
            let name = &after[..end];
            let var = Var::parse(name).ok_or_else(|| TemplateError::Unknown(name.to_owned()))?;
            parts.push(Part::Var(var));
            rest = &after[end + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_owned()));
        }
        Ok(Template { parts })
    }

    /// The text, if it has no placeholder.
    pub(crate) fn plain(&self) -> Option<String> {
        match self.parts.as_slice() {
            [] => Some(String::new()),
            [Part::Text(t)] => Some(t.clone()),
            _ => None,
        }
    }

    /// The text with every placeholder written as `stand_in`, for syntax checks.
    pub(crate) fn with_stand_in(&self, stand_in: &str) -> String {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Text(t) => t.as_str(),
                Part::Var(_) => stand_in,
            })
            .collect()
    }

    /// Checks that every placeholder is a whole `/`-separated level.
    pub(crate) fn check_levels(&self) -> Result<(), TemplateError> {
        for (i, part) in self.parts.iter().enumerate() {
            if !matches!(part, Part::Var(_)) {
                continue;
            }
            let before = i.checked_sub(1).map(|j| &self.parts[j]);
            let after = self.parts.get(i + 1);
            let starts = match before {
                None => true,
                Some(Part::Text(t)) => t.ends_with('/'),
                Some(Part::Var(_)) => false,
            };
            let ends = match after {
                None => true,
                Some(Part::Text(t)) => t.starts_with('/'),
                Some(Part::Var(_)) => false,
            };
            if !starts || !ends {
                return Err(TemplateError::NotALevel);
            }
        }
        Ok(())
    }

    /// Checks that no placeholder stands inside a glob class (`[...]`), where the
    /// escaping of [`Template::render_glob`] would not hold.
    pub(crate) fn check_glob(&self) -> Result<(), TemplateError> {
        let mut open = false;
        for part in &self.parts {
            match part {
                Part::Text(t) => open = class_open_after(open, t.as_bytes()),
                Part::Var(_) if open => return Err(TemplateError::InClass),
                Part::Var(_) => {}
            }
        }
        Ok(())
    }

    /// Refuses any placeholder.
    pub(crate) fn check_none(&self) -> Result<(), TemplateError> {
        match self.plain() {
            Some(_) => Ok(()),
            None => Err(TemplateError::NotAllowed),
        }
    }

    /// The topic filter for `who`; `None` when a value is missing or could widen it.
    pub(crate) fn render_topic(&self, who: &Principal<'_>) -> Option<String> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Var(var) => {
                    let value = var.value(who)?;
                    let unsafe_char = value.contains(['/', '+', '#', '\0']);
                    if unsafe_char || (out.is_empty() && value.starts_with('$')) {
                        return None;
                    }
                    out.push_str(value);
                }
            }
        }
        Some(out)
    }

    /// The glob pattern for `who`, each value matched literally; `None` when a value is
    /// missing.
    pub(crate) fn render_glob(&self, who: &Principal<'_>) -> Option<String> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Var(var) => escape_glob(var.value(who)?, &mut out),
            }
        }
        Some(out)
    }
}

/// Appends `value` so that the glob matches it literally.
fn escape_glob(value: &str, out: &mut String) {
    for c in value.chars() {
        match c {
            '*' | '?' | '[' | ']' => {
                out.push('[');
                out.push(c);
                out.push(']');
            }
            _ => out.push(c),
        }
    }
}

/// Whether a glob class is open after `text`, given whether one was open before it.
/// Mirrors the pattern language closely enough for placement checks: `[` opens, `]`
/// closes unless it is the class's first member (right after `[` or `[!`).
fn class_open_after(mut open: bool, text: &[u8]) -> bool {
    let mut first = false;
    for (i, &c) in text.iter().enumerate() {
        if !open {
            if c == b'[' {
                open = true;
                first = true;
            }
            continue;
        }
        if first && c == b'!' && i > 0 && text[i - 1] == b'[' {
            continue;
        }
        if c == b']' && !first {
            open = false;
        }
        first = false;
    }
    open
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn who<'a>(
        id: &'a str,
        user: Option<&'a str>,
        attrs: &'a BTreeMap<String, String>,
    ) -> Principal<'a> {
        Principal {
            client_id: id,
            username: user,
            attributes: attrs,
        }
    }

    #[test]
    fn parses_placeholders_and_keeps_other_braces() {
        let t = Template::parse("a/{principal.clientId}/{x}/{principal.attributes.floor}").unwrap();
        assert_eq!(t.with_stand_in("_"), "a/_/{x}/_");
        assert_eq!(
            Template::parse("{principal.password}"),
            Err(TemplateError::Unknown("password".into()))
        );
        assert_eq!(
            Template::parse("{principal.clientId"),
            Err(TemplateError::Unclosed)
        );
        assert_eq!(
            Template::parse("{principal.attributes.}"),
            Err(TemplateError::Unknown("attributes.".into()))
        );
    }

    #[test]
    fn placeholders_must_be_whole_levels() {
        let ok = [
            "{principal.clientId}",
            "a/{principal.clientId}",
            "{principal.username}/b/#",
        ];
        for t in ok {
            assert_eq!(Template::parse(t).unwrap().check_levels(), Ok(()), "{t}");
        }
        let bad = [
            "client-{principal.clientId}/#",
            "a/{principal.clientId}x",
            "{principal.clientId}{principal.username}",
        ];
        for t in bad {
            assert_eq!(
                Template::parse(t).unwrap().check_levels(),
                Err(TemplateError::NotALevel),
                "{t}"
            );
        }
    }

    #[test]
    fn topic_values_that_would_widen_match_nothing() {
        let attrs = BTreeMap::new();
        let t = Template::parse("users/{principal.username}/#").unwrap();
        for bad in ["+", "#", "a/b", "a\0", "x+y"] {
            assert_eq!(
                t.render_topic(&who("c", Some(bad), &attrs)),
                None,
                "{bad:?}"
            );
        }
        assert_eq!(t.render_topic(&who("c", None, &attrs)), None);
        assert_eq!(
            t.render_topic(&who("c", Some("$ok"), &attrs)).as_deref(),
            Some("users/$ok/#")
        );
        let first = Template::parse("{principal.clientId}/#").unwrap();
        assert_eq!(first.render_topic(&who("$SYS", None, &attrs)), None);
    }

    #[test]
    fn glob_values_are_literal() {
        let attrs = BTreeMap::from([("room".to_owned(), "1*".to_owned())]);
        let t = Template::parse("rooms/{principal.attributes.room}/*").unwrap();
        assert_eq!(
            t.render_glob(&who("c", None, &attrs)).as_deref(),
            Some("rooms/1[*]/*")
        );
        let id = Template::parse("{principal.clientId}").unwrap();
        assert_eq!(
            id.render_glob(&who("a?[b]", None, &attrs)).as_deref(),
            Some("a[?][[]b[]]")
        );
    }

    #[test]
    fn placeholders_inside_classes_are_refused() {
        for t in [
            "k[{principal.clientId}]",
            "k[!{principal.clientId}]",
            "k[]{principal.clientId}]",
        ] {
            assert_eq!(
                Template::parse(t).unwrap().check_glob(),
                Err(TemplateError::InClass),
                "{t}"
            );
        }
        for t in [
            "k[ab]{principal.clientId}",
            "{principal.clientId}[0-9]",
            "k[]]{principal.clientId}",
        ] {
            assert_eq!(Template::parse(t).unwrap().check_glob(), Ok(()), "{t}");
        }
    }
}
