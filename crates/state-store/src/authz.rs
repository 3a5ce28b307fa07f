//! The per-key authorization hook.
//!
//! The store asks the [`Authorizer`] once per request for the addressed key (and, for
//! SCAN, once per key it would return: keys a client may not see are left out of the page
//! rather than failing the scan). A denial is the refusal `not authorized`.

/// What a request wants to do with a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// GET.
    Get,
    /// SET.
    Set,
    /// DEL or VDEL.
    Delete,
    /// KEYNOTIFY, start or stop.
    KeyNotify,
    /// Seeing the key in a SCAN page.
    Scan,
}

/// Decides whether a client may perform an operation on a key.
pub trait Authorizer {
    /// `true` to allow. `client_id` is the requesting MQTT client id.
    fn authorize(&self, client_id: &str, key: &[u8], op: Operation) -> bool;
}

/// Allows everything: the default.
#[derive(Debug, Clone, Copy, Default)]
pub struct AllowAll;

impl Authorizer for AllowAll {
    fn authorize(&self, _client_id: &str, _key: &[u8], _op: Operation) -> bool {
        true
    }
}

impl<F> Authorizer for F
where
    F: Fn(&str, &[u8], Operation) -> bool,
{
    fn authorize(&self, client_id: &str, key: &[u8], op: Operation) -> bool {
        self(client_id, key, op)
    }
}
