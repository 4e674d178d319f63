"""A text prompt in the dashboard, in JupyterLab: a notebook (written by this test) makes a tiny llama GGUF
with a real SPM vocabulary (the first 512 tokens of llama.cpp's ggml-vocab-llama-spm), prints what
``toolkit.jaxrt.decode`` gives for a text through the Python API, and opens ``toolkit.dashboard`` on the file.
The test types the text into the dashboard's tokens box in the page and presses "run prompt": the page must
show the same token ids and the same five next tokens, each as text.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import nbformat
from conftest import LabServer, NotebookRun
from test_dashboard import UPDATE_TIMEOUT_S
from testenv import REPO_ROOT

TEXT = "The capital of France is"
VOCAB = REPO_ROOT / "tests" / "data" / "tokenizer" / "ggml-vocab-llama-spm.gguf.gz"

MAKE_MODEL = f"""\
import dataclasses, gzip, json
from pathlib import Path

import toolkit
from toolkit.context import Context
from toolkit.jaxrt import decode
from toolkit.jaxrt.gguf_io import write_gguf
from toolkit.models import ContextParams, presets
from toolkit.models.gguf_file import open_gguf
from toolkit.models.tokenizer import load_vocab, top_tokens

full = Path("llama-spm-vocab.gguf")
full.write_bytes(gzip.decompress(Path({str(VOCAB)!r}).read_bytes()))
f = open_gguf(full)
vocab = {{k: f.get_array(f"tokenizer.ggml.{{key}}").tolist()[:512]
         for k, key in (("tokens", "tokens"), ("scores", "scores"), ("token_types", "token_type"))}}
write_gguf("tiny-spm.gguf", dataclasses.replace(presets.tiny("f32"), n_vocab=512), seed=3, vocab=vocab)
"""

API_ANSWER = f"""\
v = load_vocab("tiny-spm.gguf")
ids = v.tokenize({TEXT!r}, add_special=True, parse_special=True)
ctx = Context("tiny-spm.gguf", ContextParams(n_ctx=64, n_batch=64, n_ubatch=32, flash_attn="off"))
top = top_tokens(decode(ctx, {TEXT!r}, last_only=True), 5, v)
print("API " + json.dumps({{"ids": ids, "top": [i for i, _, _ in top], "pieces": [p for _, _, p in top]}}))
"""

DASHBOARD = """\
toolkit.dashboard("tiny-spm.gguf", n_ctx=64, n_batch=64, n_ubatch=32, flash_attn="off")
"""

RESULT_JS = """() => {
    const el = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .toolkit-prompt-result');
    return el ? {tokens: JSON.parse(el.dataset.tokens), top: JSON.parse(el.dataset.top), text: el.innerText} : null;
}"""


def test_the_dashboard_runs_a_typed_text(jupyter_lab: LabServer, run_notebook: Any, artifacts_dir: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in (MAKE_MODEL, API_ANSWER, DASHBOARD)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, jupyter_lab.workdir / "text-prompt.ipynb")

    run: NotebookRun = run_notebook("text-prompt.ipynb")
    page = run.page
    line = next(x for x in run.output_text().splitlines() if x.startswith("API "))
    api = json.loads(line.removeprefix("API "))
    assert api["ids"][0] == 1 and len(api["ids"]) > 5   # BOS, then the text's pieces

    box = page.locator(".jp-NotebookPanel:visible .toolkit-tokens input")
    box.wait_for(timeout=UPDATE_TIMEOUT_S * 1000)
    box.fill(TEXT)
    box.press("Enter")
    page.locator(".jp-NotebookPanel:visible .toolkit-run").first.click()
    deadline = time.monotonic() + UPDATE_TIMEOUT_S
    while (got := page.evaluate(RESULT_JS)) is None:
        if time.monotonic() > deadline:
            shown = page.locator(".jp-NotebookPanel:visible .toolkit-runtime").all_inner_texts()
            raise AssertionError(f"no prompt result in the page; the runtime line says {shown}")
        page.wait_for_timeout(200)
    assert got["tokens"] == api["ids"]
    assert got["top"] == api["top"]
    # the next tokens as text, in the order of their logits
    nxt = got["text"].split("next: ", 1)[1]
    at = [nxt.index(f"{p!r} ({i})") for i, p in zip(api["top"], api["pieces"], strict=True)]
    assert at == sorted(at), nxt
    shot = artifacts_dir / "dashboard-text-prompt.png"
    page.locator(".jp-NotebookPanel:visible .toolkit-runtime").first.screenshot(path=str(shot))
    run.screenshots.append(shot)
    errors = [e for e in run.console_errors if "favicon" not in e]
    assert errors == [], errors
