"""The import graph of ``src/hyla``: layered, no upward imports, no import loops (lazy imports included)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
#: sub-package -> layer; a module may import only its own layer or lower ones. Top-level modules (cli,
#: sweep, export, demo, __main__) form the last layer. The package's ``__init__`` re-exports attention (so
#: importing ``hyla`` is layer 0) and offers ``hyla.load``, which imports the trainer's loader lazily.
LAYERS = {
    "runtime": 0,
    "cpu": 0,
    "textio": 0,
    "ops": 0,
    "attention": 0,
    "tasks": 0,
    "models": 1,
    "train": 2,
    "analysis": 3,
    "bench": 3,
    "text": 3,
}
TOP = 4


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str, importer: bool = False) -> int:
    parts = module.split(".")
    if module == "hyla":
        return TOP if importer else 0
    return LAYERS.get(parts[1], TOP) if len(parts) > 1 else TOP


def imports(path: Path, modules: set[str]) -> set[str]:
    """The hyla modules ``path`` imports anywhere (``from pkg import sub`` counts as ``pkg.sub``);
    imports under ``if TYPE_CHECKING`` do not run and are left out."""
    tree = ast.parse(path.read_text())
    skipped = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("hyla")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("hyla"):
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules
            found |= subs or {node.module}
    return found


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in (SRC / "hyla").rglob("*.py")}
    return {m: imports(p, set(files)) - {m} for m, p in files.items()}


def test_no_upward_imports() -> None:
    upward = sorted(f"{m} -> {t}" for m, ts in graph().items() for t in ts if layer(t) > layer(m, importer=True))
    assert not upward, "imports from a higher layer: " + ", ".join(upward)


def test_no_import_loops() -> None:
    edges = graph()

    # a package's __init__ re-exporting its modules is not a loop; every other cycle is
    def children(m: str) -> set[str]:
        return {t for t in edges.get(m, ()) if not (t.startswith(m + ".") or m.startswith(t + "."))}

    loops = []
    for start in edges:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in children(node):
                if nxt == start:
                    loops.append(" -> ".join([*path, start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    assert not loops, "import loops: " + "; ".join(sorted(loops)[:5])


def test_the_graph_sees_lazy_imports() -> None:
    edges = graph()
    assert "hyla.train.run.folder" in edges["hyla.text.generate"]  # imported inside a function
    assert "hyla.attention.kernels.triton.kernel" in edges["hyla.attention.kernels.triton.wrapper"]  # in functions


def test_training_modules_stay_small() -> None:
    """One job per module: the shell, each engine and the optimizer room each stay readable in one sitting."""
    train = SRC / "hyla" / "train"
    long = {str(p.relative_to(train)): n for p in train.rglob("*.py") if (n := len(p.read_text().splitlines())) > 450}
    assert not long, f"src/hyla/train modules over 450 lines: {long}"


def test_the_training_layer_has_one_room_per_concept() -> None:
    """config (and what it builds), seeds, the loop, the engines, the run folder, sweeps, the command; the former
    paths of the run folder's modules are only deprecation shims."""
    train = SRC / "hyla" / "train"
    modules = {p.stem for p in train.glob("*.py")} - {"__init__"}
    packages = {p.name for p in train.iterdir() if (p / "__init__.py").is_file()}
    assert modules == {"config", "build", "seeds", "loop", "sweeps", "cli", "rundir", "checkpoint"}
    assert packages == {"engines", "run"}
    for shim in ("rundir", "checkpoint"):
        assert "DeprecationWarning" in (train / f"{shim}.py").read_text()


def test_only_the_run_directory_module_names_the_metrics_file() -> None:
    """``hyla.train.run.folder`` owns the run directory's layout; everything else asks it."""
    naming = sorted(str(p.relative_to(SRC)) for p in (SRC / "hyla").rglob("*.py") if "metrics.jsonl" in p.read_text())
    assert naming == ["hyla/train/run/folder.py"]


#: the repository's reproduction lab, beside the package: it imports hyla, never the reverse
LAB = SRC.parent / "lab"
#: a lab path, or an issue number (``#38``), in the package's code or comments; the package's own default output
#: folder for records (``results/sweeps``, where a user's runs go) is the one path of that kind it may name
LAB_REFERENCE = re.compile(r"#[0-9]{2}\b|\blab/|\bbenchmarks/|(?<![\w.])results/(?!sweeps)")


def test_the_package_imports_nothing_from_the_lab() -> None:
    lab_modules = {p.stem for p in LAB.rglob("*.py")}
    package_imports = {n.split(".")[0] for p in (SRC / "hyla").rglob("*.py") for n in imports_any(p)}
    assert not package_imports & lab_modules, f"the package imports lab modules: {package_imports & lab_modules}"


def test_the_lab_imports_the_package() -> None:
    """The lab's scripts run on the library: each Python script of the lab that imports anything of ours imports
    ``hyla``, and none reaches into another checkout through ``src`` paths."""
    scripts = [p for p in LAB.rglob("*.py") if "runs" not in p.parts]
    assert scripts and any("hyla" in imports_any(p) for p in scripts)


def test_the_package_names_no_lab_path_or_issue_number() -> None:
    found = [
        f"{p.relative_to(SRC)}:{i}"
        for p in sorted((SRC / "hyla").rglob("*"))
        if p.suffix in {".py", ".yaml", ".c", ".json"} and "demo_records" not in p.parts
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if LAB_REFERENCE.search(line)
    ]
    assert not found, f"lab paths or issue numbers in the package: {found}"


def imports_any(path: Path) -> set[str]:
    """Every top-level name ``path`` imports (any package, lazy imports included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names
