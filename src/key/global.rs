//! [`GlobalKey`]: one key for every request.

use super::{Key, KeyError, KeyExtractor};
use crate::request::RequestView;

/// Counts every request against one shared key: a ceiling for the whole service (or, combined
/// with [`RouteKey`](super::RouteKey), for one endpoint), protecting a backend whatever the
/// number of clients.
///
/// ```
/// use tollgate::key::{GlobalKey, Key, KeyExtractor};
/// use tollgate::RequestView;
///
/// let req = http::Request::get("/").body(()).unwrap();
/// assert_eq!(GlobalKey.extract(&RequestView::new(&req)), Ok(Key::global()));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct GlobalKey;

impl KeyExtractor for GlobalKey {
    #[inline]
    fn extract<'r>(&self, _req: &RequestView<'r>) -> Result<Key<'r>, KeyError> {
        Ok(Key::global())
    }
}
