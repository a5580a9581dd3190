//! [`CostTable`]: costs by method and route, with a default.

use std::collections::HashMap;
use std::fmt;

use http::Method;

use super::Cost;
use crate::key::matched_route;
use crate::request::RequestView;

/// Costs looked up by method and/or route, with a default for everything else.
///
/// The route is the template the router matched (`/users/{id}`, axum's `MatchedPath` with the
/// `axum` feature) or, when there is none, the request's URI path (without the query). Write
/// routes exactly as they are declared in the router: with axum, `/users/{id}` matches every user,
/// while `/users/42` would only ever match if no router ran.
///
/// The most specific entry wins: method and route, then route, then method, then the default.
/// A later entry for the same method and route replaces an earlier one. [`Cost::max_cost`] is the
/// largest cost in the table, so a limit too small for the most expensive route is caught when the
/// layer is built.
///
/// ```
/// use http::Method;
/// use tollgate::cost::{Cost, CostTable};
/// use tollgate::RequestView;
///
/// let costs = CostTable::new(1)
///     .route("/search", 5)
///     .method(Method::POST, 2)
///     .method_route(Method::POST, "/upload", 10);
///
/// let cost = |method: Method, uri: &str| {
///     let req = http::Request::builder().method(method).uri(uri).body(()).unwrap();
///     costs.cost(&RequestView::new(&req))
/// };
/// assert_eq!(cost(Method::GET, "/search?q=x"), 5);
/// assert_eq!(cost(Method::POST, "/search"), 5); // the route is more specific than the method
/// assert_eq!(cost(Method::POST, "/upload"), 10);
/// assert_eq!(cost(Method::POST, "/items"), 2);
/// assert_eq!(cost(Method::GET, "/items"), 1);
/// assert_eq!(costs.max_cost(), Some(10));
/// ```
///
/// By gRPC method: the route of a gRPC call is its method path, `/package.Service/Method`
/// (a layer on a tonic `Server` runs before tonic's router, so the URI path is what it sees):
///
/// ```
/// use tollgate::cost::{Cost, CostTable};
/// use tollgate::RequestView;
///
/// let costs = CostTable::new(1).route("/shop.Catalog/Export", 20).route("/shop.Catalog/Search", 5);
/// let call = |method: &str| {
///     let req = http::Request::post(method).header("content-type", "application/grpc").body(()).unwrap();
///     costs.cost(&RequestView::new(&req))
/// };
/// assert_eq!(call("/shop.Catalog/Export"), 20);
/// assert_eq!(call("/shop.Catalog/Search"), 5);
/// assert_eq!(call("/shop.Catalog/Get"), 1);
/// ```
///
/// By method only, e.g. writes cost more than reads:
///
/// ```
/// use http::Method;
/// use tollgate::cost::{Cost, CostTable};
/// use tollgate::RequestView;
///
/// let costs = CostTable::new(1).method(Method::PUT, 3).method(Method::DELETE, 3);
/// let req = http::Request::delete("/items/7").body(()).unwrap();
/// assert_eq!(costs.cost(&RequestView::new(&req)), 3);
/// ```
#[derive(Clone)]
pub struct CostTable {
    default: u64,
    routes: HashMap<Box<str>, RouteCosts, foldhash::fast::RandomState>,
    methods: Vec<(Method, u64)>,
}

#[derive(Debug, Clone, Default)]
struct RouteCosts {
    any_method: Option<u64>,
    methods: Vec<(Method, u64)>,
}

fn find(entries: &[(Method, u64)], method: &Method) -> Option<u64> {
    entries.iter().find(|(m, _)| m == method).map(|&(_, c)| c)
}

fn set(entries: &mut Vec<(Method, u64)>, method: Method, cost: u64) {
    match entries.iter_mut().find(|(m, _)| *m == method) {
        Some(entry) => entry.1 = cost,
        None => entries.push((method, cost)),
    }
}

impl CostTable {
    /// A table where requests without a matching entry cost `default`.
    pub fn new(default: u64) -> Self {
        Self {
            default,
            routes: HashMap::default(),
            methods: Vec::new(),
        }
    }

    /// Requests to `route`, whatever their method, cost `cost`.
    #[must_use]
    pub fn route(mut self, route: impl Into<String>, cost: u64) -> Self {
        self.route_entry(route).any_method = Some(cost);
        self
    }

    /// Requests with `method`, whatever their route, cost `cost`.
    #[must_use]
    pub fn method(mut self, method: Method, cost: u64) -> Self {
        set(&mut self.methods, method, cost);
        self
    }

