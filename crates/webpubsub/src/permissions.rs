//! What a client connection may do, from the `role` claims of its access token.
//!
//! Roles: `webpubsub.joinLeaveGroup` and `webpubsub.sendToGroup` grant every group;
//! `webpubsub.joinLeaveGroup.<group>` / `webpubsub.sendToGroup.<group>` grant one group;
//! `webpubsub.joinLeaveGroups.<pattern>` / `webpubsub.sendToGroups.<pattern>` grant the
//! groups matching a glob pattern (`*` any run of characters, `?` one character).
//! Unknown roles are ignored, as the service does.
//!
//! The REST API then grants and revokes permissions per connection. A revoke for one
//! group also takes that group out of a wildcard grant (it is remembered as denied), so
//! "all groups but this one" can be expressed; a grant for the group lifts the denial.

use std::collections::HashSet;

const JOIN_LEAVE: &str = "webpubsub.joinLeaveGroup";
const SEND: &str = "webpubsub.sendToGroup";
const JOIN_LEAVE_PATTERN: &str = "webpubsub.joinLeaveGroups.";
const SEND_PATTERN: &str = "webpubsub.sendToGroups.";

/// A permission the REST API grants, revokes and checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    /// `joinLeaveGroup`.
    JoinLeaveGroup,
    /// `sendToGroup`.
    SendToGroup,
}

impl Permission {
    /// Parses the REST path segment (case-insensitive).
    pub fn parse(name: &str) -> Option<Self> {
        if name.eq_ignore_ascii_case("joinLeaveGroup") {
            Some(Self::JoinLeaveGroup)
        } else if name.eq_ignore_ascii_case("sendToGroup") {
            Some(Self::SendToGroup)
        } else {
            None
        }
    }

    /// Its name in the REST path (what [`Permission::parse`] reads).
    pub fn name(self) -> &'static str {
        match self {
            Self::JoinLeaveGroup => "joinLeaveGroup",
            Self::SendToGroup => "sendToGroup",
        }
    }
}

/// One permission's grants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Grant {
    all: bool,
    groups: HashSet<String>,
    patterns: Vec<String>,
    denied: HashSet<String>,
}

impl Grant {
    fn allows(&self, group: &str) -> bool {
        !self.denied.contains(group)
            && (self.all
                || self.groups.contains(group)
                || self
                    .patterns
                    .iter()
                    .any(|p| glob(p.as_bytes(), group.as_bytes())))
    }

    fn set(&mut self, group: Option<&str>, allowed: bool) {
        match (group, allowed) {
            (None, true) => {
                self.all = true;
                self.denied.clear();
            }
            (None, false) => *self = Self::default(),
            (Some(g), true) => {
                self.denied.remove(g);
                self.groups.insert(g.to_owned());
            }
            (Some(g), false) => {
                self.groups.remove(g);
                self.denied.insert(g.to_owned());
            }
        }
    }

    fn has(&self, group: Option<&str>) -> bool {
        match group {
            Some(g) => self.allows(g),
            None => self.all && self.denied.is_empty(),
        }
    }
}

/// A connection's permissions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Permissions {
    join_leave: Grant,
    send: Grant,
}

impl Permissions {
    /// Builds the permissions from role claims.
    pub fn from_roles<S: AsRef<str>>(roles: &[S]) -> Self {
        let mut p = Self::default();
        for role in roles {
            p.grant(role.as_ref());
        }
        p
    }

    /// Adds one role.
    pub fn grant(&mut self, role: &str) {
        if role == JOIN_LEAVE {
            self.join_leave.all = true;
        } else if role == SEND {
            self.send.all = true;
        } else if let Some(pattern) = role.strip_prefix(JOIN_LEAVE_PATTERN) {
            self.join_leave.patterns.push(pattern.to_owned());
        } else if let Some(pattern) = role.strip_prefix(SEND_PATTERN) {
            self.send.patterns.push(pattern.to_owned());
        } else if let Some(group) = role
            .strip_prefix(JOIN_LEAVE)
            .and_then(|r| r.strip_prefix('.'))
        {
            self.join_leave.groups.insert(group.to_owned());
        } else if let Some(group) = role.strip_prefix(SEND).and_then(|r| r.strip_prefix('.')) {
            self.send.groups.insert(group.to_owned());
        }
    }

    /// The permissions as roles, denials prefixed with `!`: what a session's copy in
    /// the cluster keeps, read back by [`Permissions::from_mirrored`].
    pub fn mirrored(&self) -> Vec<String> {
        let mut roles = Vec::new();
        for (grant, one, pattern) in [
            (&self.join_leave, JOIN_LEAVE, JOIN_LEAVE_PATTERN),
            (&self.send, SEND, SEND_PATTERN),
        ] {
            if grant.all {
                roles.push(one.to_owned());
            }
            roles.extend(grant.groups.iter().map(|g| format!("{one}.{g}")));
            roles.extend(grant.patterns.iter().map(|p| format!("{pattern}{p}")));
            roles.extend(grant.denied.iter().map(|g| format!("!{one}.{g}")));
        }
        roles
    }

    /// Reads what [`Permissions::mirrored`] wrote (plain roles as [`Permissions::from_roles`]).
    pub fn from_mirrored<S: AsRef<str>>(roles: &[S]) -> Self {
        let mut p = Self::default();
        for role in roles {
            let role = role.as_ref();
            let Some(denied) = role.strip_prefix('!') else {
                p.grant(role);
                continue;
            };
            let deny = |grant: &mut Grant, one: &str| {
                let group = denied.strip_prefix(one).and_then(|r| r.strip_prefix('.'));
                if let Some(g) = group {
                    grant.denied.insert(g.to_owned());
                }
            };
            deny(&mut p.join_leave, JOIN_LEAVE);
            deny(&mut p.send, SEND);
        }
        p
    }

