"""The kvpress adapter against the real kvpress: what it keeps is what the press's own ``score`` ranks highest.

Geometry: 2 layers x 3 heads of 12 channels, 16 tokens per latent frame, chunks of 2 frames (32 tokens).
Four chunks of random keys and values are written through ``attend``; with sink 1 and window 2, the
commit of chunk 3 compacts chunk 1, whose rows every head then holds are compared with the top of the
press's scores computed here from the same tensors. The tests that need kvpress are skipped without it
(``pip install -e '.[kvpress]'``, README); the error without it is tested by hiding it.
"""

from __future__ import annotations

import importlib.util
import math
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from cmbench.cache import KVCache
from cmbench.errors import ConfigError
from cmbench.hashing import derive_seed
from cmbench.method_check import check_method
from cmbench.methods import build_method
from cmbench.methods.base import BeforeChunk, ChunkSignals
from cmbench.methods.kvpress_adapter import import_kvpress
from fakes import fake_geometry

needs_kvpress = pytest.mark.skipif(importlib.util.find_spec("kvpress") is None,
                                   reason="kvpress is not installed: pip install -e '.[kvpress]'")

G = fake_geometry(num_layers=2, num_heads=3, height=8, width=8)  # 16 tokens per frame, 32 per chunk
L, SEED, RATIO = 32, 7, 0.75
DOCS = Path(__file__).resolve().parents[1] / "docs" / "methods.md"


def presses() -> list[str]:
    if importlib.util.find_spec("kvpress") is None:
        return []
    from cmbench.methods.kvpress_adapter import runnable_presses

    return runnable_presses()[1]


def drive(method, chunks: int = 4):
    """Write ``chunks`` chunks of random K/V (and a probe query per chunk) through the adapter.

    Returns the cache, the keys and values written, ``{(chunk, layer): [1, H, L, D]}`` each, and every
    probe query ``{chunk: {layer: [1, L, H, D]}}`` (as the loop's probe records them).
    """
    gen = torch.Generator().manual_seed(0)
    cache = KVCache.from_geometry(G, layout=method.layout(G))
    written, queries = {}, {}
    for c in range(chunks):
        info = cache.begin_chunk(c, 2 * c, 2)
        queries[c] = {layer: 2 * torch.randn(1, L, G.num_heads, G.head_dim, generator=gen) for layer in range(G.num_layers)}
        method.before_denoise(cache, BeforeChunk(geometry=G, chunk=info, phase="context", probe_queries=queries[c],
                                                 queries={layer: q.mean(dim=1) for layer, q in queries[c].items()}))
        for layer in range(G.num_layers):
            k, v = torch.randn(2, 1, L, G.num_heads, G.head_dim, generator=gen).unbind(0)
            written[c, layer] = (k.transpose(1, 2), v.transpose(1, 2))
            cache.attend(layer, torch.randn(1, L, G.num_heads, G.head_dim, generator=gen), k, v)
        info = cache.commit_chunk()
        method.after_chunk(cache, ChunkSignals(geometry=G, chunk=info, phase="context", generated_index=None,
                                               context_frames=2 * chunks, seed=SEED, x0_final=torch.zeros(1)))
    return cache, written, queries


def shim(layer: int) -> SimpleNamespace:
    """The attributes of an LLM attention module that presses read, for one DiT layer (kvpress's view)."""
    return SimpleNamespace(layer_idx=layer, head_dim=G.head_dim, num_key_value_groups=1,
                           config=SimpleNamespace(num_attention_heads=G.num_heads, num_key_value_heads=G.num_heads,
                                                  head_dim=G.head_dim, hidden_size=G.num_heads * G.head_dim,
                                                  num_hidden_layers=G.num_layers, _attn_implementation="eager"))


def every_softmax(queries, keys) -> torch.Tensor:
    """``[1, H, Lq, L]``: each probe query's (``[1, Lq, H, D]``) softmax over the keys ``[1, H, L, D]``, whole."""
    return (torch.einsum("bqhd,bhnd->bhqn", queries, keys) / math.sqrt(G.head_dim)).softmax(-1)


