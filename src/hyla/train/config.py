"""Experiment configuration: typed dataclasses, YAML files in ``hyla/configs/``, ``key.sub=value`` overrides.

An experiment is ``seed`` + ``data`` (the task and its split) + ``model`` (a
``TransformerConfig``; input/output sizes come from the task) + ``train``.
Unknown keys fail with the list of valid keys at that level.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import types
import typing
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hyla.models import TransformerConfig
from hyla.tasks import REGISTRY, task_entry
from hyla.textio import FileFormatError, load_yaml, read_yaml, yaml_error_text
from hyla.train.seeds import default_data_seed

#: ``data.task`` when a config names none
DEFAULT_TASK = "sraven"


class _Unset:
    """A ``data.*`` key the config did not give: ``data_config_class`` fills it from the task's options."""

    def __repr__(self) -> str:
        return "<unset>"


_UNSET: Any = _Unset()
_DATA_CLASSES: dict[tuple[tuple[str, type], ...], type] = {}


def data_config_class() -> type:
    """``DataConfig``, the ``data`` section of the registered tasks (``hyla.tasks.REGISTRY``, rebuilt
    when a task registers): ``task``, ``split_seed``, then every registered task's options.

    A key the config leaves out takes the default of ``data.task``'s own options dataclass, so each task
    keeps its defaults; a key of another task (which the run never reads) takes the default of the first
    registered task that has it, so that it stays the same in every record and checkpoint."""
    key = tuple((name, entry.options) for name, entry in REGISTRY.items())
    if key not in _DATA_CLASSES:
        _DATA_CLASSES[key] = _make_data_config_class()
    return _DATA_CLASSES[key]


def _make_data_config_class() -> type:
    types_: dict[str, Any] = {}
    other_task_values: dict[str, Any] = {}
    for name, entry in REGISTRY.items():
        hints = typing.get_type_hints(entry.options)
        for option, default in dataclasses.asdict(entry.options()).items():
            if option in types_ and types_[option] != hints[option]:
                raise TypeError(f"data.{option}: task {name} gives it another type than an earlier task")
            types_.setdefault(option, hints[option])
            other_task_values.setdefault(option, default)

    def __post_init__(self: Any) -> None:
        own = dataclasses.asdict(task_entry(self.task).options())  # an unknown data.task fails here
        for option, value in other_task_values.items():
            if getattr(self, option) is _UNSET:
                setattr(self, option, own.get(option, value))

    # split_seed None: the held-out split follows the run's seed (the paper's code)
    specs: list[Any] = [("task", str, field(default=DEFAULT_TASK)), ("split_seed", int | None, field(default=0))]
    specs += [(option, t, field(default=_UNSET)) for option, t in types_.items()]
    cls = dataclasses.make_dataclass("DataConfig", specs, namespace={"__post_init__": __post_init__})
    cls.__module__, cls.__doc__ = __name__, data_config_class.__doc__
    return cls


def __getattr__(name: str) -> Any:
    if name == "DataConfig":  # the class of the tasks registered now
        return data_config_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def task_options(data: Any) -> Any:
    """The options dataclass of ``data.task``, filled from the ``data`` section."""
    options = task_entry(data.task).options
    return options(**{f.name: getattr(data, f.name) for f in dataclasses.fields(options)})


@dataclass
class TrainConfig:
    steps: int = 1000
    batch_size: int = 128  # global batch (split over DDP processes)
    lr: float = 1e-3
    weight_decay: float = 0.1  # applied to the parameters that weight_decay_mask names
    weight_decay_mask: str = "ndim"  # ndim: >= 2-D parameters | authors: the paper's code (hyla.train.engines.optim)
    warmup_steps: int = 100  # linear warmup from 0
    final_lr_fraction: float = 0.1  # cosine decay to this fraction of lr
    cosine_end: str = "steps"  # steps | steps_minus_warmup (the paper's code): where the floor is reached
    eval_every: int = 500
    eval_size: int = 51_200  # problems per split at each evaluation (the paper: 51,200)
    eval_batch_size: int = 1024
    eval_seed: int = 1234  # evaluation problems are the same for every run and every evaluation
    log_every: int = 50
    checkpoint_every: int = 1000
    data_seed: int | None = None  # training stream; default derived from `seed`
    # a fresh run starts from these weights (safetensors of the model's state dict) instead of its initial draw;
    # every random stream (data, dropout) stays the one `seed` gives. E.g. another code's initial draw
    init_weights: str | None = None
    moe_aux_weight: float = 0.01  # MoE load-balancing loss weight (the paper has none: 0 in its configs)
    grad_accum_steps: int = 1  # micro-batches per update (the batch is split, the update is the same)
    bf16: bool = False
    compile: bool = False
    compile_mode: str = "default"  # torch.compile mode; "reduce-overhead" captures CUDA graphs
    tf32: bool = True  # TF32 matmuls on CUDA (no effect on CPU)
    fast: bool = False  # compile (CUDA graphs on CUDA) for launch-bound steps; see hyla.train.engines.fast
    graph_step: bool = False  # CUDA, one process: the whole step (sampling ... AdamW) as one CUDA graph
    # stacked runs: "vmap" (one call, R x wider), "loop" (run by run); auto: vmap on CUDA, loop elsewhere
    stack_forward: str = "auto"


