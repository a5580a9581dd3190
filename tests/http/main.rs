//! The layer in the servers people run it in, over real connections on 127.0.0.1: axum, plain
//! hyper, tonic, stacks with tower-http, key extractors and clients behind proxies.

#[path = "../harness/mod.rs"]
mod harness;

mod grpc_tonic;
mod http_axum;
mod http_hyper;
mod http_proxy;
mod key_extractors;
mod stacks;
