//! The trusted roles' HTTPS API (docs/client.md): the KV routes of a front end and the jobs
//! routes of the leader, behind client credentials, every answer signed by the endpoint's
//! attested TLS key over the request's nonce.
//!
//! [`Guard`] is what every route shares: it checks a request's credential (an owner-signed
//! [`ClientCert`] and the client's signature over the request) and signs the answer. [`kv`]
//! maps the KV routes onto a [`FrontEnd`], so the HTTPS API and the memcached protocol are two
//! views of the same items: a value put over HTTPS is a memcached item with flags 0 and no
//! expiry, and a memcached `set` is readable over HTTPS.

use crate::util::now_ms;
use base64::Engine as _;
use psl_capsule::{CapsuleName, ClientCert, Permissions};
use psl_crypto::{OwnerPublicKey, Signature};
use psl_faas::tls::AnswerSigner;
use psl_http::{ApiAnswer, ApiRequest, Outcome as Counted};
use psl_memcached::op::{Outcome, Rmw};
use psl_memcached::{FrontEnd, Versioned};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// The prefixes [`kv`] serves.
pub const KV_PREFIXES: [&str; 4] = ["/v1/kv", "/v1/cas", "/v1/sync", "/v1/batch"];
/// Longest key, after percent-decoding: memcached's, so every key is also a memcached key.
pub const KEY_BYTES_MAX: usize = 250;
/// Most items one scan answers.
pub const SCAN_LIMIT_MAX: usize = 1000;
/// Items a scan answers when the request names no limit.
pub const SCAN_LIMIT_DEFAULT: usize = 100;
/// Most ops in one atomic batch (`POST /v1/batch`); the request body's bound limits its bytes.
pub const BATCH_OPS_MAX: usize = 256;
/// How long a sync may wait before the answer says it timed out.
pub const SYNC_TIMEOUT_MS: u64 = 10_000;

/// The checks and the signature every API answer shares.
pub struct Guard {
    capsule: CapsuleName,
    owner: OwnerPublicKey,
    spki_hash: [u8; 32],
    signer: AnswerSigner,
    /// Certificates whose owner signature checked, decoded, by the SHA-256 of their bytes: a
    /// client shows the same one on every request, and its signature never changes. Emptied
    /// when it reaches [`CERTS_CACHED_MAX`]. What is still checked per request: the capsule,
    /// the expiry, the permission, and the client's signature over the request (or that its
    /// connection proved the credential).
    checked: parking_lot::Mutex<std::collections::HashMap<[u8; 32], ClientCert>>,
}

/// Most certificates [`Guard`] remembers as checked.
pub const CERTS_CACHED_MAX: usize = 4096;

/// A refusal before the route runs: status, how it is counted, why.
type Refusal = (u16, Counted, String);

impl Guard {
    /// A guard for `capsule` under `owner`'s credentials, signing with the endpoint's TLS key
    /// (`signer`, whose certificate's SPKI hash is `spki_hash`).
    pub fn new(capsule: CapsuleName, owner: OwnerPublicKey, spki_hash: [u8; 32], signer: AnswerSigner) -> Guard {
        Guard { capsule, owner, spki_hash, signer, checked: Default::default() }
    }

    /// The request's nonce (`psl-nonce`, 64 hex digits; 32 zero bytes when absent).
    fn nonce(req: &ApiRequest) -> Result<[u8; 32], Refusal> {
        let Some(h) = req.header("psl-nonce") else { return Ok([0; 32]) };
        let mut n = [0u8; 32];
        hex::decode_to_slice(h.trim(), &mut n)
            .map_err(|_| (400, Counted::Bad, "psl-nonce must be 64 hex digits (32 fresh random bytes)".to_string()))?;
        Ok(n)
    }

    /// Checks the credential and the client's signature over this request.
    fn authorize(&self, req: &ApiRequest, nonce: &[u8; 32], rh: &[u8; 32], needs: Permissions) -> Result<(), Refusal> {
        let unauth = |why: String| (401, Counted::Unauthenticated, why);
        let cert = req.header("psl-credential").ok_or_else(|| {
            unauth("no credential: send psl-credential and psl-signature (psl keys client makes one)".into())
        })?;
        let bytes = hex::decode(cert.trim()).map_err(|_| unauth("psl-credential is not hex".into()))?;
        let refused = |e: psl_capsule::ClientCertError| {
            let counted = if e.status() == 403 { Counted::Forbidden } else { Counted::Unauthenticated };
            (e.status(), counted, e.to_string())
        };
        let id = psl_crypto::sha256(&[&bytes]).0;
        let cached = self.checked.lock().get(&id).cloned();
        let cert = match cached {
            Some(c) => c,
            None => {
                let cert = ClientCert::decode(&bytes).map_err(|e| unauth(format!("psl-credential: {e}")))?;
                cert.check_signature(&self.owner).map_err(refused)?;
                let mut c = self.checked.lock();
                if c.len() >= CERTS_CACHED_MAX {
                    c.clear();
                }
                c.insert(id, cert.clone());
                cert
            }
        };
        cert.check_use(self.capsule, now_ms(), needs).map_err(refused)?;
        let proved = *req.connection.principal.lock() == Some(id);
        let Some(given) = req.header("psl-signature") else {
            // This connection proved the credential's key already: over TLS, only the party
            // that made the handshake sends on it.
            return if proved {
                Ok(())
            } else {
                Err(unauth("no psl-signature: the first request of a connection is signed".into()))
            };
        };
        if req.header("psl-nonce").is_none() {
            return Err(unauth("a signed request needs psl-nonce: the signature covers it".into()));
        }
        let mut sig = [0u8; 64];
        hex::decode_to_slice(given.trim(), &mut sig)
            .map_err(|_| unauth("psl-signature must be 128 hex digits (r ‖ s)".into()))?;
        let digest = psl_capsule::client::request_digest(&self.spki_hash, nonce, rh);
        cert.key.verify(&digest, &Signature(sig)).map_err(|_| {
            unauth("psl-signature does not verify under the credential's key for this request and endpoint".into())
        })?;
        *req.connection.principal.lock() = Some(id);
        Ok(())
    }

    /// The answer, signed over `nonce ‖ request hash ‖ status ‖ SHA-256(body)`.
    fn answer(&self, nonce: &[u8; 32], rh: &[u8; 32], status: u16, counted: Counted, body: &Value) -> ApiAnswer {
        let body = body.to_string().into_bytes();
        let sig = self.signer.sign(&answer_message(nonce, rh, status, &body));
        ApiAnswer { status, body, headers: vec![("psl-signature", hex::encode(sig))], outcome: counted, events: None }
    }

    /// Serves one KV request: credential, route, signed answer.
    pub fn serve(&self, req: &ApiRequest, route: impl FnOnce(&Request) -> (u16, Value)) -> ApiAnswer {
        self.serve_with(req, Request::parse, Request::needs, route)
    }

    /// Serves one request of any route set: `parse` it, check the credential for what it
    /// `needs`, run `route`, sign the answer.
    pub fn serve_with<R>(
        &self,
        req: &ApiRequest,
        parse: impl FnOnce(&ApiRequest) -> Result<R, (u16, String)>,
        needs: impl FnOnce(&R) -> Permissions,
        route: impl FnOnce(&R) -> (u16, Value),
    ) -> ApiAnswer {
        match self.admit(req, parse, needs) {
            Ok((parsed, nonce, rh)) => {
                let (status, body) = route(&parsed);
                self.answer(&nonce, &rh, status, counted_as(status), &body)
            }
            Err(refused) => refused,
        }
    }

    /// Nonce, parse and credential: the request parsed with its nonce and hash, or the
    /// signed refusal.
    fn admit<R>(
        &self,
        req: &ApiRequest,
        parse: impl FnOnce(&ApiRequest) -> Result<R, (u16, String)>,
        needs: impl FnOnce(&R) -> Permissions,
    ) -> Result<(R, [u8; 32], [u8; 32]), ApiAnswer> {
        let rh = psl_capsule::client::request_hash(&req.method, &req.path_and_query, &req.body);
        let nonce = Self::nonce(req)
            .map_err(|(status, counted, why)| self.answer(&[0; 32], &rh, status, counted, &json!({ "error": why })))?;
        let parsed = parse(req)
            .map_err(|(status, why)| self.answer(&nonce, &rh, status, Counted::Bad, &json!({ "error": why })))?;
        if let Err((status, counted, why)) = self.authorize(req, &nonce, &rh, needs(&parsed)) {
            return Err(self.answer(&nonce, &rh, status, counted, &json!({ "error": why })));
        }
        Ok((parsed, nonce, rh))
    }

    /// Serves a request answered by a stream of server-sent events: checked as
    /// [`Guard::serve_with`] checks, then `start` gets an [`EventSigner`] bound to this
    /// request and returns the stream (or a status and body to answer instead). The stream's
    /// head is signed over an empty body; each event is signed on its own.
    pub fn serve_events<R>(
        self: &Arc<Self>,
        req: &ApiRequest,
        parse: impl FnOnce(&ApiRequest) -> Result<R, (u16, String)>,
        needs: impl FnOnce(&R) -> Permissions,
        start: impl FnOnce(&R, EventSigner) -> Result<psl_http::Events, (u16, Value)>,
    ) -> ApiAnswer {
        let (parsed, nonce, rh) = match self.admit(req, parse, needs) {
            Ok(a) => a,
            Err(refused) => return refused,
        };
        match start(&parsed, EventSigner { guard: self.clone(), nonce, request_hash: rh }) {
            Ok(events) => {
                let sig = self.signer.sign(&answer_message(&nonce, &rh, 200, b""));
                ApiAnswer {
                    status: 200,
                    body: Vec::new(),
                    headers: vec![("psl-signature", hex::encode(sig))],
                    outcome: Counted::Ok,
                    events: Some(events),
                }
            }
            Err((status, body)) => self.answer(&nonce, &rh, status, counted_as(status), &body),
        }
    }
}

