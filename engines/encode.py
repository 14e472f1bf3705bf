"""Request text to token ids: the tokenizer's own ids, for short text in ~1/4 of the time and
~1/6 of the CPU of the batch encoder (which also keeps worker threads busy).

The request check (engines/validate.py) tokenizes every text sample. The fast tokenizer's batch
encoder costs ~4.5 µs a token there, mostly per-call and per-piece overhead. For the pipeline
of Qwen's byte-level BPE (NFC, one regex Split, ByteLevel, BPE) the same ids come from
splitting with the tokenizer's own pattern and looking each piece up in a cache piece -> ids
that the BPE model itself fills: words repeat, so nearly every piece is a hit.

The cache starts with the vocabulary: every token whose text the BPE model gives back as
that one token (all of Qwen's 150k byte-level tokens that are whole UTF-8 text), asked of
the model once per BPE model and process (~0.9 s, at the encoder's construction), so a word
that is one token is a hit the first time it is met -- a piece the model is asked for costs
~3 µs, and a request of 15 texts of new words spent ~0.7 ms learning them.

`FastEncoder(tokenizer).encode(texts)` equals `backend.encode_batch_fast(texts,
add_special_tokens=False)` id for id. The backend still encodes:
- every text, when the pipeline has another shape, or a Split pattern not checked here
  against the backend's regex engine (Oniguruma), code point by code point;
- a text longer than MAX_CHARS, or with more than MISS_CHARS characters of pieces not met yet
  (the backend releases the GIL while it works; here Python holds it: ~20 µs for a 24-word
  text, ~2 ms for the worst 4,096 characters);
- a text holding an added token's content (the backend splits those out first);
- a non-ASCII text with a code point Python's Unicode data does not know (a letter to the
  regex package may be unassigned to Oniguruma), and every non-ASCII text when Python's
  Unicode data is newer than either regex engine's.
Non-ASCII text is NFC'd by the backend's own normalizer (Python's `unicodedata` is of another
Unicode version); ASCII text is NFC already.

`batch_decoder(tokenizer)` is the way back for beams' ids: the backend's batch decoder, which
gives transformers' `batch_decode` text where the tokenizer cleans up no spaces, in ~1/4 of the
time (100 beams of 4 tokens: 0.08 vs 0.35 ms).
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
import unicodedata
from typing import Any

import regex

MAX_CHARS = 4096  # longer text: the backend, which releases the GIL while it works
MISS_CHARS = 1024  # characters of new pieces a text may send to the BPE model (~0.4 µs each)
CACHE_SIZE = 200_000  # pieces learnt beyond the vocabulary's; the cache starts over past this

# Split patterns found to split every code point (each in several contexts) alike under the
# regex package and under Oniguruma, but for those Python's Unicode data leaves unassigned
# (tokenizers 0.23, regex 2026.11; tests/engines/test_encode.py samples them again): Qwen2's,
# Qwen2.5's, Qwen3's.
# Each comes with its twin for ASCII text in the standard `re` (which splits it twice as fast):
# \p{L} is A-Za-z there, \p{N} 0-9 and \s the six ASCII spaces (Unicode's White_Space).
_L, _N, _S = "A-Za-z", "0-9", r"\t\n\x0b\x0c\r "
VERIFIED_SPLITS = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+":
    rf"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n{_L}{_N}]?[{_L}]+|[{_N}]| ?[^{_S}{_L}{_N}]+[\r\n]*|[{_S}]*[\r\n]+|[{_S}]+(?![^{_S}])|[{_S}]+",
}

# A letter first assigned in each Unicode version (CJK G, Arabic, Kawi, CJK I, Garay, Sidetic)
_NEW_LETTERS = {(13, 0): "\U00030000", (14, 0): "\u0870", (15, 0): "\U00011f04", (15, 1): "\U0002ebf0",
                (16, 0): "\U00010d50", (17, 0): "\U00010940"}


def _byte_chars() -> dict[int, str]:
    """GPT-2's byte-level alphabet: byte b (as latin-1 char code) -> the char that stands for it."""
    shown = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    hidden = [b for b in range(256) if b not in shown]
    return {**{b: chr(b) for b in shown}, **{b: chr(256 + k) for k, b in enumerate(hidden)}}


