"""A full disk: every command ends with "bertforge CMD: error: no space left on PATH" and exit code 2,
PATH being the file or folder it was writing, and leaves what was there before byte-identical and no
temporary files behind.

Two ways to fill a disk: a small tmpfs (real writers on a real full disk; needs root, skipped
otherwise) and writers made to fail as they fail on a full disk (always run). Feature files are
memory-mapped, so on a full disk they are written in a separate process: a crash (SIGBUS) shows as
a negative return code there.
"""

from __future__ import annotations

import errno
import gc
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from data_fixtures import documents, write_google, write_tokenizer
from finetune_fixtures import FILLER, base, root, write  # noqa: F401 - fixtures: a tiny "pre-trained" BERT, a folder
from pretrain_fixtures import one_thread, subprocess_env  # noqa: F401 - autouse fixture: one thread for tiny models
from safetensors import SafetensorError

from bertforge import cli
from bertforge import io as bio
from bertforge.io import atomic_dir, atomic_path

ENOSPC_TEXT = os.strerror(errno.ENOSPC)  # "No space left on device"


@pytest.fixture
def small_disk(tmp_path):
    """``small_disk(kib)`` -> an empty folder on a tmpfs of ``kib`` KiB (root only), unmounted after
    the test; ``small_disk.grow(folder, kib)`` makes it larger."""
    mounted: list[Path] = []

    def mount(kib: int) -> Path:
        if os.geteuid() != 0 or not shutil.which("mount"):
            pytest.skip("mounting a small tmpfs needs root")
        folder = tmp_path / f"disk{len(mounted)}"
        folder.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(folder)],
                              capture_output=True, text=True)
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
        mounted.append(folder)
        return folder

    def grow(folder: Path, kib: int) -> None:
        subprocess.run(["mount", "-o", f"remount,size={kib}k", str(folder)], check=True)

    mount.grow = grow  # type: ignore[attr-defined]
    yield mount
    gc.collect()  # a failed writer's file, still open in a traceback's frame, keeps the tmpfs busy
    for folder in mounted:
        if subprocess.run(["umount", str(folder)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(folder)], check=True)


def files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones too) -> its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def cli_error(capsys) -> str:
    """The last line the command wrote to stderr."""
    return capsys.readouterr().err.strip().splitlines()[-1]


# ------------------------------------------------------------------------------ the writers
def _safetensors_error() -> Exception:
    return SafetensorError(f"Error while serializing: I/O error: {ENOSPC_TEXT} (os error 28)")


def _torch_save_error() -> Exception:
    """What torch.save into an open file raises on a full disk: a RuntimeError raised while handling ENOSPC."""
    try:
        raise OSError(errno.ENOSPC, ENOSPC_TEXT)
    except OSError:
        try:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
        except RuntimeError as e:
            return e


@pytest.mark.parametrize("error, suffix", [
    (OSError(errno.ENOSPC, ENOSPC_TEXT), ""),
    (OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)), " (disk quota exceeded)"),
    (_safetensors_error(), ""),
    (_torch_save_error(), ""),
], ids=["ENOSPC", "EDQUOT", "safetensors", "torch.save"])
def test_a_write_that_fails_for_want_of_space_names_the_file_and_leaves_the_old_one(tmp_path, error, suffix):
    target = tmp_path / "model.safetensors"
    target.write_bytes(b"old")
    with pytest.raises(OSError) as caught:
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half of the new")
            raise error
    assert str(caught.value) == f"no space left on {target}{suffix}"
    assert caught.value.errno == (error.errno if isinstance(error, OSError) else errno.ENOSPC)
    assert caught.value.filename == str(target)
    assert files(tmp_path) == {"model.safetensors": b"old"}


def test_a_folder_names_itself_whichever_file_in_it_did_not_fit(tmp_path, monkeypatch):
    target = tmp_path / "step-00000004"
    (target / "config.json").parent.mkdir()
    (target / "config.json").write_text("old")
    before = files(tmp_path)
    with pytest.raises(OSError, match=f"^no space left on {target}$"):
        with atomic_dir(target) as tmp, atomic_path(tmp / "model.safetensors"):
            raise _safetensors_error()
    assert files(tmp_path) == before

    # torch.save to a file name drops the OS error: a bare RuntimeError on a disk with no space left
    def save() -> None:
        with atomic_dir(target) as tmp:
            (tmp / "trainer_state.pt").write_bytes(b"partial")
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 14464 vs 14356")

    monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(total=10 << 20, used=10 << 20, free=4096))
    with pytest.raises(OSError, match=f"^no space left on {target}$"):
        save()
    monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(total=10 << 20, used=1 << 20, free=9 << 20))
    with pytest.raises(RuntimeError, match="unexpected pos"):  # space left: the error is the writer's own
        save()
    assert files(tmp_path) == before


