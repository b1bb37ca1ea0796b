"""`bertforge.train.precision`: "auto" is the faster of fp32 and bf16 (fp32 where bf16 is emulated, bf16
with AMX, else what a probe measured, kept per process and per machine in a cache file that is not
trusted blindly), fp16 is refused off CUDA with a clear error (by the module and by the training loop),
autocast runs in the chosen dtype, and the loop and the demo share the module's names instead of tables
of their own."""

from __future__ import annotations

import json
import logging
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from bertforge import machine
from bertforge.train import precision as prec
from bertforge.train.config import TrainConfig
from bertforge.train.loop import Trainer
from bertforge.train.precision import PRECISIONS

REAL_PROBE = prec.probe_timings


BF16_FASTER = prec.bf16_faster


@pytest.fixture(autouse=True)
def probe(monkeypatch, tmp_path):
    """No test here measures this machine or touches the user's cache: the cache folder is ``tmp_path``,
    the CPU has no AMX, and the probe returns ``probe.timings`` (bf16 twice as fast unless a test sets
    others) and records each call in ``probe.calls``; the per-process answer is forgotten around each test."""
    monkeypatch.setenv("BERTFORGE_CACHE", str(tmp_path))
    monkeypatch.setattr(prec, "bf16_faster", BF16_FASTER)  # the real one (tests/conftest.py stands in for it)
    monkeypatch.setattr(prec, "has_amx", lambda: False)
    state = SimpleNamespace(timings={"fp32": 0.040, "bf16": 0.020}, calls=[], file=tmp_path / "precision_probe.json")

    def probe_timings():
        state.calls.append(dict(state.timings))
        return dict(state.timings)

    monkeypatch.setattr(prec, "probe_timings", probe_timings)
    prec.bf16_faster.cache_clear()
    yield state
    prec.bf16_faster.cache_clear()


def new_process():
    """What a new process sees: no answer kept in memory, only the cache file."""
    prec.bf16_faster.cache_clear()


@pytest.mark.parametrize("native, expected", [(True, "bf16"), (False, "fp32")])
def test_auto_is_fp32_where_bf16_is_emulated_and_bf16_where_native_and_faster(monkeypatch, probe, native, expected):
    monkeypatch.setattr(prec, "native_bf16", lambda device: native)
    assert prec.resolve_precision("auto", "cpu") == expected
    with prec.autocast("auto", "cpu"):
        y = nn.Linear(4, 4)(torch.ones(2, 4))
    assert y.dtype == (torch.bfloat16 if native else torch.float32)
    assert len(probe.calls) == (1 if native else 0)  # emulated bf16 is never timed


def test_auto_is_bf16_with_amx_without_a_probe(monkeypatch, probe):
    monkeypatch.setattr(prec, "native_bf16", lambda device: True)
    monkeypatch.setattr(prec, "has_amx", lambda: True)
    probe.timings.update(fp32=0.010, bf16=0.050)  # what a probe would say is not asked
    assert prec.resolve_precision("auto", "cpu") == "bf16"
    assert probe.calls == [] and not probe.file.exists()


@pytest.mark.parametrize("fp32, bf16, expected", [(0.040, 0.080, "fp32"), (0.040, 0.039, "bf16"), (0.040, 0.040, "fp32")])
def test_where_bf16_is_native_without_amx_auto_is_what_the_probe_finds_faster(monkeypatch, probe, caplog,
                                                                              fp32, bf16, expected):
    monkeypatch.setattr(prec, "native_bf16", lambda device: True)
    probe.timings.update(fp32=fp32, bf16=bf16)
    with caplog.at_level(logging.DEBUG, logger="bertforge"):
        assert prec.resolve_precision("auto", "cpu") == expected
        assert prec.resolve_precision("auto", "cpu", inference=True) == expected
        assert prec.dtype_of("int8") == prec.dtype_of(expected)  # int8's float rest follows auto
    assert len(probe.calls) == 1  # once per process
    said = [r for r in caplog.records if r.getMessage().startswith("precision auto: ")]
    assert [r.levelno for r in said] == [logging.INFO]  # what was decided, why, said once
    assert said[0].getMessage().startswith(f"precision auto: {expected} on this CPU")
    assert f"{bf16 * 1e3:.1f} ms in bf16 against {fp32 * 1e3:.1f} ms in fp32" in said[0].getMessage()
    with prec.autocast("auto", "cpu"):
        y = nn.Linear(4, 4)(torch.ones(2, 4))
    assert y.dtype == (torch.bfloat16 if expected == "bf16" else torch.float32)