fn counted_as(status: u16) -> Counted {
    match status {
        200..=299 | 404 | 409 => Counted::Ok,
        400..=499 => Counted::Bad,
        _ => Counted::Failed,
    }
}

/// Signs the events of one streamed answer, each over the request's nonce and hash and its
/// sequence number ([`event_message`]), so a client can tell an event of its own stream, in
/// its place, from a replayed or reordered one.
pub struct EventSigner {
    guard: Arc<Guard>,
    nonce: [u8; 32],
    request_hash: [u8; 32],
}

impl EventSigner {
    /// The `data:` line of event `seq`: the signature (128 hex digits), a space, then the
    /// event's JSON exactly as signed.
    pub fn frame(&self, seq: u64, event: &Value) -> String {
        let json = event.to_string();
        let sig = self.guard.signer.sign(&event_message(&self.nonce, &self.request_hash, seq, json.as_bytes()));
        format!("{} {json}", hex::encode(sig))
    }
}

/// What an event signature covers: `"psl/http-event/v1" ‖ nonce ‖ request hash ‖ seq (u64,
/// big-endian) ‖ SHA-256(event JSON)` (docs/client.md, "Job progress").
pub fn event_message(nonce: &[u8; 32], request_hash: &[u8; 32], seq: u64, json: &[u8]) -> Vec<u8> {
    signed_message(b"psl/http-event/v1", nonce, request_hash, &seq.to_be_bytes(), json)
}

/// `label ‖ nonce ‖ request hash ‖ place ‖ SHA-256(bytes)`: what the endpoint's answer and
/// event signatures cover.
fn signed_message(label: &[u8], nonce: &[u8; 32], request_hash: &[u8; 32], place: &[u8], bytes: &[u8]) -> Vec<u8> {
    let mut m = label.to_vec();
    m.extend_from_slice(nonce);
    m.extend_from_slice(request_hash);
    m.extend_from_slice(place);
    m.extend_from_slice(&psl_crypto::sha256(&[bytes]).0);
    m
}

/// The client's side of a request (what the SDK does, for Rust callers: the benchmark and
/// tests): a credential that signs requests for one endpoint and checks its answers.
pub struct ClientSide {
    /// The credential's key.
    pub key: psl_crypto::SigningKey,
    /// The certificate, hex (the `psl-credential` header).
    pub cert_hex: String,
    /// The endpoint's SPKI hash (what the request signature binds).
    pub spki_hash: [u8; 32],
    /// The endpoint's Ed25519 key (what answers are checked with).
    pub answer_key: [u8; 32],
}

/// One request as [`ClientSide::request`] made it: its headers, nonce and request hash.
pub struct Outgoing {
    /// `psl-nonce`, `psl-credential` and (when signed) `psl-signature`.
    pub headers: Vec<(&'static str, String)>,
    /// The nonce the answer must be signed over.
    pub nonce: [u8; 32],
    /// The request hash the answer must be signed over.
    pub request_hash: [u8; 32],
}

impl ClientSide {
    /// The headers of `method path body` with a fresh nonce, signed when `sign`.
    pub fn request(&self, method: &str, path: &str, body: &[u8], sign: bool) -> Outgoing {
        let nonce: [u8; 32] = rand::random();
        let rh = psl_capsule::client::request_hash(method, path, body);
        let mut headers = vec![("psl-nonce", hex::encode(nonce)), ("psl-credential", self.cert_hex.clone())];
        if sign {
            let sig = self.key.sign(&psl_capsule::client::request_digest(&self.spki_hash, &nonce, &rh));
            headers.push(("psl-signature", hex::encode(sig.0)));
        }
        Outgoing { headers, nonce, request_hash: rh }
    }

    /// Whether an answer (its status, body and `psl-signature` header, if any) is signed by the
    /// endpoint over this request.
    pub fn answer_checks(&self, sent: &Outgoing, status: u16, body: &[u8], signature_hex: Option<&str>) -> bool {
        let Some(sig) = signature_hex.and_then(|h| hex::decode(h).ok()) else { return false };
        let m = answer_message(&sent.nonce, &sent.request_hash, status, body);
        psl_faas::tls::AnswerSigner::verify(&self.answer_key, &m, &sig)
    }
}

/// What an answer signature covers (docs/client.md, "Answers").
pub fn answer_message(nonce: &[u8; 32], request_hash: &[u8; 32], status: u16, body: &[u8]) -> Vec<u8> {
    signed_message(b"psl/http-answer/v1", nonce, request_hash, &status.to_be_bytes(), body)
}

/// A KV request, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `GET /v1/kv/{key}`.
    Get(Vec<u8>),
    /// `PUT /v1/kv/{key}` with the value as the body.
    Put(Vec<u8>, Vec<u8>),
    /// `DELETE /v1/kv/{key}`.
    Delete(Vec<u8>),
    /// `GET /v1/kv?prefix=&after=&limit=`.
    Scan {
        /// Keys that start with this.
        prefix: Vec<u8>,
        /// Keys after this one (the previous page's last).
        after: Option<Vec<u8>>,
        /// At most this many items.
        limit: usize,
    },
    /// `POST /v1/cas/{key}?cas=UNIQUE` with the new value as the body.
    Cas(Vec<u8>, u64, Vec<u8>),
    /// `POST /v1/batch` with `{"ops": [{"op": "put", "key": B64, "value": B64} | {"op":
    /// "delete", "key": B64}, ...]}`: every op or none, atomically ([`FrontEnd::batch`]).
    Batch(Vec<BatchOp>),
    /// `POST /v1/sync?durable=true|false`.
    Sync {
        /// Wait for a quorum of capsule servers too.
        durable: bool,
    },
}

impl Request {
    /// Parses the path, query and body; `Err((status, why))`.
    pub fn parse(req: &ApiRequest) -> Result<Request, (u16, String)> {
        let path = req.path();
        let query = req.query().unwrap_or("");
        let param = |name: &str| -> Result<Option<Vec<u8>>, (u16, String)> {
            query
                .split('&')
                .find_map(|kv| kv.strip_prefix(name).and_then(|r| r.strip_prefix('=')))
                .map(|v| percent_decode(v).ok_or((400, format!("query parameter {name} is not percent-encoded"))))
                .transpose()
        };
        let key_of = |rest: &str| -> Result<Vec<u8>, (u16, String)> {
            let k = percent_decode(rest).ok_or((400, "the key is not percent-encoded".to_string()))?;
            check_key(&k)?;
            Ok(k)
        };
        let m = req.method.as_str();
        let wrong = |allowed: &str| Err((405, format!("method {m} is not allowed on {path}: use {allowed}")));
        if let Some(rest) = path.strip_prefix("/v1/kv/") {
            let key = key_of(rest)?;
            return match m {
                "GET" => Ok(Request::Get(key)),
                "PUT" => Ok(Request::Put(key, req.body.to_vec())),
                "DELETE" => Ok(Request::Delete(key)),
                _ => wrong("GET, PUT or DELETE"),
            };
        }
        if path == "/v1/kv" {
            if m != "GET" {
                return wrong("GET");
            }
            let limit = match param("limit")? {
                None => SCAN_LIMIT_DEFAULT,
                Some(l) => std::str::from_utf8(&l)
                    .ok()
                    .and_then(|l| l.parse::<usize>().ok())
                    .filter(|l| (1..=SCAN_LIMIT_MAX).contains(l))
                    .ok_or((400, format!("limit must be a number from 1 to {SCAN_LIMIT_MAX}")))?,
            };
            let prefix = param("prefix")?.unwrap_or_default();
            if prefix.len() > KEY_BYTES_MAX {
                return Err((400, format!("the prefix is over {KEY_BYTES_MAX} bytes")));
            }
            return Ok(Request::Scan { prefix, after: param("after")?, limit });
        }
        if let Some(rest) = path.strip_prefix("/v1/cas/") {
            if m != "POST" {
                return wrong("POST");
            }
            let key = key_of(rest)?;
            let cas = param("cas")?
                .and_then(|c| std::str::from_utf8(&c).ok()?.parse::<u64>().ok())
                .filter(|c| *c != 0)
                .ok_or((400, "give the CAS unique a get returned: POST /v1/cas/{key}?cas=N".to_string()))?;
            return Ok(Request::Cas(key, cas, req.body.to_vec()));
        }
        if path == "/v1/batch" {
            if m != "POST" {
                return wrong("POST");
            }
            return parse_batch(&req.body).map(Request::Batch);
        }
        if path == "/v1/sync" {
            if m != "POST" {
                return wrong("POST");
            }
            let durable = match param("durable")?.as_deref() {
                None | Some(b"false") => false,
                Some(b"true") => true,
                Some(_) => return Err((400, "durable must be true or false".into())),
            };
            return Ok(Request::Sync { durable });
        }
        Err((
            404,
            format!(
                "no such path {path:?}: the KV API is /v1/kv/{{key}}, /v1/kv?prefix=, /v1/cas/{{key}}, /v1/batch, /v1/sync"
            ),
        ))
    }

    /// The permission it needs.
    pub fn needs(&self) -> Permissions {
        match self {
            Request::Get(_) | Request::Scan { .. } | Request::Sync { .. } => Permissions::READ,
            Request::Put(..) | Request::Delete(_) | Request::Cas(..) | Request::Batch(_) => Permissions::WRITE,
        }
    }
}

