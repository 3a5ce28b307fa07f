//! Text to typed [`Expr`] in two phases, as OData does: a syntax pass (lexer and
//! recursive descent, precedence `not` > comparisons and `in` > `and` > `or`) building an
//! untyped tree, then a binding pass resolving identifiers, operators and functions and
//! checking types. Syntax errors therefore win over unknown names: `invalid filter` is a
//! comparison whose operator is `filter` and whose right operand is missing, a syntax
//! error at position 14, exactly as the service reports it.
//!
//! Positions count characters from 0. Recursion is bounded by [`MAX_DEPTH`] (parentheses
//! and `not`s); `and`/`or` chains are flat lists, so long chains cost no depth.

use super::{CmpOp, Detail, Expr, Field, Func, Literal, Ty};

/// Longest filter accepted, in bytes.
pub(crate) const MAX_LEN: usize = 8192;
/// Deepest nesting of parentheses, `not`s and function calls accepted.
pub(super) const MAX_DEPTH: usize = 64;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Word(String),
    Str(String),
    Int(i64),
    LParen,
    RParen,
    Comma,
    End,
}

#[derive(Debug, Clone, PartialEq)]
struct Token {
    tok: Tok,
    pos: usize,
}

fn lex(text: &str) -> Result<Vec<Token>, Detail> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let start = i;
        let tok = match c {
            c if c.is_whitespace() => {
                i += 1;
                continue;
            }
            '(' => Tok::LParen,
            ')' => Tok::RParen,
            ',' => Tok::Comma,
            '\'' => {
                let mut s = String::new();
                i += 1;
                loop {
                    match chars.get(i) {
                        None => return Err(Detail::Syntax(i)),
                        Some('\'') if chars.get(i + 1) == Some(&'\'') => {
                            s.push('\'');
                            i += 2;
                        }
                        Some('\'') => break,
                        Some(&c) => {
                            s.push(c);
                            i += 1;
                        }
                    }
                }
                Tok::Str(s)
            }
            c if c.is_ascii_digit()
                || ((c == '-' || c == '+')
                    && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit())) =>
            {
                let mut end = i + 1;
                while chars.get(end).is_some_and(|d| d.is_ascii_digit()) {
                    end += 1;
                }
                let digits: String = chars[i..end].iter().collect();
                i = end - 1;
                Tok::Int(digits.parse().map_err(|_| Detail::Syntax(start))?)
            }
            c if c.is_alphabetic() || c == '_' => {
                let mut end = i + 1;
                while chars
                    .get(end)
                    .is_some_and(|d| d.is_alphanumeric() || *d == '_')
                {
                    end += 1;
                }
                let word: String = chars[i..end].iter().collect();
                i = end - 1;
                Tok::Word(word)
            }
            _ => return Err(Detail::Syntax(start)),
        };
        out.push(Token { tok, pos: start });
        i += 1;
    }
    out.push(Token {
        tok: Tok::End,
        pos: chars.len(),
    });
    Ok(out)
}

/// The untyped syntax tree.
#[derive(Debug, Clone, PartialEq)]
enum Ast {
    Or(Vec<Ast>),
    And(Vec<Ast>),
    Not(Box<Ast>),
    Binary {
        op: String,
        pos: usize,
        left: Box<Ast>,
        right: Box<Ast>,
    },
    In {
        left: Box<Ast>,
        right: InRight,
        pos: usize,
    },
    Lit(Literal),
    Ident(String, usize),
    Call(String, usize, Vec<Ast>),
}

/// The right side of `in`: a parenthesized list, or one operand (which must be a
/// collection).
#[derive(Debug, Clone, PartialEq)]
enum InRight {
    List(Vec<Ast>),
    Single(Box<Ast>),
}

fn is_word(tok: &Tok, word: &str) -> bool {
    matches!(tok, Tok::Word(w) if w.eq_ignore_ascii_case(word))
}

struct Parser {
    toks: Vec<Token>,
    at: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> &Token {
        // The token list always ends with `End`, which is never consumed.
        &self.toks[self.at.min(self.toks.len() - 1)]
    }

