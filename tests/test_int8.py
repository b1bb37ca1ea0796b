"""Int8 inference (`bertforge.fast.int8`): the quantized product against the float one and against
exact integer arithmetic; the saturation guard; which layers are quantized and when they run in int8
(inference only: training, gradients and export run the float weights); the state dict untouched; caches
that follow changed weights; and ``precision="int8"`` through the Predictor, features, evaluate and the
command line, refused in training and off CPU."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bertforge import BertForSequenceClassification, BertModel
from bertforge.fast import int8 as int8_module
from bertforge.fast import speed_up, quantize_int8
from bertforge.fast.int8 import full_range_int8, int8_linear, int8_weights, is_quantized, quantized_layers
from bertforge.train import precision as prec
from bertforge.train.config import TrainConfig


def _layers(*shapes: tuple[int, int]) -> list[nn.Linear]:
    layers = [nn.Linear(i, o) for i, o in shapes]
    for layer in layers:
        int8_module._set_quantized(layer, True)
        layer.eval()
    return layers


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@torch.no_grad()
def test_int8_product_is_close_to_the_float_one_stacked_or_alone():
    q, k, v = _layers((48, 32), (48, 32), (48, 32))
    x = torch.randn(2, 7, 48)
    x[0, 3] *= 50  # one token with large activations costs only itself its precision (per-token scales)
    alone = int8_linear(x, q)
    assert alone.shape == (2, 7, 32) and alone.dtype == torch.float32
    assert _relative_error(alone, F.linear(x, q.weight, q.bias)) < 0.02
    stacked = int8_linear(x, q, k, v)
    want = F.linear(x, torch.cat([q.weight, k.weight, v.weight]), torch.cat([q.bias, k.bias, v.bias]))
    assert _relative_error(stacked, want) < 0.02
    assert torch.equal(stacked[..., :32], alone)  # the same per-channel weights, stacked or not
    other = x.clone()
    other[0, 3] = 0
    assert torch.equal(int8_linear(other, q)[1], alone[1])  # a row's result depends on that row only
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert int8_linear(x, q).dtype == torch.bfloat16  # what F.linear gives under autocast
    assert int8_linear(torch.randn(0, 48), q).shape == (0, 32)


def _kernels() -> list:
    return [pytest.param(k, marks=pytest.mark.skipif(k not in int8_module.kernel_candidates(),
                                                     reason=f"no {k} int8 kernel on this CPU"))
            for k in int8_module.KERNELS]


@pytest.mark.parametrize("kernel", _kernels())
@torch.no_grad()
def test_each_kernel_s_integer_product_is_exact_with_the_weights_range_it_gets(kernel, monkeypatch):
    """A kernel gets weights of +-127 only where the probe found its product exact for them (VNNI), else +-63
    (AVX2's 16-bit saturation); either way the product of worst-case operands is exact, and a quantized
    layer's output is the quantized operands' product, scaled, to float32 rounding."""
    w_max = 127 if full_range_int8(kernel) else 63
    g = torch.Generator().manual_seed(1)
    a = torch.where(torch.rand(64, 512, generator=g) < 0.5, 127, -127).to(torch.int8)
    w = torch.where(torch.rand(48, 512, generator=g) < 0.5, w_max, -w_max).to(torch.int8)
    got = int8_module._product(kernel, int8_module._pack(kernel, w), a, torch.ones(48))
    assert torch.equal(got.double(), a.double() @ w.double().t())
    monkeypatch.setattr(int8_module, "_kernel", lambda: (kernel, w_max))
    (layer,) = _layers((512, 48))
    q = layer.__dict__[int8_module._INT8][1]
    assert q.kernel == kernel
    x = torch.randn(3, 512, generator=g)
    amax = x.abs().amax(1, keepdim=True)
    w_scale = layer.weight.abs().amax(1) / w_max
    wq = torch.round(layer.weight / w_scale[:, None])
    xq = torch.round(x * (127 / amax))
    want = (xq.double() @ wq.double().t()) * (amax / 127).double() * w_scale.double() + layer.bias.double()
    torch.testing.assert_close(int8_linear(x, layer).double(), want, rtol=1e-5, atol=1e-5)
    assert int(wq.abs().max()) == w_max


@pytest.mark.parametrize("kernel", _kernels())
@torch.no_grad()
def test_a_quantized_layer_copies_and_its_copy_quantizes_its_own_weights(kernel, monkeypatch):
    """oneDNN's packed weights cannot be copied (an opaque tensor): a copied layer shares the quantized entry,
    which its own weights, at other addresses, then replace on first use."""
    monkeypatch.setattr(int8_module, "_kernel", lambda: (kernel, 63))
    (layer,) = _layers((64, 16))
    x = torch.randn(5, 64)
    want = int8_linear(x, layer)
    twin = copy.deepcopy(layer)
    assert torch.equal(int8_linear(x, twin), want)
    assert twin.__dict__[int8_module._INT8][1] is not layer.__dict__[int8_module._INT8][1]
    twin.weight.mul_(2)
    assert torch.equal(int8_linear(x, layer), want)


@pytest.mark.parametrize("kernel", _kernels())
@torch.no_grad()
def test_six_bit_weights_stay_close_to_the_float_product(kernel, monkeypatch):
    monkeypatch.setattr(int8_module, "_kernel", lambda: (kernel, 63))
    (layer,) = _layers((64, 16))
    x = torch.randn(5, 64)
    assert _relative_error(int8_linear(x, layer), F.linear(x, layer.weight, layer.bias)) < 0.04


def test_the_encoders_dense_layers_are_quantized_and_the_heads_are_not(tiny_config):
    model = BertForSequenceClassification(tiny_config(num_labels=3))
    quantize_int8(model)
    encoder = [m for m in model.bert.modules() if isinstance(m, nn.Linear)]
    assert len(encoder) == 6 * model.config.num_hidden_layers + 1  # q, k, v, attention out, in, out; pooler
    assert quantized_layers(model) == encoder and all(is_quantized(m) for m in encoder)
    assert not is_quantized(model.classifier)


@pytest.mark.parametrize("causal", [False, True], ids=["unpadded", "causal-reference"])
def test_a_quantized_model_is_close_to_float_in_inference_and_float_elsewhere(causal, tiny_config, randomize,
                                                                              make_batch):
    config = tiny_config(is_decoder=True) if causal else tiny_config()
    reference = randomize(BertModel(config), std=0.05).eval()
    model = speed_up(copy.deepcopy(reference), freeze=True, int8=True)
    state = {k: v.clone() for k, v in reference.state_dict().items()}
    batch = make_batch(config, lengths=(11, 7, 4))
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        want = reference(**batch).last_hidden_state
        got = model(**batch).last_hidden_state
    assert 0 < _relative_error(got[real], want[real]) < 0.05
    assert torch.all(got[~real] == 0) or causal  # unpadded: zeros at padding, as the reference
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())  # the checkpoint is unchanged
    with torch.enable_grad():  # gradients on: the float weights, exactly the reference's path
        assert torch.allclose(model(**batch).last_hidden_state[real], want[real], atol=1e-5)
    model.train()
    assert torch.allclose(model(**batch).last_hidden_state[real], reference.train()(**batch).last_hidden_state[real],
                          atol=1e-5)
    model.eval()
    with torch.no_grad(), int8_weights(model, False):
        assert torch.allclose(model(**batch).last_hidden_state[real], want[real], atol=1e-5)
    assert all(is_quantized(m) for m in quantized_layers(model))  # as it was after the block
    quantize_int8(model, False)
    assert not any(is_quantized(m) for m in model.modules())
    assert all("forward" not in m.__dict__ for m in quantized_layers(model))
    with torch.no_grad():
        assert torch.allclose(model(**batch).last_hidden_state[real], want[real], atol=1e-5)


@torch.no_grad()
def test_int8_weights_follow_weights_changed_in_place_or_replaced(tiny_config, make_batch):
    model = speed_up(BertModel(tiny_config()).eval(), freeze=True, int8=True)
    batch = make_batch(model.config)
    before = model(**batch).last_hidden_state
    other = BertModel(tiny_config()).state_dict()
    model.load_state_dict(other)  # copy_ in place: the version counters move
    after = model(**batch).last_hidden_state
    fresh = speed_up(BertModel(tiny_config()).eval(), freeze=True, int8=True)
    fresh.load_state_dict(other)
    assert not torch.equal(before, after)
    assert torch.equal(after, fresh(**batch).last_hidden_state)


def test_export_runs_the_float_weights(tiny_config, monkeypatch):
    (layer,) = _layers((16, 8))
    x = torch.randn(3, 16)
    monkeypatch.setattr(int8_module, "tracing", lambda: True)
    with torch.no_grad():
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))


def test_int8_is_an_inference_precision_on_cpu_only():
    assert prec.resolve_precision("int8", "cpu", inference=True) == "int8"
    assert prec.dtype_of("int8") == prec.dtype_of(prec.resolve_precision("auto", "cpu"))  # the float rest: auto's
    with pytest.raises(ValueError, match="int8 is for inference"):
        TrainConfig(precision="int8")
    with pytest.raises(ValueError, match="int8 is for inference"):
        prec.resolve_precision("int8", "cpu")
    with pytest.raises(ValueError, match="int8 runs on CPU; on cuda use bf16 or fp16"):
        prec.resolve_precision("int8", "cuda", inference=True)
    with pytest.raises(ValueError, match="must be one of auto, fp32, bf16, fp16, int8"):
        prec.check_precision("int4", inference=True)


# ------------------------------------------------------------------ through the commands and APIs
@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    from data_fixtures import VOCAB_SIZE, write_tokenizer

    from bertforge.model.config import BertConfig

    folder = tmp_path_factory.mktemp("int8") / "classifier"
    torch.manual_seed(2)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=VOCAB_SIZE, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64, num_labels=2, id2label={0: "neg", 1: "pos"}))
    model.save_pretrained(folder)
    write_tokenizer(folder)
    return folder


TEXTS = ["the old house by the river .", "a good book", "the river was long , and the road was short !"]


def test_predictor_and_features_run_int8_and_leave_other_precisions_alone(classifier):
    from bertforge.serving.features import embed, extract_features
    from bertforge.serving.predictor import Predictor

    fp32 = Predictor.from_pretrained(classifier, device="cpu")
    int8 = Predictor.from_pretrained(classifier, device="cpu", precision="int8")
    assert int8.precision == "int8" and all(is_quantized(m) for m in quantized_layers(int8.model))
    assert not any(is_quantized(m) for m in quantized_layers(fp32.model))
    a, b = fp32.classify(TEXTS), int8.classify(TEXTS)
    diff = max(abs(x - y) for p, q in zip(a, b) for x, y in zip(p["probabilities"].values(),
                                                               q["probabilities"].values()))
    assert 0 < diff < 0.05
    vectors = {p: extract_features(classifier, TEXTS, pooling="mean", precision=p, device="cpu").values for p in
               ("fp32", "int8")}
    cos = [float(np.dot(u, v) / np.linalg.norm(u) / np.linalg.norm(v)) for u, v in zip(*vectors.values())]
    assert min(cos) > 0.99 and vectors["fp32"].tolist() != vectors["int8"].tolist()
    encoder = fp32.model.bert
    assert np.array_equal(embed(encoder, fp32.tokenizer, TEXTS, precision="fp32"), vectors["fp32"])
    embed(encoder, fp32.tokenizer, TEXTS, precision="int8")
    assert not any(is_quantized(m) for m in quantized_layers(encoder))  # int8 for that call only
    with pytest.raises(ValueError, match="int8 runs on CPU"):
        Predictor(fp32.model, fp32.tokenizer, "classification", device="meta", precision="int8")
    from starlette.testclient import TestClient

    from bertforge.serving.http import create_app

    assert TestClient(create_app(int8)).get("/health").json()["precision"] == "int8"  # /health says so


def test_evaluate_and_the_command_line_take_int8(classifier, tmp_path, capsys):
    from bertforge import cli
    from bertforge.tasks.finetune import evaluate

    data = tmp_path / "dev.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": ("neg", "pos")[i % 2]}) + "\n"
                            for i, t in enumerate(TEXTS * 4)))
    settings = dict(task="classification", text_column="text", label_column="label")
    int8 = evaluate(classifier, data, precision="int8", settings=settings)
    assert 0 <= int8["accuracy"] <= 1
    assert cli.main(["predict", str(classifier), TEXTS[0], "--precision", "int8", "--format", "jsonl"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["label"] in ("neg", "pos")
    assert cli.main(["finetune", "--precision", "int8"]) == 2  # training's precisions are the flag's choices
    assert "--precision: expected one of auto, fp32, bf16, fp16, got 'int8'" in capsys.readouterr().err


# ------------------------------------------------------------------ the kernel choice, and int8 where it does not pay
def test_the_probe_times_each_exact_kernel_and_keeps_its_answer_per_machine(tmp_path, monkeypatch):
    """The probe measures fp32 and every exact kernel once per machine, keeps the times in the cache folder
    and takes the fastest kernel that beats fp32, or none; a damaged cache is measured again."""
    monkeypatch.undo()  # the real int8_choice, not the untimed one the tests run with
    monkeypatch.setenv("BERTFORGE_CACHE", str(tmp_path))
    times = int8_module.probe_times({k: 63 for k in int8_module.kernel_candidates()}, repeats=1)
    assert set(times) == {"fp32", *int8_module.kernel_candidates()} and all(0 < t < 1e4 for t in times.values())
    measured = []

    def fake(w_max, repeats=5):
        measured.append(sorted(w_max))
        return {"fp32": 2.0, **{k: 1.0 + i for i, k in enumerate(w_max)}}

    monkeypatch.setattr(int8_module, "probe_times", fake)
    int8_module.int8_choice.cache_clear()
    try:
        first = int8_module.int8_choice()
        want = int8_module.kernel_candidates()[0] if int8_module.kernel_candidates() else None
        assert first.kernel == want and "measured now" in first.source
        int8_module.int8_choice.cache_clear()
        assert int8_module.int8_choice().times == first.times and len(measured) == 1  # read back, not measured
        entry = json.loads(int8_module.probe_file().read_text())["entries"]
        assert len(entry) == 1 and "int8 probe 2" in next(iter(entry))
        monkeypatch.setattr(int8_module, "probe_times", lambda w_max, repeats=5: {"fp32": 1.0, **dict.fromkeys(w_max,
                                                                                                              3.0)})
        int8_module.probe_file().write_text("{not json")
        int8_module.int8_choice.cache_clear()
        slow = int8_module.int8_choice()
        assert slow.kernel is None and "measured now" in slow.source
        assert all(f"{k} 3.00 ms (0.33x)" in slow.summary() for k in int8_module.kernel_candidates())
    finally:
        int8_module.int8_choice.cache_clear()


def test_where_no_kernel_beats_fp32_int8_runs_fp32_and_says_so(classifier, monkeypatch, caplog, capsys):
    """The Predictor, /health, evaluate and the command line run fp32 for --precision int8 where the probe
    found int8 slower, with one warning that names the CPU and the times."""
    from starlette.testclient import TestClient

    from bertforge import cli
    from bertforge.serving.http import create_app
    from bertforge.serving.predictor import Predictor

    slow = int8_module.Int8Choice(None, {"onednn": 63}, {"fp32": 1.0, "onednn": 3.0}, "measured before")
    monkeypatch.setattr(int8_module, "int8_choice", lambda: slow)
    prec._int8_pays.cache_clear()
    with caplog.at_level("WARNING", logger="bertforge"):
        predictor = Predictor.from_pretrained(classifier, device="cpu", precision="int8")
        assert prec.resolve_precision("int8", "cpu", inference=True) == "fp32"
    warnings = [r.getMessage() for r in caplog.records if "precision int8" in r.getMessage()]
    assert len(warnings) == 1 and "no int8 kernel beats fp32 on this CPU" in warnings[0]
    assert "onednn 3.00 ms (0.33x)" in warnings[0] and warnings[0].endswith("running fp32")
    assert predictor.precision == "fp32" and not any(is_quantized(m) for m in quantized_layers(predictor.model))
    health = TestClient(create_app(predictor)).get("/health").json()
    assert health["precision"] == "fp32" and "no int8 kernel beats fp32" in health["precision_note"]
    prec._int8_pays.cache_clear()
    assert cli.main(["predict", str(classifier), TEXTS[0], "--precision", "int8"]) == 0
    err = capsys.readouterr().err
    assert err.count("WARNING:bertforge:precision int8: no int8 kernel beats fp32") == 1


def test_the_demo_s_inference_table_lists_int8_only_where_it_pays(classifier, monkeypatch):
    from bertforge.demo.run import _inference_table, time_inference

    texts = TEXTS * 4
    assert set(time_inference(classifier, texts, torch.device("cpu"))) >= {"fp32", "int8"}
    slow = int8_module.Int8Choice(None, {"onednn": 63}, {"fp32": 1.0, "onednn": 3.0}, "measured before")
    monkeypatch.setattr(int8_module, "int8_choice", lambda: slow)
    prec._int8_pays.cache_clear()
    assert "int8" not in time_inference(classifier, texts, torch.device("cpu"))
    table = _inference_table({"inference": {"precisions": {"fp32": {"sentences_per_s": 10.0, "vs_fp32": 1.0,
                                                                  "cosine_min": 1.0, "cosine_mean": 1.0}},
                                            "sentences": 12, "model": "m", "int8": prec.int8_note()}})
    assert any("int8 is not listed: no int8 kernel beats fp32 on this CPU" in line for line in table)


def test_a_kernel_that_fails_to_run_is_left_out_of_the_choice(monkeypatch, tmp_path):
    monkeypatch.undo()
    monkeypatch.setenv("BERTFORGE_CACHE", str(tmp_path))

    def broken(kernel, wq):
        raise RuntimeError("onednn int8 linear: not on this CPU")

    monkeypatch.setattr(int8_module, "_pack", broken)
    monkeypatch.setattr(int8_module, "probe_times", lambda w_max, repeats=5: {"fp32": 1.0, **dict.fromkeys(w_max,
                                                                                                          0.5)})
    int8_module.int8_choice.cache_clear()
    int8_module.full_range_int8.cache_clear()
    try:
        choice = int8_module.int8_choice()
        assert choice.kernel is None and choice.w_max == {} and "no exact int8 kernel" in choice.summary()
    finally:
        int8_module.int8_choice.cache_clear()
        int8_module.full_range_int8.cache_clear()


# ------------------------------------------------------------------ the fused passes
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.no_grad()
def test_the_fused_passes_compute_what_the_pytorch_ops_do(dtype):
    """The compiled quantize gives the very bytes and scales of the PyTorch ops (a zero row, a row with one
    huge value, both byte forms); the compiled scaling back gives their outputs to one rounding of the
    output's dtype."""
    from bertforge.fast.kernels import cpu_kernels

    ops = cpu_kernels()
    if ops is None:
        pytest.skip("no C++ compiler here: the fused passes are not built")
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(300, 384, generator=g) * 4).to(dtype)
    x[7] = 0
    x[8, 5] = 1e4
    xf = x.float()
    amax = xf.abs().amax(1, keepdim=True).clamp_min(2.0 ** -100)
    want = torch.round(xf * (127.0 / amax))
    assert torch.equal(want[7], torch.zeros(384))
    for unsigned in (False, True):
        q, s = ops.quantize_rows(x, unsigned)
        assert q.dtype == (torch.uint8 if unsigned else torch.int8) and torch.equal(s, amax / 127.0)
        assert torch.equal(q.float(), want + 128 * unsigned)
    acc = torch.randint(-2 ** 20, 2 ** 20, (300, 96), generator=g, dtype=torch.int32)
    ws, bias, s = torch.rand(96, generator=g), torch.randn(96, generator=g), torch.rand(300, 1, generator=g)
    reference = acc.float().mul_(ws).mul_(s).add_(bias)
    got = ops.dequantize_rows(acc, ws, s, bias, dtype == torch.bfloat16)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), reference.to(dtype).float(), rtol=2 ** -7 if dtype != torch.float32
                               else 1e-6, atol=0)
    torch.testing.assert_close(ops.dequantize_rows(acc.float(), None, s, None, False), acc.float() * s, rtol=1e-6,
                               atol=0)


