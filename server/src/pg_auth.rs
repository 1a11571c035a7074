//! Password authentication of the PostgreSQL protocol: SCRAM-SHA-256
//! (RFC 5802 and RFC 7677) for several users.
//!
//! Each user is known by the verifier PostgreSQL keeps in `pg_authid`,
//! `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>` (base64), so
//! the server can check a password without holding it. A configured
//! plaintext password is turned into a verifier at start and dropped.
//!
//! The exchange, after the startup message names the user:
//!
//! ```text
//! server: AuthenticationSASL          "SCRAM-SHA-256"
//! client: SASLInitialResponse         n,,n=,r=<client nonce>
//! server: AuthenticationSASLContinue  r=<client nonce><server nonce>,s=<salt>,i=<iterations>
//! client: SASLResponse                c=biws,r=<nonce>,p=<ClientProof>
//! server: AuthenticationSASLFinal     v=<ServerSignature>, then AuthenticationOk
//! ```
//!
//! The server checks `H(ClientProof XOR HMAC(StoredKey, AuthMessage)) ==
//! StoredKey` and proves itself with `HMAC(ServerKey, AuthMessage)`. The
//! user is the startup message's; the SCRAM user name is ignored, as
//! PostgreSQL does. An unknown user goes through the same exchange with a
//! salt derived from its name and fails at the proof, so a client cannot
//! tell which users exist. Channel binding (`SCRAM-SHA-256-PLUS`) is not
//! offered. Every failure is logged at warn with the peer's address and the
//! user name, never with what the client sent as proof.

use std::collections::BTreeMap;
use std::fmt::{self, Debug};
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use datafusion_postgres::pgwire::api::auth::sasl::scram::{gen_salted_password, random_nonce};
use datafusion_postgres::pgwire::api::auth::{
    finish_authentication, protocol_negotiation, save_startup_parameters_to_metadata,
    DefaultServerParameterProvider, StartupHandler,
};
use datafusion_postgres::pgwire::api::{
    ClientInfo, ConnectionGuard, ConnectionHandle, ConnectionManager, PgWireConnectionState,
    PidSecretKeyGenerator, RandomPidSecretKeyGenerator,
};
use datafusion_postgres::pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use datafusion_postgres::pgwire::messages::startup::Authentication;
use datafusion_postgres::pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use futures::{Sink, SinkExt};
use ring::{digest, hmac};

const MECHANISM: &str = "SCRAM-SHA-256";

/// PostgreSQL's default `scram_iterations`.
pub const DEFAULT_ITERATIONS: u32 = 4096;

/// What the server keeps of a password: PostgreSQL's SCRAM-SHA-256 verifier.
#[derive(Clone, PartialEq, Eq)]
pub struct ScramVerifier {
    iterations: u32,
    salt: Vec<u8>,
    stored_key: Vec<u8>,
    server_key: Vec<u8>,
}

impl ScramVerifier {
    /// The verifier of `password` with a fresh random salt (16 bytes, as
    /// PostgreSQL) and [`DEFAULT_ITERATIONS`].
    pub fn new(password: &str) -> Self {
        let salt: [u8; 16] = rand_bytes();
        Self::with_salt(password, &salt, DEFAULT_ITERATIONS)
    }

    /// The verifier of `password` with this salt and iteration count. The
    /// password is SASLprep-normalised first, as by clients.
    pub fn with_salt(password: &str, salt: &[u8], iterations: u32) -> Self {
        let salted = gen_salted_password(password, salt, iterations.max(1) as usize);
        let client_key = mac(&salted, b"Client Key");
        ScramVerifier {
            iterations: iterations.max(1),
            salt: salt.to_vec(),
            stored_key: sha256(&client_key),
            server_key: mac(&salted, b"Server Key"),
        }
    }

    /// True when this is the verifier of `password`.
    pub fn is_of(&self, password: &str) -> bool {
        let other = Self::with_salt(password, &self.salt, self.iterations);
        same(&other.stored_key, &self.stored_key)
    }
}

