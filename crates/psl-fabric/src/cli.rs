//! The library side of `psl router`: [`RouterArgs`] (clap) and [`run_router`].

use std::io::Write;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use anyhow::Context;

use crate::config::{FRAME_BYTES_MAX_DEFAULT, QUEUE_MSGS_MAX_DEFAULT};
use crate::fault::FaultConfig;
use crate::router::{Router, RouterConfig};

/// How a role attaches to the fabric: flatten into every role's arguments.
///
/// `--fabric URL` (alias `--router`, which always took a router's `HOST:PORT`): a router
/// (`psl://HOST:PORT` or `HOST:PORT`) or NATS servers (`nats://H1:4222,nats://H2:4222`).
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct FabricArgs {
    /// The fabric: psl://HOST:PORT (a router; bare HOST:PORT too) or nats://H1:4222[,nats://H2:4222...].
    #[arg(long = "fabric", visible_alias = "router", value_name = "URL")]
    pub fabric: Option<crate::url::FabricUrl>,
    /// NATS credentials file (JWT and NKey seed) issued by the NATS operator.
    #[arg(long, value_name = "FILE")]
    pub nats_creds: Option<std::path::PathBuf>,
    /// CA certificate (PEM) that signs the NATS servers' TLS certificates; TLS is then required.
    #[arg(long, value_name = "FILE")]
    pub nats_tls_ca: Option<std::path::PathBuf>,
    /// First token(s) of every NATS subject (deployments sharing one NATS account differ here).
    #[arg(long, value_name = "PREFIX", default_value = crate::subject::SUBJECT_PREFIX_DEFAULT)]
    pub nats_prefix: String,
}

impl FabricArgs {
    /// The spec these flags name, or an error naming `role` if `--fabric` is missing.
    pub fn spec(&self, role: &str) -> anyhow::Result<crate::url::FabricSpec> {
        let Some(url) = self.fabric.clone() else {
            anyhow::bail!("{role} needs --fabric URL (psl://HOST:PORT or nats://HOST:PORT,...)");
        };
        self.spec_of(url)
    }

    /// `url` with the NATS options of these flags.
    pub fn spec_of(&self, url: crate::url::FabricUrl) -> anyhow::Result<crate::url::FabricSpec> {
        if !url.is_nats() && (self.nats_creds.is_some() || self.nats_tls_ca.is_some()) {
            anyhow::bail!("--nats-creds and --nats-tls-ca go with a nats:// fabric, not {url}");
        }
        if !crate::subject::valid_prefix(&self.nats_prefix) {
            anyhow::bail!("--nats-prefix {:?} is not dot-separated [A-Za-z0-9_-] tokens", self.nats_prefix);
        }
        Ok(crate::url::FabricSpec {
            url,
            nats_creds: self.nats_creds.clone(),
            nats_tls_ca: self.nats_tls_ca.clone(),
            nats_prefix: self.nats_prefix.clone(),
        })
    }
}

/// `psl router`: run one router of the TCP fabric, optionally as an adversary.
///
/// Prints `listening ADDR` on stdout once bound (so `--listen 127.0.0.1:0` can be used), then
/// runs until killed. Logs go to stderr.
#[derive(Debug, Clone, PartialEq, clap::Parser)]
#[command(name = "router")]
pub struct RouterArgs {
    /// Address to listen on for endpoints and child routers (port 0: any free port).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7400")]
    pub listen: SocketAddr,
    /// Parent router to connect to (host:port); omit for the root of the tree.
    #[arg(long, value_name = "ADDR")]
    pub parent: Option<String>,
    /// Probability each frame is lost on each link.
    #[arg(long, value_name = "RATE", default_value_t = 0.0, value_parser = parse_rate)]
    pub loss: f64,
    /// Probability each frame is sent twice.
    #[arg(long, value_name = "RATE", default_value_t = 0.0, value_parser = parse_rate)]
    pub duplicate: f64,
    /// Probability each frame is held back behind up to --reorder-window later frames.
    #[arg(long, value_name = "RATE", default_value_t = 0.0, value_parser = parse_rate)]
    pub reorder: f64,
    /// Most later frames a reordered frame waits for.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub reorder_window: u32,
    /// Probability each frame is delayed (default: 1 if --delay-ms is given, else 0).
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    pub delay: Option<f64>,
    /// A delayed frame is held 1..=this many milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub delay_ms: u64,
    /// Probability 1..4 bytes of a frame are flipped.
    #[arg(long, value_name = "RATE", default_value_t = 0.0, value_parser = parse_rate)]
    pub corrupt: f64,
    /// Probability an earlier frame is sent again.
    #[arg(long, value_name = "RATE", default_value_t = 0.0, value_parser = parse_rate)]
    pub replay: f64,
    /// Seed of the fault sequence.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Longest outbound queue per link, in frames; a full queue drops.
    #[arg(long, value_name = "N", default_value_t = QUEUE_MSGS_MAX_DEFAULT)]
    pub queue_msgs_max: usize,
    /// Largest frame accepted, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = FRAME_BYTES_MAX_DEFAULT)]
    pub frame_bytes_max: usize,
    /// Log a line of counters every this many seconds (0: never).
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    pub stats_every: u64,
    /// Host (name or IP) printed on the `listening` line with the bound port, instead of the
    /// bound address: what endpoints on other hosts dial when the router listens on 0.0.0.0.
    #[arg(long, value_name = "HOST")]
    pub advertise: Option<String>,
}

