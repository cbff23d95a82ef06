"""The API registry (support_wrap_ops.yaml) and the interception that uses it."""