/// The ops of a `POST /v1/batch` body: 1 to [`BATCH_OPS_MAX`] of them, keys and values in
/// base64 (standard alphabet, padded), each key checked as a path key is.
fn parse_batch(body: &[u8]) -> Result<Vec<BatchOp>, (u16, String)> {
    use base64::Engine as _;
    let bad = |why: String| (400, why);
    let v: Value = serde_json::from_slice(body).map_err(|e| bad(format!("the body is not JSON: {e}")))?;
    let ops = v.get("ops").and_then(Value::as_array).ok_or_else(|| {
        bad(r#"the body is {"ops": [{"op": "put", "key": B64, "value": B64} | {"op": "delete", "key": B64}, ...]}"#
            .into())
    })?;
    if ops.is_empty() || ops.len() > BATCH_OPS_MAX {
        return Err(bad(format!("a batch holds 1 to {BATCH_OPS_MAX} ops; this one holds {}", ops.len())));
    }
    let b64d = |i: usize, field: &str, x: Option<&Value>| -> Result<Vec<u8>, (u16, String)> {
        let text =
            x.and_then(Value::as_str).ok_or_else(|| bad(format!("op {i}: {field} is missing (a base64 string)")))?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|e| bad(format!("op {i}: {field} is not base64: {e}")))
    };
    ops.iter()
        .enumerate()
        .map(|(i, op)| {
            let key = b64d(i, "key", op.get("key"))?;
            check_key(&key).map_err(|(s, why)| (s, format!("op {i}: {why}")))?;
            match op.get("op").and_then(Value::as_str) {
                Some("put") => Ok((key, Some(b64d(i, "value", op.get("value"))?))),
                Some("delete") => Ok((key, None)),
                _ => Err(bad(format!("op {i}: \"op\" is \"put\" or \"delete\""))),
            }
        })
        .collect()
}

/// One op of a batch: the key and the value (`None`: a delete).
pub type BatchOp = (Vec<u8>, Option<Vec<u8>>);

/// A key the API takes: 1 to [`KEY_BYTES_MAX`] bytes, none of them a space or a control
/// character (memcached's rule, so every key can be named by a memcached client too).
fn check_key(k: &[u8]) -> Result<(), (u16, String)> {
    if k.is_empty() || k.len() > KEY_BYTES_MAX {
        return Err((400, format!("a key is 1 to {KEY_BYTES_MAX} bytes; this one is {}", k.len())));
    }
    if k.iter().any(|b| *b <= b' ' || *b == 0x7f) {
        return Err((400, "a key holds no space or control character".into()));
    }
    Ok(())
}

/// `%XX` decoding (a `+` stays a `+`); `None` on a bad escape.
pub fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let mut x = [0u8; 1];
            hex::decode_to_slice(b.get(i + 1..i + 3)?, &mut x).ok()?;
            out.push(x[0]);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

fn version_json(v: &Versioned) -> Value {
    json!({ "lamport": v.version.lamport, "writer": v.version.writer, "cas": v.cas })
}

fn payload(v: &Versioned) -> &[u8] {
    psl_memcached::item::decode(&v.item).map_or(&[][..], |it| it.data)
}

/// The answer to an atomic batch: every op's key and version (a delete's `cas` is 0 on a
/// front end).
fn batch_answer(
    ops: &[(&[u8], Option<&[u8]>)],
    done: impl Iterator<Item = (psl_scl::Version, u64)>,
    epoch: u64,
) -> Value {
    let ops: Vec<Value> = ops
        .iter()
        .zip(done)
        .map(|((k, v), (ver, cas))| {
            json!({ "key": b64(k), "op": if v.is_some() { "put" } else { "delete" },
                    "version": { "lamport": ver.lamport, "writer": ver.writer, "cas": cas } })
        })
        .collect();
    json!({ "applied": true, "ops": ops, "epoch": epoch })
}

/// The KV routes over `fe` behind `guard` (what `psl memcached --http` serves). The checks
/// and a get the memtable answers run inline on the server's worker; everything that may
/// wait runs under [`psl_http::may_block`].
pub fn kv(fe: Arc<FrontEnd>, guard: Arc<Guard>) -> (Vec<&'static str>, psl_http::Api) {
    let api: psl_http::Api = Arc::new(move |req: ApiRequest| {
        guard.serve(&req, |r| {
            misdirected(&fe, r).unwrap_or_else(|| {
                let a = route_inline(&fe, r).unwrap_or_else(|| psl_http::may_block(|| route_unstamped(&fe, r)));
                stamped(&fe, a)
            })
        })
    });
    (KV_PREFIXES.to_vec(), api)
}

/// With several shards (`psl up --shards N`; docs/protocol/sharding.md): the answer to a
/// request this front end does not serve. A key of another shard is 421 (the client asks
/// that shard's front end); an atomic batch whose keys span shards is 400, as the design
/// refuses it. A scan merges every shard's pages ([`FrontEnd::scan_shards`]).
fn misdirected(fe: &FrontEnd, r: &Request) -> Option<(u16, Value)> {
    let sh = fe.shards()?;
    let (me, version) = (sh.me(), sh.map().map_version);
    let elsewhere = |key: &[u8]| {
        sh.elsewhere(key).map(|s| {
            (
                421,
                json!({ "error": format!("key of shard {s}; this front end serves shard {me} (map version {version})"),
                        "shard": s, "map_version": version }),
            )
        })
    };
    match r {
        Request::Get(k) | Request::Put(k, _) | Request::Delete(k) | Request::Cas(k, _, _) => elsewhere(k),
        Request::Batch(ops) => {
            let mut shards: Vec<u16> = ops.iter().map(|(k, _)| sh.map().shard_of(k)).collect();
            shards.sort_unstable();
            shards.dedup();
            match shards.as_slice() {
                [] => None,
                [_] => elsewhere(&ops[0].0),
                many => Some((
                    400,
                    json!({ "error": format!("an atomic batch must stay in one shard (keys in shards {many:?})"),
                            "map_version": version }),
                )),
            }
        }
        Request::Scan { .. } | Request::Sync { .. } => None,
    }
}

/// `r` on the front end without waiting: a get the memtable answers, a put its writer queue
/// has room for; `None` for everything else (run [`route`] where it may wait).
fn route_inline(fe: &FrontEnd, r: &Request) -> Option<(u16, Value)> {
    match r {
        Request::Get(key) => fe.read_versioned_local(key).map(|read| get_answer(fe, key, read)),
        Request::Put(key, value) => fe.try_set(key, 0, 0, value, true).map(|o| put_answer(fe, key, o)),
        _ => None,
    }
}

/// The answer to a put or a compare-and-set on a front end, from what the write did.
fn put_answer(fe: &FrontEnd, key: &[u8], o: Outcome) -> (u16, Value) {
    let epoch = fe.node().metrics().epoch.load(std::sync::atomic::Ordering::Relaxed);
    match o {
        Outcome::Stored { cas } => (200, json!({ "key": b64(key), "stored": true, "cas": cas, "epoch": epoch })),
        Outcome::Exists => (409, json!({ "key": b64(key), "stored": false, "reason": "exists", "epoch": epoch })),
        Outcome::NotFound => (409, json!({ "key": b64(key), "stored": false, "reason": "not_found", "epoch": epoch })),
        Outcome::TooLarge => (413, json!({ "error": "the value is larger than this front end takes" })),
        other => (503, json!({ "error": format!("not written: {other:?}") })),
    }
}

/// The answer to a get on a front end, from what the read found.
fn get_answer(fe: &FrontEnd, key: &[u8], read: Result<Option<Versioned>, String>) -> (u16, Value) {
    let epoch = fe.node().metrics().epoch.load(std::sync::atomic::Ordering::Relaxed);
    match read {
        Ok(Some(v)) => (
            200,
            json!({ "key": b64(key), "found": true, "value": b64(payload(&v)), "version": version_json(&v), "epoch": epoch }),
        ),
        Ok(None) => (404, json!({ "key": b64(key), "found": false, "epoch": epoch })),
        Err(e) => (503, json!({ "error": format!("the key is not readable now: {e}") })),
    }
}

/// Adds to an answer's body what a client checks it against (docs/client.md): the capsule
/// the answering front end serves and, with several shards, its shard and map version, so
/// that a client holding the map can check `map.shard_of(point(key))` named that capsule.
/// The answer's signature covers them.
fn stamped(fe: &FrontEnd, (status, mut body): (u16, Value)) -> (u16, Value) {
    if let Value::Object(m) = &mut body {
        m.insert("capsule".into(), json!(fe.node().capsule().0.to_hex()));
        if let Some(sh) = fe.shards() {
            m.insert("shard".into(), json!(sh.me()));
            m.insert("map_version".into(), json!(sh.map().map_version));
        }
    }
    (status, body)
}

/// Runs one parsed request on the front end: `(status, body)`, stamped with the capsule
/// (and shard) that answered.
pub fn route(fe: &FrontEnd, r: &Request) -> (u16, Value) {
    if let Some(refused) = misdirected(fe, r) {
        return refused;
    }
    stamped(fe, route_unstamped(fe, r))
}

