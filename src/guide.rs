//! Guides by topic: the prose that does not belong to one type.
//!
//! Each guide is a page of `docs/guide/` in the repository, shown here as a module with no
//! items. Their Rust code blocks are compiled and run by `cargo test --all-features`, so every
//! snippet builds against the current API and asserts what it claims.
//!
//! | guide | read it to |
//! |---|---|
//! | [`getting_started`] | add a limit to an axum app, see the headers and the 429, add a second limit |
//! | [`algorithms`] | choose between the six algorithms, and see them side by side |
//! | [`keys`] | count per client IP (directly or behind proxies), API key, user, route, or for everybody |
//! | [`headers`] | read `X-RateLimit-*`, `Retry-After`, the IETF fields and the 429 body |
//! | [`plans`] | give API keys plans, load limits from a TOML file, reload it, try a limit in shadow |
//! | [`redis`] | share limits between instances through Redis or a Redis Cluster |
//! | [`hybrid`] | decide most requests locally while Redis keeps the shared budget |
//! | [`grpc`] | limit a tonic server |
//! | [`shaping`] | make requests wait for their turn instead of refusing them |
//! | [`concurrency`] | cap the requests in flight per key |
//! | [`load_shedding`] | choose between rate limits, concurrency limits and shedding; shed by priority beyond a learned limit |
//! | [`outbound`] | keep a client to the limits of the APIs it calls |
//! | [`operations`] | export metrics, alert, and choose failure policies for production |
//! | [`testing_your_app`] | test an app's limits without sleeping, with a manual clock |
//! | [`tower_governor`] | move from tower_governor: quotas, key extractors, responses |
//! | [`performance`] | know what a decision costs, and where the figures come from |
//! | [`versioning`] | know what a release may change; the MSRV; feature flags |
//!
//! The pages read the same on GitHub: their links to one another are relative `.md` links,
//! written as reference links (`[Keys][keys.md]` with `[keys.md]: keys.md` at the end of the
//! page). Here each guide is preceded by definitions of the same labels that point to these
//! modules, and take precedence because the first definition of a label wins.

// The link definitions every guide gets in rustdoc, ahead of its own (the first definition of
// a label wins, in CommonMark and in rustdoc): the guides' relative `.md` links become links to
// the guide modules, links to other files of the repository go to the packaged sources on
// docs.rs, and links to the API (docs.rs URLs on GitHub) become intra-doc links, or relative
// paths for modules behind a feature, so that docs built without it have no broken link. `structure_tests::every_guide_link_works_on_github_and_in_rustdoc` checks them.
macro_rules! guide_links {
    () => {
        "[getting-started.md]: crate::guide::getting_started
[algorithms.md]: crate::guide::algorithms
[algorithms.md#see-them-the-simulator]: crate::guide::algorithms#see-them-the-simulator
[keys.md]: crate::guide::keys
[keys.md#behind-proxies-clientip]: crate::guide::keys#behind-proxies-clientip
[keys.md#no-key-missingkey]: crate::guide::keys#no-key-missingkey
[headers.md]: crate::guide::headers
[headers.md#several-limits]: crate::guide::headers#several-limits
[plans.md]: crate::guide::plans
[plans.md#shadow-limits]: crate::guide::plans#shadow-limits
[redis.md]: crate::guide::redis
[redis.md#when-redis-fails]: crate::guide::redis#when-redis-fails
[redis.md#memory-eviction-and-maxmemory-policy]: crate::guide::redis#memory-eviction-and-maxmemory-policy
[hybrid.md]: crate::guide::hybrid
[grpc.md]: crate::guide::grpc
[shaping.md]: crate::guide::shaping
[concurrency.md]: crate::guide::concurrency
[load-shedding.md]: crate::guide::load_shedding
[outbound.md]: crate::guide::outbound
[operations.md]: crate::guide::operations
[testing-your-app.md]: crate::guide::testing_your_app
[tower-governor.md]: crate::guide::tower_governor
[performance.md]: crate::guide::performance
[versioning.md]: crate::guide::versioning
[RELIABILITY.md]: https://docs.rs/crate/tollgate/latest/source/RELIABILITY.md
[BENCHMARKS.md]: https://docs.rs/crate/tollgate/latest/source/BENCHMARKS.md
[CHANGELOG.md]: https://docs.rs/crate/tollgate/latest/source/CHANGELOG.md
[testing.md]: https://docs.rs/crate/tollgate/latest/source/docs/testing.md
[examples/plans.toml]: https://docs.rs/crate/tollgate/latest/source/examples/plans.toml
[edge.svg]: https://docs.rs/crate/tollgate/latest/source/docs/simulator/edge.svg
[burst.svg]: https://docs.rs/crate/tollgate/latest/source/docs/simulator/burst.svg
[replay-example.log]: https://docs.rs/crate/tollgate/latest/source/docs/simulator/replay-example.log
[tollgate::key]: crate::key
[ClientIp]: crate::key::ClientIp
[tollgate::metrics]: mod@crate::metrics
[tollgate::concurrency]: crate::concurrency
[tollgate::load_shed]: crate::load_shed
[tollgate::store::redis]: ../../store/redis/index.html
[tollgate::store::hybrid]: ../../store/hybrid/index.html

"
    };
}

#[doc = guide_links!()]
#[doc = include_str!("../docs/guide/getting-started.md")]
pub mod getting_started {}

#[doc = guide_links!()]
#[doc = include_str!("../docs/guide/algorithms.md")]
pub mod algorithms {}

#[doc = guide_links!()]
#[doc = include_str!("../docs/guide/keys.md")]
pub mod keys {}

#[doc = guide_links!()]
#[doc = include_str!("../docs/guide/headers.md")]
pub mod headers {}

#[doc = guide_links!()]
#[doc = include_str!("../docs/guide/plans.md")]
pub mod plans {}

#[doc = guide_links!()]
#[doc = include_str!("../docs/guide/redis.md")]
pub mod redis {}

#[doc = guide_links!()]
#[doc = include_str!("../docs/guide/hybrid.md")]
pub mod hybrid {}

#[doc = guide_links!()]
#[doc = include_str!("../docs/guide/grpc.md")]
pub mod grpc {}

#[doc = guide_links!()]
#[doc = include_str!("../docs/guide/shaping.md")]
pub mod shaping {}

#[doc = guide_links!()]
#[doc = include_str!("../docs/guide/concurrency.md")]
pub mod concurrency {}

#[doc = guide_links!()]
#[doc = include_str!("../docs/guide/load-shedding.md")]
pub mod load_shedding {}

#[doc = guide_links!()]
#[doc = include_str!("../docs/guide/outbound.md")]
pub mod outbound {}

#[doc = guide_links!()]
#[doc = include_str!("../docs/guide/operations.md")]
pub mod operations {}

#[doc = guide_links!()]
#[doc = include_str!("../docs/guide/testing-your-app.md")]
pub mod testing_your_app {}

#[doc = guide_links!()]
#[doc = include_str!("../docs/guide/tower-governor.md")]
pub mod tower_governor {}

#[doc = guide_links!()]
#[doc = include_str!("../docs/guide/performance.md")]
pub mod performance {}

#[doc = guide_links!()]
#[doc = include_str!("../docs/guide/versioning.md")]
pub mod versioning {}
