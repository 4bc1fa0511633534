"""The array API over the C core: quantize / dequantize and the kind registry (quant), packed
weights and their matmul and files (packed), the NPU's int4 x int4 -> int16 matmul contract
(int4: pack_i4, unpack_i4, mm_i4, mm_i4_partials), CPU dispatch (cpu), the NumPy reference
(reference).
"""
