"""Text prompts: decode(ctx, "text") and ``run --prompt`` on a tiny llama GGUF with a real SPM
vocabulary (the first tokens of llama.cpp's ggml-vocab-llama-spm test file, with their scores and
types: <unk>, <s>, </s>, the 256 byte tokens, then the best merges)."""

from __future__ import annotations

import dataclasses
import gzip
from pathlib import Path

import numpy as np
import pytest

from toolkit.jaxrt.devices import request_cpu_devices  # noqa: E402

request_cpu_devices(4)

from toolkit.context import Context  # noqa: E402
from toolkit.errors import ParameterError  # noqa: E402
from toolkit.jaxrt.cli import main as run_main  # noqa: E402
from toolkit.jaxrt.gguf_io import write_gguf  # noqa: E402
from toolkit.jaxrt.runtime import decode, generate, runtime_of  # noqa: E402
from toolkit.models import ContextParams, presets  # noqa: E402
from toolkit.models.gguf_file import open_gguf  # noqa: E402
from toolkit.models.tokenizer import load_vocab  # noqa: E402

DATA = Path(__file__).parent / "data" / "tokenizer"
N_VOCAB = 512
TEXT = "The capital of France is"


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("prompt")
    full = d / "llama-spm.gguf"
    full.write_bytes(gzip.decompress((DATA / "ggml-vocab-llama-spm.gguf.gz").read_bytes()))
    f = open_gguf(full)
    vocab = {k: f.get_array(f"tokenizer.ggml.{key}").tolist()[:N_VOCAB]  # type: ignore[union-attr]
             for k, key in (("tokens", "tokens"), ("scores", "scores"), ("token_types", "token_type"))}
    hp = dataclasses.replace(presets.tiny("f32"), n_vocab=N_VOCAB)
    path = d / "tiny-spm.gguf"
    write_gguf(path, hp, seed=3, vocab=vocab)
    return path


def _ctx(path: Path) -> Context:
    cp = ContextParams(n_ctx=64, n_batch=64, n_ubatch=32, flash_attn="off")
    return Context(str(path), cp)


def test_decode_takes_a_text(spm_model: Path) -> None:
    vocab = load_vocab(spm_model)
    ids = vocab.tokenize(TEXT, add_special=True, parse_special=True)
    assert ids[0] == 1 and max(ids) < N_VOCAB
    assert vocab.detokenize(ids, special=False) == " " + TEXT
    ctx = _ctx(spm_model)
    by_text = decode(ctx, TEXT)
    runtime_of(ctx).clear(data=True)
    by_ids = decode(ctx, ids)
    assert by_text.shape == (len(ids), N_VOCAB)
    np.testing.assert_array_equal(by_text, by_ids)
    runtime_of(ctx).clear(data=True)
    assert generate(ctx, TEXT, 2) == generate(_ctx(spm_model), ids, 2)


def test_a_context_without_a_vocabulary_refuses_a_text() -> None:
    hp = dataclasses.replace(presets.tiny("f32"), n_vocab=256)
    ctx = Context(hp, ContextParams(n_ctx=64, n_batch=64, n_ubatch=32, flash_attn="off"))
    with pytest.raises(ParameterError, match="no GGUF vocabulary"):
        decode(ctx, TEXT)


def test_run_prompt_prints_the_top_tokens_as_text(spm_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_main(["--gguf", str(spm_model), "--prompt", TEXT, "--n-ctx", "64", "--n-ubatch", "32"]) == 0
    out = capsys.readouterr().out
    vocab = load_vocab(spm_model)
    ids = vocab.tokenize(TEXT, add_special=True, parse_special=True)
    assert f"prompt {TEXT!r} -> tokens {ids}" in out
    top = next(line for line in out.splitlines() if line.startswith("last token logits"))
    argmax = int(top.split("argmax ")[1].split(",")[0])
    assert f"{argmax}:" in top and repr(vocab.piece(argmax)) in top


def test_the_dashboard_tokens_box_takes_a_text_for_a_gguf_context() -> None:
    from toolkit.ui.panels import parse_prompt

    assert parse_prompt("1, 2, 3", 512, has_vocab=True) == [1, 2, 3]
    assert parse_prompt(TEXT, 512, has_vocab=True) == TEXT
    with pytest.raises(ParameterError, match="tokens="):
        parse_prompt(TEXT, 512, has_vocab=False)     # no vocabulary: ids only
    with pytest.raises(ParameterError, match="tokens="):
        parse_prompt("1, 600", 512, has_vocab=True)  # ids past the vocabulary stay an error


def test_the_dashboard_runs_a_text_and_shows_the_next_tokens_as_text(spm_model: Path) -> None:
    """The run button of a GGUF context's dashboard: the text's ids as the file's tokenizer gives them, and
    the five best next tokens (ids and pieces) of the logits decode() gives for the same ids; ids typed in
    the box show their next tokens as text too, and each run starts from an empty KV cache."""
    import html
    import json
    import re

    import toolkit

    vocab = load_vocab(spm_model)
    ids = vocab.tokenize(TEXT, add_special=True, parse_special=True)
    want = decode(_ctx(spm_model), ids)[-1]
    best = [int(i) for i in np.argsort(-want, kind="stable")[:5]]
    db = toolkit.dashboard(str(spm_model), n_ctx=64, n_batch=64, n_ubatch=32, flash_attn="off")
    for typed in (TEXT, ", ".join(map(str, ids))):
        db.tokens.value = typed
        db.run_button.click()
        out = db.runner.html.value
        m = re.search(r"data-tokens='([^']*)' data-top='([^']*)'", out)
        assert m is not None, out
        assert json.loads(m.group(1)) == ids and json.loads(m.group(2)) == best
        assert f"next: {vocab.piece(best[0])!r} ({best[0]})" in html.unescape(out)
        assert (f"{TEXT!r} → " in html.unescape(out)) == (typed == TEXT)
        db.runner.html.value = ""   # the next run starts from an empty cache: the same answer for the same ids


def test_top_tokens_orders_ids_and_names_pieces(spm_model: Path) -> None:
    from toolkit.models.tokenizer import top_tokens

    vocab = load_vocab(spm_model)
    row = [0.0] * 520
    row[300], row[7], row[515], row[8] = 3.0, 2.0, 2.0, 1.0   # a tie (7, 515) and an id past the vocabulary
    assert top_tokens(row, 4, vocab) == [(300, 3.0, vocab.piece(300)), (7, 2.0, vocab.piece(7)), (515, 2.0, None),
                                         (8, 1.0, vocab.piece(8))]
    assert [p for _, _, p in top_tokens(row, 2)] == [None, None]
    with pytest.raises(ParameterError, match="k=0"):
        top_tokens(row, 0, vocab)