    fn bump(&mut self) -> Token {
        let t = self.peek().clone();
        if t.tok != Tok::End {
            self.at += 1;
        }
        t
    }

    fn expect(&mut self, tok: Tok) -> Result<(), Detail> {
        let t = self.peek();
        if t.tok == tok {
            self.bump();
            Ok(())
        } else {
            Err(Detail::Syntax(t.pos))
        }
    }

    fn nest(&mut self) -> Result<(), Detail> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(Detail::TooComplex);
        }
        Ok(())
    }

    /// `next (word next)*`, flattened into one `make` node.
    fn chain(
        &mut self,
        word: &str,
        next: fn(&mut Self) -> Result<Ast, Detail>,
        make: fn(Vec<Ast>) -> Ast,
    ) -> Result<Ast, Detail> {
        let mut items = vec![next(self)?];
        while is_word(&self.peek().tok, word) {
            self.bump();
            items.push(next(self)?);
        }
        Ok(if items.len() == 1 {
            items.remove(0)
        } else {
            make(items)
        })
    }

    fn or_expr(&mut self) -> Result<Ast, Detail> {
        self.chain("or", Self::and_expr, Ast::Or)
    }

    fn and_expr(&mut self) -> Result<Ast, Detail> {
        self.chain("and", Self::comparison, Ast::And)
    }

    /// An operand, then optionally `in …` or any word taken as a binary operator.
    fn comparison(&mut self) -> Result<Ast, Detail> {
        let left = self.unary()?;
        let next = self.peek().clone();
        let Tok::Word(word) = &next.tok else {
            return Ok(left);
        };
        if is_word(&next.tok, "and") || is_word(&next.tok, "or") {
            return Ok(left);
        }
        self.bump();
        if is_word(&next.tok, "in") {
            let right = if self.peek().tok == Tok::LParen {
                self.bump();
                self.nest()?;
                let mut items = vec![self.or_expr()?];
                while self.peek().tok == Tok::Comma {
                    self.bump();
                    items.push(self.or_expr()?);
                }
                self.expect(Tok::RParen)?;
                self.depth -= 1;
                InRight::List(items)
            } else {
                InRight::Single(Box::new(self.unary()?))
            };
            return Ok(Ast::In {
                left: Box::new(left),
                right,
                pos: next.pos,
            });
        }
        let right = self.unary()?;
        Ok(Ast::Binary {
            op: word.clone(),
            pos: next.pos,
            left: Box::new(left),
            right: Box::new(right),
        })
    }

    fn unary(&mut self) -> Result<Ast, Detail> {
        if is_word(&self.peek().tok, "not") {
            self.bump();
            self.nest()?;
            let inner = self.unary()?;
            self.depth -= 1;
            return Ok(Ast::Not(Box::new(inner)));
        }
        self.primary()
    }

    fn primary(&mut self) -> Result<Ast, Detail> {
        let t = self.bump();
        match t.tok {
            Tok::LParen => {
                self.nest()?;
                let inner = self.or_expr()?;
                self.expect(Tok::RParen)?;
                self.depth -= 1;
                Ok(inner)
            }
            Tok::Str(s) => Ok(Ast::Lit(Literal::Str(s))),
            Tok::Int(n) => Ok(Ast::Lit(Literal::Int(n))),
            Tok::Word(w) if self.peek().tok == Tok::LParen => {
                self.bump();
                self.nest()?;
                let mut args = Vec::new();
                if self.peek().tok != Tok::RParen {
                    args.push(self.or_expr()?);
                    while self.peek().tok == Tok::Comma {
                        self.bump();
                        args.push(self.or_expr()?);
                    }
                }
                self.expect(Tok::RParen)?;
                self.depth -= 1;
                Ok(Ast::Call(w, t.pos, args))
            }
            Tok::Word(w) => Ok(match w.to_ascii_lowercase().as_str() {
                "true" => Ast::Lit(Literal::Bool(true)),
                "false" => Ast::Lit(Literal::Bool(false)),
                "null" => Ast::Lit(Literal::Null),
                _ => Ast::Ident(w, t.pos),
            }),
            Tok::RParen | Tok::Comma | Tok::End => Err(Detail::Syntax(t.pos)),
        }
    }
}