STACK_FORWARDS = ("auto", "vmap", "loop")
#: retired ``train.stack_forward`` values still read (as ``loop``) so that older run configs load
RETIRED_STACK_FORWARDS = ("threads",)
#: ``train.weight_decay_mask`` values (hyla.train.engines.optim.decayed_parameter_names says what each decays)
WEIGHT_DECAY_MASKS: tuple[str, ...] = ("ndim", "authors")
#: ``train.cosine_end`` values: the step at which the cosine reaches its floor (hyla.train.engines.optim.lr_at)
COSINE_ENDS: tuple[str, ...] = ("steps", "steps_minus_warmup")
#: ``model.*`` sizes that must be >= 1 (``input_dim`` and ``vocab_size`` also when the task leaves them unset)
MODEL_SIZES: tuple[str, ...] = (
    "output_dim",
    "input_dim",
    "vocab_size",
    "emb_dim",
    "num_layers",
    "num_heads",
    "qk_dim",
    "v_dim",
    "mlp_dim",
)
#: config keys that may change between an interrupted run and its resumption
RESUMABLE_CHANGES = (
    "train.steps",
    "train.eval_every",
    "train.log_every",
    "train.checkpoint_every",
    # how a step is computed, not what: a run started on a CPU may continue on a GPU with train.fast=true
    "train.stack_forward",
    "train.graph_step",
    "train.fast",
    "train.compile",
    "train.compile_mode",
    "train.tf32",
    "model.attention_backend",
)
#: what ``--device`` may name: a device type, or a CUDA device by its index
DEVICES = "cpu, cuda, cuda:N (N a GPU index), mps"


def check_device_name(device: str) -> None:
    """Refuse a ``--device`` that names no device this suite trains on (``tpu``), naming the allowed values."""
    kind, _, index = device.partition(":")
    if device in ("cpu", "cuda", "mps") or (kind == "cuda" and index.isdigit()):
        return
    raise ValueError(f"--device {device!r} is not valid; allowed values: {DEVICES}")


@dataclass
class ExperimentConfig:
    name: str = "experiment"
    seed: int = 0  # model initialization (and the data stream unless train.data_seed)
    # its class depends on the registered tasks: read at parse time (metadata "type")
    data: Any = field(default_factory=lambda: data_config_class()(), metadata={"type": data_config_class})
    model: TransformerConfig = field(default_factory=TransformerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    @property
    def split_seed(self) -> int:
        """The seed of the held-out split: ``data.split_seed``, or the run's ``seed`` when that is None."""
        return self.seed if self.data.split_seed is None else self.data.split_seed

    @property
    def data_seed(self) -> int:
        """The training stream's seed: ``train.data_seed``, else derived from ``seed`` (``hyla.train.seeds``)."""
        return self.train.data_seed if self.train.data_seed is not None else default_data_seed(self.seed)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self) -> None:
        t = self.train
        for name in (
            "steps",
            "batch_size",
            "eval_every",
            "eval_size",
            "eval_batch_size",
            "log_every",
            "checkpoint_every",
        ):
            if getattr(t, name) < 1:
                raise ValueError(f"train.{name} must be >= 1, got {getattr(t, name)}")
        for name in ("warmup_steps", "weight_decay", "moe_aux_weight"):  # `not >=`: a NaN fails too
            if not getattr(t, name) >= 0:
                raise ValueError(f"train.{name} must be >= 0, got {getattr(t, name)}")
        if not t.lr > 0:
            raise ValueError(f"train.lr must be > 0, got {t.lr}")
        if t.compile_mode not in ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"):
            raise ValueError(
                f"train.compile_mode={t.compile_mode!r} is not valid; allowed values: default, reduce-overhead, "
                "max-autotune, max-autotune-no-cudagraphs"
            )
        if t.stack_forward not in STACK_FORWARDS + RETIRED_STACK_FORWARDS:
            raise ValueError(
                f"train.stack_forward={t.stack_forward!r} is not valid; allowed values: {', '.join(STACK_FORWARDS)}"
            )
        if not 0 <= t.final_lr_fraction <= 1:
            raise ValueError(f"train.final_lr_fraction must be in [0, 1], got {t.final_lr_fraction}")
        for key, value, allowed in (
            ("train.weight_decay_mask", t.weight_decay_mask, WEIGHT_DECAY_MASKS),
            ("train.cosine_end", t.cosine_end, COSINE_ENDS),
        ):
            if value not in allowed:
                raise ValueError(f"{key}={value!r} is not valid; allowed values: {', '.join(allowed)}")
        options = task_options(self.data)  # an unknown data.task fails here, naming the allowed ones
        if hasattr(options, "validate"):
            options.validate()
        if t.grad_accum_steps < 1 or t.batch_size % t.grad_accum_steps:
            raise ValueError(
                f"train.grad_accum_steps={t.grad_accum_steps} must be >= 1 and divide train.batch_size={t.batch_size}"
            )
        model = self.model
        for name in MODEL_SIZES:  # None: the task sets it
            value = getattr(model, name)
            if value is not None and value < 1:
                raise ValueError(f"model.{name} must be >= 1, got {value}")
        if not 0 <= model.attention_dropout < 1:
            raise ValueError(f"model.attention_dropout must be in [0, 1), got {model.attention_dropout}")
        if model.input_dim is None and model.vocab_size is None:  # the task sets its sizes: check the rest now
            tokens = task_entry(self.data.task).task.token_inputs
            sizes = {"vocab_size": 2, "output_dim": 2} if tokens else {"input_dim": 1}
            model = dataclasses.replace(model, **sizes)
        model.validate()


