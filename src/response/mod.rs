//! Rejection responses: `429` problem+json, `413` for a cost that can never fit, `503` when the
//! store fails closed, and gRPC trailers-only responses.
//!
//! TODO(layer): module examples.

mod body;
mod grpc;
mod problem;
mod rejection;

pub use body::RejectionBody;
pub use grpc::{
    grpc_trailers_only, is_grpc, GrpcCode, GRPC_MESSAGE, GRPC_RETRY_PUSHBACK_MS, GRPC_STATUS,
};
pub use problem::{ProblemDetails, APPLICATION_PROBLEM_JSON};
pub use rejection::{DefaultRejection, RejectReason, Rejected, Rejection};