def test_auto_on_cuda_follows_native_bf16_without_a_probe(monkeypatch, probe):
    for native, expected in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(prec, "native_bf16", lambda device, native=native: native)
        assert prec.resolve_precision("auto", "cuda") == expected
    assert probe.calls == []


def test_the_probes_answer_is_written_to_the_cache_and_read_back_by_the_next_process(monkeypatch, probe, caplog):
    monkeypatch.setattr(prec, "native_bf16", lambda device: True)
    assert prec.resolve_precision("auto", "cpu") == "bf16"
    kept = json.loads(probe.file.read_text())
    entry = kept["entries"][prec._machine_key()]
    assert kept["version"] == 1 and (entry["fp32_ms"], entry["bf16_ms"]) == (40.0, 20.0)
    assert prec._machine_key().startswith(machine.cpu_info()[0]) and torch.__version__ in prec._machine_key()

    new_process()
    probe.timings.update(fp32=0.010, bf16=0.050)  # a new probe would say fp32; the file is what decides
    with caplog.at_level(logging.DEBUG, logger="bertforge"):
        assert prec.resolve_precision("auto", "cpu") == "bf16"
    assert len(probe.calls) == 1
    assert f"measured before, read from {probe.file}" in caplog.text

    entry.update(fp32_ms=30.0, bf16_ms=45.0)  # the answer is derived from the times kept
    probe.file.write_text(json.dumps(kept))
    new_process()
    assert prec.resolve_precision("auto", "cpu") == "fp32"
    assert len(probe.calls) == 1


@pytest.mark.parametrize("content", [
    "{not json", "\xff\xfe", "[]", '{"version": 2, "entries": {}}', '{"version": 1, "entries": []}',
    'KEY: "nothing"', 'KEY: {"fp32_ms": 40.0}', 'KEY: {"fp32_ms": "fast", "bf16_ms": 1}',
    'KEY: {"fp32_ms": true, "bf16_ms": 20.0}', 'KEY: {"fp32_ms": 40.0, "bf16_ms": -1}',
    'KEY: {"fp32_ms": Infinity, "bf16_ms": 20.0}', 'KEY: {"fp32_ms": NaN, "bf16_ms": 20.0}',
    "[" * 200_000 + "]" * 200_000,  # deeper than the JSON parser recurses
])
def test_a_corrupt_cache_is_ignored_measured_again_and_rewritten(monkeypatch, probe, content):
    monkeypatch.setattr(prec, "native_bf16", lambda device: True)
    other = {"fp32_ms": 10.0, "bf16_ms": 30.0, "measured": "2026-01-01T00:00:00+00:00"}  # another machine's
    if content.startswith("KEY: "):
        entries = {prec._machine_key(): json.loads(content[5:]), "another CPU; avx2; torch 2.3": other}
        content = json.dumps({"version": 1, "entries": entries})
    probe.file.write_bytes(content.encode("latin-1"))
    probe.timings.update(fp32=0.040, bf16=0.080)
    assert prec.resolve_precision("auto", "cpu") == "fp32"  # not what any corrupt entry would say
    assert len(probe.calls) == 1
    kept = json.loads(probe.file.read_text())
    entry = kept["entries"][prec._machine_key()]
    assert (entry["fp32_ms"], entry["bf16_ms"]) == (40.0, 80.0)
    assert all(math.isfinite(e["fp32_ms"]) for e in kept["entries"].values())
    if len(kept["entries"]) > 1:  # a valid file's other entries stay
        assert kept["entries"]["another CPU; avx2; torch 2.3"] == other


def test_a_cache_that_cannot_be_written_costs_a_probe_per_process_not_an_error(monkeypatch, probe, tmp_path, caplog):
    monkeypatch.setattr(prec, "native_bf16", lambda device: True)
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("BERTFORGE_CACHE", str(tmp_path / "a-file" / "cache"))
    with caplog.at_level(logging.INFO, logger="bertforge"):
        assert prec.resolve_precision("auto", "cpu") == "bf16"
    assert len(probe.calls) == 1 and "not kept" in caplog.text