# ---------------------------------------------------------------------------------------- parsing
def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: f.metadata["type"]() if "type" in f.metadata else hints[f.name] for f in dataclasses.fields(cls)}


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if value is None:
            return None
        return _coerce(value, args[0], key)
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, dict):
            raise ValueError(f"{key} must be a mapping of its fields, got {value!r}")
        return _build(annotation, value, key + ".")
    if annotation is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{key} must be true or false, got {value!r}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
            raise ValueError(f"{key} must be an integer, got {value!r}")
        return int(value)
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{key} must be a number, got {value!r}")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ValueError(f"{key} must be a string, got {value!r}")
        return value
    return value


def _build(cls: type, values: dict[str, Any], prefix: str = "") -> Any:
    types_ = _field_types(cls)
    unknown = sorted(set(values) - set(types_))
    if unknown:
        close = difflib.get_close_matches(unknown[0], types_, n=1)
        hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
        raise ValueError(
            f"unknown config key {prefix}{unknown[0]}{hint}; valid keys at {prefix.rstrip('.') or 'top level'}: "
            f"{', '.join(types_)}"
        )
    kwargs = {name: _coerce(v, types_[name], prefix + name) for name, v in values.items()}
    return cls(**kwargs)


def set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    """Set ``tree``'s entry at the dotted ``key`` (``train.steps``), making the sections on the way."""
    parts = key.split(".")
    node = tree
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ValueError(f"cannot set {key}: {p} is not a section")
    node[parts[-1]] = value


def parse_override_value(item: str, raw: str) -> Any:
    """The value of override ``item`` (``key=raw``) read as YAML: ``3``, ``true``, ``[1, 2]``, ``null``."""
    if raw == "":
        return ""
    try:
        return load_yaml(raw)
    except yaml.YAMLError as err:
        raise ValueError(
            f"override {item!r}: its value is not valid YAML, {yaml_error_text(err)}; quote it to pass a string"
        ) from err


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """``["model.attention=hyla", "train.lr=3e-4"]`` -> nested dict (values parsed as YAML scalars)."""
    tree: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like key.sub=value")
        key, raw = item.split("=", 1)
        if not all(part.strip() for part in key.split(".")):
            raise ValueError(f"override {item!r} has an empty key name; write key.sub=value, e.g. train.lr=0.001")
        value = parse_override_value(item, raw)
        if isinstance(value, str):  # YAML reads 3e-4 as a string; accept plain numbers too
            with contextlib.suppress(ValueError):
                value = float(value) if any(c in value for c in ".eE") else int(value)
        set_dotted(tree, key.strip(), value)
    return tree


