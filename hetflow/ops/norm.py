"""norm ops."""
