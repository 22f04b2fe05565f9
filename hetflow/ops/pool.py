"""pool ops."""