fn parse_rate(s: &str) -> Result<f64, String> {
    let p: f64 = s.parse().map_err(|e| format!("{s:?} is not a number: {e}"))?;
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err(format!("{p} is not a rate in [0, 1]"))
    }
}

impl RouterArgs {
    /// The fault config these flags ask for (`None` when every rate is 0).
    pub fn faults(&self) -> Option<FaultConfig> {
        let f = FaultConfig {
            seed: self.seed,
            drop: self.loss,
            duplicate: self.duplicate,
            reorder: self.reorder,
            reorder_window: self.reorder_window,
            delay: self.delay.unwrap_or(if self.delay_ms > 0 { 1.0 } else { 0.0 }),
            delay_ms_max: self.delay_ms,
            corrupt: self.corrupt,
            replay: self.replay,
            ..FaultConfig::default()
        };
        (!f.is_transparent()).then_some(f)
    }

    /// The router config these flags ask for (resolves `--parent`).
    pub fn to_config(&self) -> anyhow::Result<RouterConfig> {
        let parent = match &self.parent {
            None => None,
            Some(p) => Some(
                p.to_socket_addrs()
                    .with_context(|| format!("--parent {p}: cannot resolve"))?
                    .next()
                    .with_context(|| format!("--parent {p}: no address"))?,
            ),
        };
        let cfg = RouterConfig {
            listen: self.listen,
            parent,
            link_queue_msgs_max: self.queue_msgs_max,
            frame_bytes_max: self.frame_bytes_max,
            faults: self.faults(),
            stats_log_interval: (self.stats_every > 0).then(|| Duration::from_secs(self.stats_every)),
            ..RouterConfig::default()
        };
        cfg.validate().context("psl router")?;
        Ok(cfg)
    }
}

/// Runs `psl router` until the process is killed.
pub fn run_router(args: RouterArgs) -> anyhow::Result<()> {
    let cfg = args.to_config()?;
    let faults = cfg.faults.clone();
    let router = Router::spawn(cfg).context("psl router")?;
    tracing::info!(addr = %router.local_addr(), ?faults, "psl router started");
    let mut out = std::io::stdout().lock();
    match &args.advertise {
        Some(a) => writeln!(out, "listening {a}:{}", router.local_addr().port())?,
        None => writeln!(out, "listening {}", router.local_addr())?,
    }
    out.flush()?;
    drop(out);
    router.wait().context("psl router")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn flags_map_to_config() {
        let a = RouterArgs::parse_from([
            "router",
            "--listen",
            "127.0.0.1:0",
            "--loss",
            "0.2",
            "--reorder",
            "0.2",
            "--seed",
            "7",
            "--delay-ms",
            "5",
        ]);
        let c = a.to_config().unwrap();
        let f = c.faults.unwrap();
        assert_eq!((f.drop, f.reorder, f.seed, f.delay, f.delay_ms_max), (0.2, 0.2, 7, 1.0, 5));
        assert_eq!(c.parent, None);
        let a = RouterArgs::parse_from(["router", "--parent", "127.0.0.1:9"]);
        assert_eq!(a.to_config().unwrap().faults, None);
        assert_eq!(a.to_config().unwrap().parent, Some("127.0.0.1:9".parse().unwrap()));
    }

    #[test]
    fn usable_as_a_subcommand_of_the_psl_binary() {
        #[derive(clap::Parser)]
        enum Psl {
            Router(RouterArgs),
        }
        let Psl::Router(a) = Psl::parse_from(["psl", "router", "--loss", "0.2", "--reorder", "0.2", "--seed", "7"]);
        assert_eq!((a.loss, a.reorder, a.seed), (0.2, 0.2, 7));
    }

    #[test]
    fn fabric_flags_take_a_url_and_keep_router_as_an_alias() {
        #[derive(clap::Parser)]
        struct Role {
            #[command(flatten)]
            f: FabricArgs,
        }
        let r = Role::parse_from(["role", "--router", "127.0.0.1:7400"]);
        assert_eq!(r.f.spec("role").unwrap().url, crate::FabricUrl::Router("127.0.0.1:7400".into()));
        let r = Role::parse_from(["role", "--fabric", "nats://a:4222,nats://b:4222", "--nats-creds", "/x.creds"]);
        let s = r.f.spec("role").unwrap();
        assert!(s.url.is_nats() && s.nats_creds.is_some() && s.nats_prefix == "psl");
        assert!(Role::parse_from(["role"]).f.spec("role").is_err());
        assert!(Role::try_parse_from(["role", "--fabric", "ftp://x:1"]).is_err());
        let r = Role::parse_from(["role", "--fabric", "psl://h:1", "--nats-tls-ca", "/ca.pem"]);
        assert!(r.f.spec("role").is_err(), "NATS options on a router URL are refused");
    }

    #[test]
    fn bad_rates_are_refused_by_the_parser() {
        assert!(RouterArgs::try_parse_from(["router", "--loss", "1.5"]).is_err());
        assert!(RouterArgs::try_parse_from(["router", "--corrupt", "x"]).is_err());
    }
}