def _merge(base: dict[str, Any], extra: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``extra`` laid over ``base``, section by section. A section (a mapping) replaced by a value, or a value
    by a section, is an error naming the key: ``train: 5`` over a base's ``train: {...}`` would silently drop
    the base's section (and an override ``train.lr=...`` then starts a new one)."""
    out = dict(base)
    for k, v in extra.items():
        if k in out and isinstance(out[k], dict) and not isinstance(v, dict):
            first = next(iter(out[k]), "key")
            raise ValueError(
                f"{prefix}{k} is a section (keys like {prefix}{k}.{first}), got the value {v!r}; give its keys as a "
                f"mapping, e.g. {k}: {{{first}: ...}}"
            )
        if k in out and isinstance(v, dict) and not isinstance(out[k], dict) and out[k] is not None:
            raise ValueError(f"{prefix}{k} is a value ({out[k]!r}), not a section; got the mapping {v!r}")
        out[k] = _merge(out[k], v, f"{prefix}{k}.") if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def config_from_dict(values: dict[str, Any]) -> ExperimentConfig:
    cfg = _build(ExperimentConfig, values)
    cfg.validate()
    return cfg


#: the paper configs, shipped inside the package (``hyla/configs/``) so that an installed wheel has them
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def packaged_yaml(name_or_path: str, folder: Path, what: str) -> Path:
    """A YAML file: ``name_or_path`` itself if it is a file (a user's own file wins), else the packaged
    ``folder/NAME.yaml``; an unknown name fails listing the packaged names."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    name = name_or_path.replace("-", "_")  # one spelling everywhere: `hyla data fuzzy-logic` is `fuzzy_logic` here
    candidate = folder / (name if name.endswith(".yaml") else name + ".yaml")
    if candidate.is_file():
        return candidate
    available = sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []
    raise ValueError(f"{what} {name_or_path!r} not found; give a YAML path or one of: {', '.join(available)}")


def resolve_config_path(name_or_path: str) -> Path:
    """A YAML path, or the name of a packaged config in ``hyla/configs/`` (``sraven``, ``fuzzy_logic``)."""
    return packaged_yaml(name_or_path, CONFIG_DIR, "config")


def read_config_values(name_or_path: str, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The YAML mapping of a config; a top-level ``base: other.yaml`` is read first and overlaid."""
    path = resolve_config_path(name_or_path).resolve()
    if path in _seen:
        raise ValueError(f"config {path} includes itself through 'base'")
    values = read_yaml(path) or {}
    if not isinstance(values, dict):
        raise FileFormatError(f"{path}: the top level of a config must be a mapping of sections like train: {{...}}")
    for key, annotation in _field_types(ExperimentConfig).items():
        if key in values and dataclasses.is_dataclass(annotation) and not isinstance(values[key], dict):
            raise FileFormatError(
                f"{path}: {key} is a section, got the value {values[key]!r}; give its keys as a mapping, e.g. "
                f"{key}: {{{dataclasses.fields(annotation)[0].name}: ...}}"
            )
    base = values.pop("base", None)
    if base is None:
        return values
    if not isinstance(base, str):
        raise FileFormatError(f"{path}: base must name a config file (e.g. base: fuzzy_logic.yaml), got {base!r}")
    base_path = path.parent / base if (path.parent / base).is_file() else base
    base_values = read_config_values(str(base_path), (*_seen, path))
    try:
        return _merge(base_values, values)
    except ValueError as err:  # a section replaced by a value: this file's doing, not its base's
        raise FileFormatError(f"{path}: {err}") from err


def config_with_overrides(values: dict[str, Any], overrides: list[str] | None = None) -> ExperimentConfig:
    """A config from a mapping (a YAML file's, a checkpoint's) with ``KEY=VALUE`` overrides laid over it."""
    tree = parse_overrides(overrides or [])
    try:
        merged = _merge(values, tree)
    except ValueError as err:  # e.g. a key set inside a value: the overrides' doing
        raise ValueError(f"overrides: {err}") from err
    return config_from_dict(merged)


def load_config(name_or_path: str, overrides: list[str] | None = None) -> ExperimentConfig:
    return config_with_overrides(read_config_values(name_or_path), overrides)


def dump_config(cfg: ExperimentConfig) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)


def flat_config(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config mapping as dotted keys: ``{"model": {"attention": "hyla"}}`` as ``{"model.attention": ...}``."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        flat.update(flat_config(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return flat


def config_key(flat: dict[str, Any], ignore: Collection[str]) -> str:
    """One string per flat config but the keys ``ignore``: configs that differ only there share it (runs
    that stack, seeds of one setting in a report)."""
    return json.dumps({k: v for k, v in sorted(flat.items()) if k not in ignore})