fn route_unstamped(fe: &FrontEnd, r: &Request) -> (u16, Value) {
    let node = fe.node();
    // The gauge the node's core sets when it applies a SYNC (no round trip to the core).
    let epoch = || node.metrics().epoch.load(std::sync::atomic::Ordering::Relaxed);
    let failed = |why: String| (503, json!({ "error": why }));
    let written = |key: &[u8], o: Outcome| put_answer(fe, key, o);
    match r {
        Request::Get(key) => get_answer(fe, key, fe.read_versioned(key)),
        Request::Put(key, value) => written(key, fe.set(key, 0, 0, value, true)),
        Request::Delete(key) => match fe.delete(key) {
            Outcome::Deleted => (200, json!({ "key": b64(key), "deleted": true, "epoch": epoch() })),
            Outcome::NotFound => (200, json!({ "key": b64(key), "deleted": false, "epoch": epoch() })),
            other => failed(format!("not deleted: {other:?}")),
        },
        Request::Scan { prefix, after, limit } => match fe.scan_shards(prefix, after.as_deref(), *limit) {
            Ok((items, more)) => {
                let items: Vec<Value> = items
                    .iter()
                    .map(|(k, v)| json!({ "key": b64(k), "value": b64(payload(v)), "version": version_json(v) }))
                    .collect();
                (200, json!({ "items": items, "more": more, "epoch": epoch() }))
            }
            Err(e) => failed(format!("the scan did not complete: {e}")),
        },
        Request::Cas(key, cas, value) => {
            let op = Rmw::Store {
                mode: psl_memcached::proto::StoreMode::Set,
                flags: 0,
                exptime: 0,
                cas: Some(*cas),
                data: value,
            };
            written(key, fe.rmw(key, op))
        }
        Request::Batch(ops) => {
            let ops: Vec<(&[u8], Option<&[u8]>)> = ops.iter().map(|(k, v)| (k.as_slice(), v.as_deref())).collect();
            match fe.batch(&ops) {
                Ok(done) => (200, batch_answer(&ops, done.into_iter(), epoch())),
                Err(Outcome::TooLarge) => (
                    413,
                    json!({ "error": "a value, or the whole batch, is larger than this front end takes in one record" }),
                ),
                Err(other) => failed(format!("the batch was not written (no op of it was): {other:?}")),
            }
        }
        Request::Sync { durable } => {
            let t = Duration::from_millis(SYNC_TIMEOUT_MS);
            let done = if *durable { node.sync_durable(t) } else { node.sync(t) };
            match done {
                Ok(()) => (200, json!({ "epoch": epoch(), "durable": durable })),
                Err(e) => (504, json!({ "error": format!("the sync did not complete: {e}") })),
            }
        }
    }
}

/// The KV routes over a bare node (`psl node --http`): raw values, as lambdas and `psl kv`
/// write them (a front end's are memcached items; the two are different views, so use one
/// kind of client per key). Compare-and-set needs a key's home, which only front ends
/// arbitrate: `POST /v1/cas` is answered 405 here.
pub fn node_kv(node: Arc<psl_node::Node>, guard: Arc<Guard>) -> (Vec<&'static str>, psl_http::Api) {
    let api: psl_http::Api =
        Arc::new(move |req: ApiRequest| guard.serve(&req, |r| psl_http::may_block(|| route_node(&node, r))));
    (KV_PREFIXES.to_vec(), api)
}

fn node_version(v: psl_scl::Version) -> Value {
    json!({ "lamport": v.lamport, "writer": v.writer, "cas": psl_memcached::item::cas_of(v.lamport, v.writer) })
}

/// Runs one parsed request on a bare node: `(status, body)`.
pub fn route_node(node: &psl_node::Node, r: &Request) -> (u16, Value) {
    let epoch = || node.metrics().epoch.load(std::sync::atomic::Ordering::Relaxed);
    let failed = |status: u16, why: String| (status, json!({ "error": why }));
    let write_failed = |e: psl_node::NodeError| match e {
        psl_node::NodeError::ValueTooLarge { .. } | psl_node::NodeError::KeyTooLong { .. } => {
            failed(413, e.to_string())
        }
        e => failed(503, format!("not written: {e}")),
    };
    match r {
        Request::Get(key) => match node.try_entry(key) {
            Ok(Some(psl_scl::Entry { version, value: Some(v) })) => (
                200,
                json!({ "key": b64(key), "found": true, "value": b64(&v), "version": node_version(version), "epoch": epoch() }),
            ),
            Ok(_) => (404, json!({ "key": b64(key), "found": false, "epoch": epoch() })),
            Err(e) => failed(503, format!("the key is not readable now: {e}")),
        },
        Request::Put(key, value) => match node.write_below(key, Some(value), u64::MAX) {
            Ok(v) => (
                200,
                json!({ "key": b64(key), "stored": true, "version": node_version(v), "cas": psl_memcached::item::cas_of(v.lamport, v.writer), "epoch": epoch() }),
            ),
            Err(e) => write_failed(e),
        },
        Request::Delete(key) => {
            let existed = matches!(node.try_entry(key), Ok(Some(psl_scl::Entry { value: Some(_), .. })));
            match node.write_below(key, None, u64::MAX) {
                Ok(_) => (200, json!({ "key": b64(key), "deleted": existed, "epoch": epoch() })),
                Err(e) => write_failed(e),
            }
        }
        Request::Scan { prefix, after, limit } => match node.scan(prefix, after.as_deref(), limit + 1) {
            Ok(mut items) => {
                let more = items.len() > *limit;
                items.truncate(*limit);
                let items: Vec<Value> = items
                    .into_iter()
                    .filter_map(|(k, e)| Some((k, e.version, e.value?)))
                    .map(|(k, v, val)| json!({ "key": b64(&k), "value": b64(&val), "version": node_version(v) }))
                    .collect();
                (200, json!({ "items": items, "more": more, "epoch": epoch() }))
            }
            Err(e) => failed(503, format!("the scan did not complete: {e}")),
        },
        Request::Cas(..) => failed(
            405,
            "compare-and-set runs at a key's home front end (psl memcached --http), which arbitrates its writers; \
             a bare node has no homes"
                .into(),
        ),
        Request::Batch(ops) => {
            let ops: Vec<(&[u8], Option<&[u8]>)> = ops.iter().map(|(k, v)| (k.as_slice(), v.as_deref())).collect();
            match node.write_batch(&ops, u64::MAX) {
                Ok(vs) => {
                    let done = vs.into_iter().map(|v| (v, psl_memcached::item::cas_of(v.lamport, v.writer)));
                    (200, batch_answer(&ops, done, epoch()))
                }
                Err(e @ psl_node::NodeError::BatchTooLarge { .. }) => failed(413, e.to_string()),
                Err(e) => write_failed(e),
            }
        }
        Request::Sync { durable } => {
            let t = Duration::from_millis(SYNC_TIMEOUT_MS);
            match if *durable { node.sync_durable(t) } else { node.sync(t) } {
                Ok(()) => (200, json!({ "epoch": epoch(), "durable": durable })),
                Err(e) => failed(504, format!("the sync did not complete: {e}")),
            }
        }
    }
}

/// The prefix [`jobs`] serves.
pub const JOBS_PREFIX: &str = "/v1/jobs";
/// Jobs run at once; one more is answered 503.
pub const JOBS_RUNNING_MAX: usize = 4;
/// Finished jobs remembered (the oldest is forgotten first).
pub const JOBS_KEPT_MAX: usize = 256;

/// What `POST /v1/jobs` asks for.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// The lambda program (JavaScript source).
    pub program: String,
    /// How many lambdas run it.
    pub lambdas: u32,
    /// The input every lambda reads (`input()`), if any.
    #[serde(default)]
    pub input: Option<String>,
}

/// A jobs request, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobRequest {
    /// `POST /v1/jobs` with a [`JobSpec`] as JSON.
    Submit(JobSpec),
    /// `GET /v1/jobs/{id}`.
    Status(String),
    /// `GET /v1/jobs/{id}/events`: the job's progress as server-sent events.
    Events(String),
}

impl JobRequest {
    /// Parses a request under [`JOBS_PREFIX`].
    pub fn parse(req: &ApiRequest) -> Result<JobRequest, (u16, String)> {
        let path = req.path();
        let m = req.method.as_str();
        if path == JOBS_PREFIX {
            if m != "POST" {
                return Err((405, format!("method {m} is not allowed on {path}: use POST")));
            }
            let spec: JobSpec = serde_json::from_slice(&req.body)
                .map_err(|e| (400, format!("the body must be JSON {{\"program\", \"lambdas\", \"input\"}}: {e}")))?;
            let max = psl_faas::deploy::LAMBDAS_MAX;
            if spec.lambdas == 0 || spec.lambdas > max {
                return Err((400, format!("lambdas must be 1 to {max}, not {}", spec.lambdas)));
            }
            return Ok(JobRequest::Submit(spec));
        }
        if let Some(rest) = path.strip_prefix("/v1/jobs/") {
            if m != "GET" {
                return Err((405, format!("method {m} is not allowed on {path}: use GET")));
            }
            let (id, events) = match rest.strip_suffix("/events") {
                Some(id) => (id, true),
                None => (rest, false),
            };
            if id.len() != 16 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err((404, format!("no job {id:?}: a job id is 16 hex digits")));
            }
            let id = id.to_ascii_lowercase();
            return Ok(if events { JobRequest::Events(id) } else { JobRequest::Status(id) });
        }
        Err((
            404,
            format!(
                "no such path {path:?}: the jobs API is POST /v1/jobs, GET /v1/jobs/{{id}} and GET /v1/jobs/{{id}}/events"
            ),
        ))
    }
}

/// Runs one job to its end, telling `progress` each step: its report as JSON, or why it
/// failed.
pub type JobRunner = Arc<dyn Fn(JobSpec, psl_faas::net::Progress) -> Result<Value, String> + Send + Sync>;

/// Most progress steps a job keeps for its event streams.
pub const JOB_STEPS_KEPT_MAX: usize = 256;
/// Most event streams open at once on one leader; more are answered 503.
pub const JOB_STREAMS_MAX: usize = 16;
/// A stream with nothing new says the job still runs this often.
pub const JOB_HEARTBEAT_MS: u64 = 5_000;

enum JobState {
    Running { started_ms: u64 },
    Done { report: Value, took_ms: u64 },
    Failed { error: String, took_ms: u64 },
}

/// The jobs a leader runs for API clients, each on a thread of its own: at most
/// [`JOBS_RUNNING_MAX`] at once, at most [`JOBS_KEPT_MAX`] remembered.
pub struct Jobs {
    runner: JobRunner,
    /// By id: the submission number (for forgetting the oldest first) and the state.
    table: parking_lot::Mutex<std::collections::BTreeMap<String, (u64, JobState)>>,
    /// By id: the progress steps so far (at most [`JOB_STEPS_KEPT_MAX`]), for event streams.
    steps: parking_lot::Mutex<std::collections::HashMap<String, Vec<Value>>>,
    /// Signalled at every step and every end.
    changed: parking_lot::Condvar,
    streams: std::sync::atomic::AtomicUsize,
    /// A stream with nothing new repeats the job's status this often.
    heartbeat: Duration,
}

