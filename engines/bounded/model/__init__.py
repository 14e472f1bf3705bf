"""The model: an HF model directory read into a decoder that only assembles layers.

config.py (ModelConfig), precision.py (PrecisionPolicy: dtypes and GEMM kind per layer
group), families.py (config.json -> ModelConfig by model_type), weights.py (safetensors),
layers.py (weight-holding modules around the kernels), decoder.py (the one layer loop).
"""
