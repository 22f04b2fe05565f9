"""gemm ops."""