def fed(press, queries, keys) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hidden_states [1, 1, H * D], attentions [1, H, 1, L])`` as kvpress's ``score`` should see them to give
    the adapter's scores: the mean over queries of their softmax; for ObservedAttentionPress, whose score
    divides the attention a key receives by the causal count ``arange(L, 0, -1)`` of queries that see it,
    that mean times the count (every probe query sees every candidate: the plain mean)."""
    attentions = every_softmax(queries, keys).mean(dim=2, keepdim=True)
    if type(press).__name__ == "ObservedAttentionPress":
        attentions = attentions * torch.arange(keys.shape[2], 0, -1)
    return queries.mean(dim=1).reshape(1, 1, -1), attentions


def expected_keep(press, layer: int, keys, values, queries) -> torch.Tensor:
    """``bool [H, L]``: per head, the ``int(L * (1 - RATIO))`` highest of the press's own scores."""
    hidden, attentions = fed(press, queries, keys)
    torch.manual_seed(derive_seed("kvpress", SEED, 1, layer))
    scores = press.score(shim(layer), hidden, keys, values, attentions, {})[0]  # [H, L]
    keep = torch.zeros(G.num_heads, L, dtype=torch.bool)
    for h in range(G.num_heads):
        ranked = sorted(range(L), key=lambda i: (-float(scores[h, i]), i))
        keep[h, ranked[: int(L * (1 - RATIO))]] = True
    return keep


@needs_kvpress
@pytest.mark.parametrize("press", presses())
def test_each_listed_press_keeps_exactly_the_tokens_its_own_score_ranks_highest(press):
    """Every press the adapter lists: after chunk 1 leaves the window, each head of each layer holds
    exactly the 8 of its 32 tokens the press's own ``score`` ranks highest on that layer's keys and values
    (and the mean over the newest chunk's probe queries of their softmax), earlier chunks and the window untouched; the global random
    state is as before (a stochastic press cannot move the sampler's noise)."""
    kvpress = import_kvpress()

    method = build_method({"name": "kvpress", "press": press, "compression_ratio": RATIO, "recent_chunks": 2})
    state = torch.get_rng_state()
    cache, written, queries = drive(method)
    assert torch.equal(torch.get_rng_state(), state)
    reference = getattr(kvpress, press)(compression_ratio=RATIO)
    for layer, banks in enumerate(cache.banks):
        keys, values = written[1, layer]
        keep = expected_keep(reference, layer, keys, values, queries[3][layer])
        for bank in banks:
            (head,) = bank.group.heads
            gids = bank.field("gid")
            kept = sorted(int(g) - L for g in gids if L <= g < 2 * L)
            assert kept == keep[head].nonzero().flatten().tolist(), (press, layer, head)
            assert sorted(set(range(4 * L)) - set(gids.tolist())) == sorted(set(range(L, 2 * L)) - {L + i for i in kept})


@needs_kvpress
@pytest.mark.parametrize("press", presses())
def test_each_press_scores_and_keeps_what_kvpress_compress_keeps_on_the_same_tensors(press):
    """One layer's 32 candidates and 32 probe queries: the adapter's scores are the press's own ``score``
    fed every query's softmax (``fed``), and the tokens it keeps per head (``int(32 * 0.25)`` = 8) are
    those kvpress's own ``compress`` keeps: its gathered keys, found among the candidates."""
    from cmbench.methods.kvpress_adapter import Probe, PressModule, build_press, kept_count, press_scores, top_tokens

    kvpress = import_kvpress()
    gen = torch.Generator().manual_seed(1)
    keys, values = torch.randn(2, 1, G.num_heads, L, G.head_dim, generator=gen).unbind(0)
    queries = 2 * torch.randn(1, L, G.num_heads, G.head_dim, generator=gen)
    ours, theirs = build_press(press, RATIO), getattr(kvpress, press)(compression_ratio=RATIO)
    reads = press in ("ObservedAttentionPress", "TOVAPress")  # the presses that read attention weights
    hidden, attentions = fed(theirs, queries, keys) if reads else (None, None)
    scores = press_scores(ours, PressModule.of(0, G.num_layers, G.num_heads, G.head_dim), keys, values,
                          Probe.of(queries, keys) if reads else None, 5)
    torch.manual_seed(5)
    assert torch.allclose(scores, theirs.score(shim(0), hidden, keys, values, attentions, {}), rtol=1e-5, atol=1e-8)
    torch.manual_seed(5)
    kept_keys, _ = theirs.compress(shim(0), hidden, keys, values, attentions, {})
    found = (kept_keys[0, :, :, None] == keys[0, :, None]).all(dim=-1)  # [H, kept, L]
    assert (found.sum(dim=-1) == 1).all() and kept_keys.shape[2] == kept_count(L, RATIO) == 8
    assert torch.equal(top_tokens(scores[0], kept_count(L, RATIO)), found.any(dim=1)), press


