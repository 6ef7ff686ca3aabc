//! Serving the coordinator over gRPC, with the standard health service.

use rhosynth_proto::coordinator_server::CoordinatorServer;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Server, ServerTlsConfig};

use crate::service::CoordinatorService;

/// Serves on `listener` until `shutdown` resolves; over TLS when `tls` is given (the
/// coordinator's identity, and the workers' CA for client certificates).
pub async fn serve(
    listener: TcpListener,
    service: CoordinatorService,
    tls: Option<ServerTlsConfig>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_serving::<CoordinatorServer<CoordinatorService>>().await;
    let mut builder = Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls)?;
    }
    builder
        .add_service(health)
        .add_service(
            CoordinatorServer::new(service)
                .max_decoding_message_size(rhosynth_proto::MAX_MESSAGE_BYTES)
                .max_encoding_message_size(rhosynth_proto::MAX_MESSAGE_BYTES),
        )
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await
}