impl FromStr for ScramVerifier {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        const FORM: &str = "SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>";
        let bad = |why: &str| format!("not a SCRAM-SHA-256 verifier ({why}); expected {FORM}");
        let rest = s
            .trim()
            .strip_prefix("SCRAM-SHA-256$")
            .ok_or_else(|| bad("it does not start with SCRAM-SHA-256$"))?;
        let (params, keys) = rest.split_once('$').ok_or_else(|| bad("no second $"))?;
        let (iterations, salt) = params
            .split_once(':')
            .ok_or_else(|| bad("no : between iterations and salt"))?;
        let (stored, server) = keys
            .split_once(':')
            .ok_or_else(|| bad("no : between StoredKey and ServerKey"))?;
        let iterations: u32 = iterations
            .parse()
            .ok()
            .filter(|&i| i > 0)
            .ok_or_else(|| bad("the iteration count is not a positive number"))?;
        let decode = |what: &str, v: &str| {
            B64.decode(v)
                .map_err(|_| bad(&format!("the {what} is not base64")))
        };
        let salt = decode("salt", salt)?;
        let stored_key = decode("StoredKey", stored)?;
        let server_key = decode("ServerKey", server)?;
        if salt.is_empty() {
            return Err(bad("the salt is empty"));
        }
        if stored_key.len() != 32 || server_key.len() != 32 {
            return Err(bad("the keys are not 32 bytes each"));
        }
        Ok(ScramVerifier {
            iterations,
            salt,
            stored_key,
            server_key,
        })
    }
}

impl fmt::Display for ScramVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SCRAM-SHA-256${}:{}${}:{}",
            self.iterations,
            B64.encode(&self.salt),
            B64.encode(&self.stored_key),
            B64.encode(&self.server_key)
        )
    }
}

impl Debug for ScramVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScramVerifier")
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

/// The users who may connect, by name.
pub struct PgUsers {
    users: BTreeMap<String, ScramVerifier>,
    /// Derives the made-up salt of an unknown user.
    mock: hmac::Key,
}

impl PgUsers {
    /// Refuses a name given twice.
    pub fn new(users: impl IntoIterator<Item = (String, ScramVerifier)>) -> Result<Self, String> {
        let mut map = BTreeMap::new();
        for (name, verifier) in users {
            if name.is_empty() {
                return Err("a PostgreSQL user has an empty name".into());
            }
            if map.insert(name.clone(), verifier).is_some() {
                return Err(format!("the PostgreSQL user {name:?} is configured twice"));
            }
        }
        Ok(PgUsers {
            users: map,
            mock: hmac::Key::new(hmac::HMAC_SHA256, &rand_bytes::<32>()),
        })
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.users.keys().map(String::as_str)
    }

    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    /// The user's verifier, or for an unknown user one no proof matches,
    /// with a salt that stays the same for the name.
    fn verifier(&self, user: &str) -> (ScramVerifier, bool) {
        match self.users.get(user) {
            Some(v) => (v.clone(), true),
            None => {
                let salt = hmac::sign(&self.mock, user.as_bytes());
                (
                    ScramVerifier {
                        iterations: DEFAULT_ITERATIONS,
                        salt: salt.as_ref()[..16].to_vec(),
                        stored_key: rand_bytes::<32>().to_vec(),
                        server_key: rand_bytes::<32>().to_vec(),
                    },
                    false,
                )
            }
        }
    }
}

impl Debug for PgUsers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.users.keys()).finish()
    }
}

/// One connection's SCRAM exchange. pgwire asks for a startup handler per
/// connection, so the state is the connection's own.
pub struct ScramStartup {
    users: Arc<PgUsers>,
    /// Where cancel requests find the connection once it is in.
    connections: Arc<ConnectionManager>,
    phase: Mutex<Phase>,
}

enum Phase {
    /// Before the startup message.
    Start,
    /// AuthenticationSASL sent: the client's first message is next.
    First {
        user: String,
    },
    /// The server's first message sent: the client's proof is next.
    Final(Box<Exchange>),
    Done,
}

struct Exchange {
    user: String,
    known: bool,
    verifier: ScramVerifier,
    /// `n,,` or `y,,`, which the client repeats base64-encoded in `c=`.
    gs2_header: String,
    client_first_bare: String,
    server_first: String,
    nonce: String,
}

impl ScramStartup {
    pub fn new(users: Arc<PgUsers>, connections: Arc<ConnectionManager>) -> Self {
        ScramStartup {
            users,
            connections,
            phase: Mutex::new(Phase::Start),
        }
    }