impl Jobs {
    /// A table whose jobs `runner` runs.
    pub fn new(runner: JobRunner) -> Arc<Jobs> {
        Jobs::with_heartbeat(runner, Duration::from_millis(JOB_HEARTBEAT_MS))
    }

    /// [`Jobs::new`], with streams that repeat a quiet job's status every `heartbeat`.
    pub fn with_heartbeat(runner: JobRunner, heartbeat: Duration) -> Arc<Jobs> {
        Arc::new(Jobs {
            runner,
            table: Default::default(),
            steps: Default::default(),
            changed: Default::default(),
            streams: Default::default(),
            heartbeat,
        })
    }

    /// `GET /v1/jobs/{id}/events`: a thread that sends each progress step as it happens and,
    /// last, the job's final status (the body `GET /v1/jobs/{id}` answers, with `"last":
    /// true`), then ends the stream.
    fn stream(self: &Arc<Self>, id: &str, signer: EventSigner) -> Result<psl_http::Events, (u16, Value)> {
        use std::sync::atomic::Ordering::AcqRel;
        if !self.table.lock().contains_key(id) {
            return Err(self.status(id));
        }
        if self.streams.fetch_add(1, AcqRel) >= JOB_STREAMS_MAX {
            self.streams.fetch_sub(1, AcqRel);
            return Err((
                503,
                json!({ "error": format!("{JOB_STREAMS_MAX} event streams are open: poll GET /v1/jobs/{id}") }),
            ));
        }
        let (sink, events) = psl_http::event_stream();
        let (me, id) = (self.clone(), id.to_string());
        let spawned = std::thread::Builder::new().name(format!("job {id} events")).spawn(move || {
            me.send_events(&id, &signer, &sink);
            me.streams.fetch_sub(1, AcqRel);
        });
        if let Err(e) = spawned {
            self.streams.fetch_sub(1, AcqRel);
            return Err((503, json!({ "error": format!("cannot start the stream's thread: {e}") })));
        }
        Ok(events)
    }

    fn send_events(&self, id: &str, signer: &EventSigner, sink: &psl_http::EventSink) {
        let mut sent = 0;
        let mut seq = 0u64;
        let mut send = |event: Value| {
            seq += 1;
            sink.send(seq, &signer.frame(seq, &event))
        };
        loop {
            let (new, running) = {
                let mut steps = self.steps.lock();
                let due = std::time::Instant::now() + self.heartbeat;
                loop {
                    let have = steps.get(id).map_or(0, Vec::len);
                    let running = matches!(self.table.lock().get(id), Some((_, JobState::Running { .. })));
                    if have > sent || !running || self.changed.wait_until(&mut steps, due).timed_out() {
                        let new: Vec<Value> = steps.get(id).map_or(&[][..], |s| &s[sent.min(s.len())..]).to_vec();
                        break (new, running);
                    }
                }
            };
            // Nothing new for a heartbeat: say the job still runs (a client's read timeout
            // must not take a quiet job for a dead stream).
            if new.is_empty() && running && !send(self.status(id).1) {
                return;
            }
            sent += new.len();
            for step in new {
                if !send(json!({ "id": id, "status": "running", "progress": step })) {
                    return;
                }
            }
            if !running {
                let (_, mut last) = self.status(id);
                last["last"] = json!(true);
                send(last);
                return;
            }
            if sink.is_closed() {
                return;
            }
        }
    }

    fn submit(self: &Arc<Self>, spec: &JobSpec) -> (u16, Value) {
        let id = hex::encode(rand::random::<[u8; 8]>());
        let mut forgotten = Vec::new();
        {
            let mut t = self.table.lock();
            let running = t.values().filter(|(_, s)| matches!(s, JobState::Running { .. })).count();
            if running >= JOBS_RUNNING_MAX {
                return (503, json!({ "error": format!("{running} jobs are running, the most at once: retry later") }));
            }
            while t.len() >= JOBS_KEPT_MAX {
                let oldest = t
                    .iter()
                    .filter(|(_, (_, s))| !matches!(s, JobState::Running { .. }))
                    .min_by_key(|(_, (n, _))| *n)
                    .map(|(k, _)| k.clone());
                match oldest {
                    Some(k) => {
                        forgotten.push(k.clone());
                        t.remove(&k)
                    }
                    None => break,
                };
            }
            let n = t.values().map(|(n, _)| *n).max().unwrap_or(0) + 1;
            t.insert(id.clone(), (n, JobState::Running { started_ms: now_ms() }));
        }
        // Not under the table's lock: a stream takes the steps' lock, then the table's.
        let mut steps = self.steps.lock();
        for k in forgotten {
            steps.remove(&k);
        }
        drop(steps);
        let (me, spec, job) = (self.clone(), spec.clone(), id.clone());
        let (steps, at) = (self.clone(), id.clone());
        let progress: psl_faas::net::Progress = Arc::new(move |p: psl_faas::net::JobProgress| {
            let step = serde_json::to_value(&p).unwrap_or(Value::Null);
            let mut all = steps.steps.lock();
            let kept = all.entry(at.clone()).or_default();
            if kept.len() < JOB_STEPS_KEPT_MAX {
                kept.push(step);
            }
            drop(all);
            steps.changed.notify_all();
        });
        let spawned = std::thread::Builder::new().name(format!("job {id}")).spawn(move || {
            let t0 = now_ms();
            let outcome = (me.runner)(spec, progress);
            let took_ms = now_ms().saturating_sub(t0);
            let state = match outcome {
                Ok(report) => JobState::Done { report, took_ms },
                Err(error) => JobState::Failed { error, took_ms },
            };
            if let Some(slot) = me.table.lock().get_mut(&job) {
                slot.1 = state;
            }
            // Under the steps' lock, so a stream between its check and its wait hears it.
            let steps = me.steps.lock();
            me.changed.notify_all();
            drop(steps);
        });
        if let Err(e) = spawned {
            self.table.lock().remove(&id);
            return (503, json!({ "error": format!("cannot start the job's thread: {e}") }));
        }
        (202, json!({ "id": id, "status": "running" }))
    }

    fn status(&self, id: &str) -> (u16, Value) {
        match self.table.lock().get(id) {
            None => (404, json!({ "id": id, "error": "no such job here (never submitted, or forgotten)" })),
            Some((_, JobState::Running { started_ms })) => {
                (200, json!({ "id": id, "status": "running", "running_ms": now_ms().saturating_sub(*started_ms) }))
            }
            Some((_, JobState::Done { report, took_ms })) => {
                let status = if report["ok"].as_bool().unwrap_or(false) { "done" } else { "failed" };
                (200, json!({ "id": id, "status": status, "took_ms": took_ms, "report": report }))
            }
            Some((_, JobState::Failed { error, took_ms })) => {
                (200, json!({ "id": id, "status": "failed", "took_ms": took_ms, "error": error }))
            }
        }
    }

    /// Serves one parsed jobs request.
    pub fn route(self: &Arc<Self>, r: &JobRequest) -> (u16, Value) {
        match r {
            JobRequest::Submit(spec) => self.submit(spec),
            JobRequest::Status(id) | JobRequest::Events(id) => self.status(id),
        }
    }
}

/// The jobs routes behind `guard` (what `psl leader --http` serves): `POST /v1/jobs` and
/// `GET /v1/jobs/{id}`, both needing the `run` permission.
pub fn jobs(jobs: Arc<Jobs>, guard: Arc<Guard>) -> (Vec<&'static str>, psl_http::Api) {
    let api: psl_http::Api = Arc::new(move |req: ApiRequest| {
        if req.path().ends_with("/events") {
            return guard.serve_events(
                &req,
                JobRequest::parse,
                |_| Permissions::RUN,
                |r, signer| match r {
                    JobRequest::Events(id) => jobs.stream(id, signer),
                    other => Err(jobs.route(other)),
                },
            );
        }
        guard.serve_with(&req, JobRequest::parse, |_| Permissions::RUN, |r| jobs.route(r))
    });
    (vec![JOBS_PREFIX], api)
}

#[cfg(test)]
mod tests {
    use super::*;
    use psl_crypto::{OwnerKey, SigningKey};
    use psl_faas::tls::{AnswerSigner, TlsIdentity};

    fn req(method: &str, pq: &str) -> ApiRequest {
        ApiRequest {
            method: method.into(),
            path_and_query: pq.into(),
            psl_headers: vec![],
            body: Default::default(),
            connection: Default::default(),
        }
    }

    /// One in-process front end behind a guard, and a client that signs like the SDK.
    struct World {
        _emb: psl_memcached::deploy::Embedded,
        fe: Arc<FrontEnd>,
        guard: Arc<Guard>,
        spki: [u8; 32],
        server_key: [u8; 32],
        owner: OwnerKey,
        capsule: CapsuleName,
    }

    struct Cred {
        key: SigningKey,
        cert: ClientCert,
    }

    impl World {
        fn new() -> World {
            let emb = psl_memcached::deploy::Embedded::start(&Default::default()).unwrap();
            let fe = emb.front_ends[0].clone();
            let id = TlsIdentity::generate("psl test").unwrap();
            let signer = id.answer_signer().unwrap();
            let server_key = signer.public_key();
            let owner = OwnerKey::from_seed(&[3; 32]).unwrap();
            let capsule = emb.meta.name();
            let guard = Arc::new(Guard::new(capsule, owner.public(), id.spki_hash(), signer));
            World { _emb: emb, fe, guard, spki: id.spki_hash(), server_key, owner, capsule }
        }

