//! The OData `filter` of the REST API's send and group operations: which connections a
//! message or a membership change applies to.
//!
//! The grammar is the service's documented subset of OData (`reference-odata-filter`):
//! the identifiers `userId`, `connectionId` and `groups`; `and`, `or`, `not`; `eq`, `ne`,
//! `gt`, `ge`, `lt`, `le`; `in` with a list or with `groups`; string, integer, boolean and
//! `null` literals; the functions `tolower`, `toupper`, `trim`, `substring`, `concat`,
//! `indexof`, `length`, `startswith`, `endswith`, `contains`. It is small, so it is ours:
//! a lexer and a recursive-descent parser (`parse`) that also checks types, and an
//! evaluator (`eval`) run once per connection.
//!
//! Semantics where the documentation is silent, chosen as OData does: identifiers,
//! keywords and function names are case-insensitive, string comparisons are ordinal
//! (case-sensitive; use `tolower`), positions and lengths count characters, `null` only
//! equals `null`, an ordering comparison or a boolean function with a `null` operand is
//! false, and a string or integer function of `null` is `null`.

mod eval;
mod parse;

use std::collections::HashSet;

pub(crate) use parse::MAX_LEN;

/// A parsed, type-checked filter.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Filter {
    root: Expr,
}

/// The connection a filter is evaluated against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Conn<'a> {
    /// `connectionId`.
    pub connection_id: &'a str,
    /// `userId`; `None` is `null`.
    pub user_id: Option<&'a str>,
    /// `groups`.
    pub groups: &'a HashSet<String>,
}

/// Why a filter was refused; the REST API answers 400 with [`FilterError::message`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.message())]
pub(crate) struct FilterError {
    filter: String,
    detail: Detail,
}

/// What is wrong with a filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Detail {
    /// The text does not follow the grammar at this character position.
    Syntax(usize),
    /// An identifier other than `userId`, `connectionId`, `groups`, at this position.
    UnknownIdentifier(String, usize),
    /// An unknown function, at this position.
    UnknownFunction(String, usize),
    /// An operand of the wrong type.
    Type { found: Ty, expected: &'static str },
    /// Longer than [`MAX_LEN`] bytes or nested too deeply.
    TooComplex,
}

/// The static type of an expression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ty {
    /// `true`, `false`, comparisons, boolean functions.
    Bool,
    /// Strings (may evaluate to `null`, e.g. `userId`).
    Str,
    /// Integers (may evaluate to `null`, e.g. `length(userId)`).
    Int,
    /// The literal `null`.
    Null,
    /// `groups`.
    Collection,
}

impl Ty {
    fn name(self) -> &'static str {
        match self {
            Self::Bool => "bool",
            Self::Str => "string",
            Self::Int => "int",
            Self::Null => "null",
            Self::Collection => "collection",
        }
    }
}

impl FilterError {
    fn new(filter: &str, detail: Detail) -> Self {
        Self {
            filter: filter.to_owned(),
            detail,
        }
    }

    #[cfg(test)]
    /// What is wrong.
    pub(crate) fn detail(&self) -> &Detail {
        &self.detail
    }

    /// The message the service gives, e.g. `Invalid syntax for 'invalid filter': Syntax
    /// error at position 14 in 'invalid filter'. (Parameter 'filter')`.
    pub(crate) fn message(&self) -> String {
        let f = &self.filter;
        let detail = match &self.detail {
            Detail::Syntax(pos) => format!("Syntax error at position {pos} in '{f}'."),
            Detail::UnknownIdentifier(name, pos) => {
                format!("Unknown identifier '{name}' at position {pos} in '{f}'.")
            }
            Detail::UnknownFunction(name, pos) => {
                format!("Unknown function '{name}' at position {pos} in '{f}'.")
            }
            Detail::Type { found, expected } => {
                format!("Type '{}', expect '{expected}'.", found.name())
            }
            Detail::TooComplex => format!(
                "The filter is longer than {MAX_LEN} bytes or nested more than {} levels.",
                parse::MAX_DEPTH
            ),
        };
        format!("Invalid syntax for '{f}': {detail} (Parameter 'filter')")
    }
}

/// A literal value.
#[derive(Debug, Clone, PartialEq)]
enum Literal {
    Null,
    Bool(bool),
    Int(i64),
    Str(String),
}

/// A field of the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    UserId,
    ConnectionId,
    Groups,
}

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CmpOp {
    Eq,
    Ne,
    Gt,
    Ge,
    Lt,
    Le,
}

/// A function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Func {
    ToLower,
    ToUpper,
    Trim,
    Substring,
    Concat,
    IndexOf,
    Length,
    StartsWith,
    EndsWith,
    Contains,
}

/// A typed expression tree.
#[derive(Debug, Clone, PartialEq)]
enum Expr {
    Or(Vec<Expr>),
    And(Vec<Expr>),
    Not(Box<Expr>),
    Cmp(CmpOp, Box<Expr>, Box<Expr>),
    InList(Box<Expr>, Vec<Expr>),
    InGroups(Box<Expr>),
    Lit(Literal),
    Field(Field),
    Call(Func, Vec<Expr>),
}

impl Filter {
    /// Parses and type-checks `text`.
    pub(crate) fn parse(text: &str) -> Result<Self, FilterError> {
        parse::parse(text)
            .map(|root| Self { root })
            .map_err(|detail| FilterError::new(text, detail))
    }

    /// Does the connection match?
    pub(crate) fn matches(&self, conn: &Conn<'_>) -> bool {
        eval::matches(&self.root, conn)
    }
}

#[cfg(test)]
#[path = "filter_test.rs"]
mod tests;
