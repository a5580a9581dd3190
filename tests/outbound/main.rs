//! `tollgate::outbound`, the client-side layer, through real servers on 127.0.0.1: hyper-util's
//! client, a tonic `Channel` and (feature `reqwest`) a `reqwest-middleware` client.

mod outbound;
mod outbound_grpc;
#[cfg(feature = "reqwest")]
mod outbound_reqwest;