    /// Requests with `method` to `route` cost `cost`.
    #[must_use]
    pub fn method_route(mut self, method: Method, route: impl Into<String>, cost: u64) -> Self {
        set(&mut self.route_entry(route).methods, method, cost);
        self
    }

    fn route_entry(&mut self, route: impl Into<String>) -> &mut RouteCosts {
        self.routes
            .entry(route.into().into_boxed_str())
            .or_default()
    }

    /// The cost of requests without a matching entry.
    pub fn default_cost(&self) -> u64 {
        self.default
    }
}

impl Cost for CostTable {
    fn cost(&self, req: &RequestView<'_>) -> u64 {
        let method = req.method();
        if !self.routes.is_empty() {
            let route = matched_route(req).unwrap_or_else(|| req.uri().path());
            if let Some(costs) = self.routes.get(route)
                && let Some(cost) = find(&costs.methods, method).or(costs.any_method)
            {
                return cost;
            }
        }
        find(&self.methods, method).unwrap_or(self.default)
    }

    fn max_cost(&self) -> Option<u64> {
        let routes = self.routes.values().flat_map(|r| {
            r.any_method
                .into_iter()
                .chain(r.methods.iter().map(|e| e.1))
        });
        let methods = self.methods.iter().map(|e| e.1);
        routes.chain(methods).chain([self.default]).max()
    }
}

impl fmt::Debug for CostTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut routes: Vec<_> = self.routes.iter().collect();
        routes.sort_by(|a, b| a.0.cmp(b.0));
        f.debug_struct("CostTable")
            .field("default", &self.default)
            .field("methods", &self.methods)
            .field("routes", &routes)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(table: &CostTable, method: Method, uri: &str) -> u64 {
        let req = http::Request::builder()
            .method(method)
            .uri(uri)
            .body(())
            .unwrap();
        table.cost(&RequestView::new(&req))
    }

    #[test]
    fn most_specific_entry_wins() {
        let t = CostTable::new(1)
            .route("/a", 5)
            .method(Method::POST, 2)
            .method_route(Method::POST, "/a", 9)
            .method_route(Method::PUT, "/b", 7);
        assert_eq!(cost(&t, Method::POST, "/a"), 9);
        assert_eq!(cost(&t, Method::GET, "/a"), 5);
        assert_eq!(cost(&t, Method::POST, "/b"), 2); // /b has only a PUT entry
        assert_eq!(cost(&t, Method::PUT, "/b"), 7);
        assert_eq!(cost(&t, Method::GET, "/b"), 1);
        assert_eq!(cost(&t, Method::GET, "/a/"), 1); // exact match only
        assert_eq!(cost(&t, Method::GET, "/a?x=1"), 5); // the query is not part of the route
    }

    #[test]
    fn later_entries_replace_earlier_ones() {
        let t = CostTable::new(1)
            .route("/a", 5)
            .route("/a", 6)
            .method(Method::GET, 3)
            .method(Method::GET, 4);
        assert_eq!(cost(&t, Method::GET, "/a"), 6);
        assert_eq!(cost(&t, Method::GET, "/z"), 4);
        assert_eq!(t.max_cost(), Some(6));
    }

    #[test]
    fn max_cost_covers_every_entry_and_the_default() {
        assert_eq!(CostTable::new(3).max_cost(), Some(3));
        assert_eq!(CostTable::new(30).route("/a", 5).max_cost(), Some(30));
        assert_eq!(
            CostTable::new(1)
                .method(Method::GET, 4)
                .method_route(Method::POST, "/x", 12)
                .route("/y", 8)
                .max_cost(),
            Some(12)
        );
        assert_eq!(CostTable::new(0).max_cost(), Some(0));
    }

    #[test]
    fn zero_and_huge_costs_pass_through() {
        let t = CostTable::new(0).route("/big", u64::MAX);
        assert_eq!(cost(&t, Method::GET, "/"), 0);
        assert_eq!(cost(&t, Method::GET, "/big"), u64::MAX);
        assert!(format!("{t:?}").contains("/big"));
    }

    #[cfg(feature = "axum")]
    #[tokio::test]
    async fn uses_axum_matched_route() {
        use axum::{body::Body, extract::Request, routing::get, Router};
        use tower::ServiceExt;

        let table = CostTable::new(1)
            .route("/users/{id}", 4)
            .route("/users/42", 99);
        let app = Router::new().route(
            "/users/{id}",
            get(move |req: Request| async move { table.cost(&RequestView::new(&req)).to_string() }),
        );
        let res = app
            .oneshot(http::Request::get("/users/42").body(Body::empty()).unwrap())
            .await
            .unwrap();
        let body = axum::body::to_bytes(res.into_body(), 64).await.unwrap();
        assert_eq!(&body[..], b"4");
    }
}
