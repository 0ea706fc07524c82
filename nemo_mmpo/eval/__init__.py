"""Evaluation and analysis: metrics, the verifier pool, generation and reports."""
