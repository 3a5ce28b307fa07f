//! statehub's authorization: rules in, decisions out, no I/O.
//!
//! The rules have the shape of the Azure IoT Operations MQTT broker's
//! `BrokerAuthorization` resource ([`rules`]), so AIO users carry theirs over. A client
//! gets the union of what the rules whose principals match it grant:
//!
//! * `brokerResources`: `Connect` (limited to `clientIds` patterns if given), `Publish`
//!   and `Subscribe` on topic filters;
//! * `stateStoreResources`: `Read` (GET, KEYNOTIFY, SCAN) and `Write` (SET, DEL, VDEL) on
//!   keys given as glob patterns, exact strings or base64 bytes.
//!
//! Topics, `Pattern` keys and `Connect` client ids may hold `{principal.clientId}`,
//! `{principal.username}` and `{principal.attributes.<name>}` ([`template`](crate::template)
//! says what keeps a substituted value from widening a grant).
//!
//! **Deny by default once any rule exists**: with rules, a client may do only what they
//! grant (connecting included). **With no rules** everything is allowed, and the caller
//! skips authorization altogether. The [`builtin`] protections apply either way.
//!
//! A SUBSCRIBE is allowed only when one granted filter covers the requested one
//! entirely ([`topic::covers`]), as the AIO broker does: `sensors/#` granted allows
//! `sensors/+/temp` but not `#`. So what a subscription delivers, retained messages
//! included, never needs checking again.
//!
//! [`Policy::compile`] checks and compiles the rules once; [`Policy::access`] derives a
//! principal's [`Access`] (placeholders filled in, patterns compiled), which callers keep
//! per connection and ask on every operation.

mod access;
pub mod builtin;
mod policy;
pub mod rules;
mod template;
pub mod topic;

use std::collections::BTreeMap;

pub use access::{Access, Description};
pub use policy::{Policy, PolicyError, RuleError};
pub use rules::{Format, ParseError, Rule};
pub use template::TemplateError;

/// Who asks: what rules match against.
#[derive(Debug, Clone, Copy)]
pub struct Principal<'a> {
    /// The MQTT client id.
    pub client_id: &'a str,
    /// The authenticated user name, if any.
    pub username: Option<&'a str>,
    /// Authorization attributes (token claims, certificate attributes).
    pub attributes: &'a BTreeMap<String, String>,
}
