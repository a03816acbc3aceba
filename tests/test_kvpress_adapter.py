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

    Returns the cache, the keys and values written, ``{(chunk, layer): [1, H, L, D]}`` each, the probe
    queries ``{chunk: {layer: [1, H, D]}}`` and the chunk-1 rows per (layer, head) before its compaction.
    """
    gen = torch.Generator().manual_seed(0)
    cache = KVCache.from_geometry(G, layout=method.layout(G))
    written, queries = {}, {}
    for c in range(chunks):
        info = cache.begin_chunk(c, 2 * c, 2)
        queries[c] = {layer: torch.randn(1, G.num_heads, G.head_dim, generator=gen) for layer in range(G.num_layers)}
        method.before_denoise(cache, BeforeChunk(geometry=G, chunk=info, phase="context", queries=queries[c]))
        for layer in range(G.num_layers):
            k, v = torch.randn(2, 1, L, G.num_heads, G.head_dim, generator=gen).unbind(0)
            written[c, layer] = (k.transpose(1, 2), v.transpose(1, 2))
            cache.attend(layer, torch.randn(1, L, G.num_heads, G.head_dim, generator=gen), k, v)
        info = cache.commit_chunk()
        method.after_chunk(cache, ChunkSignals(geometry=G, chunk=info, phase="context", generated_index=None,
                                               context_frames=2 * chunks, seed=SEED, x0_final=torch.zeros(1)))
    return cache, written, queries


def expected_keep(press, layer: int, keys, values, query) -> torch.Tensor:
    """``bool [H, L]``: per head, the ``int(L * (1 - RATIO))`` highest of the press's own scores."""
    module = SimpleNamespace(layer_idx=layer, head_dim=G.head_dim, num_key_value_groups=1,
                             config=SimpleNamespace(num_attention_heads=G.num_heads, num_key_value_heads=G.num_heads,
                                                    head_dim=G.head_dim, hidden_size=G.num_heads * G.head_dim,
                                                    num_hidden_layers=G.num_layers, _attn_implementation="eager"))
    hidden = query.reshape(1, 1, -1)
    attentions = (torch.einsum("bhd,bhnd->bhn", query, keys) / math.sqrt(G.head_dim)).softmax(-1)[:, :, None]
    torch.manual_seed(derive_seed("kvpress", SEED, 1, layer))
    scores = press.score(module, hidden, keys, values, attentions, {})[0]  # [H, L]
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
    (and the newest chunk's probe query), earlier chunks and the window untouched; the global random
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
