//! Evaluates a bound filter against one connection. Types were checked when the filter
//! was parsed, so a value of an unexpected kind here can only be `null` (e.g. `userId`
//! of an anonymous connection) and follows the null rules in the module docs.

use std::borrow::Cow;

use super::{CmpOp, Conn, Expr, Field, Func, Literal};

#[derive(Debug, Clone, PartialEq)]
enum Value<'a> {
    Null,
    Bool(bool),
    Int(i64),
    Str(Cow<'a, str>),
    Groups,
}

pub(super) fn matches(expr: &Expr, conn: &Conn<'_>) -> bool {
    truth(expr, conn)
}

fn truth(expr: &Expr, conn: &Conn<'_>) -> bool {
    match expr {
        Expr::Or(items) => items.iter().any(|e| truth(e, conn)),
        Expr::And(items) => items.iter().all(|e| truth(e, conn)),
        Expr::Not(e) => !truth(e, conn),
        Expr::Cmp(op, l, r) => compare(*op, &value(l, conn), &value(r, conn)),
        Expr::InList(l, items) => {
            let v = value(l, conn);
            items.iter().any(|e| equal(&v, &value(e, conn)))
        }
        Expr::InGroups(l) => match value(l, conn) {
            Value::Str(s) => conn.groups.contains(s.as_ref()),
            _ => false,
        },
        other => value(other, conn) == Value::Bool(true),
    }
}

fn equal(a: &Value<'_>, b: &Value<'_>) -> bool {
    a == b
}

fn compare(op: CmpOp, a: &Value<'_>, b: &Value<'_>) -> bool {
    let ordering = match (a, b) {
        (Value::Int(x), Value::Int(y)) => Some(x.cmp(y)),
        (Value::Str(x), Value::Str(y)) => Some(x.cmp(y)),
        _ => None,
    };
    match op {
        CmpOp::Eq => equal(a, b),
        CmpOp::Ne => !equal(a, b),
        CmpOp::Gt => ordering.is_some_and(|o| o.is_gt()),
        CmpOp::Ge => ordering.is_some_and(|o| o.is_ge()),
        CmpOp::Lt => ordering.is_some_and(|o| o.is_lt()),
        CmpOp::Le => ordering.is_some_and(|o| o.is_le()),
    }
}

fn value<'a>(expr: &'a Expr, conn: &Conn<'a>) -> Value<'a> {
    match expr {
        Expr::Lit(Literal::Null) => Value::Null,
        Expr::Lit(Literal::Bool(b)) => Value::Bool(*b),
        Expr::Lit(Literal::Int(n)) => Value::Int(*n),
        Expr::Lit(Literal::Str(s)) => Value::Str(Cow::Borrowed(s)),
        Expr::Field(Field::UserId) => conn
            .user_id
            .map_or(Value::Null, |u| Value::Str(Cow::Borrowed(u))),
        Expr::Field(Field::ConnectionId) => Value::Str(Cow::Borrowed(conn.connection_id)),
        Expr::Field(Field::Groups) => Value::Groups,
        Expr::Call(f, args) => call(*f, args, conn),
        Expr::Or(_)
        | Expr::And(_)
        | Expr::Not(_)
        | Expr::Cmp(..)
        | Expr::InList(..)
        | Expr::InGroups(_) => Value::Bool(truth(expr, conn)),
    }
}

fn call<'a>(f: Func, args: &'a [Expr], conn: &Conn<'a>) -> Value<'a> {
    let vals: Vec<Value<'a>> = args.iter().map(|a| value(a, conn)).collect();
    if let (Func::Length, [Value::Groups]) = (f, vals.as_slice()) {
        return Value::Int(i64::try_from(conn.groups.len()).unwrap_or(i64::MAX));
    }
    let strs: Vec<Option<&str>> = vals
        .iter()
        .map(|v| match v {
            Value::Str(s) => Some(s.as_ref()),
            _ => None,
        })
        .collect();
    let int = |i: usize| match vals.get(i) {
        Some(Value::Int(n)) => Some(*n),
        _ => None,
    };
    let chars = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    match (f, strs.as_slice()) {
        (Func::StartsWith, [Some(a), Some(b)]) => Value::Bool(a.starts_with(b)),
        (Func::EndsWith, [Some(a), Some(b)]) => Value::Bool(a.ends_with(b)),
        (Func::Contains, [Some(a), Some(b)]) => Value::Bool(a.contains(b)),
        (Func::StartsWith | Func::EndsWith | Func::Contains, _) => Value::Bool(false),
        (Func::ToLower, [Some(a)]) => Value::Str(Cow::Owned(a.to_lowercase())),
        (Func::ToUpper, [Some(a)]) => Value::Str(Cow::Owned(a.to_uppercase())),
        (Func::Trim, [Some(a)]) => Value::Str(Cow::Owned(a.trim().to_owned())),
        (Func::Concat, [Some(a), Some(b)]) => Value::Str(Cow::Owned(format!("{a}{b}"))),
        (Func::Length, [Some(a)]) => Value::Int(chars(a.chars().count())),
        (Func::IndexOf, [Some(a), Some(b)]) => Value::Int(
            a.find(b)
                .map_or(-1, |byte| chars(a[..byte].chars().count())),
        ),
        (Func::Substring, [Some(a), ..]) => match (int(1), args.len()) {
            (Some(start), 2) => Value::Str(Cow::Owned(substring(a, start, None))),
            (Some(start), 3) => match int(2) {
                Some(len) => Value::Str(Cow::Owned(substring(a, start, Some(len)))),
                None => Value::Null,
            },
            _ => Value::Null,
        },
        _ => Value::Null,
    }
}

/// Characters from `start` (clamped to 0), at most `len` of them (negative is none).
fn substring(s: &str, start: i64, len: Option<i64>) -> String {
    let skip = usize::try_from(start.max(0)).unwrap_or(usize::MAX);
    let rest = s.chars().skip(skip);
    match len {
        Some(n) => rest
            .take(usize::try_from(n.max(0)).unwrap_or(usize::MAX))
            .collect(),
        None => rest.collect(),
    }
}
