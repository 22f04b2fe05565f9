"""softmax ops."""
