//! PLACEHOLDER: response headers (owned by the layer work).