    fn phase(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The client's first message: `gs2-header client-first-bare`.
    fn first(&self, user: String, data: &[u8]) -> Result<Exchange, &'static str> {
        let text = std::str::from_utf8(data).map_err(|_| "client-first is not UTF-8")?;
        let (flag, rest) = text.split_once(',').ok_or("no GS2 header")?;
        let (authzid, bare) = rest.split_once(',').ok_or("no GS2 header")?;
        match flag {
            "n" | "y" => {}
            _ => return Err("channel binding was asked for, and is not offered"),
        }
        if !authzid.is_empty() {
            return Err("an authorization identity is not supported");
        }
        let mut client_nonce = None;
        for (i, attr) in bare.split(',').enumerate() {
            match attr.split_once('=') {
                Some(("m", _)) if i == 0 => return Err("mandatory extensions are not supported"),
                Some(("r", nonce)) if !nonce.is_empty() => client_nonce = Some(nonce),
                _ => {}
            }
        }
        let client_nonce = client_nonce.ok_or("no client nonce")?;
        if !client_nonce
            .bytes()
            .all(|b| (0x21..=0x7e).contains(&b) && b != b',')
        {
            return Err("the client nonce has characters SCRAM does not allow");
        }
        let (verifier, known) = self.users.verifier(&user);
        let nonce = format!("{client_nonce}{}", random_nonce());
        let server_first = format!(
            "r={nonce},s={},i={}",
            B64.encode(&verifier.salt),
            verifier.iterations
        );
        Ok(Exchange {
            user,
            known,
            verifier,
            gs2_header: format!("{flag},{authzid},"),
            client_first_bare: bare.to_owned(),
            server_first,
            nonce,
        })
    }
}

impl Exchange {
    /// Checks the client's final message; the server's final message when
    /// the proof holds.
    fn verify(&self, data: &[u8]) -> Result<Result<String, ()>, &'static str> {
        let text = std::str::from_utf8(data).map_err(|_| "client-final is not UTF-8")?;
        let at = text.rfind(",p=").ok_or("no proof")?;
        let (without_proof, proof) = (&text[..at], &text[at + 3..]);
        let mut binding = None;
        let mut nonce = None;
        for attr in without_proof.split(',') {
            match attr.split_once('=') {
                Some(("c", v)) => binding = Some(v),
                Some(("r", v)) => nonce = Some(v),
                _ => {}
            }
        }
        if binding != Some(B64.encode(&self.gs2_header).as_str()) {
            return Err("the channel binding does not repeat the GS2 header");
        }
        if nonce != Some(self.nonce.as_str()) {
            return Err("the nonce is not the one of this exchange");
        }
        let proof = B64.decode(proof).map_err(|_| "the proof is not base64")?;
        if proof.len() != 32 {
            return Err("the proof is not 32 bytes");
        }
        let auth_message = format!(
            "{},{},{}",
            self.client_first_bare, self.server_first, without_proof
        );
        let signature = mac(&self.verifier.stored_key, auth_message.as_bytes());
        let client_key: Vec<u8> = proof.iter().zip(&signature).map(|(p, s)| p ^ s).collect();
        if !same(&sha256(&client_key), &self.verifier.stored_key) {
            return Ok(Err(()));
        }
        let server_signature = mac(&self.verifier.server_key, auth_message.as_bytes());
        Ok(Ok(format!("v={}", B64.encode(server_signature))))
    }
}

/// FATAL 28P01, PostgreSQL's answer to a wrong password or an unknown user.
fn refused(user: &str) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "FATAL".to_owned(),
        "28P01".to_owned(),
        format!("password authentication failed for user \"{user}\""),
    )))
}

/// FATAL 08P01 for a SCRAM message that does not follow the protocol.
fn malformed(why: &str) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "FATAL".to_owned(),
        "08P01".to_owned(),
        format!("malformed SCRAM message: {why}"),
    )))
}

