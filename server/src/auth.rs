//! Who may use the HTTP API, and from where.
//!
//! - **Bearer tokens with scopes.** `Authorization: Bearer <token>`; the
//!   configuration holds only each token's SHA-256, so a leaked config file
//!   gives nobody access. A token carries scopes: `query` (SQL and the
//!   lease and violation endpoints), `metrics` (`/metrics`) and `ingest`
//!   (endpoints that write events). `/health` is open to all, for load
//!   balancers and orchestrators.
//! - **Host and Origin.** A browser tricked into talking to the API (DNS
//!   rebinding: a hostile name that resolves to this address) sends that
//!   name as `Host`; a cross-site form or fetch sends its page as `Origin`.
//!   Both must name this server: an IP address, `localhost`, or a name in
//!   the allowed list. Anything else is refused before a token is looked
//!   at.
//!
//! With no tokens configured the API is open, which `serve` allows only on
//! a loopback address.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    Query,
    Metrics,
    Ingest,
}

/// One token, as the configuration names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// Who holds it, for logs (`grafana`, `oncall`).
    pub name: String,
    /// The token's SHA-256, in hex: `printf %s "$TOKEN" | sha256sum`.
    pub sha256: String,
    pub scopes: Vec<Scope>,
}

#[derive(Debug)]
struct Token {
    name: String,
    hash: [u8; 32],
    scopes: Vec<Scope>,
}

/// The API's guard: tokens and allowed host names.
#[derive(Debug, Default)]
pub struct HttpAuth {
    tokens: Vec<Token>,
    /// Host names besides IP addresses and `localhost`, lowercase.
    hosts: Vec<String>,
}

/// Why a request was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Denied {
    /// No token, or one that matches none: 401.
    Unauthenticated,
    /// A known token without the scope: 403.
    Forbidden { token: String, scope: Scope },
    /// `Host` or `Origin` names another server: 403.
    ForeignHost(String),
}

impl HttpAuth {
    /// `tokens` with their hashes checked; `hosts` the names clients may
    /// use for this server besides its addresses.
    pub fn new(tokens: &[TokenConfig], hosts: &[String]) -> Result<Self, String> {
        let tokens = tokens
            .iter()
            .map(|t| {
                let bytes = hex::decode(t.sha256.trim())
                    .ok()
                    .and_then(|b| <[u8; 32]>::try_from(b).ok())
                    .ok_or_else(|| {
                        format!(
                            "token {:?}: sha256 must be 64 hex digits (printf %s \"$TOKEN\" | sha256sum)",
                            t.name
                        )
                    })?;
                if t.scopes.is_empty() {
                    return Err(format!("token {:?} has no scopes", t.name));
                }
                Ok(Token {
                    name: t.name.clone(),
                    hash: bytes,
                    scopes: t.scopes.clone(),
                })
            })
            .collect::<Result<_, String>>()?;
        Ok(HttpAuth {
            tokens,
            hosts: hosts.iter().map(|h| h.to_ascii_lowercase()).collect(),
        })
    }

