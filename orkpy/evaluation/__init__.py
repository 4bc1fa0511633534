"""Evaluation: perplexity and KL, the end-to-end gate, tables and reports, the fused-FFN sweep,
the synthetic demo model and the test helpers.
"""
