"""Ops below both the attention and the models: the C library of the CPU kernels (``clib``) and the tanh GELU
it computes (``gelu``)."""
