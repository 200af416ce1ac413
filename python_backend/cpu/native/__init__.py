"""Native CPU kernels, compiled on first use with the machine's C compiler (see attention_kernel.py)."""
