//! Fabric URLs: how every role is told which fabric to attach to.
//!
//! - `psl://HOST:PORT`: a router of PSL's TCP router tree ([`crate::TcpEndpoint`]); a bare
//!   `HOST:PORT` means the same (what `--router` always took).
//! - `nats://HOST:PORT[,nats://HOST:PORT...]` (or `tls://`): a NATS deployment
//!   ([`crate::NatsEndpoint`]); several URLs are servers of one cluster, tried in turn, and the
//!   client fails over among them (and among the servers the cluster advertises).
//!
//! A [`FabricSpec`] is a URL with the NATS options (credentials file, TLS CA, subject prefix);
//! [`FabricSpec::connect`] makes the endpoint for a role, subscribed on NATS to what the
//! role's [`Interest`] names.

use std::fmt;
use std::net::ToSocketAddrs;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use crate::error::FabricError;
use crate::fabric::Fabric;
use crate::nats::{NatsConfig, NatsEndpoint};
use crate::subject::{Interest, SUBJECT_PREFIX_DEFAULT};
use crate::tcp::{TcpConfig, TcpEndpoint};

/// Most servers in one NATS URL list.
pub const NATS_SERVERS_MAX: usize = 64;

/// Which fabric, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FabricUrl {
    /// A router of the TCP tree: `host:port`.
    Router(String),
    /// NATS servers: each `nats://host:port` or `tls://host:port`.
    Nats(Vec<String>),
}

impl FabricUrl {
    /// Whether this names NATS servers (rather than a router).
    pub fn is_nats(&self) -> bool {
        matches!(self, FabricUrl::Nats(_))
    }
}

fn host_port(url: &str, hp: &str) -> Result<(), FabricError> {
    let bad = |reason: &str| FabricError::Url { url: url.to_string(), reason: reason.to_string() };
    let (host, port) = hp.rsplit_once(':').ok_or_else(|| bad("expected HOST:PORT"))?;
    if host.is_empty() {
        return Err(bad("the host is empty"));
    }
    port.parse::<u16>().map_err(|_| bad("the port is not a number in 0..=65535"))?;
    Ok(())
}

impl FromStr for FabricUrl {
    type Err = FabricError;

    fn from_str(s: &str) -> Result<FabricUrl, FabricError> {
        let s = s.trim();
        let bad = |reason: String| FabricError::Url { url: s.to_string(), reason };
        if s.is_empty() {
            return Err(bad("empty".into()));
        }
        let parts: Vec<&str> = s.split(',').map(str::trim).collect();
        if parts.iter().all(|p| p.starts_with("nats://") || p.starts_with("tls://")) {
            if parts.len() > NATS_SERVERS_MAX {
                return Err(bad(format!("more than {NATS_SERVERS_MAX} servers")));
            }
            for p in &parts {
                let rest = p.split_once("://").map(|x| x.1).unwrap_or_default();
                // Credentials in the URL would end up in logs and process lists: refuse them.
                if rest.contains('@') {
                    return Err(bad("credentials in the URL are refused; use --nats-creds FILE".into()));
                }
                host_port(p, rest.trim_end_matches('/'))?;
            }
            return Ok(FabricUrl::Nats(parts.iter().map(|p| p.trim_end_matches('/').to_string()).collect()));
        }
        if parts.len() != 1 {
            return Err(bad(
                "a list is only for NATS servers (nats://A,nats://B); a router is one psl://HOST:PORT".into()
            ));
        }
        let hp = match s.split_once("://") {
            Some(("psl", hp)) => hp.trim_end_matches('/'),
            Some((scheme, _)) => return Err(bad(format!("unknown scheme {scheme:?}: use psl:// or nats://"))),
            None => s,
        };
        host_port(s, hp)?;
        Ok(FabricUrl::Router(hp.to_string()))
    }
}

impl fmt::Display for FabricUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FabricUrl::Router(hp) => write!(f, "psl://{hp}"),
            FabricUrl::Nats(v) => write!(f, "{}", v.join(",")),
        }
    }
}

