"""The paper's reported numbers (Table A1: mean +- s.e. over 3 seeds, in %), for side-by-side reports."""

from __future__ import annotations

from typing import Any

from hyla.tasks import REGISTRY

#: preset -> (fuzzy-logic OOD R^2, SRAVEN OOD accuracy), each (mean, s.e.) in percent
TABLE_A1: dict[str, tuple[tuple[float, float], tuple[float, float]]] = {
    "softmax": ((63.28, 2.31), (56.56, 1.05)),
    "linear": ((59.89, 5.22), (56.30, 1.11)),
    "hyla": ((81.13, 7.77), (69.13, 1.90)),
    "linear_rmshead": ((68.93, 5.10), (59.01, 2.50)),
    "hyla_no_rmshead": ((81.27, 7.88), (62.53, 5.73)),
    "hyla_no_nonlinearity": ((84.54, 5.32), (56.54, 0.21)),
    "hyla_no_nonlinearity_no_rmshead": ((79.42, 7.43), (56.33, 1.41)),
    "hyla_softmax": ((70.98, 7.08), (38.21, 2.98)),
    "hyla_plus": ((87.65, 4.54), (66.59, 0.08)),
}
#: MoE rows of Table A1 (E=5 experts, top-2): preset -> same layout
TABLE_A1_MOE: dict[str, tuple[tuple[float, float], tuple[float, float]]] = {
    "softmax": ((63.83, 6.07), (57.68, 1.31)),
    "linear": ((60.09, 6.16), (64.34, 4.30)),
    "hyla": ((82.37, 6.55), (66.94, 3.94)),
}
#: review discussion: SRAVEN OOD accuracy of HYLA by nonlinearity (Table A1's column NONLINEARITIES_COLUMN)
NONLINEARITIES_COLUMN = 1
NONLINEARITIES_SRAVEN: dict[str, tuple[float, float]] = {
    "hyla_relu": (69.13, 1.90),
    "hyla_silu": (71.04, 1.05),
    "hyla_gelu": (58.92, 1.50),
    "hyla_sigmoid": (56.26, 1.83),
    "hyla_tanh": (54.87, 0.26),
}


def _preset(model: dict[str, Any]) -> str | None:
    """The attention preset (``hyla`` + ``nonlinearity=phi`` read as ``hyla_phi``); None if not standard."""
    preset, phi = model["attention"], model.get("nonlinearity")
    if phi in (None, "relu"):
        return preset
    return f"hyla_{phi}" if preset == "hyla" else None


def _table(config: dict[str, Any]) -> tuple[dict[str, tuple[float, float]], str] | None:
    """The paper table (preset -> OOD (mean, s.e.)) and its name that this configuration belongs to."""
    model = config["model"]
    if model.get("width_multiplier", 1) != 1 or model.get("single_head") or model.get("init", "flax") != "flax":
        return None  # another size, one head, or another initialization than the authors' (flax's): not theirs
    moe = model.get("moe_experts") or 0
    if moe and not (moe == 5 and model.get("moe_top_k") == 2):
        return None
    entry = REGISTRY.get(config["data"]["task"])
    if entry is None or entry.paper_column is None or not entry.in_paper_setting(config):
        return None
    column = entry.paper_column.index
    if moe:
        return {k: v[column] for k, v in TABLE_A1_MOE.items()}, "Table A1, MoE"
    table = {k: v[column] for k, v in TABLE_A1.items()}
    if column == NONLINEARITIES_COLUMN:
        table.update({k: v for k, v in NONLINEARITIES_SRAVEN.items() if k not in table})
    return table, "Table A1"


def paper_reference(config: dict[str, Any]) -> tuple[float, float] | None:
    """The paper's OOD number (mean, s.e. in %) for this configuration when it matches a Table A1
    setting (SRAVEN: default sizes and 20M problems; fuzzy logic: holdout 0.7, N = 32), else None."""
    found, preset = _table(config), _preset(config["model"])
    return found[0].get(preset) if found and preset else None


def paper_row(config: dict[str, Any]) -> str | None:
    """Where ``paper_reference`` comes from, e.g. ``"Table A1: HYLA"``."""
    from hyla.attention.config import PRESET_TITLES

    found, preset = _table(config), _preset(config["model"])
    if not found or preset not in found[0]:
        return None
    if preset in NONLINEARITIES_SRAVEN and preset not in TABLE_A1:
        return f"review discussion: HYLA, {preset.removeprefix('hyla_')}"
    title = PRESET_TITLES.get(preset, preset)
    return f"{found[1]}: {title}" + (" + MoE" if "MoE" in found[1] else "")
