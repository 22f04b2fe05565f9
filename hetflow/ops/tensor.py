"""tensor ops."""
