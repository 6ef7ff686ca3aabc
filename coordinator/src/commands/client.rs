//! How a submitter's commands (`submit`, `ledger show` of a served dataset) reach a
//! coordinator: its URL, the CA that signed its certificate, and the bearer token.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use rhosynth_proto::coordinator_client::CoordinatorClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

/// A coordinator as one submitter reaches it.
#[derive(Args)]
pub struct SubmitterArgs {
    /// Coordinator gRPC URL (`https://` with --tls-ca).
    #[arg(long, env = "RHOSYNTH_COORDINATOR", default_value = "http://127.0.0.1:50051")]
    pub coordinator: String,
    /// The CA that signed the coordinator's certificate (PEM).
    #[arg(long, env = "RHOSYNTH_TLS_CA")]
    tls_ca: Option<PathBuf>,
    /// A file holding the submitter's bearer token (`RHOSYNTH_TOKEN` also works).
    #[arg(long)]
    token_file: Option<PathBuf>,
}

/// Sends the submitter's token with every request.
#[derive(Clone)]
pub struct BearerToken(Option<MetadataValue<Ascii>>);

impl Interceptor for BearerToken {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request.metadata_mut().insert("authorization", value.clone());
        }
        Ok(request)
    }
}

pub type SubmitterClient = CoordinatorClient<InterceptedService<Channel, BearerToken>>;

impl SubmitterArgs {
    /// Connects, having refused a URL that would send the token in the clear.
    pub async fn connect(&self) -> anyhow::Result<SubmitterClient> {
        let token = match (&self.token_file, std::env::var("RHOSYNTH_TOKEN")) {
            (Some(path), _) => {
                Some(std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?)
            }
            (None, Ok(token)) => Some(token),
            (None, Err(_)) => None,
        };
        check_coordinator_url(&self.coordinator, token.is_some(), self.tls_ca.is_some())?;
        let authorization = token
            .map(|t| format!("Bearer {}", t.trim()).parse())
            .transpose()
            .context("the token is not a valid header value")?;
        let mut endpoint = Endpoint::from_shared(self.coordinator.clone())?;
        if let Some(ca) = &self.tls_ca {
            endpoint = endpoint.tls_config(rhosynth_proto::tls::client_config(ca, None)?)?;
        }
        let channel = endpoint
            .connect()
            .await
            .with_context(|| format!("connecting to the coordinator at {}", self.coordinator))?;
        Ok(CoordinatorClient::with_interceptor(channel, BearerToken(authorization)))
    }
}

/// Refuses a coordinator URL that would send a bearer token in the clear: with a token,
/// https, or http to a loopback address; with `--tls-ca`, https (tonic uses TLS for https
/// alone); never user information in the authority, which would name another host.
fn check_coordinator_url(url: &str, token: bool, tls_ca: bool) -> anyhow::Result<()> {
    let uri: tonic::transport::Uri = url.parse().with_context(|| format!("coordinator URL {url}"))?;
    let authority = uri.authority().map(|a| a.as_str()).unwrap_or_default();
    if authority.contains('@') {
        bail!("the coordinator URL {url} names a user; give the host alone");
    }
    let https = uri.scheme_str() == Some("https");
    if tls_ca && !https {
        bail!("--tls-ca is for an https:// coordinator; over {url} it would not be used");
    }
    let host = uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']');
    let loopback = host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if token && !https && !loopback {
        bail!("refusing to send a bearer token without TLS to {url}: give --tls-ca and an https:// URL");
    }
    Ok(())
}
