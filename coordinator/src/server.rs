//! Serving the coordinator over gRPC, with the standard health service.

use dpsynth_proto::coordinator_server::CoordinatorServer;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Server;

use crate::service::CoordinatorService;

/// Serves on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    service: CoordinatorService,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_serving::<CoordinatorServer<CoordinatorService>>().await;
    Server::builder()
        .add_service(health)
        .add_service(
            CoordinatorServer::new(service)
                .max_decoding_message_size(dpsynth_proto::MAX_MESSAGE_BYTES)
                .max_encoding_message_size(dpsynth_proto::MAX_MESSAGE_BYTES),
        )
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await
}