/// Parses and binds a whole filter; it must be a boolean expression.
pub(super) fn parse(text: &str) -> Result<Expr, Detail> {
    if text.len() > MAX_LEN {
        return Err(Detail::TooComplex);
    }
    let mut p = Parser {
        toks: lex(text)?,
        at: 0,
        depth: 0,
    };
    let ast = p.or_expr()?;
    let end = p.peek();
    if end.tok != Tok::End {
        return Err(Detail::Syntax(end.pos));
    }
    let (expr, ty) = bind(ast)?;
    expect(ty, Ty::Bool)?;
    Ok(expr)
}

fn expect(found: Ty, want: Ty) -> Result<(), Detail> {
    if found == want {
        Ok(())
    } else {
        Err(Detail::Type {
            found,
            expected: want.name(),
        })
    }
}

/// A scalar operand of `want`'s type or the `null` literal.
fn expect_nullable(found: Ty, want: Ty) -> Result<(), Detail> {
    if found == Ty::Null {
        Ok(())
    } else {
        expect(found, want)
    }
}

/// Can `a` and `b` be compared with `eq`/`ne` (or `in`)?
fn equatable(a: Ty, b: Ty) -> Result<(), Detail> {
    match (a, b) {
        (Ty::Collection, _) | (_, Ty::Collection) => Err(Detail::Type {
            found: Ty::Collection,
            expected: "string, int or bool",
        }),
        (Ty::Null, _) | (_, Ty::Null) => Ok(()),
        _ => expect(b, a),
    }
}

fn cmp_op(op: &str) -> Option<CmpOp> {
    Some(match op.to_ascii_lowercase().as_str() {
        "eq" => CmpOp::Eq,
        "ne" => CmpOp::Ne,
        "gt" => CmpOp::Gt,
        "ge" => CmpOp::Ge,
        "lt" => CmpOp::Lt,
        "le" => CmpOp::Le,
        _ => return None,
    })
}

fn func(name: &str) -> Option<Func> {
    Some(match name.to_ascii_lowercase().as_str() {
        "tolower" => Func::ToLower,
        "toupper" => Func::ToUpper,
        "trim" => Func::Trim,
        "substring" => Func::Substring,
        "concat" => Func::Concat,
        "indexof" => Func::IndexOf,
        "length" => Func::Length,
        "startswith" => Func::StartsWith,
        "endswith" => Func::EndsWith,
        "contains" => Func::Contains,
        _ => return None,
    })
}

fn bind_all(items: Vec<Ast>, want: Ty) -> Result<Vec<Expr>, Detail> {
    items
        .into_iter()
        .map(|a| {
            let (e, t) = bind(a)?;
            expect(t, want)?;
            Ok(e)
        })
        .collect()
}

