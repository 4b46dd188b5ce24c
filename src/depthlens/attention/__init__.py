"""Per-head attention operators: capture, pattern features, resolvent features, nulls, roles."""
