"""Ops below both the attention and the models: the C library of the CPU kernels (``clib``), the tanh GELU
it computes (``gelu``), and the mixture of experts' feed-forward, dense or routed (``moe``)."""