impl serde::Serialize for FabricUrl {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for FabricUrl {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<FabricUrl, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A fabric URL and the options a NATS deployment needs. (The router backend ignores them.)
/// In JSON: an object, or just the URL string (what cluster files held before NATS).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(from = "SpecRepr")]
pub struct FabricSpec {
    /// Which fabric to connect to, and where.
    pub url: FabricUrl,
    /// NATS credentials file (`--nats-creds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nats_creds: Option<PathBuf>,
    /// CA certificate to verify NATS servers' TLS with (`--nats-tls-ca`); TLS is then required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nats_tls_ca: Option<PathBuf>,
    /// First subject token(s) (`--nats-prefix`, default `psl`).
    #[serde(default = "default_prefix")]
    pub nats_prefix: String,
}

#[derive(serde::Deserialize)]
#[serde(untagged)]
enum SpecRepr {
    Url(FabricUrl),
    Full {
        url: FabricUrl,
        #[serde(default)]
        nats_creds: Option<PathBuf>,
        #[serde(default)]
        nats_tls_ca: Option<PathBuf>,
        #[serde(default = "default_prefix")]
        nats_prefix: String,
    },
}

impl From<SpecRepr> for FabricSpec {
    fn from(r: SpecRepr) -> FabricSpec {
        match r {
            SpecRepr::Url(url) => url.into(),
            SpecRepr::Full { url, nats_creds, nats_tls_ca, nats_prefix } => {
                FabricSpec { url, nats_creds, nats_tls_ca, nats_prefix }
            }
        }
    }
}

fn default_prefix() -> String {
    SUBJECT_PREFIX_DEFAULT.to_string()
}

impl From<FabricUrl> for FabricSpec {
    fn from(url: FabricUrl) -> FabricSpec {
        FabricSpec { url, nats_creds: None, nats_tls_ca: None, nats_prefix: default_prefix() }
    }
}

impl fmt::Display for FabricSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.url.fmt(f)
    }
}

impl FabricSpec {
    /// The spec of a router at `addr`.
    pub fn router(addr: std::net::SocketAddr) -> FabricSpec {
        FabricUrl::Router(addr.to_string()).into()
    }

    /// Attaches an endpoint named `name` for a role that wants `interest` (NATS subscribes to
    /// its subjects; the router forwards what it wants, told by an interest frame).
    pub fn connect(&self, name: &str, interest: &Interest) -> Result<Arc<dyn Fabric>, FabricError> {
        match &self.url {
            FabricUrl::Router(hp) => {
                let addr = hp
                    .to_socket_addrs()
                    .map_err(|e| FabricError::Url {
                        url: self.url.to_string(),
                        reason: format!("cannot resolve: {e}"),
                    })?
                    .next()
                    .ok_or_else(|| FabricError::Url { url: self.url.to_string(), reason: "no address".into() })?;
                let cfg =
                    TcpConfig { name: name.to_string(), interest: Some(interest.clone()), ..TcpConfig::default() };
                let ep = TcpEndpoint::connect(addr, cfg)?;
                Ok(Arc::new(ep))
            }
            FabricUrl::Nats(servers) => {
                let cfg = NatsConfig {
                    name: name.to_string(),
                    prefix: self.nats_prefix.clone(),
                    creds: self.nats_creds.clone(),
                    tls_ca: self.nats_tls_ca.clone(),
                    ..NatsConfig::default()
                };
                Ok(Arc::new(NatsEndpoint::connect(servers, interest, cfg)?))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_to_their_backend() {
        assert_eq!("127.0.0.1:7400".parse::<FabricUrl>().unwrap(), FabricUrl::Router("127.0.0.1:7400".into()));
        assert_eq!("psl://h1:7400/".parse::<FabricUrl>().unwrap(), FabricUrl::Router("h1:7400".into()));
        assert_eq!(
            "nats://h1:4222, nats://10.0.0.2:4222".parse::<FabricUrl>().unwrap(),
            FabricUrl::Nats(vec!["nats://h1:4222".into(), "nats://10.0.0.2:4222".into()])
        );
        assert!("tls://h:4443".parse::<FabricUrl>().unwrap().is_nats());
        for bad in [
            "",
            "psl://h1",
            "psl://:1",
            "http://h:1",
            "nats://u:p@h:4222",
            "nats://h:4222,psl://h:1",
            "psl://a:1,psl://b:2",
            "nats://h:99999",
        ] {
            assert!(bad.parse::<FabricUrl>().is_err(), "{bad}");
        }
        let u: FabricUrl = "nats://a:1,nats://b:2".parse().unwrap();
        assert_eq!(u.to_string().parse::<FabricUrl>().unwrap(), u);
        assert_eq!(FabricUrl::Router("h:1".into()).to_string(), "psl://h:1");
    }

    #[test]
    fn specs_round_trip_through_json() {
        let s = FabricSpec {
            nats_creds: Some("/etc/psl/user.creds".into()),
            ..FabricSpec::from("nats://a:4222".parse::<FabricUrl>().unwrap())
        };
        let j = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<FabricSpec>(&j).unwrap(), s);
        let short: FabricSpec = serde_json::from_str(r#"{"url":"127.0.0.1:9"}"#).unwrap();
        assert_eq!(short, FabricSpec::router("127.0.0.1:9".parse().unwrap()));
        let old: FabricSpec = serde_json::from_str(r#""127.0.0.1:9""#).unwrap();
        assert_eq!(old, FabricSpec::router("127.0.0.1:9".parse().unwrap()));
    }
}
