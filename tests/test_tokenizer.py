"""The GGUF file's own tokenizer against llama.cpp's tokenizer test files (tests/data/tokenizer).

Each ``ggml-vocab-NAME.gguf`` (stored gzipped) comes with llama.cpp's ``.inp`` texts and the ``.out``
ids llama.cpp's ``test-tokenizer-0`` expects for them (add_special and parse_special off).
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.errors import ParameterError, ToolkitError
from toolkit.models.tokenizer import (
    SUPPORTED_PRE,
    TokenizerError,
    Vocab,
    load_vocab,
    read_tests,
)

DATA = Path(__file__).parent / "data" / "tokenizer"
ROOT = Path(__file__).resolve().parents[1]
VOCABS = sorted(p.name[len("ggml-vocab-"):-len(".gguf.gz")] for p in DATA.glob("ggml-vocab-*.gguf.gz"))
# texts per vocabulary (read_tests keys a map by text, so a repeated text counts once)
N_TEXTS = {name: 50 if name == "qwen35" else 46 for name in VOCABS}


@pytest.fixture(scope="module")
def vocab_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("vocab")
    for name in VOCABS:
        (d / f"ggml-vocab-{name}.gguf").write_bytes(gzip.decompress((DATA / f"ggml-vocab-{name}.gguf.gz").read_bytes()))
    return d


def test_the_vocabularies_are_there() -> None:
    assert set(VOCABS) >= {"llama-spm", "gpt-2", "deepseek-llm", "llama-bpe", "qwen2", "qwen35", "command-r"}


@pytest.mark.parametrize("name", VOCABS)
def test_every_text_gives_llama_cpp_ids(name: str, vocab_dir: Path) -> None:
    vocab = load_vocab(vocab_dir / f"ggml-vocab-{name}.gguf")
    tests = read_tests(DATA / f"ggml-vocab-{name}.gguf.inp", DATA / f"ggml-vocab-{name}.gguf.out")
    assert len(tests) == N_TEXTS[name]
    got = {t: vocab.tokenize(t, add_special=False, parse_special=False) for t in tests}
    wrong = {t: (got[t], ids) for t, ids in tests.items() if got[t] != ids}
    assert not wrong, f"{name}: {len(wrong)} of {len(tests)} texts differ: {list(wrong.items())[:3]}"


@pytest.mark.parametrize("name", ["llama-spm", "gpt-2", "llama-bpe", "qwen2"])
def test_detokenize_gives_the_text_back(name: str, vocab_dir: Path) -> None:
    vocab = load_vocab(vocab_dir / f"ggml-vocab-{name}.gguf")
    tests = read_tests(DATA / f"ggml-vocab-{name}.gguf.inp", DATA / f"ggml-vocab-{name}.gguf.out")
    for text, ids in tests.items():
        got = vocab.detokenize(ids)
        # SPM adds a leading space (add_space_prefix), which the piece of the first token carries
        want = " " + text if vocab.add_space_prefix and text else text
        assert got == want


def test_special_flags_of_the_files(vocab_dir: Path) -> None:
    spm = load_vocab(vocab_dir / "ggml-vocab-llama-spm.gguf")
    assert (spm.bos, spm.eos, spm.add_bos, spm.add_space_prefix) == (1, 2, True, True)
    assert spm.tokenize("Hello world") == [1, *spm.tokenize("Hello world", add_special=False)]
    bpe = load_vocab(vocab_dir / "ggml-vocab-llama-bpe.gguf")
    assert bpe.add_bos and bpe.bos == 128000
    assert bpe.tokenize("Hello world") == [128000, 9906, 1917]
    gpt2 = load_vocab(vocab_dir / "ggml-vocab-gpt-2.gguf")
    assert not gpt2.add_bos
    assert gpt2.piece(gpt2.tokenize(" world", add_special=False)[0]) == " world"
    # control tokens are split out only with parse_special
    assert bpe.tokenize("<|begin_of_text|>x", add_special=False, parse_special=True)[0] == 128000
    assert 128000 not in bpe.tokenize("<|begin_of_text|>x", add_special=False)


def test_cli_json_and_ids(vocab_dir: Path) -> None:
    f = vocab_dir / "ggml-vocab-llama-bpe.gguf"
    tests = read_tests(DATA / "ggml-vocab-llama-bpe.gguf.inp", DATA / "ggml-vocab-llama-bpe.gguf.out")
    texts = list(tests)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "toolkit", "tokenize", "-m", str(f), "--json"],
                       input=json.dumps(texts), capture_output=True, text=True, env=env, check=True)
    assert json.loads(r.stdout) == [tests[t] for t in texts]
    r = subprocess.run([sys.executable, "-m", "toolkit", "tokenize", "-m", str(f), "Hello world"],
                       capture_output=True, text=True, env=env, check=True)
    assert r.stdout == "[128000, 9906, 1917]\n"
    r = subprocess.run([sys.executable, "-m", "toolkit", "tokenize", "-m", str(f), "--json"],
                       input='{"not": "a list"}', capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "a JSON list of strings" in r.stderr


def test_typed_errors(vocab_dir: Path) -> None:
    with pytest.raises(TokenizerError) as e:
        Vocab.from_tokens(["a", "b"], model="gpt2", pre="no-such-pre")
    assert e.value.key == "tokenizer.ggml.pre" and e.value.value == "no-such-pre"
    assert "'llama-bpe'" in str(e.value) and "'qwen2'" in str(e.value)
    assert set(e.value.supported) == set(SUPPORTED_PRE)
    with pytest.raises(TokenizerError, match="tokenizer.ggml.model='bert'"):
        Vocab.from_tokens(["a"], model="bert")
    vocab = load_vocab(vocab_dir / "ggml-vocab-gpt-2.gguf")
    with pytest.raises(ParameterError, match="token="):
        vocab.token_to_piece(vocab.n_tokens)
    with pytest.raises(ParameterError, match="text="):
        vocab.tokenize(b"bytes")  # type: ignore[arg-type]
    assert issubclass(TokenizerError, ToolkitError)


def test_typed_errors_from_gguf_files(tmp_path: Path) -> None:
    from gguf import GGUFWriter

    def write(name: str, model: str | None, pre: str | None) -> Path:
        path = tmp_path / f"{name}.gguf"
        w = GGUFWriter(str(path), "llama")
        if model is not None:
            w.add_tokenizer_model(model)
            w.add_token_list([b"a", b"b", b"ab"])
            w.add_token_merges([b"a b"])
        if pre is not None:
            w.add_tokenizer_pre(pre)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path

    with pytest.raises(TokenizerError) as e:
        load_vocab(write("pre", "gpt2", "no-such-pre"))
    assert (e.value.key, e.value.value) == ("tokenizer.ggml.pre", "no-such-pre") and "'gpt-2'" in str(e.value)
    with pytest.raises(TokenizerError, match="tokenizer.ggml.model=None .*has no vocabulary"):
        load_vocab(write("none", None, None))
    v = load_vocab(write("ok", "gpt2", "gpt-2"))
    assert v.tokenize("ab", add_special=False) == [2] and v.tokenize("ba", add_special=False) == [1, 0]
