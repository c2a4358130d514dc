"""What trains R runs' parameters, step by step: ``base`` the engine both share (setup, the micro-batch loop, the
captured step, a run's checkpoint), ``lone`` one run (DDP, compile, ``torch.optim.AdamW``), ``stacked`` R runs
as rows of one parameter tensor, ``optim`` AdamW for one or R runs and the schedule, ``fast`` compile modes and
CUDA graphs, ``vmap_rules`` the C ops' batching rules that a vmap stack needs."""