    /// True when no token is configured: anyone may call the API.
    pub fn is_open(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Whether `host` (a `Host` header's value, or an origin's host with
    /// its port) names this server.
    fn host_allowed(&self, host: &str) -> bool {
        let host = host.trim().to_ascii_lowercase();
        // Strip the port: `[::1]:8080`, `127.0.0.1:8080`, `name:8080`.
        let name = if let Some(rest) = host.strip_prefix('[') {
            rest.split(']').next().unwrap_or("")
        } else {
            host.rsplit_once(':').map_or(host.as_str(), |(n, _)| n)
        };
        name == "localhost"
            || name.parse::<std::net::IpAddr>().is_ok()
            || self.hosts.iter().any(|h| h == name)
    }

    /// The scope a path needs; `None` for the open ones.
    pub fn scope_for(path: &str) -> Option<Scope> {
        match path {
            "/health" => None,
            "/metrics" => Some(Scope::Metrics),
            "/v1/logs" => Some(Scope::Ingest),
            _ => Some(Scope::Query),
        }
    }

    /// Decides one request.
    pub fn check(&self, path: &str, headers: &HeaderMap) -> Result<(), Denied> {
        if let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) {
            if !self.host_allowed(host) {
                return Err(Denied::ForeignHost(host.to_string()));
            }
        }
        if let Some(origin) = headers.get(header::ORIGIN).and_then(|h| h.to_str().ok()) {
            // `null` (a sandboxed page, a file) is no site of ours either.
            let host = url::Url::parse(origin).ok().and_then(|u| {
                u.host_str()
                    .map(|h| format!("{h}:{}", u.port_or_known_default().unwrap_or(0)))
            });
            if !host.is_some_and(|h| self.host_allowed(&h)) {
                return Err(Denied::ForeignHost(origin.to_string()));
            }
        }
        let Some(scope) = Self::scope_for(path) else {
            return Ok(());
        };
        if self.is_open() {
            return Ok(());
        }
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or(Denied::Unauthenticated)?;
        let mut hash = [0u8; 32];
        hash.copy_from_slice(&Sha256::digest(presented.as_bytes()));
        let token = self
            .tokens
            .iter()
            .find(|t| t.hash == hash)
            .ok_or(Denied::Unauthenticated)?;
        if token.scopes.contains(&scope) {
            Ok(())
        } else {
            Err(Denied::Forbidden {
                token: token.name.clone(),
                scope,
            })
        }
    }
}

/// The axum middleware around every route.
pub async fn guard(State(auth): State<Arc<HttpAuth>>, req: Request, next: Next) -> Response {
    match auth.check(req.uri().path(), req.headers()) {
        Ok(()) => next.run(req).await,
        Err(denied) => denied.into_response(),
    }
}

impl IntoResponse for Denied {
    fn into_response(self) -> Response {
        let (status, error, message) = match &self {
            Denied::Unauthenticated => (
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "a bearer token is required: Authorization: Bearer <token>".to_string(),
            ),
            Denied::Forbidden { token, scope } => (
                StatusCode::FORBIDDEN,
                "forbidden",
                format!("token {token:?} lacks the {scope:?} scope").to_lowercase(),
            ),
            Denied::ForeignHost(h) => (
                StatusCode::FORBIDDEN,
                "foreign_host",
                format!("{h} does not name this server (serve.allowed_hosts lists the names it answers to)"),
            ),
        };
        if status == StatusCode::UNAUTHORIZED {
            tracing::info!(error, "refused an HTTP request without a valid token");
        } else {
            tracing::warn!(error, %message, "refused an HTTP request");
        }
        let mut resp = (
            status,
            Json(serde_json::json!({ "error": error, "message": message })),
        )
            .into_response();
        if status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn sha(s: &str) -> String {
        hex::encode(Sha256::digest(s.as_bytes()))
    }

    fn auth() -> HttpAuth {
        HttpAuth::new(
            &[
                TokenConfig {
                    name: "grafana".into(),
                    sha256: sha("s3cret"),
                    scopes: vec![Scope::Query],
                },
                TokenConfig {
                    name: "prom".into(),
                    sha256: sha("scrape"),
                    scopes: vec![Scope::Metrics],
                },
            ],
            &["leaseline.example.com".into()],
        )
        .unwrap()
    }

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(k.clone(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn tokens_open_what_their_scopes_name_and_nothing_else() {
        let a = auth();
        let bearer = |t: &str| headers(&[(header::AUTHORIZATION, &format!("Bearer {t}"))]);
        assert_eq!(a.check("/api/v1/sql", &bearer("s3cret")), Ok(()));
        assert_eq!(
            a.check("/metrics", &bearer("s3cret")),
            Err(Denied::Forbidden {
                token: "grafana".into(),
                scope: Scope::Metrics
            })
        );
        assert_eq!(a.check("/metrics", &bearer("scrape")), Ok(()));
        assert_eq!(
            a.check("/api/v1/sql", &bearer("wrong")),
            Err(Denied::Unauthenticated)
        );
        assert_eq!(
            a.check("/api/v1/sql", &HeaderMap::new()),
            Err(Denied::Unauthenticated)
        );
        assert_eq!(a.check("/health", &HeaderMap::new()), Ok(()));
    }

    #[test]
    fn host_and_origin_must_name_this_server() {
        let a = auth();
        for ok in [
            "127.0.0.1:8080",
            "[::1]:8080",
            "localhost:8080",
            "LeaseLine.example.com",
        ] {
            assert_eq!(
                a.check("/health", &headers(&[(header::HOST, ok)])),
                Ok(()),
                "{ok}"
            );
        }
        let rebinding = headers(&[(header::HOST, "evil.example:8080")]);
        assert_eq!(
            a.check("/health", &rebinding),
            Err(Denied::ForeignHost("evil.example:8080".into()))
        );
        let cross_site = headers(&[
            (header::HOST, "127.0.0.1:8080"),
            (header::ORIGIN, "https://evil.example"),
        ]);
        assert!(matches!(
            a.check("/health", &cross_site),
            Err(Denied::ForeignHost(_))
        ));
        let null = headers(&[(header::ORIGIN, "null")]);
        assert!(matches!(
            a.check("/health", &null),
            Err(Denied::ForeignHost(_))
        ));
        let same = headers(&[(header::ORIGIN, "http://localhost:3000")]);
        assert_eq!(a.check("/health", &same), Ok(()));
    }

    #[test]
    fn a_bad_hash_or_no_scope_is_a_configuration_error() {
        let bad = TokenConfig {
            name: "x".into(),
            sha256: "abc".into(),
            scopes: vec![Scope::Query],
        };
        assert!(HttpAuth::new(&[bad], &[])
            .unwrap_err()
            .contains("64 hex digits"));
        let none = TokenConfig {
            name: "x".into(),
            sha256: sha("t"),
            scopes: vec![],
        };
        assert_eq!(
            HttpAuth::new(&[none], &[]).unwrap_err(),
            "token \"x\" has no scopes"
        );
    }
}