        fn cred(&self, owner: &OwnerKey, capsule: CapsuleName, can: &str) -> Cred {
            let key = SigningKey::generate();
            let can = Permissions::parse(can).unwrap();
            let cert = ClientCert::issue(&owner.signing_key(), capsule, key.verifying_key(), can, 0, u64::MAX);
            Cred { key, cert }
        }

        /// A request signed with `cred` for this endpoint, with its nonce and request hash.
        fn signed(&self, cred: &Cred, method: &str, pq: &str, body: &[u8]) -> (ApiRequest, [u8; 32], [u8; 32]) {
            let nonce: [u8; 32] = rand::random();
            let rh = psl_capsule::client::request_hash(method, pq, body);
            let mut r = req(method, pq);
            r.body = body.to_vec().into();
            r.psl_headers.push(("psl-nonce".into(), hex::encode(nonce)));
            r.psl_headers.push(("psl-credential".into(), hex::encode(cred.cert.encode())));
            let sig = cred.key.sign(&psl_capsule::client::request_digest(&self.spki, &nonce, &rh));
            r.psl_headers.push(("psl-signature".into(), hex::encode(sig.0)));
            (r, nonce, rh)
        }

        /// Sends `method pq body` signed with `cred` for the endpoint `spki`; checks the
        /// answer's signature as a client would and returns `(status, body)`.
        fn call(&self, cred: Option<&Cred>, spki: &[u8; 32], method: &str, pq: &str, body: &[u8]) -> (u16, Value) {
            let nonce: [u8; 32] = rand::random();
            let rh = psl_capsule::client::request_hash(method, pq, body);
            let mut r = req(method, pq);
            r.body = body.to_vec().into();
            r.psl_headers.push(("psl-nonce".into(), hex::encode(nonce)));
            if let Some(c) = cred {
                let sig = c.key.sign(&psl_capsule::client::request_digest(spki, &nonce, &rh));
                r.psl_headers.push(("psl-credential".into(), hex::encode(c.cert.encode())));
                r.psl_headers.push(("psl-signature".into(), hex::encode(sig.0)));
            }
            let a = self.guard.serve(&r, |p| route(&self.fe, p));
            let sig = hex::decode(&a.headers.iter().find(|(n, _)| *n == "psl-signature").unwrap().1).unwrap();
            let m = answer_message(&nonce, &rh, a.status, &a.body);
            assert!(AnswerSigner::verify(&self.server_key, &m, &sig), "the answer's signature checks");
            // The same answer does not check for another nonce: a replay is caught.
            let other = answer_message(&[0xee; 32], &rh, a.status, &a.body);
            assert!(!AnswerSigner::verify(&self.server_key, &other, &sig));
            (a.status, serde_json::from_slice(&a.body).unwrap())
        }
    }

    #[test]
    fn a_front_end_of_one_shard_refuses_other_shards_keys_and_spanning_batches() {
        use psl_scl::shard::{Route, Shard, ShardMap};
        let w = World::new();
        let map = ShardMap {
            map_version: 4,
            shards: vec![
                Shard { capsule: w.capsule.0 .0, front_ends: vec!["127.0.0.1:9".into()] },
                Shard { capsule: [7; 32], front_ends: vec!["127.0.0.1:9".into()] },
            ],
            routes: vec![Route { first: 0, shard: 0 }, Route { first: 1 << 63, shard: 1 }],
            moves: vec![],
        };
        let key = psl_memcached::peer::PeerKey::derive(&psl_crypto::DataKey::from_bytes(&[1; 32]));
        let cfg = psl_memcached::peer::PeerConfig::default();
        w.fe.serve_shard(psl_memcached::shards::Shards::new(map.clone(), &w.capsule.0 .0, key, cfg).unwrap());
        let key_in = |s: u16| (0..).map(|i| format!("k{i}")).find(|k| map.shard_of(k.as_bytes()) == s).unwrap();
        let (mine, theirs) = (key_in(0), key_in(1));
        let c = w.cred(&w.owner, w.capsule, "read,write");
        let (s, body) = w.call(Some(&c), &w.spki, "PUT", &format!("/v1/kv/{mine}"), b"v");
        assert_eq!(s, 200);
        // The signed answer names the capsule and shard that answered, as the map says.
        assert_eq!(body["capsule"], json!(w.capsule.0.to_hex()), "{body}");
        assert_eq!((&body["shard"], &body["map_version"]), (&json!(0), &json!(4)), "{body}");
        let (s, body) = w.call(Some(&c), &w.spki, "GET", &format!("/v1/kv/{theirs}"), b"");
        assert_eq!((s, &body["shard"], &body["map_version"]), (421, &json!(1), &json!(4)), "{body}");
        assert_eq!(w.call(Some(&c), &w.spki, "PUT", &format!("/v1/kv/{theirs}"), b"v").0, 421);
        assert!(matches!(w.fe.lookup(theirs.as_bytes()), psl_memcached::store::Lookup::Miss), "not written here");
        let batch = |keys: &[&str]| {
            let ops: Vec<Value> =
                keys.iter().map(|k| json!({"op": "put", "key": b64(k.as_bytes()), "value": b64(b"x")})).collect();
            serde_json::to_vec(&json!({ "ops": ops })).unwrap()
        };
        let (s, body) = w.call(Some(&c), &w.spki, "POST", "/v1/batch", &batch(&[&mine, &theirs]));
        assert_eq!(s, 400, "{body}");
        assert!(body["error"].as_str().unwrap().contains("must stay in one shard"), "{body}");
        assert_eq!(w.call(Some(&c), &w.spki, "POST", "/v1/batch", &batch(&[&theirs])).0, 421);
        assert_eq!(w.call(Some(&c), &w.spki, "POST", "/v1/batch", &batch(&[&mine])).0, 200);
        // The other shard's front end (127.0.0.1:9) does not answer: the scan says which shard.
        let (s, body) = w.call(Some(&c), &w.spki, "GET", "/v1/kv?prefix=k", b"");
        assert!(s == 503 && body["error"].as_str().unwrap().contains("shard 1"), "{s} {body}");
    }

    #[test]
    fn a_credentialed_client_puts_gets_scans_cas_and_syncs_with_signed_answers() {
        let w = World::new();
        let c = w.cred(&w.owner, w.capsule, "read,write");
        let (s, put) = w.call(Some(&c), &w.spki, "PUT", "/v1/kv/user%3A1", b"alice");
        assert_eq!(s, 200, "{put}");
        let (s, got) = w.call(Some(&c), &w.spki, "GET", "/v1/kv/user%3A1", b"");
        assert_eq!(s, 200, "{got}");
        assert_eq!(got["value"], b64(b"alice"));
        assert_eq!(got["version"]["cas"], put["cas"], "a get names the version the put made");
        assert!(got["version"]["lamport"].as_u64().unwrap() > 0);
        // The memcached protocol sees the same item.
        assert!(matches!(w.fe.lookup(b"user:1"), psl_memcached::store::Lookup::Hit { .. }));
        // Compare-and-set: the unique the get returned wins once; the stale one loses.
        let cas = got["version"]["cas"].as_u64().unwrap();
        let (s, won) = w.call(Some(&c), &w.spki, "POST", &format!("/v1/cas/user%3A1?cas={cas}"), b"bob");
        assert_eq!((s, &won["stored"]), (200, &json!(true)), "{won}");
        let (s, lost) = w.call(Some(&c), &w.spki, "POST", &format!("/v1/cas/user%3A1?cas={cas}"), b"carol");
        assert_eq!((s, &lost["reason"]), (409, &json!("exists")), "{lost}");
        w.call(Some(&c), &w.spki, "PUT", "/v1/kv/user%3A2", b"dave");
        w.call(Some(&c), &w.spki, "PUT", "/v1/kv/other", b"x");
        let (s, scan) = w.call(Some(&c), &w.spki, "GET", "/v1/kv?prefix=user%3A&limit=1", b"");
        assert_eq!(s, 200);
        assert_eq!(scan["items"].as_array().unwrap().len(), 1);
        assert_eq!((scan["items"][0]["value"].clone(), scan["more"].clone()), (json!(b64(b"bob")), json!(true)));
        let (_, all) = w.call(Some(&c), &w.spki, "GET", "/v1/kv?prefix=user%3A", b"");
        assert_eq!(all["items"].as_array().unwrap().len(), 2, "{all}");
        let (s, sync) = w.call(Some(&c), &w.spki, "POST", "/v1/sync", b"");
        assert_eq!(s, 200, "{sync}");
        let (s, del) = w.call(Some(&c), &w.spki, "DELETE", "/v1/kv/user%3A1", b"");
        assert_eq!((s, &del["deleted"]), (200, &json!(true)));
        let (s, gone) = w.call(Some(&c), &w.spki, "GET", "/v1/kv/user%3A1", b"");
        assert_eq!((s, &gone["found"]), (404, &json!(false)));
    }

