"""The run folder, its one owner: ``folder`` writes and reads it (config, metrics, ``made_by.jsonl`` pieces, the
trained model), ``checkpoint`` its checkpoints, ``lock`` one writer at a time."""