#[async_trait]
impl StartupHandler for ScramStartup {
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let peer = client.socket_addr();
        match message {
            PgWireFrontendMessage::Startup(ref startup) => {
                protocol_negotiation(client, startup).await?;
                save_startup_parameters_to_metadata(client, startup);
                let user = client.metadata().get("user").cloned().unwrap_or_default();
                if user.is_empty() {
                    return Err(PgWireError::UserError(Box::new(ErrorInfo::new(
                        "FATAL".to_owned(),
                        "28000".to_owned(),
                        "no PostgreSQL user name specified in startup packet".to_owned(),
                    ))));
                }
                *self.phase() = Phase::First { user };
                client.set_state(PgWireConnectionState::AuthenticationInProgress);
                client
                    .send(PgWireBackendMessage::Authentication(Authentication::SASL(
                        vec![MECHANISM.to_owned()],
                    )))
                    .await?;
            }
            PgWireFrontendMessage::PasswordMessageFamily(msg) => {
                let phase = std::mem::replace(&mut *self.phase(), Phase::Done);
                match phase {
                    Phase::First { user } => {
                        let initial = msg.into_sasl_initial_response()?;
                        if initial.auth_method != MECHANISM {
                            tracing::warn!(%peer, user, mechanism = initial.auth_method, "postgres authentication failed: unsupported SASL mechanism");
                            return Err(malformed("only SCRAM-SHA-256 is offered"));
                        }
                        let data = initial.data.unwrap_or_default();
                        let exchange = self.first(user.clone(), &data).map_err(|why| {
                            tracing::warn!(%peer, user, why, "postgres authentication failed: malformed SCRAM message");
                            malformed(why)
                        })?;
                        let server_first = exchange.server_first.clone();
                        *self.phase() = Phase::Final(Box::new(exchange));
                        client
                            .send(PgWireBackendMessage::Authentication(
                                Authentication::SASLContinue(server_first.into_bytes().into()),
                            ))
                            .await?;
                    }
                    Phase::Final(exchange) => {
                        let response = msg.into_sasl_response()?;
                        let user = exchange.user.as_str();
                        let server_final = match exchange.verify(&response.data) {
                            Err(why) => {
                                tracing::warn!(%peer, user, why, "postgres authentication failed: malformed SCRAM message");
                                return Err(malformed(why));
                            }
                            Ok(Err(())) => {
                                let why = if exchange.known {
                                    "wrong password"
                                } else {
                                    "no such user"
                                };
                                tracing::warn!(%peer, user, why, "postgres authentication failed");
                                return Err(refused(user));
                            }
                            Ok(Ok(server_final)) => server_final,
                        };
                        client
                            .send(PgWireBackendMessage::Authentication(
                                Authentication::SASLFinal(server_final.into_bytes().into()),
                            ))
                            .await?;
                        let (pid, secret_key) =
                            RandomPidSecretKeyGenerator::default().generate(client);
                        client.set_pid_and_secret_key(pid, secret_key.clone());
                        let (handle, guard) = self.connections.register(pid, secret_key);
                        client
                            .session_extensions()
                            .insert::<Arc<ConnectionHandle>>(handle);
                        client.session_extensions().insert::<ConnectionGuard>(guard);
                        tracing::debug!(%peer, user, "postgres user authenticated");
                        finish_authentication(client, &DefaultServerParameterProvider::default())
                            .await?;
                    }
                    Phase::Start | Phase::Done => {
                        return Err(malformed("a password message out of turn"));
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }
}

fn mac(key: &[u8], message: &[u8]) -> Vec<u8> {
    hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), message)
        .as_ref()
        .to_vec()
}

fn sha256(data: &[u8]) -> Vec<u8> {
    digest::digest(&digest::SHA256, data).as_ref().to_vec()
}

/// Compares in time that does not depend on where the bytes differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn rand_bytes<const N: usize>() -> [u8; N] {
    use ring::rand::SecureRandom;
    let mut out = [0u8; N];
    ring::rand::SystemRandom::new()
        .fill(&mut out)
        .expect("the system's random source");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verifiers_round_trip_and_recognise_their_password() {
        let v = ScramVerifier::new("s3cret");
        let text = v.to_string();
        assert!(text.starts_with("SCRAM-SHA-256$4096:"), "{text}");
        let back: ScramVerifier = text.parse().unwrap();
        assert_eq!(back, v);
        assert!(back.is_of("s3cret"));
        assert!(!back.is_of("s3cre"));
        assert!(!format!("{back:?}").contains(&B64.encode(&v.stored_key)));
        for bad in [
            "md5abc",
            "SCRAM-SHA-256$0:c2FsdA==$AAAA:AAAA",
            "SCRAM-SHA-256$4096:c2FsdA==$AAAA:AAAA",
            "SCRAM-SHA-256$4096:c2FsdA==",
        ] {
            assert!(bad.parse::<ScramVerifier>().is_err(), "{bad}");
        }
    }

    /// RFC 7677's example exchange, user "user", password "pencil".
    #[test]
    fn the_rfc_7677_exchange_verifies() {
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let verifier = ScramVerifier::with_salt("pencil", &salt, 4096);
        let exchange = Exchange {
            user: "user".into(),
            known: true,
            verifier,
            gs2_header: "n,,".into(),
            client_first_bare: "n=user,r=rOprNGfwEbeRWgbNEkqO".into(),
            server_first: "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096".into(),
            nonce: "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0".into(),
        };
        let final_ok = exchange.verify(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=");
        assert_eq!(
            final_ok,
            Ok(Ok(
                "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=".to_string()
            ))
        );
        let wrong = exchange.verify(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=AHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=");
        assert_eq!(wrong, Ok(Err(())));
        assert!(exchange
            .verify(b"c=biws,r=other,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
            .is_err());
    }
}
