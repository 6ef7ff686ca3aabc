//! TLS for the coordinator's gRPC port, from PEM files (a Kubernetes Secret mounted as
//! files, e.g. issued by cert-manager). Workers authenticate with client certificates
//! signed by the workers' CA (mutual TLS); submitters verify the coordinator with the same
//! files and authenticate with bearer tokens.

use std::path::Path;

use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

fn read(path: &Path) -> std::io::Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

/// The coordinator's side: its certificate and key, and the CA whose client certificates
/// identify workers. A client certificate is optional at the handshake (submitters have
/// none); the worker RPCs require one.
pub fn server_config(cert: &Path, key: &Path, worker_ca: &Path) -> std::io::Result<ServerTlsConfig> {
    Ok(ServerTlsConfig::new()
        .identity(Identity::from_pem(read(cert)?, read(key)?))
        .client_ca_root(Certificate::from_pem(read(worker_ca)?))
        .client_auth_optional(true))
}

/// A client's side: the CA that signed the coordinator's certificate and, for a worker,
/// its own certificate and key.
pub fn client_config(ca: &Path, identity: Option<(&Path, &Path)>) -> std::io::Result<ClientTlsConfig> {
    let config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)?));
    Ok(match identity {
        Some((cert, key)) => config.identity(Identity::from_pem(read(cert)?, read(key)?)),
        None => config,
    })
}