def test_without_a_compiler_the_int8_path_runs_as_pytorch_ops_and_says_so_once(monkeypatch, caplog):
    from torch.utils import cpp_extension

    from bertforge.fast import kernels

    def no_compiler(*args, **kwargs):
        raise RuntimeError("Error building extension: c++: command not found")

    monkeypatch.setattr(cpp_extension, "load_inline", no_compiler)
    kernels.cpu_kernels.cache_clear()
    try:
        with caplog.at_level("INFO", logger="bertforge"):
            assert kernels.cpu_kernels() is None and kernels.cpu_kernels() is None
            (layer,) = _layers((64, 16))
            x = torch.randn(5, 64)
            with torch.no_grad():
                q = layer.__dict__[int8_module._INT8][1]
                assert torch.equal(int8_linear(x, layer), int8_module._linear_ops(x, q))
        said = [r.getMessage() for r in caplog.records if "could not be built" in r.getMessage()]
        assert said == ["bertforge's CPU kernels could not be built here (RuntimeError: Error building "
                        "extension: c++: command not found); PyTorch ops run instead"]
    finally:
        kernels.cpu_kernels.cache_clear()


@torch.no_grad()
def test_an_all_zero_row_gives_the_bias_on_both_paths():
    (layer,) = _layers((64, 16))
    q = layer.__dict__[int8_module._INT8][1]
    x = torch.zeros(3, 64)
    assert torch.equal(int8_module._linear_ops(x, q), layer.bias.expand(3, 16))
    assert torch.equal(int8_linear(x, layer), layer.bias.expand(3, 16))
