//! Helpers shared by the integration tests.
#![allow(dead_code)]

use bytes::Bytes;
use statehub_state_store::{Config, Effect, Hlc, Machine, MemoryEngine, Outcome, Request};

/// 2023-10-03T23:07:05Z, the protocol page's example time.
pub const T0: u64 = 1_696_374_425_000;

/// A RESP array of bulk strings, as the SDKs serialize requests.
pub fn resp(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// A client HLC at `ms`.
pub fn client_ts(ms: u64) -> String {
    format!("{ms:015}:00000:CLIENT")
}

/// A server version.
pub fn version(wall_ms: u64, counter: u64) -> Hlc {
    Hlc::new(wall_ms, counter, "state-store")
}

/// A request with the given payload and properties.
pub fn request<'a>(
    client: &'a str,
    payload: &[u8],
    ts: Option<&'a str>,
    ft: Option<&'a str>,
) -> Request<'a> {
    Request {
        client_id: client,
        payload: Bytes::copy_from_slice(payload),
        timestamp: ts,
        fencing_token: ft,
        access: None,
    }
}

/// A machine plus a hand-driven clock.
pub struct Harness {
    pub machine: Machine<MemoryEngine>,
    pub now: u64,
}

impl Harness {
    pub fn new() -> Self {
        Self::with_config(Config::default())
    }

    pub fn with_config(config: Config) -> Self {
        Self {
            machine: Machine::in_memory(config),
            now: T0,
        }
    }

    /// Sends `args` from `client` with `__ts` = the client clock at `now`.
    pub fn send(&mut self, client: &str, args: &[&[u8]]) -> Outcome {
        let ts = client_ts(self.now);
        self.send_with(client, args, Some(&ts), None)
    }

    /// Sends `args` with explicit `__ts` and `__ft`.
    pub fn send_with(
        &mut self,
        client: &str,
        args: &[&[u8]],
        ts: Option<&str>,
        ft: Option<&str>,
    ) -> Outcome {
        self.raw(request(client, &resp(args), ts, ft))
    }

    pub fn raw(&mut self, request: Request) -> Outcome {
        self.machine
            .handle(request, self.now)
            .expect("memory engine never fails")
    }

    /// The reply payload and `__ts` of a request, asserting it had no effects.
    pub fn reply(&mut self, client: &str, args: &[&[u8]]) -> (Vec<u8>, Option<String>) {
        let outcome = self.send(client, args);
        (
            outcome.reply.payload.to_vec(),
            outcome.reply.version.map(|v| v.to_string()),
        )
    }

    pub fn advance(&mut self, ms: u64) {
        self.now += ms;
    }
}

/// The notify effects among `effects`, as (client, key, payload, `__ts`).
pub fn notifies(effects: &[Effect]) -> Vec<(String, Vec<u8>, Vec<u8>, String)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Notify(n) => Some((
                n.client_id.clone(),
                n.key.to_vec(),
                n.payload.to_vec(),
                n.version.to_string(),
            )),
            Effect::ArmExpiry { .. } | Effect::AwaitDurable(_) => None,
        })
        .collect()
}