_BYTE_CHARS = _byte_chars()


class FastEncoder:
    """Texts to token ids for one tokenizer (a HF fast tokenizer, its `backend_tokenizer`, or a
    slow tokenizer, which is only called). Safe to share between threads."""

    def __init__(self, tokenizer: Any):
        from tokenizers import Tokenizer

        self.tokenizer = tokenizer
        backend = tokenizer if isinstance(tokenizer, Tokenizer) else getattr(tokenizer, "backend_tokenizer", None)
        self.backend = backend if hasattr(backend, "encode_batch_fast") else None
        pattern = split_pattern(backend) if isinstance(self.backend, Tokenizer) else None
        self.fast = pattern is not None
        if not self.fast:
            return
        self._split = regex.compile(pattern).findall
        self._split_ascii = re.compile(VERIFIED_SPLITS[pattern]).findall
        self._model = self.backend.model
        norm = self.backend.normalizer
        self._normalize = norm.normalize_str if norm is not None else None
        self._added = _added_tokens(self.backend)
        self._unicode = _same_letters(self.backend.pre_tokenizer, self._split)
        self._vocabulary = vocabulary_pieces(self.backend)
        self._one: dict[str, int] = dict(self._vocabulary)  # piece -> its id, for pieces that are one token
        self._many: dict[str, tuple[int, ...]] = {}  # piece -> ids, for the others

    def encode(self, texts: list[str]) -> list[list[int]]:
        if not self.fast:
            return self._slow(texts)
        out = [self._encode_one(t) for t in texts]
        left = [k for k, ids in enumerate(out) if ids is None]
        if left:
            for k, ids in zip(left, self._slow([texts[k] for k in left])):
                out[k] = ids
        return out

    def _encode_one(self, text: str) -> list[int] | None:
        """The ids of `text`, or None when the backend must encode it."""
        if len(text) > MAX_CHARS:
            return None
        added = self._added
        if added is not None and added.search(text):
            return None
        if text.isascii():
            pieces = self._split_ascii(text)
        else:
            if not self._unicode or (not text.isprintable() and _unassigned(text)):
                return None
            if self._normalize is not None:
                text = self._normalize(text)
                if added is not None and added.search(text):
                    return None
            pieces = self._split(text)
        ids = list(map(self._one.get, pieces))  # every piece one known token: the common case
        return ids if None not in ids else self._spell(pieces)

    def _spell(self, pieces: list[str]) -> list[int] | None:
        """Ids piece by piece, learning the pieces not met yet; None past MISS_CHARS characters
        of those (the BPE model holds the GIL: the backend takes such text, the pieces stay)."""
        ids: list[int] = []
        budget = MISS_CHARS
        for piece in pieces:
            one = self._one.get(piece)
            if one is not None:
                ids.append(one)
                continue
            many = self._many.get(piece)
            if many is None:
                budget -= len(piece)
                if budget < 0:
                    return None
                many = self._learn(piece)
            ids += many
        return ids

    def _learn(self, piece: str) -> tuple[int, ...]:
        """The BPE model's ids of one piece (in byte-level chars), remembered."""
        ids = tuple(t.id for t in self._model.tokenize(piece.encode().decode("latin-1").translate(_BYTE_CHARS)))
        if len(self._one) + len(self._many) - len(self._vocabulary) >= CACHE_SIZE:
            self._one = dict(self._vocabulary)
            self._many = {}
        if len(ids) == 1:
            self._one[piece] = ids[0]
        else:
            self._many[piece] = ids
        return ids

    def _slow(self, texts: list[str]) -> list[list[int]]:
        if self.backend is not None:  # releases the GIL while it works
            return [enc.ids for enc in self.backend.encode_batch_fast(texts, add_special_tokens=False)]
        return [list(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]


_vocabularies: dict[str, dict[str, int]] = {}  # digest of a BPE model (vocabulary, merges) -> its pieces
_vocabularies_lock = threading.Lock()


def vocabulary_pieces(backend: Any) -> dict[str, int]:
    """text -> id for every token of the BPE vocabulary whose text (its bytes as UTF-8, and
    normalized) the model encodes as that token alone: asked of the model once per process
    and model (the same tokenizer loaded again, by another engine of a run, finds them)."""
    model, norm = backend.model, backend.normalizer
    key = hashlib.sha256(model.__getstate__()).hexdigest()  # ~0.1 s; learning them: ~0.9 s
    with _vocabularies_lock:
        known = _vocabularies.get(key)
        if known is not None:
            return known
        latin1 = {ord(c): chr(b) for b, c in _BYTE_CHARS.items()}  # byte-level char -> the byte
        pieces: dict[str, int] = {}
        for chars, token in backend.get_vocab(with_added_tokens=False).items():
            try:
                text = chars.translate(latin1).encode("latin-1").decode("utf-8")
            except (UnicodeEncodeError, UnicodeDecodeError):  # part of a character, or not byte-level
                continue
            if text.encode().decode("latin-1").translate(_BYTE_CHARS) != chars:
                continue  # not what `_learn` would ask the model for this text (a raw space, ...)
            if norm is not None and not text.isascii() and not unicodedata.is_normalized("NFC", text):
                continue  # never a piece: text is normalized before it is split (a miss would be harmless)
            tokens = model.tokenize(chars)
            if len(tokens) == 1 and tokens[0].id == token:
                pieces[text] = token
        _vocabularies[key] = pieces
        return pieces


def split_pattern(backend: Any) -> str | None:
    """The Split pattern of a pipeline whose ids the fast path reproduces exactly, or None.

    Reads each stage's own JSON (the whole `to_str()` carries the vocabulary: ~0.6 s). The
    post-processor does not matter: without special tokens it changes offsets only."""
    from tokenizers import models

    if backend.truncation is not None or backend.padding is not None:
        return None
    if _spec(backend.normalizer) not in (None, {"type": "NFC"}):
        return None
    if not isinstance(backend.model, models.BPE) or backend.model.dropout is not None:
        return None
    pre = _spec(backend.pre_tokenizer)
    stages = pre.get("pretokenizers") if pre is not None and pre.get("type") == "Sequence" else None
    if not isinstance(stages, list) or len(stages) != 2:
        return None
    split, byte_level = stages
    pattern = split.get("pattern", {}).get("Regex")
    if split != {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}:
        return None
    if byte_level.get("type") != "ByteLevel" or byte_level.get("use_regex") or byte_level.get("add_prefix_space"):
        return None
    return pattern if pattern in VERIFIED_SPLITS else None


def _spec(component: Any) -> dict[str, Any] | None:
    return None if component is None else json.loads(component.__getstate__())


def _added_tokens(backend: Any) -> Any:
    """A pattern finding any added token's content (also as normalized), or None."""
    contents = {tok.content for tok in backend.get_added_tokens_decoder().values() if tok.content}
    if backend.normalizer is not None:
        contents |= {backend.normalizer.normalize_str(c) for c in contents}
    if not contents:
        return None
    return re.compile("|".join(map(re.escape, sorted(contents, key=len, reverse=True))))


def _same_letters(pre_tokenizer: Any, split: Any) -> bool:
    """Whether Oniguruma (through the backend) and the regex package both know every letter of
    Python's Unicode version: then a code point Python knows is classed alike by both."""
    version = tuple(int(p) for p in unicodedata.unidata_version.split(".")[:2])
    if version > max(_NEW_LETTERS):
        return False  # newer than any probe here: unknown
    probes = ["x" + c for v, c in _NEW_LETTERS.items() if v <= version]
    return all(len(pre_tokenizer.pre_tokenize_str(p)) == 1 and len(split(p)) == 1 for p in probes)


def _unassigned(text: str) -> bool:
    """Whether `text` holds a code point Python's Unicode data leaves unassigned (or a surrogate)."""
    return any(unicodedata.category(c) in ("Cn", "Cs") for c in set(text))


def batch_decoder(tokenizer: Any) -> Any:
    """ids lists -> texts, as `tokenizer.batch_decode(ids)` gives them (special tokens kept)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return tokenizer.batch_decode
    return lambda ids: backend.decode_batch(ids, skip_special_tokens=False)
