"""Quantization and calibration: the recipe and the pipeline's stages (source -> transform ->
calibrate -> allocate -> round -> pack -> write) and the methods they use (imatrix, rotations,
AWQ, GPTQ, target-size allocation).
"""
