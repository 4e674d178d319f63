"""The GGUF file's own tokenizer: text -> token ids and ids -> text, as llama.cpp's ``llama_vocab``.

:func:`load_vocab` reads the ``tokenizer.ggml.*`` keys of a GGUF file (through
:mod:`toolkit.models.gguf_file`) into a :class:`Vocab`:

* ``tokenizer.ggml.model`` = ``"llama"``: SentencePiece-style BPE over scores
  (``llm_tokenizer_spm_session``), with ``<0xXX>`` byte fallback;
* ``"gpt2"``: byte-level BPE over ``tokenizer.ggml.merges`` (``llm_tokenizer_bpe_session``) after
  the pre-tokenizer named by ``tokenizer.ggml.pre`` (the regex lists of ``llm_tokenizer_bpe``, split
  as ``unicode_regex_split`` does).

:meth:`Vocab.tokenize` is ``llama_vocab::impl::tokenize`` (special-token partition by
``tokenizer_st_partition``, BOS/EOS by ``add_special``); :meth:`Vocab.token_to_piece` is
``llama_token_to_piece`` and :meth:`Vocab.detokenize` joins the pieces.

Character classes follow ``unicode_cpt_flags``: ``\\s`` is the White_Space set of llama.cpp's
``unicode_set_whitespace``; letters, numbers, marks, punctuation and symbols are the Unicode general
categories of the ``regex`` package's tables (llama.cpp's tables may differ on codepoints added in a
later Unicode version than either knows; no measured llama.cpp case pins those).

Not ported: WPM, UGM, RWKV and PLaMo-2 vocabularies; the pre-tokenizers that need llama.cpp's
hand-written splitters (kimi-k2, afmoe, tiny_aya, superbpe, gemma4-style SPM-BPE); the EOG / FIM
token-attribute overrides of ``llama_vocab::impl::load`` (they only change what
``parse_special=True`` splits out).

>>> v = Vocab.from_tokens(["<unk>", "<s>", "</s>", "\u2581a", "b"], scores=[0, 0, 0, -1, -2],
...                       token_types=[2, 3, 3, 1, 1], model="llama")
>>> v.tokenize("a")
[1, 3]
>>> v.detokenize([1, 3], special=False)
' a'
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import regex  # type: ignore[import-untyped]

from toolkit.errors import GGUFError, ParameterError, ToolkitError
from toolkit.models.gguf_file import GGUFFile, open_gguf

# llama_token_type (tokenizer.ggml.token_type) -> llama_token_attr bits
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
ATTR_LSTRIP = 1 << 7
ATTR_RSTRIP = 1 << 8
_TYPE_TO_ATTR = {0: ATTR_UNDEFINED, 1: ATTR_NORMAL, 2: ATTR_UNKNOWN, 3: ATTR_CONTROL,
                 4: ATTR_USER_DEFINED, 5: ATTR_UNUSED, 6: ATTR_BYTE}


class TokenizerError(ToolkitError):
    """A vocabulary the toolkit cannot tokenize with (an unknown ``tokenizer.ggml.model`` or
    ``tokenizer.ggml.pre``, no vocabulary at all). ``key`` names the GGUF key, ``value`` its value,
    ``supported`` lists what is accepted."""

    def __init__(self, key: str, value: Any, supported: Sequence[str], detail: str = "") -> None:
        self.key = key
        self.value = value
        self.supported = tuple(supported)
        extra = f" ({detail})" if detail else ""
        super().__init__(f"{key}={value!r} is not supported{extra}: supported are "
                         + ", ".join(repr(s) for s in self.supported))


# ---- pre-tokenizers (llm_tokenizer_bpe's regex_exprs) ---------------------------------------------
# \s and \S as llama.cpp's unicode_set_whitespace (std::regex sees non-ASCII whitespace as 0x0B)
_WS = r"\t-\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
# the GPT-2 expression; unicode_regex_split_custom_gpt2 also ends a lone whitespace run (\s+)
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEEPSEEK_LLM_LETTERS = (
    r"A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-"
    r"\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1"
    r"\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-"
    r"\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15"
    r"\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d"
    r"\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb"
    r"\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d"
    r"\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183"
    r"\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b"
    r"\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-"
    r"\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb"
    r"\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943")

_PRE_REGEXES: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "llama3": (_LLAMA3,),
    "gpt2": (_GPT2,),
    "qwen2": (_QWEN2,),
    "qwen35": (_QWEN35,),
    "deepseek-llm": (r"[\r\n]", r"\s?[" + _DEEPSEEK_LLM_LETTERS + r"]+",
                     r"\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
                     r"\s+\Z", r"[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", r"\p{N}+"),
    "deepseek-coder": (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", r"\p{N}"),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"),
    "starcoder": (r"\p{N}", _GPT2),
    "bloom": (r" ?[^(\s|.,!?…。，、।۔،)]+",),
    "viking": (r" ?[^(\s|.,!?…。，、।۔،)]+", r"\p{N}"),
}
# tokenizer.ggml.pre -> (regex list, clean_spaces), as llama_vocab::impl::load names them
_PRE_NAMES: dict[str, tuple[str, bool]] = {
    "default": ("default", True),
    **{n: ("llama3", True) for n in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1",
                                      "pixtral", "midm-2.0", "lfm2", "jina-v5-nano")},
    "dbrx": ("llama3", True), "smaug-bpe": ("llama3", True),
    "glm4": ("llama3", True), "chatglm-bpe": ("llama3", True),  # CHATGLM4: same expression
    "deepseek-llm": ("deepseek-llm", False),
    "deepseek-coder": ("deepseek-coder", False),
    "falcon": ("falcon", True),
    **{n: ("gpt2", True) for n in ("mpt", "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat",
                                    "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum", "modern-bert",
                                    "olmo", "jais", "exaone4")},
    "trillion": ("gpt2", False), "granite-docling": ("gpt2", False),
    **{n: ("starcoder", True) for n in ("starcoder", "refact", "codeshell", "exaone",
                                         "minerva-7b", "mellum2")},
    "command-r": ("starcoder", False), "smollm": ("starcoder", False),
    **{n: ("qwen2", False) for n in ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan",
                                      "solar-open", "grok-2")},
    "megrez": ("qwen2", True), "stablelm2": ("qwen2", True),
    "qwen35": ("qwen35", False),
    "poro-chat": ("bloom", False), "bloom": ("bloom", True), "gpt3-finnish": ("bloom", True),
    "viking": ("viking", False),
}
# load() sets ignore_merges (a word that is a token is not merged) and add_bos for these names
_LLAMA3_NAMES = frozenset(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                           "midm-2.0", "lfm2", "jina-v5-nano"))
SUPPORTED_PRE = tuple(sorted(_PRE_NAMES))
SUPPORTED_MODELS = ("llama", "gpt2")


def _compile(expr: str) -> Any:
    """One expression with ``\\s``/``\\S`` spelled out as llama.cpp's whitespace set."""
    out, inside, i = [], False, 0
    while i < len(expr):
        c = expr[i]
        if c == "\\" and i + 1 < len(expr):
            two = expr[i:i + 2]
            if two == r"\s":
                out.append(_WS if inside else "[" + _WS + "]")
            elif two == r"\S" and not inside:
                out.append("[^" + _WS + "]")
            else:
                out.append(two)
            i += 2
            continue
        if c == "[" and not inside:
            inside = True
        elif c == "]" and inside:
            inside = False
        out.append(c)
        i += 1
    return regex.compile("".join(out), regex.VERSION0)