def test_the_real_probe_times_both_precisions_and_leaves_the_process_as_it_was():
    threads, rng = torch.get_num_threads(), torch.get_rng_state()
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):  # as a predictor first asks
        times = REAL_PROBE(repeats=1)
    assert set(times) == {"fp32", "bf16"} and all(0 < t < math.inf for t in times.values())
    assert torch.get_num_threads() == threads and torch.equal(torch.get_rng_state(), rng)


def test_explicit_precisions_resolve_to_themselves_and_bf16_warns_where_emulated(monkeypatch, caplog):
    monkeypatch.setattr(prec, "native_bf16", lambda device: False)
    assert prec.resolve_precision("fp32", "cpu") == "fp32"
    assert caplog.text == ""
    assert prec.resolve_precision("bf16", "cpu") == "bf16"
    assert "emulated" in caplog.text
    assert [prec.dtype_of(p) for p in ("fp32", "bf16", "fp16")] == [None, torch.bfloat16, torch.float16]
    assert [prec.needs_grad_scaler(p) for p in ("fp32", "bf16", "fp16")] == [False, False, True]


def test_fp16_on_cpu_is_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="precision fp16 needs a CUDA device"):
        prec.resolve_precision("fp16", "cpu")
    config = TrainConfig(precision="fp16", device="cpu")  # a valid setting; the CPU is what refuses it
    with pytest.raises(ValueError, match="precision fp16 needs a CUDA device .*on CPU use bf16"):
        Trainer(nn.Linear(2, 2), None, None, config, "unused")  # type: ignore[arg-type]


def test_unknown_precisions_are_refused_naming_the_choices():
    for bad in ("fp8", "bfloat16", ""):
        with pytest.raises(ValueError, match="precision must be one of auto, fp32, bf16, fp16"):
            TrainConfig(precision=bad)
        with pytest.raises(ValueError, match="precision must be one of"):
            prec.resolve_precision(bad, "cpu")
    assert TrainConfig(precision="auto").precision == "auto"
    assert TrainConfig().precision == "fp32"  # the default stays fp32: a run's numbers do not depend on the CPU


def test_the_loop_uses_the_precision_modules_names():
    assert PRECISIONS is prec.PRECISIONS


def test_the_trainer_resolves_auto_once_and_runs_in_it(monkeypatch):
    monkeypatch.setattr(prec, "native_bf16", lambda device: True)
    config = TrainConfig(precision="auto", device="cpu")
    trainer = Trainer(nn.Linear(4, 4), None, None, config, "unused")  # type: ignore[arg-type]
    assert trainer.precision == "bf16" and trainer.scaler is None
    monkeypatch.setattr(prec, "native_bf16", lambda device: False)  # resolved already: no second look
    with trainer._autocast():
        assert trainer.model(torch.ones(1, 4)).dtype == torch.bfloat16


def test_kernels_limited_to_avx2_count_bf16_as_emulated_and_the_cpu_name_says_so(monkeypatch):
    for name in prec.KERNEL_LIMITS:
        monkeypatch.delenv(name, raising=False)
    plain = prec.cpu_name()
    assert "kernels limited" not in plain and prec.kernel_limits() == {}
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    prec.native_bf16.cache_clear()  # asked once per device and process: ask anew under the limits
    try:
        assert prec.native_bf16(torch.device("cpu")) is False  # whatever the CPU has
    finally:
        prec.native_bf16.cache_clear()
    assert prec.cpu_name() == plain + "; kernels limited by ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2"
    assert "ATEN_CPU_CAPABILITY=avx2" in prec._machine_key()  # a probe under limits is kept apart


def test_the_cpu_is_named_by_model_family_and_number(monkeypatch, tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n"
                    "model name\t: AMD EPYC 7B13\nflags\t\t: fpu avx2 fma\n\nprocessor\t: 1\nmodel name\t: other\n")
    real_path = machine.Path
    monkeypatch.setattr(machine, "Path", lambda p: info if p == "/proc/cpuinfo" else real_path(p))
    machine.cpu_info.cache_clear()
    try:
        assert machine.cpu_info() == ("AMD EPYC 7B13 (family 25 model 1)", frozenset({"fpu", "avx2", "fma"}))
        for name in machine.KERNEL_LIMITS:
            monkeypatch.delenv(name, raising=False)
        assert prec.cpu_name() == "AMD EPYC 7B13 (family 25 model 1), AVX2"
    finally:
        machine.cpu_info.cache_clear()
