//! `tollgate::outbound`, the client-side layer, through real servers on 127.0.0.1: hyper-util's
//! client and a tonic `Channel`.

mod outbound;
mod outbound_grpc;
