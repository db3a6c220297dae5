"""Compute backends behind one contract (see base.py): NumPy reference, C kernels, MLX."""