def test_a_line_that_does_not_fit_is_not_appended_in_part(small_disk):
    log = small_disk(16) / "metrics.jsonl"
    log.write_text('{"step": 1}\n')
    with pytest.raises(OSError, match=f"^no space left on {log}$"):
        bio.append_text(log, '{"step": 2, "note": "' + "x" * (64 << 10) + '"}\n')
    assert log.read_text() == '{"step": 1}\n'
    bio.append_text(log, '{"step": 2}\n')
    assert log.read_text() == '{"step": 1}\n{"step": 2}\n'


# ------------------------------------------------------------------------------ features
@pytest.fixture(scope="module")
def texts(root) -> Path:
    rng = random.Random(0)
    return write(root / "texts.txt", "".join(" ".join(rng.choices(FILLER, k=10)) + "\n" for _ in range(300)))


def _previous_outputs(out: Path) -> dict[str, bytes]:
    """Files an earlier run left at ``out`` (and its .npy sidecars)."""
    for path in (out, out.with_suffix(".offsets.npy"), out.with_suffix(".token_ids.npy")):
        if path == out or out.suffix == ".npy":
            path.write_bytes(b"an earlier run's " + path.name.encode())
    return files(out.parent)


@pytest.mark.parametrize("suffix", [".npy", ".safetensors"])
def test_features_on_a_full_disk_is_an_error_not_a_crash(base, texts, small_disk, suffix):
    out = small_disk(256) / f"feats{suffix}"  # 3,600 tokens x 64 values: 900 KiB
    before = _previous_outputs(out)
    done = subprocess.run([sys.executable, "-m", "bertforge", "features", str(base), str(texts), "--out", str(out),
                           "--layers", "-1,-2", "--no-progress"], env=subprocess_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert done.stderr.strip().splitlines()[-1] == f"bertforge features: error: no space left on {out}"
    assert files(out.parent) == before


@pytest.mark.parametrize("suffix", [".npy", ".safetensors"])
def test_features_reserve_their_files_before_writing_them(base, texts, tmp_path, monkeypatch, capsys, suffix):
    out = tmp_path / f"feats{suffix}"
    before = _previous_outputs(out)

    def no_room(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, ENOSPC_TEXT)

    monkeypatch.setattr(os, "posix_fallocate", no_room, raising=False)
    assert cli.main(["features", str(base), str(texts), "--out", str(out), "--layers", "-1", "--no-progress"]) == 2
    assert cli_error(capsys) == f"bertforge features: error: no space left on {out}"
    assert files(tmp_path) == before


# ------------------------------------------------------------------------------ vocab, prepare
def test_vocab_on_a_full_disk_leaves_the_previous_vocab_whole(root, small_disk, capsys):
    corpus = write_google(root / "vocab_corpus.txt", documents(3, 40, 3, 6))
    out = write_tokenizer(small_disk(80) / "vocab")  # about 50 KiB: no room for a second one
    before = files(out)
    assert cli.main(["vocab", str(corpus), "--out", str(out), "--vocab-size", "300"]) == 2
    assert cli_error(capsys).startswith(f"bertforge vocab: error: no space left on {out}/")
    assert files(out) == before


def _prepare_args(root: Path, out: Path) -> list[str]:
    corpus = root / "prepare_corpus.txt"
    if not corpus.is_file():
        write_google(corpus, documents(1, 40, 3, 6))
    tok = root / "prepare_tok"
    if not tok.is_dir():
        write_tokenizer(tok)
    return ["prepare", str(corpus), "--out", str(out), "--tokenizer", str(tok), "--max-seq-length", "32",
            "--max-predictions-per-seq", "5", "--dupe-factor", "5", "--shard-chars", "3000"]


def test_prepare_on_a_full_disk_names_the_shard_and_a_rerun_with_room_completes(root, small_disk, capsys):
    disk = small_disk(48)  # three shards of 16-24 KiB (and their sidecars): the second does not fit
    out = disk / "data"
    assert cli.main(_prepare_args(root, out)) == 2
    assert cli_error(capsys) == f"bertforge prepare: error: no space left on {out / 'shard-00001.safetensors'}"
    assert sorted(files(out)) == ["settings.json", "shard-00000.json", "shard-00000.safetensors"]
    small_disk.grow(disk, 256)
    assert cli.main(_prepare_args(root, out)) == 0
    reference = root / "prepared_with_room"
    assert cli.main(_prepare_args(root, reference)) == 0
    assert files(out).keys() == files(reference).keys()
    shards = {k: v for k, v in files(reference).items() if k.endswith(".safetensors")}
    assert {k: v for k, v in files(out).items() if k.endswith(".safetensors")} == shards


def test_prepare_reports_safetensors_full_disk_error_by_the_shard(root, tmp_path, monkeypatch, capsys):
    from bertforge.data import shards

    def save_file(arrays, path, metadata=None):
        Path(path).write_bytes(b"part of a shard")
        raise _safetensors_error()

    monkeypatch.setattr(shards, "save_file", save_file)
    out = tmp_path / "data"
    assert cli.main(_prepare_args(root, out)) == 2
    assert cli_error(capsys) == f"bertforge prepare: error: no space left on {out / 'shard-00000.safetensors'}"
    assert sorted(files(out)) == ["settings.json"]


# ------------------------------------------------------------------------------ training
def _finetune_args(root: Path, base: Path, out: Path, steps: int) -> list[str]:
    rng = random.Random(1)
    rows = []
    for _ in range(32):
        words = [rng.choice(FILLER) for _ in range(5)]
        label = rng.choice(["pos", "neg"])
        words.insert(2, "good" if label == "pos" else "bad")
        rows.append(f'"{" ".join(words)}",{label}\n')
    train = write(root / "disk_full_train.csv", "review,sentiment\n" + "".join(rows))
    return ["finetune", "--model", str(base), "--task", "classification", "--train-file", str(train),
            "--text-column", "review", "--label-column", "sentiment", "--out", str(out), "--max-steps", str(steps),
            "--checkpoint-every", "2", "--batch-size", "16", "--no-keep-best", "--no-progress", "--device", "cpu"]


def _resume_until_the_disk_fills(root: Path, base: Path, out: Path, capsys) -> None:
    """A run of 2 steps (a checkpoint at step 2 and model/), resumed to 4 steps when the step-4
    checkpoint does not fit: an error naming that checkpoint, step 2's and model/ byte-identical."""
    assert cli.main(_finetune_args(root, base, out, 2)) == 0
    kept = {k: v for k, v in files(out).items() if k.startswith(("checkpoints", "model"))}
    assert "checkpoints/step-00000002/trainer_state.pt" in kept and "model/model.safetensors" in kept
    assert cli.main(_finetune_args(root, base, out, 4) + ["--resume"]) == 2
    assert cli_error(capsys) == f"bertforge finetune: error: no space left on {out / 'checkpoints' / 'step-00000004'}"
    after = files(out)
    assert {k: v for k, v in after.items() if k.startswith(("checkpoints", "model"))} == kept
    assert not [p for p in out.rglob(".*")], "temporary files left behind"


def test_a_checkpoint_that_does_not_fit_leaves_the_previous_one(root, base, small_disk, capsys):
    # ~660 KiB after 2 steps (a 470 KiB checkpoint, a 180 KiB model/): the step-4 checkpoint's weights
    # fit, its trainer_state.pt (torch.save, which reports a full disk as a bare RuntimeError) does not
    _resume_until_the_disk_fills(root, base, small_disk(1000) / "run", capsys)


def test_a_trainer_state_that_does_not_fit_leaves_the_previous_checkpoint(root, base, tmp_path, monkeypatch,
                                                                          capsys):
    save = torch.save

    def save_until_step_4(obj, f, *args, **kwargs):
        if obj.get("step") == 4:
            Path(f).write_bytes(b"PK part of a trainer state")
            raise _torch_save_error()
        return save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_until_step_4)
    _resume_until_the_disk_fills(root, base, tmp_path / "run", capsys)