def test_probe_attention_is_the_mean_over_queries_of_their_softmax():
    """Not the softmax of the mean query: 40 queries of 3 heads over 5 keys, against the whole
    ``[1, H, 40, 5]`` softmax averaged over queries; each row sums to 1."""
    from cmbench.methods.kvpress_adapter import probe_attention

    gen = torch.Generator().manual_seed(2)
    queries, keys = 3 * torch.randn(2, 40, 3, 4, generator=gen), torch.randn(2, 3, 5, 4, generator=gen)
    got = probe_attention(queries, keys)
    want = (torch.einsum("bqhd,bhnd->bhqn", queries, keys) / 2).softmax(-1).mean(dim=2, keepdim=True)
    assert got.shape == (2, 3, 1, 5) and torch.allclose(got, want, atol=1e-6)
    assert torch.allclose(got.sum(-1), torch.ones(2, 3, 1))


@needs_kvpress
def test_the_probe_is_asked_for_only_by_presses_that_read_it():
    """A press that reads attention weights gets the newest chunk's queries (one probe call per chunk); a
    key-norm press runs without it."""
    assert build_method({"name": "kvpress", "press": "ObservedAttentionPress"}).needs().query_probe
    assert not build_method({"name": "kvpress", "press": "KnormPress"}).needs().query_probe


@needs_kvpress
def test_a_press_with_its_own_fields_by_target():
    """``{_target_: RandomPress, seed: 3}``: the press is built with its own field (its seed decides, not
    the run's), and the adapter's compression ratio is set on it."""
    method = build_method({"name": "kvpress", "press": {"_target_": "kvpress.RandomPress", "seed": 3},
                           "compression_ratio": 0.25})
    assert (method._press.seed, method._press.compression_ratio) == (3, 0.25)


@needs_kvpress
@pytest.mark.parametrize("press, message", [
    ("SnapKVPress", r"press SnapKVPress cannot run on a DiT \(AssertionError: Query length 1 should be greater"),
    ("NoSuchPress", r"kvpress [\d.]+ has no press 'NoSuchPress'"),
    ("cmbench.errors.ConfigError", r"is not a press class with a score method"),
])
def test_a_press_that_cannot_run_is_one_line_naming_it(press, message):
    with pytest.raises(ConfigError, match=message) as err:
        build_method({"name": "kvpress", "press": press})
    assert "\n" not in str(err.value)


@needs_kvpress
def test_the_listing_and_the_docs_cover_every_press_of_kvpress():
    """``ls method`` lists the presses that run (at least five, two of them reading attention weights);
    docs/methods.md names every other press kvpress exports with the reason it cannot run, and none that
    runs."""
    kvpress = import_kvpress()

    from cmbench.cli.ls import press_listing

    runs = set(presses())
    assert {"KnormPress", "ObservedAttentionPress", "TOVAPress"} <= runs and len(runs) >= 5
    listed = ", ".join(p for p in kvpress.__all__ if p in runs)
    assert press_listing() == f"presses that run on kvpress {version('kvpress')}: {listed}"
    text = DOCS.read_text()
    section = text[text.index("<!-- kvpress-cannot-run -->"):text.index("<!-- /kvpress-cannot-run -->")]
    lines = re.findall(r"^- ((?:`\w+`(?:, )?)+): \S", section, flags=re.M)  # "- `A`, `B`: why"
    explained = {name for line in lines for name in re.findall(r"`(\w+)`", line)}
    assert explained == set(kvpress.__all__) - runs