    #[test]
    fn a_batch_writes_every_op_or_none_and_says_what_was_wrong() {
        let w = World::new();
        let c = w.cred(&w.owner, w.capsule, "read,write");
        w.call(Some(&c), &w.spki, "PUT", "/v1/kv/old", b"x");
        let body = json!({ "ops": [
            { "op": "put", "key": b64(b"acct:a"), "value": b64(b"90") },
            { "op": "put", "key": b64(b"acct:b"), "value": b64(b"110") },
            { "op": "delete", "key": b64(b"old") },
        ]});
        let (s, done) = w.call(Some(&c), &w.spki, "POST", "/v1/batch", body.to_string().as_bytes());
        assert_eq!(s, 200, "{done}");
        assert_eq!(done["applied"], json!(true));
        let ops = done["ops"].as_array().unwrap();
        assert_eq!(ops.len(), 3);
        let lamports: Vec<u64> = ops.iter().map(|o| o["version"]["lamport"].as_u64().unwrap()).collect();
        assert!(lamports.windows(2).all(|p| p[0] < p[1]), "{done}");
        let (_, a) = w.call(Some(&c), &w.spki, "GET", "/v1/kv/acct%3Aa", b"");
        assert_eq!(
            (a["value"].clone(), a["version"]["cas"].clone()),
            (json!(b64(b"90")), ops[0]["version"]["cas"].clone())
        );
        assert_eq!(w.call(Some(&c), &w.spki, "GET", "/v1/kv/old", b"").0, 404);
        // Bad batches: nothing of them is written, and the answer says why.
        let bad_key = json!({ "ops": [
            { "op": "put", "key": b64(b"acct:c"), "value": b64(b"1") },
            { "op": "put", "key": b64(b"has space"), "value": b64(b"1") },
        ]});
        let many: Vec<Value> =
            (0..=BATCH_OPS_MAX).map(|i| json!({ "op": "delete", "key": b64(format!("k{i}").as_bytes()) })).collect();
        for (body, says) in [
            (bad_key.to_string(), "op 1"),
            (json!({ "ops": [] }).to_string(), "1 to"),
            (json!({ "ops": many }).to_string(), "1 to"),
            (json!({ "ops": [{ "op": "incr", "key": b64(b"k") }] }).to_string(), "put"),
            (json!({ "ops": [{ "op": "put", "key": "not base64!" }] }).to_string(), "base64"),
            ("not json".to_string(), "JSON"),
        ] {
            let (s, e) = w.call(Some(&c), &w.spki, "POST", "/v1/batch", body.as_bytes());
            assert_eq!(s, 400, "{e}");
            assert!(e["error"].as_str().unwrap().contains(says), "{e}");
        }
        assert_eq!(w.call(Some(&c), &w.spki, "GET", "/v1/kv/acct%3Ac", b"").0, 404);
        // A reader may not batch.
        let reader = w.cred(&w.owner, w.capsule, "read");
        assert_eq!(w.call(Some(&reader), &w.spki, "POST", "/v1/batch", body.to_string().as_bytes()).0, 403);
        assert_eq!(w.call(Some(&c), &w.spki, "GET", "/v1/batch", b"").0, 405);
    }

    #[test]
    fn requests_without_a_valid_credential_are_refused_401_and_those_it_does_not_allow_403() {
        let w = World::new();
        let reader = w.cred(&w.owner, w.capsule, "read");
        let writer = w.cred(&w.owner, w.capsule, "read,write");
        // No credential at all.
        assert_eq!(w.call(None, &w.spki, "GET", "/v1/kv/k", b"").0, 401);
        // A certificate the client signed itself (not the owner): 401, however wide.
        let mallory = OwnerKey::from_seed(&[4; 32]).unwrap();
        let forged = w.cred(&mallory, w.capsule, "read,write,run");
        assert_eq!(w.call(Some(&forged), &w.spki, "PUT", "/v1/kv/k", b"v").0, 401);
        // A request signed for another endpoint (a relay that replays it here): 401.
        assert_eq!(w.call(Some(&writer), &[9; 32], "PUT", "/v1/kv/k", b"v").0, 401);
        // Someone else's certificate without its key: the signature does not verify.
        let stolen = Cred { key: SigningKey::generate(), cert: writer.cert.clone() };
        assert_eq!(w.call(Some(&stolen), &w.spki, "PUT", "/v1/kv/k", b"v").0, 401);
        // A credential for another capsule of the same owner: 403.
        let elsewhere = w.cred(&w.owner, CapsuleName(psl_crypto::Hash256([5; 32])), "read,write");
        assert_eq!(w.call(Some(&elsewhere), &w.spki, "GET", "/v1/kv/k", b"").0, 403);
        // A reader may read, not write: 403, and nothing is written.
        let (s, e) = w.call(Some(&reader), &w.spki, "PUT", "/v1/kv/k", b"v");
        assert_eq!(s, 403, "{e}");
        assert!(e["error"].as_str().unwrap().contains("needs"), "{e}");
        assert_eq!(w.call(Some(&reader), &w.spki, "GET", "/v1/kv/k", b"").0, 404);
        assert_eq!(w.call(Some(&writer), &w.spki, "PUT", "/v1/kv/k", b"v").0, 200);
        assert_eq!(w.call(Some(&reader), &w.spki, "GET", "/v1/kv/k", b"").0, 200);
    }

    #[test]
    fn a_connection_that_proved_a_credential_may_send_that_credential_unsigned_and_no_other() {
        let w = World::new();
        let c = w.cred(&w.owner, w.capsule, "read,write");
        let other = w.cred(&w.owner, w.capsule, "read,write");
        let send = |conn: &Arc<psl_http::Connection>, cred: &Cred, sign: bool, pq: &str| {
            let nonce: [u8; 32] = rand::random();
            let mut r = req("PUT", pq);
            r.connection = conn.clone();
            r.psl_headers.push(("psl-nonce".into(), hex::encode(nonce)));
            r.psl_headers.push(("psl-credential".into(), hex::encode(cred.cert.encode())));
            if sign {
                let rh = psl_capsule::client::request_hash("PUT", pq, b"");
                let sig = cred.key.sign(&psl_capsule::client::request_digest(&w.spki, &nonce, &rh));
                r.psl_headers.push(("psl-signature".into(), hex::encode(sig.0)));
            }
            w.guard.serve(&r, |p| route(&w.fe, p)).status
        };
        let (one, two) = (Arc::default(), Arc::default());
        assert_eq!(send(&one, &c, false, "/v1/kv/a"), 401, "nothing proved yet");
        assert_eq!(send(&one, &c, true, "/v1/kv/a"), 200);
        assert_eq!(send(&one, &c, false, "/v1/kv/b"), 200, "proved on this connection");
        assert_eq!(send(&one, &other, false, "/v1/kv/c"), 401, "another credential must prove itself");
        assert_eq!(send(&two, &c, false, "/v1/kv/d"), 401, "another connection must prove it again");
        // A reader proved on a connection still may not write on it.
        let reader = w.cred(&w.owner, w.capsule, "read");
        let three = Arc::default();
        assert_eq!(send(&three, &reader, true, "/v1/kv/e"), 403);
    }