_COMPILED: dict[str, tuple[Any, ...]] = {}


def _byte_map() -> tuple[dict[int, str], dict[str, int]]:
    """``unicode_byte_to_utf8_map``: GPT-2's printable stand-in for each byte."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    b2u = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in b2u:
            b2u[b] = chr(256 + n)
            n += 1
    return b2u, {u: b for b, u in b2u.items()}


_BYTE_TO_UNICODE, _UNICODE_TO_BYTE = _byte_map()


def regex_split(text: str, pre: str) -> list[str]:
    """``unicode_regex_split`` without the byte encoding: each expression of the pre-tokenizer
    ``pre`` splits every piece left by the previous ones into its matches and the text between."""
    exprs = _COMPILED.get(pre)
    if exprs is None:
        exprs = _COMPILED[pre] = tuple(_compile(e) for e in _PRE_REGEXES[pre])
    pieces = [text] if text else []
    for rx in exprs:
        out: list[str] = []
        for piece in pieces:
            at = 0
            for m in rx.finditer(piece):
                if m.start() > at:
                    out.append(piece[at:m.start()])
                if m.end() > m.start():
                    out.append(m.group())
                at = m.end()
            if at < len(piece):
                out.append(piece[at:])
        pieces = out
    return pieces


@dataclass
class Vocab:
    """A ``llama_vocab``: tokens, scores, attributes, merges and the special-token flags.

    ``model`` is ``"llama"`` (SPM) or ``"gpt2"`` (BPE); ``pre`` the pre-tokenizer's regex list name.
    """

    model: str
    tokens: list[str]
    scores: list[float]
    attrs: list[int]
    bos: int | None
    eos: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    pre: str = "default"
    pre_name: str = ""
    clean_spaces: bool = False
    ignore_merges: bool = False
    merges: dict[tuple[str, str], int] = field(default_factory=dict)
    token_to_id: dict[str, int] = field(default_factory=dict)
    special: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.token_to_id:
            self.token_to_id = {t: i for i, t in enumerate(self.tokens)}
        if not self.special:
            # cache_special_tokens: control, user-defined and unknown tokens, longest text first
            ids = [i for i, a in enumerate(self.attrs) if a & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)]
            self.special = sorted(ids, key=lambda i: -len(self.tokens[i].encode()))

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @classmethod
    def from_tokens(cls, tokens: Sequence[str], *, scores: Sequence[float] | None = None,
                    token_types: Sequence[int] | None = None, model: str = "llama",
                    merges: Sequence[str] = (), pre: str = "default", bos: int | None = None,
                    eos: int | None = None, add_bos: bool | None = None, add_eos: bool | None = None,
                    add_space_prefix: bool | None = None, model_name: str = "") -> Vocab:
        """A vocabulary from the values of the ``tokenizer.ggml.*`` keys (``load_vocab`` reads them)."""
        if model not in SUPPORTED_MODELS:
            raise TokenizerError("tokenizer.ggml.model", model, SUPPORTED_MODELS)
        toks = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        n = len(toks)
        sc = [float(s) for s in scores] if scores is not None else [0.0] * n
        attrs = ([_TYPE_TO_ATTR.get(int(t), ATTR_UNDEFINED) for t in token_types]
                 if token_types is not None else [ATTR_NORMAL] * n)
        d_bos: int | None = None
        d_eos: int | None = None
        if model == "llama":
            d_bos, d_eos, d_add_bos, d_prefix, pre_key, clean = 1, 2, True, True, "default", False
            ranks: dict[tuple[str, str], int] = {}
        else:
            if pre not in _PRE_NAMES:
                raise TokenizerError("tokenizer.ggml.pre", pre, SUPPORTED_PRE)
            pre_key, clean = _PRE_NAMES[pre]
            d_add_bos = pre in _LLAMA3_NAMES
            d_prefix = False
            ranks = {}
            for i, m in enumerate(merges):
                at = m.find(" ", 1)
                pair = (m[:at], m[at + 1:]) if at >= 0 else ("", "")
                ranks.setdefault(pair, i)
        if "phi-3" in model_name.lower() or "phi3" in model_name.lower():
            # llama_vocab::impl::load: phi-3's special tokens strip the spaces right of them
            for i, a in enumerate(attrs):
                if a & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN):
                    attrs[i] = a | ATTR_RSTRIP
            index = {t: i for i, t in enumerate(toks)}
            for t, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
                if t in index:
                    attrs[index[t]] = attrs[index[t]] | ATTR_RSTRIP if on else attrs[index[t]] & ~ATTR_RSTRIP
        return cls(model=model, tokens=toks, scores=sc, attrs=attrs,
                   bos=d_bos if bos is None else bos, eos=d_eos if eos is None else eos,
                   add_bos=d_add_bos if add_bos is None else add_bos,
                   add_eos=False if add_eos is None else add_eos,
                   add_space_prefix=d_prefix if add_space_prefix is None else add_space_prefix,
                   pre=pre_key, pre_name=pre if model == "gpt2" else "", clean_spaces=clean,
                   merges=ranks, ignore_merges=model == "gpt2" and pre in _LLAMA3_NAMES)

    # ---- text -> ids --------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """``llama_tokenize(vocab, text, add_special, parse_special)``."""
        if not isinstance(text, str):
            raise ParameterError("text", text, "a str")
        out: list[int] = []
        frags: list[str | int] = self._partition(text, parse_special) if text else []
        if self.model == "llama":
            if add_special and self.add_bos:
                out.append(self._need(self.bos, "tokenizer.ggml.bos_token_id"))
            prev_special = True
            for f in frags:
                if isinstance(f, int):
                    out.append(f)
                    prev_special = True
                    continue
                t = (" " if self.add_space_prefix and prev_special else "") + f
                self._spm(t.replace(" ", "\u2581"), out)
                prev_special = False
            if add_special and self.add_eos:
                out.append(self._need(self.eos, "tokenizer.ggml.eos_token_id"))
            return out
        if add_special and self.add_bos:
            out.append(self._need(self.bos, "tokenizer.ggml.bos_token_id"))
        for f in frags:
            if isinstance(f, int):
                out.append(f)
            else:
                self._bpe(f, out)
        if add_special and self.add_eos:
            out.append(self._need(self.eos, "tokenizer.ggml.eos_token_id"))
        return out

    @staticmethod
    def _need(tok: int | None, key: str) -> int:
        if tok is None:
            raise TokenizerError(key, None, ("a token id",), "add_special needs it")
        return tok

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """``tokenizer_st_partition``: split raw text around special tokens (user-defined ones
        even when ``parse_special`` is false)."""
        frags: list[str | int] = [text]
        for sid in self.special:
            attr = self.attrs[sid]
            if not parse_special and attr & (ATTR_CONTROL | ATTR_UNKNOWN):
                continue
            tok = self.tokens[sid]
            new: list[str | int] = []
            for f in frags:
                if isinstance(f, int) or tok not in f:
                    new.append(f)
                    continue
                rest = f
                while True:
                    at = rest.find(tok)
                    if at < 0:
                        if rest:
                            new.append(rest)
                        break
                    left = rest[:at]
                    if attr & ATTR_LSTRIP:
                        left = left.rstrip(" \t\n\v\f\r")
                    if left:
                        new.append(left)
                    new.append(sid)
                    rest = rest[at + len(tok):]
                    if attr & ATTR_RSTRIP:
                        rest = rest.lstrip(" \t\n\v\f\r")
            frags = new
        return frags

    def _spm(self, text: str, out: list[int]) -> None:
        """``llm_tokenizer_spm_session::tokenize``: merge the best-scoring adjacent pair first."""
        n = len(text)
        if n == 0:
            return
        start = list(range(n))
        size = [1] * n
        prev = list(range(-1, n - 1))
        nxt = [*range(1, n), -1]
        heap: list[tuple[float, int, int, int]] = []
        rev: dict[str, tuple[int, int]] = {}

        def add(left: int, right: int) -> None:
            if left == -1 or right == -1:
                return
            s = text[start[left]:start[left] + size[left] + size[right]]
            tid = self.token_to_id.get(s)
            if tid is None:
                return
            heapq.heappush(heap, (-self.scores[tid], left, right, len(s)))
            rev[s] = (left, right)

        for i in range(1, n):
            add(i - 1, i)
        while heap:
            _, left, right, length = heapq.heappop(heap)
            if size[left] == 0 or size[right] == 0 or size[left] + size[right] != length:
                continue
            size[left] += size[right]
            size[right] = 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            add(prev[left], left)
            add(left, nxt[left])

        def resegment(i: int) -> None:
            s = text[start[i]:start[i] + size[i]]
            tid = self.token_to_id.get(s)
            if tid is not None:
                out.append(tid)
                return
            p = rev.get(s)
            if p is None:
                for b in s.encode():
                    out.append(self.byte_to_token(b))
                return
            resegment(p[0])
            resegment(p[1])

        i = 0
        while i != -1:
            resegment(i)
            i = nxt[i]

    def _bpe(self, text: str, out: list[int]) -> None:
        """``llm_tokenizer_bpe_session::tokenize``: pre-tokenize, byte-encode, merge by rank."""
        for word in regex_split(text, self.pre):
            enc = "".join(_BYTE_TO_UNICODE[b] for b in word.encode())
            whole = self.ignore_merges and enc in self.token_to_id
            for piece in [enc] if whole else self._bpe_word(enc):
                tid = self.token_to_id.get(piece)
                if tid is not None:
                    out.append(tid)
                    continue
                for b in piece.encode():
                    t = self.token_to_id.get(chr(b)) if b < 0x80 else None
                    if t is not None:
                        out.append(t)

    def _bpe_word(self, word: str) -> list[str]:
        n = len(word)
        syms = list(word)
        nxt = [*range(1, n), -1]
        prev = list(range(-1, n - 1))
        heap: list[tuple[int, int, int, str]] = []

        def add(left: int, right: int) -> None:
            if left == -1 or right == -1:
                return
            rank = self.merges.get((syms[left], syms[right]))
            if rank is not None:
                heapq.heappush(heap, (rank, left, right, syms[left] + syms[right]))

        for i in range(1, n):
            add(i - 1, i)
        while heap:
            _, left, right, joined = heapq.heappop(heap)
            if not syms[left] or not syms[right] or syms[left] + syms[right] != joined:
                continue
            syms[left] = joined
            syms[right] = ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            add(prev[left], left)
            add(left, nxt[left])
        return [s for s in syms if s]

    def byte_to_token(self, b: int) -> int:
        """``llama_vocab::byte_to_token``."""
        if self.model == "llama":
            tid = self.token_to_id.get(f"<0x{b:02X}>")
            if tid is None:
                tid = self.token_to_id.get(chr(b))
        else:
            tid = self.token_to_id.get(_BYTE_TO_UNICODE[b])
        if tid is None:
            raise TokenizerError("tokenizer.ggml.tokens", f"byte 0x{b:02X}", ("a vocabulary with byte tokens",),
                                 "no token for this byte")
        return tid

    # ---- ids -> text --------------------------------------------------------------------------
    def token_to_piece(self, token: int, special: bool = True) -> bytes:
        """``llama_token_to_piece(vocab, token, buf, n, lstrip=0, special)``: the token's bytes."""
        if not 0 <= token < self.n_tokens:
            raise ParameterError("token", token, f"a token id in [0, {self.n_tokens})")
        attr = self.attrs[token]
        if not special and attr & (ATTR_UNKNOWN | ATTR_CONTROL):
            return b""
        text = self.tokens[token]
        if attr & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED):
            return text.encode()
        if attr & ATTR_NORMAL:
            if self.model == "llama":
                return text.replace("\u2581", " ").encode()
            out = bytearray()
            for ch in text:  # llama_decode_text
                b = _UNICODE_TO_BYTE.get(ch)
                if b is None:
                    out += b"[UNK_BYTE_0x" + ch.encode().hex().encode() + text.encode() + b"]"
                else:
                    out.append(b)
            return bytes(out)
        if attr & ATTR_BYTE:
            if self.model == "llama":
                return bytes([int(text[3:5], 16)])
            return bytes([_UNICODE_TO_BYTE[text[0]]]) if text[:1] in _UNICODE_TO_BYTE else b""
        return b""

    def piece(self, token: int) -> str:
        """The token's text for display (``token_to_piece`` with special tokens shown), decoded
        with invalid UTF-8 replaced."""
        return self.token_to_piece(token, special=True).decode("utf-8", errors="replace")

    def detokenize(self, tokens: Sequence[int], special: bool = True) -> str:
        """The pieces of ``tokens`` joined (``llama_detokenize`` without ``remove_special``, with
        the leading space of an SPM text, as the pieces carry it, and no space cleaning)."""
        return b"".join(self.token_to_piece(int(t), special) for t in tokens).decode("utf-8", errors="replace")