@needs_kvpress
def test_ls_lists_the_presses_under_each_method_that_takes_one(capsys):
    """``kvpress_decoding`` takes a press too (DecodingPress's base press): ``ls method`` lists the presses under
    it as under ``kvpress``, and under no other method."""
    from cmbench.cli.ls import execute, press_listing

    assert execute(["method"]) == 0
    lines = capsys.readouterr().out.splitlines()
    listing = press_listing()
    under = [lines[i - 1].split()[0] for i, line in enumerate(lines) if line.strip() == listing]
    assert under == ["kvpress", "kvpress_decoding"]


@needs_kvpress
def test_the_contract_check_passes_with_the_probe():
    """The method contract (``check``) with a press that reads the probe: the loop's query probe reaches
    the compaction (the unit tests above hand the queries over by hand)."""
    results = check_method({"name": "kvpress", "press": "ObservedAttentionPress"}, context_chunks=5,
                           continuation_chunks=2)
    assert all(r.passed for r in results), [r for r in results if not r.passed]


def test_without_kvpress_the_method_is_one_line_naming_the_extra(monkeypatch):
    """With kvpress absent, ``method=kvpress`` is a one-line error that names the extra to install, and
    ``ls`` says the same instead of listing presses."""
    from cmbench.cli.ls import press_listing

    monkeypatch.setitem(sys.modules, "kvpress", None)
    with pytest.raises(ConfigError, match=re.escape("pip install -e '.[kvpress]'")) as err:
        build_method({"name": "kvpress"})
    assert "\n" not in str(err.value)
    assert press_listing() == "presses: kvpress is not installed (pip install -e '.[kvpress]')"


@needs_kvpress
def test_loading_kvpress_leaves_transformers_attention_to_the_other_models_in_the_process():
    """kvpress wraps transformers' registered attention functions when imported; the wrapper takes
    ``dropout`` positionally, which SAM 2's attention call does not pass. Loading kvpress through the
    adapter (a fresh process: the import happens once) leaves every function as transformers had it, and
    a tiny SAM 2 attention layer still runs after it."""
    script = (
        "from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS as f\n"
        "before = {k: f[k] for k in f}\n"
        "from cmbench.methods.kvpress_adapter import import_kvpress, press_class\n"
        "import_kvpress(); press_class('KnormPress'); press_class('kvpress.KeyDiffPress')\n"
        "changed = sorted(k for k in before if f[k] is not before[k])\n"
        "assert not changed, changed\n"
        "import torch\n"
        "from transformers.models.sam2.modeling_sam2 import Sam2Attention\n"
        "from transformers import Sam2MaskDecoderConfig\n"
        "cfg = Sam2MaskDecoderConfig(hidden_size=16, num_attention_heads=2)\n"
        "cfg._attn_implementation = 'sdpa'\n"
        "layer = Sam2Attention(cfg)\n"
        "x = torch.randn(1, 1, 5, 16)\n"
        "assert layer(x, x, x)[0].shape == (1, 1, 5, 16)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("tokens, ratio, kept", [
    (32, 0.7, 9),  # 9.6: rounding up or to nearest would keep 10
    (32, 0.3, 22),  # 22.4: rounding up keeps 23
    (10, 0.15, 8),  # 8.5: rounding up or half up keeps 9
    (32, 0.75, 8),  # whole
    (3, 0.9, 1),  # 0.3: at least one
    (32, 0.0, 32),
])
def test_kept_count_keeps_the_integer_part_as_kvpress_does(tokens, ratio, kept):
    from cmbench.methods.kvpress_adapter import kept_count

    assert kept_count(tokens, ratio) == kept
    if importlib.util.find_spec("kvpress") is not None:
        from kvpress.utils import compute_n_kept

        assert compute_n_kept(tokens, ratio) == kept
