"""The array API over the C core: quantize / dequantize and the kind registry (quant), packed
weights and their matmul and files (packed), CPU dispatch (cpu), the NumPy reference (reference).
"""
