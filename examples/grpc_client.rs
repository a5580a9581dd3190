//! A tonic client for `examples/grpc.rs`: calls `grpc.health.v1.Health/Check` six times and
//! prints the rate-limit metadata, and for a refusal the decoded `RetryInfo` and `QuotaFailure`.
//!
//! ```text
//! cargo run --example grpc          # in one terminal
//! cargo run --example grpc_client   # in another; PORT as for the server (default 50051)
//! ```

use tonic::transport::Channel;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_types::StatusExt;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port = std::env::var("PORT").unwrap_or_else(|_| "50051".into());
    let channel = Channel::from_shared(format!("http://127.0.0.1:{port}"))?
        .connect()
        .await?;
    let mut client = HealthClient::new(channel);
    for call in 1..=6 {
        match client.check(HealthCheckRequest::default()).await {
            Ok(response) => {
                let remaining = response.metadata().get("x-ratelimit-remaining");
                println!(
                    "{call}: OK {:?}, x-ratelimit-remaining {remaining:?}",
                    response.get_ref().status()
                );
            }
            Err(status) => {
                println!("{call}: {:?} {:?}", status.code(), status.message());
                let details = status.get_error_details();
                if let Some(retry) = details.retry_info() {
                    println!("   RetryInfo retry_delay {:?}", retry.retry_delay);
                }
                for violation in details.quota_failure().map_or(&[][..], |q| &q.violations) {
                    println!(
                        "   QuotaFailure subject {:?}, description {:?}",
                        violation.subject, violation.description
                    );
                }
            }
        }
    }
    Ok(())
}