def load_vocab(src: str | Path | GGUFFile) -> Vocab:
    """The vocabulary of a GGUF file (``llama_vocab::load``); :class:`TokenizerError` if its
    tokenizer is not one this module ports, GGUFError if it has none."""
    f = src if isinstance(src, GGUFFile) else open_gguf(src)
    model = f.get_str("tokenizer.ggml.model")
    if model is None or model in ("no_vocab", "none"):
        raise TokenizerError("tokenizer.ggml.model", model, SUPPORTED_MODELS, f"{f.path} has no vocabulary")
    if model not in SUPPORTED_MODELS:
        raise TokenizerError("tokenizer.ggml.model", model, SUPPORTED_MODELS)
    toks = f.get_array("tokenizer.ggml.tokens")
    if toks is None:
        raise GGUFError(f.path, "required key is missing", None, "tokenizer.ggml.tokens")
    scores = f.get_array("tokenizer.ggml.scores")
    types = f.get_array("tokenizer.ggml.token_type")
    merges = f.get_array("tokenizer.ggml.merges")
    pre = f.get_str("tokenizer.ggml.pre") or "default"
    if model == "gpt2" and merges is None:
        raise GGUFError(f.path, "required key is missing", None, "tokenizer.ggml.merges")

    def flag(key: str) -> bool | None:
        v = f.get(key)
        return None if v is None else bool(v)

    return Vocab.from_tokens(
        toks.strings(), scores=None if scores is None else scores.tolist(),
        token_types=None if types is None else types.tolist(), model=model,
        merges=merges.strings() if merges is not None else (), pre=pre,
        bos=f.get_int("tokenizer.ggml.bos_token_id"), eos=f.get_int("tokenizer.ggml.eos_token_id"),
        add_bos=flag("tokenizer.ggml.add_bos_token"), add_eos=flag("tokenizer.ggml.add_eos_token"),
        add_space_prefix=flag("tokenizer.ggml.add_space_prefix"),
        model_name=f.get_str("general.name") or "")


