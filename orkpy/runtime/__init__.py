"""The runtime: the model and its forward pass, activation modes, source transforms (rotations,
smoothing), the tokenizer, generation and the NPU.
"""
