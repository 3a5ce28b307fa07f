//! A REST caller signing each request the way the server SDKs do: an HS256 JWT with the
//! full request URL as audience.

use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use super::KEY;

pub const V: &str = "api-version=2024-12-01";

/// A REST token for `url`, signed with `key`.
pub fn rest_token(url: &str, key: &str) -> String {
    let exp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3600;
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &json!({"aud": url, "exp": exp}),
        &EncodingKey::from_secret(key.as_bytes()),
    )
    .unwrap()
}

/// A response: status, headers, body text.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }

    /// Asserts the service's error form: `{code, message}` and `x-ms-error-code`.
    pub fn error(&self, status: u16) -> Value {
        assert_eq!(self.status.as_u16(), status, "{}", self.body);
        let v = self.json();
        assert!(v["code"].is_string() && v["message"].is_string(), "{v}");
        assert_eq!(
            self.headers
                .get("x-ms-error-code")
                .unwrap()
                .to_str()
                .unwrap(),
            v["code"].as_str().unwrap()
        );
        v
    }
}

#[derive(Debug, Clone)]
pub struct Api {
    pub addr: SocketAddr,
    client: reqwest::Client,
}

impl Api {
    pub fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            client: reqwest::Client::new(),
        }
    }

    /// `method` on `path_and_query` (relative to the server) with a valid token.
    pub async fn call(&self, method: &str, path_and_query: &str) -> Reply {
        self.send(method, path_and_query, None, Vec::new()).await
    }

    /// `POST` of `body` as `content_type`.
    pub async fn post(&self, path_and_query: &str, content_type: &str, body: &[u8]) -> Reply {
        self.send("POST", path_and_query, Some(content_type), body.to_vec())
            .await
    }

    /// Same, with a body of `content_type`.
    pub async fn send(
        &self,
        method: &str,
        path_and_query: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> Reply {
        let url = format!("http://{}{path_and_query}", self.addr);
        self.raw(
            method,
            &url,
            Some(&rest_token(&url, KEY)),
            content_type,
            body,
        )
        .await
    }

    /// A request with exactly this bearer token (or none).
    pub async fn raw(
        &self,
        method: &str,
        url: &str,
        token: Option<&str>,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> Reply {
        let mut req = self
            .client
            .request(Method::from_bytes(method.as_bytes()).unwrap(), url)
            .body(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        let resp = req.send().await.unwrap();
        Reply {
            status: resp.status(),
            headers: resp.headers().clone(),
            body: resp.text().await.unwrap(),
        }
    }
}

/// A client of hub `chat` with this user, no roles, these initial groups and this
/// subprotocol; returns it with its `connected` message.
pub async fn client(
    addr: SocketAddr,
    user: Option<&str>,
    groups: &[&str],
    protocol: Option<&str>,
) -> (super::Ws, Value) {
    let t = super::token(addr, "chat", user, &[], groups);
    super::connect(addr, "chat", &t, protocol).await
}