def read_tests(inp: str | Path, out: str | Path) -> dict[str, list[int]]:
    """llama.cpp's tokenizer test files (``tests/test-tokenizer-0.cpp`` ``read_tests``): the texts
    of ``inp`` separated by ``"\\n__ggml_vocab_test__\\n"``, the ids of each on a line of ``out``."""
    raw = Path(inp).read_bytes().decode("utf-8")
    sep = "\n__ggml_vocab_test__\n"
    texts = raw.split(sep) if raw else []
    if raw.endswith(sep):
        texts.pop()  # read_tests stops at the end of the input: no empty text after a last marker
    lines = Path(out).read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(texts) != len(lines):
        raise ParameterError("out", str(out), f"{len(texts)} lines, one per text of {inp}", f"found {len(lines)}")
    return {t: [int(x) for x in line.split()] for t, line in zip(texts, lines, strict=True)}


def tokenize_json(vocab: Vocab, payload: str) -> str:
    """``[text, ...]`` (JSON) -> ``[[id, ...], ...]`` (JSON), add_special and parse_special off."""
    texts = json.loads(payload)
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise ParameterError("stdin", payload[:60], "a JSON list of strings")
    return json.dumps([vocab.tokenize(t, add_special=False, parse_special=False) for t in texts])


def top_tokens(logits: Sequence[float], k: int = 5, vocab: Vocab | None = None) -> list[tuple[int, float, str | None]]:
    """The ``k`` highest logits of one row, best first: ``(id, logit, piece)``, the piece as
    :meth:`Vocab.piece` shows it, or None without a vocabulary or for an id past it (a model whose
    output is wider than its vocabulary). Ties keep the lower id first, as a stable sort does."""
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ParameterError("k", k, "a positive integer")
    row = [float(x) for x in logits]
    order = sorted(range(len(row)), key=lambda i: -row[i])[:k]
    return [(i, row[i], vocab.piece(i) if vocab is not None and i < vocab.n_tokens else None) for i in order]