    /// May the connection join or leave `group`?
    pub fn can_join_leave(&self, group: &str) -> bool {
        self.join_leave.allows(group)
    }

    /// May the connection publish to `group`?
    pub fn can_send(&self, group: &str) -> bool {
        self.send.allows(group)
    }

    fn grant_of(&mut self, permission: Permission) -> &mut Grant {
        match permission {
            Permission::JoinLeaveGroup => &mut self.join_leave,
            Permission::SendToGroup => &mut self.send,
        }
    }

    /// Grants (`allowed`) or revokes a permission for one group or, with `None`, for all
    /// groups (a revoke for all removes every grant of it, roles included).
    pub fn set(&mut self, permission: Permission, group: Option<&str>, allowed: bool) {
        self.grant_of(permission).set(group, allowed);
    }

    /// Is the permission held for `group` or, with `None`, for every group?
    pub fn has(&self, permission: Permission, group: Option<&str>) -> bool {
        match permission {
            Permission::JoinLeaveGroup => self.join_leave.has(group),
            Permission::SendToGroup => self.send.has(group),
        }
    }
}

/// Glob match with `*` and `?`, iterative with one backtrack point (linear in practice,
/// never exponential).
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && (pattern[p] == b'?' || pattern[p] == text[t]) {
            p += 1;
            t += 1;
        } else if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_by_default() {
        let p = Permissions::default();
        assert!(!p.can_join_leave("g"));
        assert!(!p.can_send("g"));
    }

    #[test]
    fn all_groups() {
        let p = Permissions::from_roles(&["webpubsub.joinLeaveGroup", "webpubsub.sendToGroup"]);
        assert!(p.can_join_leave("anything"));
        assert!(p.can_send("anything"));
    }

    #[test]
    fn one_group() {
        let p =
            Permissions::from_roles(&["webpubsub.joinLeaveGroup.a", "webpubsub.sendToGroup.b.c"]);
        assert!(p.can_join_leave("a"));
        assert!(!p.can_join_leave("b.c"));
        assert!(p.can_send("b.c"));
        assert!(!p.can_send("a"));
    }

    #[test]
    fn patterns() {
        let p = Permissions::from_roles(&[
            "webpubsub.joinLeaveGroups.room-*",
            "webpubsub.sendToGroups.r?",
        ]);
        assert!(p.can_join_leave("room-1"));
        assert!(p.can_join_leave("room-"));
        assert!(!p.can_join_leave("lobby"));
        assert!(p.can_send("r1"));
        assert!(!p.can_send("r12"));
    }

    #[test]
    fn unknown_roles_are_ignored() {
        let p = Permissions::from_roles(&[
            "admin",
            "webpubsub.joinLeaveGroupX",
            "webpubsub.sendToGroupsX",
        ]);
        assert_eq!(p, Permissions::default());
    }

    #[test]
    fn what_is_mirrored_reads_back_the_same() {
        let mut p = Permissions::from_roles(&[
            "webpubsub.sendToGroups.room-*",
            "webpubsub.joinLeaveGroup",
            "webpubsub.joinLeaveGroup.a.b",
        ]);
        p.set(Permission::SendToGroup, Some("room-1"), false);
        p.set(Permission::SendToGroup, Some("x.y"), true);
        p.set(Permission::JoinLeaveGroup, Some("c"), false);
        let back = Permissions::from_mirrored(&p.mirrored());
        assert_eq!(back, p);
        assert!(!back.can_send("room-1") && back.can_send("room-2") && back.can_send("x.y"));
        assert!(!back.can_join_leave("c") && back.can_join_leave("d"));
        assert_eq!(
            Permissions::from_roles(&["!webpubsub.sendToGroup.g", "webpubsub.sendToGroup"]),
            Permissions::from_roles(&["webpubsub.sendToGroup"]),
            "a token's role cannot carry a denial"
        );
    }

    #[test]
    fn grants_and_revokes() {
        let mut p = Permissions::from_roles(&["webpubsub.sendToGroups.room-*"]);
        assert!(p.has(Permission::SendToGroup, Some("room-1")));
        assert!(!p.has(Permission::SendToGroup, None));
        p.set(Permission::SendToGroup, Some("room-1"), false);
        assert!(!p.can_send("room-1"), "a revoke beats the pattern");
        assert!(p.can_send("room-2"));
        p.set(Permission::SendToGroup, Some("room-1"), true);
        assert!(p.can_send("room-1"));
        p.set(Permission::JoinLeaveGroup, None, true);
        assert!(p.has(Permission::JoinLeaveGroup, None));
        p.set(Permission::JoinLeaveGroup, Some("x"), false);
        assert!(!p.can_join_leave("x") && p.can_join_leave("y"));
        assert!(
            !p.has(Permission::JoinLeaveGroup, None),
            "not every group any more"
        );
        p.set(Permission::SendToGroup, None, false);
        assert!(
            !p.can_send("room-2"),
            "revoking for all removes the role's grant too"
        );
        assert!(Permission::parse("SENDTOGROUP") == Some(Permission::SendToGroup));
        assert!(Permission::parse("send").is_none());
    }

    #[test]
    fn glob_cases() {
        assert!(glob(b"*", b""));
        assert!(glob(b"a*b*c", b"axxbyyc"));
        assert!(!glob(b"a*b*c", b"axxbyy"));
        assert!(glob(b"*a", b"aaa"));
        assert!(!glob(b"", b"a"));
    }
}
