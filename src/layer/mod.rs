//! PLACEHOLDER: the layer, service and future (owned by the layer work).
