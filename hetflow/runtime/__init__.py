"""Planner, executor and the InferenceSession."""
