//! PLACEHOLDER: rejection responses (owned by the layer work).
