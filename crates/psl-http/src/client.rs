//! hyper's client over rustls, keeping the certificate the server presented: one GET
//! ([`get_tls`], what `psl verify` needs to check that the evidence it is given binds the very
//! TLS key it is talking to), or a keep-alive [`Session`] of many requests (the API's
//! benchmark). The TLS configuration is the caller's (which certificates it accepts: for an
//! attested server, any, since the evidence is what vouches for the key).

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::Request;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::ClientConfig;

/// What one GET brought back.
#[derive(Debug)]
pub struct Fetched {
    /// The HTTP status.
    pub status: u16,
    /// The body (at most the caller's bound).
    pub body: Vec<u8>,
    /// The server's certificate chain, end entity first.
    pub peer_certs: Vec<CertificateDer<'static>>,
}

/// Why a GET failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The server name is not a DNS name or an IP address.
    #[error("{0:?} is not a server name")]
    Name(String),
    /// Connecting, the TLS handshake or the exchange failed (what failed, and why).
    #[error("{what} {addr}: {why}")]
    Io {
        /// The step that failed.
        what: &'static str,
        /// The server's address.
        addr: SocketAddr,
        /// Why.
        why: String,
    },
    /// Nothing came back within the timeout.
    #[error("{addr} did not answer within {ms} ms")]
    Timeout {
        /// The server's address.
        addr: SocketAddr,
        /// The bound.
        ms: u128,
    },
}

/// One answer of a [`Session`].
#[derive(Debug)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// The headers whose names start with `psl-` (lower case).
    pub psl_headers: Vec<(String, String)>,
    /// The body (at most the caller's bound).
    pub body: Vec<u8>,
}

/// A keep-alive HTTPS connection: one TLS handshake, then any number of requests in turn.
pub struct Session {
    rt: tokio::runtime::Runtime,
    send: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    addr: SocketAddr,
    host: String,
    timeout: Duration,
    /// The server's certificate chain, end entity first.
    pub peer_certs: Vec<CertificateDer<'static>>,
}

impl Session {
    /// Connects to `host` at `addr` over TLS under `tls`; every step within `timeout`.
    pub fn connect(
        addr: SocketAddr,
        host: &str,
        tls: Arc<ClientConfig>,
        timeout: Duration,
    ) -> Result<Session, FetchError> {
        let name = ServerName::try_from(host.to_string()).map_err(|_| FetchError::Name(host.into()))?;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| FetchError::Io {
            what: "starting a runtime for",
            addr,
            why: e.to_string(),
        })?;
        let io = |what: &'static str| move |e: String| FetchError::Io { what, addr, why: e };
        let (send, peer_certs) = rt.block_on(async {
            let work = async {
                let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| io("connecting to")(e.to_string()))?;
                let _ = tcp.set_nodelay(true);
                let tls = tokio_rustls::TlsConnector::from(tls)
                    .connect(name, tcp)
                    .await
                    .map_err(|e| io("the TLS handshake with")(e.to_string()))?;
                let peer_certs: Vec<CertificateDer<'static>> = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .map(|c| c.iter().map(|x| x.clone().into_owned()).collect())
                    .unwrap_or_default();
                let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                    .await
                    .map_err(|e| io("HTTP with")(e.to_string()))?;
                tokio::spawn(conn);
                Ok((send, peer_certs))
            };
            tokio::time::timeout(timeout, work)
                .await
                .unwrap_or(Err(FetchError::Timeout { addr, ms: timeout.as_millis() }))
        })?;
        Ok(Session { rt, send, addr, host: host.to_string(), timeout, peer_certs })
    }

    /// Sends one request and reads its answer (at most `body_max` bytes of body).
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, String)],
        body: Vec<u8>,
        body_max: usize,
    ) -> Result<Answer, FetchError> {
        let addr = self.addr;
        let io = |what: &'static str| move |e: String| FetchError::Io { what, addr, why: e };
        let mut req = Request::builder().method(method).uri(path).header(hyper::header::HOST, &self.host);
        for (n, v) in headers {
            req = req.header(*n, v.as_str());
        }
        let req = req.body(Full::new(Bytes::from(body))).map_err(|e| io("building the request for")(e.to_string()))?;
        let (send, timeout) = (&mut self.send, self.timeout);
        self.rt.block_on(async move {
            let work = async {
                send.ready().await.map_err(|e| io("reusing the connection to")(e.to_string()))?;
                let resp = send.send_request(req).await.map_err(|e| io("requesting from")(e.to_string()))?;
                let status = resp.status().as_u16();
                let psl_headers = resp
                    .headers()
                    .iter()
                    .filter(|(n, _)| n.as_str().starts_with("psl-"))
                    .filter_map(|(n, v)| Some((n.as_str().to_string(), v.to_str().ok()?.to_string())))
                    .collect();
                let body = Limited::new(resp.into_body(), body_max)
                    .collect()
                    .await
                    .map_err(|e| io("reading the answer of")(e.to_string()))?
                    .to_bytes()
                    .to_vec();
                Ok(Answer { status, psl_headers, body })
            };
            tokio::time::timeout(timeout, work)
                .await
                .unwrap_or(Err(FetchError::Timeout { addr, ms: timeout.as_millis() }))
        })
    }
}

/// GETs `path` from `host` at `addr` over TLS under `tls`, within `timeout`, reading at most
/// `body_max` bytes of body.
pub fn get_tls(
    addr: SocketAddr,
    host: &str,
    path: &str,
    tls: Arc<ClientConfig>,
    timeout: Duration,
    body_max: usize,
) -> Result<Fetched, FetchError> {
    let mut s = Session::connect(addr, host, tls, timeout)?;
    let a = s.request("GET", path, &[], Vec::new(), body_max)?;
    Ok(Fetched { status: a.status, body: a.body, peer_certs: std::mem::take(&mut s.peer_certs) })
}