    #[test]
    fn jobs_run_for_a_run_credential_only_and_report_when_done() {
        let w = World::new();
        let runner: JobRunner = Arc::new(|spec: JobSpec, _| {
            if spec.program.contains("boom") {
                return Err("the scheduler is gone".into());
            }
            Ok(json!({ "ok": true, "lambdas": spec.lambdas }))
        });
        let table = Jobs::new(runner);
        let call = |cred: &Cred, method: &str, pq: &str, body: &[u8]| {
            let r = w.signed(cred, method, pq, body).0;
            let a = w.guard.serve_with(&r, JobRequest::parse, |_| Permissions::RUN, |j| table.route(j));
            (a.status, serde_json::from_slice::<Value>(&a.body).unwrap())
        };
        let wait = |cred: &Cred, id: &str| {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                let (s, st) = call(cred, "GET", &format!("/v1/jobs/{id}"), b"");
                assert_eq!(s, 200, "{st}");
                if st["status"] != "running" {
                    return st;
                }
                assert!(std::time::Instant::now() < deadline, "job {id} never ended");
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        let kv_only = w.cred(&w.owner, w.capsule, "read,write");
        let runner_cred = w.cred(&w.owner, w.capsule, "run");
        let job = br#"{"program": "emit(1)", "lambdas": 2}"#;
        assert_eq!(call(&kv_only, "POST", "/v1/jobs", job).0, 403, "read,write may not run jobs");
        let (s, sub) = call(&runner_cred, "POST", "/v1/jobs", job);
        assert_eq!(s, 202, "{sub}");
        let done = wait(&runner_cred, sub["id"].as_str().unwrap());
        assert_eq!((done["status"].as_str(), done["report"]["lambdas"].as_u64()), (Some("done"), Some(2)));
        let (_, sub) = call(&runner_cred, "POST", "/v1/jobs", br#"{"program": "boom", "lambdas": 1}"#);
        let failed = wait(&runner_cred, sub["id"].as_str().unwrap());
        assert_eq!(
            (failed["status"].as_str(), failed["error"].as_str()),
            (Some("failed"), Some("the scheduler is gone"))
        );
        assert_eq!(call(&runner_cred, "GET", "/v1/jobs/00000000000000ff", b"").0, 404);
        assert_eq!(call(&runner_cred, "POST", "/v1/jobs", br#"{"program": "x", "lambdas": 0}"#).0, 400);
        assert_eq!(call(&runner_cred, "POST", "/v1/jobs", br#"{"program": "x"}"#).0, 400);
        assert_eq!(call(&runner_cred, "GET", "/v1/jobs", b"").0, 405);
    }

    #[test]
    fn a_quiet_jobs_stream_repeats_its_status_until_the_job_ends() {
        let w = World::new();
        let runner: JobRunner = Arc::new(|_: JobSpec, progress: psl_faas::net::Progress| {
            progress(psl_faas::net::JobProgress::Begun);
            std::thread::sleep(Duration::from_millis(400));
            Ok(json!({ "ok": true }))
        });
        let (_, api) = jobs(Jobs::with_heartbeat(runner, Duration::from_millis(50)), w.guard.clone());
        let cred = w.cred(&w.owner, w.capsule, "run");
        let (r, _, _) = w.signed(&cred, "POST", "/v1/jobs", br#"{"program": "emit(1)", "lambdas": 1}"#);
        let id = serde_json::from_slice::<Value>(&api(r).body).unwrap()["id"].as_str().unwrap().to_string();
        let mut events = api(w.signed(&cred, "GET", &format!("/v1/jobs/{id}/events"), b"").0).events.expect("a stream");
        let mut got = Vec::new();
        while let Some(frame) = events.next_blocking() {
            let text = String::from_utf8(frame.to_vec()).unwrap();
            let json = text.split_once("data: ").unwrap().1.split_once(' ').unwrap().1.trim_end().to_string();
            got.push(serde_json::from_str::<Value>(&json).unwrap());
        }
        let heartbeats = got.iter().filter(|e| e.get("progress").is_none() && e.get("last").is_none()).count();
        assert!(heartbeats >= 2, "a 400 ms quiet stretch under a 50 ms heartbeat: {got:?}");
        assert!(got.iter().filter(|e| e.get("last").is_none()).all(|e| e["status"] == "running"), "{got:?}");
        assert_eq!(got.last().unwrap()["last"], json!(true));
    }

    #[test]
    fn a_jobs_progress_streams_as_signed_events_ending_with_its_status() {
        let w = World::new();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let go_rx = parking_lot::Mutex::new(go_rx);
        let runner: JobRunner = Arc::new(move |spec: JobSpec, progress: psl_faas::net::Progress| {
            use psl_faas::net::JobProgress;
            progress(JobProgress::Begun);
            progress(JobProgress::Dispatched { workers: 2 });
            // Held until the test has subscribed, so some steps come live, not from the log.
            let _ = go_rx.lock().recv_timeout(Duration::from_secs(10));
            for done in 1..=2 {
                progress(JobProgress::WorkerDone { worker: done as u32, done, of: 2 });
            }
            progress(JobProgress::Ending);
            Ok(json!({ "ok": true, "lambdas": spec.lambdas }))
        });
        let (_, api) = jobs(Jobs::new(runner), w.guard.clone());
        let runner_cred = w.cred(&w.owner, w.capsule, "run");
        let (r, _, _) = w.signed(&runner_cred, "POST", "/v1/jobs", br#"{"program": "emit(1)", "lambdas": 2}"#);
        let sub: Value = serde_json::from_slice(&api(r).body).unwrap();
        let id = sub["id"].as_str().unwrap().to_string();
        let path = format!("/v1/jobs/{id}/events");
        // A reader may not watch; an unknown job is 404 (signed, no stream).
        let reader = w.cred(&w.owner, w.capsule, "read");
        let refused = api(w.signed(&reader, "GET", &path, b"").0);
        assert!(refused.status == 403 && refused.events.is_none());
        let unknown = api(w.signed(&runner_cred, "GET", "/v1/jobs/00000000000000ff/events", b"").0);
        assert_eq!((unknown.status, unknown.events.is_none()), (404, true));
        let (r, nonce, rh) = w.signed(&runner_cred, "GET", &path, b"");
        let mut a = api(r);
        assert_eq!(a.status, 200);
        let head_sig = hex::decode(&a.headers[0].1).unwrap();
        assert!(AnswerSigner::verify(&w.server_key, &answer_message(&nonce, &rh, 200, b""), &head_sig));
        go_tx.send(()).unwrap();
        let mut events = a.events.take().expect("a stream");
        let mut got = Vec::new();
        while let Some(frame) = events.next_blocking() {
            let text = String::from_utf8(frame.to_vec()).unwrap();
            let (id_line, data) = text.trim_end().split_once('\n').unwrap();
            let seq: u64 = id_line.strip_prefix("id: ").unwrap().parse().unwrap();
            let (sig, json) = data.strip_prefix("data: ").unwrap().split_once(' ').unwrap();
            let m = event_message(&nonce, &rh, seq, json.as_bytes());
            assert!(AnswerSigner::verify(&w.server_key, &m, &hex::decode(sig).unwrap()), "event {seq} is signed");
            // Signed for its place: the same event under another seq does not verify.
            let moved = event_message(&nonce, &rh, seq + 1, json.as_bytes());
            assert!(!AnswerSigner::verify(&w.server_key, &moved, &hex::decode(sig).unwrap()));
            assert_eq!(seq, got.len() as u64 + 1);
            got.push(serde_json::from_str::<Value>(json).unwrap());
        }
        let steps: Vec<&str> = got.iter().filter_map(|e| e["progress"]["step"].as_str()).collect();
        assert_eq!(steps, ["begun", "dispatched", "worker_done", "worker_done", "ending"], "{got:?}");
        let last = got.last().unwrap();
        assert_eq!((last["status"].as_str(), last["last"].as_bool()), (Some("done"), Some(true)), "{last}");
        assert_eq!(last["report"]["lambdas"], json!(2));
        // Once it has ended, a new stream gives the whole log and the end at once.
        let mut again = api(w.signed(&runner_cred, "GET", &path, b"").0).events.expect("a stream");
        let mut n = 0;
        while again.next_blocking().is_some() {
            n += 1;
        }
        assert_eq!(n, 6);
    }

    #[test]
    fn a_bare_node_serves_raw_values_with_their_versions_and_refuses_cas() {
        let w = World::new();
        let c = w.cred(&w.owner, w.capsule, "read,write");
        let node = w.fe.node().clone();
        let call = |method: &str, pq: &str, body: &[u8]| {
            let r = w.signed(&c, method, pq, body).0;
            let a = w.guard.serve(&r, |p| route_node(&node, p));
            (a.status, serde_json::from_slice::<Value>(&a.body).unwrap())
        };
        let (s, put) = call("PUT", "/v1/kv/raw%3A1", b"bytes");
        assert_eq!(s, 200, "{put}");
        let (s, got) = call("GET", "/v1/kv/raw%3A1", b"");
        assert_eq!((s, got["value"].as_str()), (200, Some("Ynl0ZXM=")), "{got}");
        assert_eq!(got["version"], put["version"], "the get names the version the put made");
        // Raw: the node holds exactly the bytes (no memcached item header).
        assert_eq!(node.get(b"raw:1").as_deref(), Some(&b"bytes"[..]));
        call("PUT", "/v1/kv/raw%3A2", b"x");
        let (_, scan) = call("GET", "/v1/kv?prefix=raw%3A&limit=1", b"");
        assert_eq!((scan["items"].as_array().map(Vec::len), &scan["more"]), (Some(1), &json!(true)), "{scan}");
        assert_eq!(call("POST", "/v1/cas/raw%3A1?cas=5", b"y").0, 405);
        assert_eq!(call("DELETE", "/v1/kv/raw%3A1", b"").1["deleted"], json!(true));
        assert_eq!(call("GET", "/v1/kv/raw%3A1", b"").0, 404);
        // An atomic batch of raw values.
        let body = json!({ "ops": [
            { "op": "put", "key": b64(b"raw:3"), "value": b64(b"three") },
            { "op": "delete", "key": b64(b"raw:2") },
        ]});
        let (s, done) = call("POST", "/v1/batch", body.to_string().as_bytes());
        assert_eq!(s, 200, "{done}");
        assert_eq!(node.get(b"raw:3").as_deref(), Some(&b"three"[..]));
        assert_eq!(node.get(b"raw:2"), None);
        let (_, got) = call("GET", "/v1/kv/raw%3A3", b"");
        assert_eq!(got["version"], done["ops"][0]["version"], "{done}");
    }

    /// The bytes both sides compute, fixed: the Python SDK's tests check the same figures
    /// (clients/python/tests/vectors.json).
    #[test]
    fn the_request_digest_and_answer_message_are_fixed() {
        let rh = psl_capsule::client::request_hash("PUT", "/v1/kv/a%2Fb?x=1", b"value");
        let d = psl_capsule::client::request_digest(&[1; 32], &[2; 32], &rh);
        let m = answer_message(&[2; 32], &rh, 200, br#"{"ok":true}"#);
        assert_eq!(hex::encode(rh), "4d93b2ebc453d3c337677d769522e8961b2916b8bf500094f049ef02400f6fd8");
        assert_eq!(d.to_hex(), "be32a020479d3b44a0a0d081f5c506ee81c84aac8a553df037715fd7ca27a584");
        assert_eq!(
            hex::encode(psl_crypto::sha256(&[&m]).0),
            "d2bd4890d85dfe3c963a80643f59b3e3232bda5dee247d9389eb1398418a5bec"
        );
    }

    #[test]
    fn routes_parse_with_their_permissions() {
        assert_eq!(Request::parse(&req("GET", "/v1/kv/a%2Fb")).unwrap(), Request::Get(b"a/b".to_vec()));
        assert_eq!(Request::parse(&req("DELETE", "/v1/kv/k")).unwrap().needs(), Permissions::WRITE);
        let scan = Request::parse(&req("GET", "/v1/kv?prefix=us%3A&limit=5")).unwrap();
        assert_eq!(scan, Request::Scan { prefix: b"us:".to_vec(), after: None, limit: 5 });
        assert_eq!(scan.needs(), Permissions::READ);
        assert_eq!(Request::parse(&req("POST", "/v1/cas/k?cas=17")).unwrap(), Request::Cas(b"k".to_vec(), 17, vec![]));
        assert_eq!(Request::parse(&req("POST", "/v1/sync?durable=true")).unwrap(), Request::Sync { durable: true });
    }

    #[test]
    fn bad_requests_say_what_was_wrong() {
        for (m, pq, status) in [
            ("GET", "/v1/kv/a%20b", 400),   // a space
            ("GET", "/v1/kv/", 400),        // empty key
            ("GET", "/v1/kv/%zz", 400),     // bad escape
            ("GET", "/v1/kv/%+1", 400),     // not two hex digits
            ("POST", "/v1/kv/k", 405),      // wrong method
            ("POST", "/v1/cas/k", 400),     // no unique
            ("GET", "/v1/kv?limit=0", 400), // limit out of range
            ("POST", "/v1/sync?durable=maybe", 400),
            ("GET", "/v1/kvx", 404),
        ] {
            let e = Request::parse(&req(m, pq)).unwrap_err();
            assert_eq!(e.0, status, "{m} {pq}: {}", e.1);
        }
        let long = format!("/v1/kv/{}", "k".repeat(KEY_BYTES_MAX + 1));
        assert_eq!(Request::parse(&req("GET", &long)).unwrap_err().0, 400);
    }
}