fn bind(ast: Ast) -> Result<(Expr, Ty), Detail> {
    Ok(match ast {
        Ast::Or(items) => (Expr::Or(bind_all(items, Ty::Bool)?), Ty::Bool),
        Ast::And(items) => (Expr::And(bind_all(items, Ty::Bool)?), Ty::Bool),
        Ast::Not(inner) => {
            let (e, t) = bind(*inner)?;
            expect(t, Ty::Bool)?;
            (Expr::Not(Box::new(e)), Ty::Bool)
        }
        Ast::Binary {
            op,
            pos,
            left,
            right,
        } => {
            let (l, lt) = bind(*left)?;
            let op = cmp_op(&op).ok_or(Detail::Syntax(pos))?;
            let (r, rt) = bind(*right)?;
            match op {
                CmpOp::Eq | CmpOp::Ne => equatable(lt, rt)?,
                _ => {
                    let base = if lt == Ty::Null { rt } else { lt };
                    if base != Ty::Null && base != Ty::Int && base != Ty::Str {
                        return Err(Detail::Type {
                            found: base,
                            expected: "int or string",
                        });
                    }
                    if base != Ty::Null {
                        expect_nullable(rt, base)?;
                    }
                }
            }
            (Expr::Cmp(op, Box::new(l), Box::new(r)), Ty::Bool)
        }
        Ast::In { left, right, pos } => bind_in(*left, right, pos)?,
        Ast::Lit(lit) => {
            let ty = match &lit {
                Literal::Null => Ty::Null,
                Literal::Bool(_) => Ty::Bool,
                Literal::Int(_) => Ty::Int,
                Literal::Str(_) => Ty::Str,
            };
            (Expr::Lit(lit), ty)
        }
        Ast::Ident(name, pos) => match name.to_ascii_lowercase().as_str() {
            "userid" => (Expr::Field(Field::UserId), Ty::Str),
            "connectionid" => (Expr::Field(Field::ConnectionId), Ty::Str),
            "groups" => (Expr::Field(Field::Groups), Ty::Collection),
            _ => return Err(Detail::UnknownIdentifier(name, pos)),
        },
        Ast::Call(name, pos, args) => bind_call(&name, pos, args)?,
    })
}

fn bind_in(left: Ast, right: InRight, pos: usize) -> Result<(Expr, Ty), Detail> {
    let (l, lt) = bind(left)?;
    let items = match right {
        InRight::Single(one) => vec![*one],
        InRight::List(items) => items,
    };
    let mut bound = Vec::with_capacity(items.len());
    for item in items {
        bound.push(bind(item)?);
    }
    if let [(Expr::Field(Field::Groups), Ty::Collection)] = bound.as_slice() {
        expect_nullable(lt, Ty::Str)?;
        return Ok((Expr::InGroups(Box::new(l)), Ty::Bool));
    }
    let mut list = Vec::with_capacity(bound.len());
    for (e, t) in bound {
        if t == Ty::Collection {
            return Err(Detail::Syntax(pos));
        }
        equatable(lt, t)?;
        list.push(e);
    }
    Ok((Expr::InList(Box::new(l), list), Ty::Bool))
}

fn bind_call(name: &str, pos: usize, args: Vec<Ast>) -> Result<(Expr, Ty), Detail> {
    let f = func(name).ok_or_else(|| Detail::UnknownFunction(name.to_owned(), pos))?;
    let mut bound = Vec::with_capacity(args.len());
    for a in args {
        bound.push(bind(a)?);
    }
    let types: Vec<Ty> = bound.iter().map(|(_, t)| *t).collect();
    let (params, result): (&[Ty], Ty) = match f {
        Func::ToLower | Func::ToUpper | Func::Trim => (&[Ty::Str], Ty::Str),
        Func::Substring if types.len() == 3 => (&[Ty::Str, Ty::Int, Ty::Int], Ty::Str),
        Func::Substring => (&[Ty::Str, Ty::Int], Ty::Str),
        Func::Concat => (&[Ty::Str, Ty::Str], Ty::Str),
        Func::IndexOf => (&[Ty::Str, Ty::Str], Ty::Int),
        Func::StartsWith | Func::EndsWith | Func::Contains => (&[Ty::Str, Ty::Str], Ty::Bool),
        Func::Length => {
            if types.len() != 1 {
                return Err(Detail::Syntax(pos));
            }
            if types[0] != Ty::Collection {
                expect_nullable(types[0], Ty::Str)?;
            }
            let args = bound.into_iter().map(|(e, _)| e).collect();
            return Ok((Expr::Call(f, args), Ty::Int));
        }
    };
    if types.len() != params.len() {
        return Err(Detail::Syntax(pos));
    }
    for (found, want) in types.iter().zip(params) {
        expect_nullable(*found, *want)?;
    }
    let args = bound.into_iter().map(|(e, _)| e).collect();
    Ok((Expr::Call(f, args), result))
}
