//! [`Principal`]: a typed value from the request extensions, such as the authenticated user.

use std::fmt;
use std::marker::PhantomData;

use super::{Key, KeyError, KeyExtractor};
use crate::request::RequestView;

/// Keys a request by a value of type `T` from the request extensions, mapped to a [`Key`] by `F`.
///
/// An authentication layer that runs before the rate limiter typically inserts the authenticated
/// principal (a user, a tenant, a verified API client) into the request extensions; this reads it.
/// The mapping may borrow from the value (`Key::string(&user.name)`), so it costs no allocation.
/// A request without a `T` (not authenticated) has no key: a [`KeyError`] naming the type, or use
/// [`KeyExtractor::or`] to fall back to another key (the client's address).
///
/// ```
/// use tollgate::key::{Key, KeyExtractor, Principal};
/// use tollgate::RequestView;
///
/// #[derive(Clone)]
/// struct User {
///     id: u64,
/// }
///
/// let by_user = Principal::new(|user: &User| Key::int(user.id));
///
/// let mut req = http::Request::get("/").body(()).unwrap();
/// req.extensions_mut().insert(User { id: 42 });
/// assert_eq!(by_user.extract(&RequestView::new(&req)).unwrap().to_string(), "int:42");
///
/// let anonymous = http::Request::get("/").body(()).unwrap();
/// assert!(by_user.extract(&RequestView::new(&anonymous)).is_err());
/// ```
///
/// Borrowing a string from the principal, and falling back to a shared key for anonymous callers:
///
/// ```
/// use tollgate::key::{GlobalKey, Key, KeyExtractor, Principal};
/// use tollgate::RequestView;
///
/// #[derive(Clone)]
/// struct Tenant(String);
///
/// let by_tenant = Principal::new(|t: &Tenant| Key::string(t.0.as_str())).or(GlobalKey);
///
/// let mut req = http::Request::get("/").body(()).unwrap();
/// req.extensions_mut().insert(Tenant("acme".to_owned()));
/// assert_eq!(by_tenant.extract(&RequestView::new(&req)).unwrap().to_string(), "b:acme");
///
/// let anonymous = http::Request::get("/").body(()).unwrap();
/// assert_eq!(by_tenant.extract(&RequestView::new(&anonymous)).unwrap().to_string(), "global");
/// ```
pub struct Principal<T, F> {
    map: F,
    _principal: PhantomData<fn() -> T>,
}

impl<T, F> Principal<T, F>
where
    T: Send + Sync + 'static,
    F: for<'r> Fn(&'r T) -> Key<'r> + Send + Sync + 'static,
{
    /// Keys by the `T` in the request extensions, mapped by `map`.
    pub fn new(map: F) -> Self {
        Self {
            map,
            _principal: PhantomData,
        }
    }
}

impl<T, F: Clone> Clone for Principal<T, F> {
    fn clone(&self) -> Self {
        Self {
            map: self.map.clone(),
            _principal: PhantomData,
        }
    }
}

impl<T, F> fmt::Debug for Principal<T, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Principal")
            .field("type", &std::any::type_name::<T>())
            .finish_non_exhaustive()
    }
}

impl<T, F> KeyExtractor for Principal<T, F>
where
    T: Send + Sync + 'static,
    F: for<'r> Fn(&'r T) -> Key<'r> + Send + Sync + 'static,
{
    #[inline]
    fn extract<'r>(&self, req: &RequestView<'r>) -> Result<Key<'r>, KeyError> {
        match req.extensions().get::<T>() {
            Some(principal) => Ok((self.map)(principal)),
            None => Err(KeyError::new(format!(
                "no {} in the request extensions: is the request authenticated?",
                std::any::type_name::<T>()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug)]
    struct User {
        id: u64,
        name: String,
    }

    #[test]
    fn maps_the_extension() {
        let by_id = Principal::new(|u: &User| Key::int(u.id));
        let by_name = Principal::new(|u: &User| Key::string(u.name.as_str()));
        let mut req = http::Request::get("/").body(()).unwrap();
        req.extensions_mut().insert(User {
            id: 7,
            name: "ada".into(),
        });
        let view = RequestView::new(&req);
        assert_eq!(by_id.extract(&view).unwrap(), Key::int(7));
        assert_eq!(by_name.extract(&view).unwrap(), Key::string("ada"));
        assert!(format!("{:?}", by_id.clone()).contains("User"));
    }

    #[test]
    fn missing_extension_is_a_request_error() {
        let by_id = Principal::new(|u: &User| Key::int(u.id));
        let mut req = http::Request::get("/").body(()).unwrap();
        // A value of another type does not count.
        req.extensions_mut().insert(7_u64);
        let err = by_id.extract(&RequestView::new(&req)).unwrap_err();
        assert!(!err.is_misconfiguration());
        assert!(err.reason().contains("User"), "{err}");
    }
}
