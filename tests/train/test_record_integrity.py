"""Run records that stay whole or say what broke them: checksums of checkpoints and final weights, a full or
read-only disk, what interrupted writes leave behind, file modes, a lost ``checkpoints/latest``."""

from __future__ import annotations

import builtins
import errno
import json
import os
import re
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import hyla
from hyla import textio
from hyla.cli import main
from hyla.textio import TornLineWarning, write_text_atomic
from hyla.train.run.checkpoint import CheckpointError, ChecksumError, latest_checkpoint, sums_file
from tiny import tiny_overrides

ARGS = ["sraven", *tiny_overrides(steps=8, every=4, log_every=2, warmup_steps=2)]


def train(out: Path, *flags: str, args: list[str] = ARGS) -> int:
    return main(["train", *args, "--out", str(out), "--quiet", *flags])


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run trained in one go, which an interrupted and resumed run must equal."""
    out = tmp_path_factory.mktemp("whole") / "run"
    assert train(out) == 0
    return out


@pytest.fixture
def stopped(tmp_path: Path) -> Path:
    """The run stopped at step 4 with a checkpoint (steps 4 and 8 are its checkpoints)."""
    out = tmp_path / "run"
    assert train(out, "--stop-at-step", "4") == 0
    return out


def same_records(run: Path, whole: Path) -> bool:
    return (run / "metrics.jsonl").read_bytes() == (whole / "metrics.jsonl").read_bytes()


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The one line a failed command printed on stderr (there must be one, and no traceback)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01  # in the tensor data: the file still parses, only its sum tells
    path.write_bytes(bytes(data))


# ------------------------------------------------------------------------------ checksums
def test_checkpoint_and_final_weights_record_their_sums(whole: Path) -> None:
    ckpt = latest_checkpoint(whole)
    recorded = json.loads((ckpt / "state.json").read_text())["sha256"]
    assert sorted(recorded) == ["model.safetensors", "optimizer.pt", "rng.safetensors"]
    digest, name = sums_file(whole / "model.safetensors").read_text().split()
    assert name == "model.safetensors" and len(digest) == 64  # sha256sum's format: `sha256sum -c` checks it


def test_resume_from_a_checkpoint_with_a_flipped_byte_exits_2_naming_the_file(stopped: Path, capsys) -> None:
    assert train(stopped, "--resume") == 0  # on to step 8: checkpoints 4 and 8
    capsys.readouterr()
    damaged = stopped / "checkpoints" / "step-000000008" / "model.safetensors"
    flip_a_byte(damaged)
    assert train(stopped, "--resume", args=[*ARGS, "train.steps=12"]) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"hyla train: error: {damaged}: its sha256 differs")
    latest = stopped / "checkpoints" / "latest"
    assert f"checkpoints/step-000000004 is intact: to resume from it, point {latest} at it" in line
    assert f"(echo step-000000004 > {latest})" in line
    latest.write_text("step-000000004")  # the advice works: the run goes on from the intact checkpoint
    assert train(stopped, "--resume", args=[*ARGS, "train.steps=12"]) == 0


def test_a_truncated_checkpoint_names_the_older_intact_one(stopped: Path, capsys) -> None:
    assert train(stopped, "--resume") == 0
    capsys.readouterr()
    model = stopped / "checkpoints" / "step-000000008" / "model.safetensors"
    model.write_bytes(model.read_bytes()[:100])
    assert train(stopped, "--resume", args=[*ARGS, "train.steps=12"]) == 2
    line = one_error_line(capsys)
    assert "step-000000008 is unreadable" in line and "checkpoints/step-000000004 is intact" in line


def test_load_of_final_weights_with_a_flipped_byte_raises_naming_the_file(whole: Path, tmp_path: Path) -> None:
    run = tmp_path / "copy"
    shutil.copytree(whole, run)
    assert hyla.load(run).weights == "final"
    flip_a_byte(run / "model.safetensors")
    with pytest.raises(ChecksumError, match=re.escape(f"{run / 'model.safetensors'}: its sha256 differs")):
        hyla.load(run)


def test_weights_and_checkpoints_without_sums_load_and_resume_as_before(stopped: Path, whole: Path) -> None:
    state = latest_checkpoint(stopped) / "state.json"
    meta = json.loads(state.read_text())
    del meta["sha256"]  # as written before checkpoints recorded sums
    state.write_text(json.dumps(meta))
    assert hyla.load(stopped).weights == "checkpoint at step 4"
    assert train(stopped, "--resume") == 0
    assert same_records(stopped, whole)
    sums_file(stopped / "model.safetensors").unlink()  # final weights from before the sidecar
    assert hyla.load(stopped).weights == "final"


def test_report_on_truncated_final_weights_is_one_line(whole: Path, tmp_path: Path, capsys) -> None:
    run = tmp_path / "copy"
    shutil.copytree(whole, run)
    weights = run / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    assert main(["report", str(run), "--out", str(tmp_path / "report"), "--latents", "16"]) == 2
    assert one_error_line(capsys).startswith(f"hyla report: error: {weights} is unreadable")


# ------------------------------------------------------------------------------ a full or read-only disk
@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Callable[[Path, Any], bool]], None]]:
    """``full_disk(when)``: every record write for which ``when(path, data)`` holds fails as on a full disk:
    half the data reaches the file, then ``write`` raises ENOSPC naming no file (what the kernel does)."""

    def install(when: Callable[[Path, Any], bool]) -> None:
        real_open = builtins.open

        class FullDisk:
            def __init__(self, f: Any, path: Path) -> None:
                self._f, self._path = f, path

            def write(self, data: Any) -> int:
                if not when(self._path, data):
                    return self._f.write(data)
                self._f.write(data[: len(data) // 2])
                self._f.flush()
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

            def __getattr__(self, name: str) -> Any:
                return getattr(self._f, name)

            def __enter__(self) -> FullDisk:
                return self

            def __exit__(self, *exc: object) -> None:
                self._f.close()

        def fake_open(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            f = real_open(path, mode, *args, **kwargs)
            return f if "r" in mode else FullDisk(f, Path(path))

        monkeypatch.setattr(textio, "open", fake_open, raising=False)  # the writers' `open`, nobody else's

    yield install
    monkeypatch.undo()


def test_a_full_disk_at_a_checkpoint_is_one_line_and_a_resume_gives_the_whole_records(
    tmp_path: Path, whole: Path, full_disk: Callable[..., None], monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    out = tmp_path / "run"
    full_disk(lambda path, data: path.parent.name == ".step-000000008.tmp")
    assert train(out) == 2
    line = one_error_line(capsys)
    assert line == (
        f"hyla train: error: no space left on device writing {out}/checkpoints/.step-000000008.tmp/model.safetensors;"
        " the records up to step 4 (the last checkpoint) are intact: once the disk is fixed (space freed, write "
        "permission given), continue with --resume"
    )
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest", "step-000000004"]  # no leftover
    monkeypatch.undo()  # space freed
    assert train(out, "--resume") == 0
    assert same_records(out, whole) and hyla.load(out).weights == "final"


def test_a_full_disk_mid_metrics_line_is_one_line_and_a_resume_gives_the_whole_records(
    tmp_path: Path, whole: Path, full_disk: Callable[..., None], monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    out = tmp_path / "run"
    full_disk(lambda path, data: path.name == "metrics.jsonl" and '"step": 6,' in data)
    assert train(out) == 2
    assert one_error_line(capsys).startswith(f"hyla train: error: no space left on device writing {out}/metrics.jsonl;")
    monkeypatch.undo()
    with pytest.warns(TornLineWarning):  # the half line the full disk took
        assert train(out, "--resume") == 0
    assert same_records(out, whole)


def test_a_full_disk_leaves_a_replaced_file_as_it_was(tmp_path: Path, full_disk: Callable[..., None]) -> None:
    path = tmp_path / "made_by.jsonl"
    path.write_text("old\n")
    full_disk(lambda p, data: True)
    with pytest.raises(OSError, match=re.escape(f"No space left on device: '{tmp_path}/.made_by.jsonl.tmp'")):
        write_text_atomic(path, "new\n")
    assert path.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["made_by.jsonl"]


@pytest.fixture
def read_only() -> Iterator[Callable[[Path], None]]:
    """``read_only(folder)``: no one may write in ``folder`` until the test ends (skips where chmod cannot stop
    this process, as root)."""
    made: list[Path] = []

    def chmod(folder: Path) -> None:
        folder.chmod(0o555)
        made.append(folder)
        if os.access(folder, os.W_OK):
            pytest.skip("this process writes in a read-only folder (root): chmod cannot simulate it")

    yield chmod
    for folder in made:
        folder.chmod(0o755)


def test_a_read_only_out_is_one_line(tmp_path: Path, read_only: Callable[[Path], None], capsys) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    read_only(folder)
    for out in (folder, folder / "run"):
        assert train(out) == 2
        line = one_error_line(capsys)
        assert line.startswith("hyla train: error: ") and str(folder) in line and "ermission denied" in line


def test_read_only_checkpoints_are_one_line_and_a_resume_gives_the_whole_records(
    stopped: Path, whole: Path, read_only: Callable[[Path], None], capsys
) -> None:
    read_only(stopped / "checkpoints")
    assert train(stopped, "--resume") == 2
    assert one_error_line(capsys).startswith(
        f"hyla train: error: permission denied writing {stopped}/checkpoints/.step-000000008.tmp; the records up to "
        "step 4 (the last checkpoint) are intact"
    )
    (stopped / "checkpoints").chmod(0o755)
    assert train(stopped, "--resume") == 0
    assert same_records(stopped, whole)


def test_an_unknown_device_is_one_line_naming_the_allowed_ones(tmp_path: Path, capsys) -> None:
    assert train(tmp_path / "run", "--device", "tpu") == 2
    assert one_error_line(capsys) == (
        "hyla train: error: --device 'tpu' is not valid; allowed values: cpu, cuda, cuda:N (N a GPU index), mps"
    )
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------ leftovers and modes
def test_leftovers_of_interrupted_writes_are_removed_by_the_next_start(stopped: Path, whole: Path) -> None:
    ckpts = stopped / "checkpoints"
    (ckpts / ".step-000000008.tmp").mkdir()  # a checkpoint write cut off by a crash
    (ckpts / ".step-000000008.tmp" / "model.safetensors").write_bytes(b"half")
    (ckpts / ".step-000000008.k2x9q1").mkdir()  # the same, from a version that named them at random
    (ckpts / ".latest.tmp").write_text("step-0")
    (stopped / ".model.safetensors.tmp").write_bytes(b"half")
    assert train(stopped, "--resume") == 0
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step-000000004", "step-000000008"]
    assert not (stopped / ".model.safetensors.tmp").exists() and same_records(stopped, whole)


@pytest.mark.parametrize("umask", [0o022, 0o007])
def test_records_are_written_with_the_process_umask(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        assert train(tmp_path / "run", args=[*ARGS, "train.steps=4"]) == 0
    finally:
        os.umask(old)
    ckpt = latest_checkpoint(tmp_path / "run")
    folders = [ckpt.parent, ckpt]
    files = [*ckpt.iterdir(), tmp_path / "run" / "model.safetensors", sums_file(tmp_path / "run" / "model.safetensors")]
    assert {stat.S_IMODE(p.stat().st_mode) for p in folders} == {0o777 & ~umask}
    assert {stat.S_IMODE(p.stat().st_mode) for p in files} == {0o666 & ~umask}


def test_a_lost_latest_pointer_gets_the_same_advice_from_resume_and_a_plain_start(stopped: Path, capsys) -> None:
    assert train(stopped, "--resume") == 0
    capsys.readouterr()
    latest = stopped / "checkpoints" / "latest"
    latest.unlink()
    lines = []
    for flags in (["--resume"], []):
        assert train(stopped, *flags) == 2
        lines.append(one_error_line(capsys))
    assert lines[0] == lines[1]
    assert f"{latest} is missing, but {latest.parent} holds step-000000004, step-000000008" in lines[0]
    assert f"checkpoints/step-000000008 is intact: to resume from it, point {latest} at it" in lines[0]
    with pytest.raises(CheckpointError, match="is missing"):
        latest_checkpoint(stopped)


def test_a_full_disk_under_a_sweep_is_one_line_and_the_sweep_continues_after(
    tmp_path: Path, full_disk: Callable[..., None], monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    from tiny import write_sweep

    path = write_sweep(tmp_path, rows={"hyla": {"model.attention": "hyla"}}, grid={}, seeds=[0])
    assert main(["sweep", str(path), "--root", str(tmp_path / "whole")]) == 0
    full_disk(lambda p, data: p.parent.name == ".step-000000008.tmp")
    capsys.readouterr()
    assert main(["sweep", str(path), "--root", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and "step 4" in err
    monkeypatch.undo()  # the disk is fixed
    assert main(["sweep", str(path), "--root", str(tmp_path / "r")]) == 0
    run = next((tmp_path / "whole" / "tiny").iterdir()).name
    whole, after = (tmp_path / d / "tiny" / run / "metrics.jsonl" for d in ("whole", "r"))
    assert after.read_bytes() == whole.read_bytes()
