//! PLACEHOLDER: the in-memory store.
use super::*;
/// PLACEHOLDER.
#[derive(Debug, Default)]
pub struct MemoryBackend;
/// PLACEHOLDER.
#[derive(Debug)]
pub struct MemoryStore;
impl Backend for MemoryBackend {
    type Store = MemoryStore;
    fn build(self, _: &[LimitSpec]) -> Result<MemoryStore, ConfigError> {
        todo!()
    }
}
impl Store for MemoryStore {
    type Future = std::future::Pending<Result<Decisions, StoreError>>;
    fn check(&self, _: &[LimitCheck<'_>]) -> Checked<Self::Future> {
        todo!()
    }
}
