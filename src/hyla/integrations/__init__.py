"""hyla inside other libraries' models: ``hyla.integrations.huggingface`` (an ``attn_implementation``)."""
