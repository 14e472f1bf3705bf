"""The fast text encoder: id for id what the backend's own batch encoder gives, on word text,
generated text of every kind of character, code points across Unicode, added tokens and long
text (the last two left to the backend); pipelines of another shape are left to the backend."""
from __future__ import annotations

import re
import unicodedata
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import regex
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers

from engines import encode as encode_mod
from engines.encode import MAX_CHARS, MISS_CHARS, VERIFIED_SPLITS, FastEncoder
from harness.workload.requests import TextMaker

(QWEN_SPLIT,) = VERIFIED_SPLITS


@pytest.fixture(scope="module")
def encoder(tokenizer):
    enc = FastEncoder(tokenizer)
    assert enc.fast, "the Qwen pipeline must take the fast path"
    return enc


def _backend(tokenizer, texts):
    return [e.ids for e in tokenizer.backend_tokenizer.encode_batch_fast(texts, add_special_tokens=False)]


def _same(tokenizer, encoder, texts, batch=64):
    for k in range(0, len(texts), batch):
        part = texts[k:k + batch]
        want, got = _backend(tokenizer, part), encoder.encode(part)
        for text, w, g in zip(part, want, got):
            assert g == w, f"{text!r}: {g} != {w}"


def _fast(encoder, texts):
    """How many of `texts` the fast path encodes itself."""
    return sum(encoder._encode_one(t) is not None for t in texts)


def test_word_texts_like_the_harness_makes(tokenizer, encoder):
    maker, rng = TextMaker(tokenizer), np.random.default_rng(0)
    texts = [maker.text(rng, int(rng.integers(1, 40))) for _ in range(2000)]
    _same(tokenizer, encoder, texts)
    assert _fast(encoder, texts) == len(texts)


FRAGMENTS = [
    # words, case, contractions
    "hello", "Hello", "HELLO", "wOrLd", "the", " the", "  the", "don't", "DON'T", "it's", "IT'S", "we'll",
    "WE'LL", "they're", "I've", "I'm", "he'd", "'s", "'S", "'ll", "'Ll", "''", "'", "'x", "ſ", "'ſ",
    # digits, punctuation runs
    "0", "7", "1234567890", "3.14159", "1,000,000", "v2", "x86_64", "!!!", "?!", "...", "—", "--", "::",
    "()", "[{<>}]", "@#$%^&*", "\"quoted\"", "a-b", "e.g.", "/usr/bin", "C++", "#1", "$5", "50%",
    # whitespace of every kind
    " ", "  ", "   ", "\t", "\t\t", " \t ", "\n", "\n\n", "\r\n", "\r\n\r\n", "\r", " \n ", "\v", "\f",
    "\x1c", "\x1f", "\x85", "\xa0", "\u2009", "\u3000", "\u200b", "\u2028", "\u2029", "\ufeff",
    # accents, precomposed and combining (NFC composes / reorders these)
    "café", "cafe\u0301", "naïve", "nai\u0308ve", "Å", "A\u030a", "\u212b", "ñ", "n\u0303", "a\u0323\u0302",
    "a\u0302\u0323", "ệ", "e\u0323\u0302", "ḍ̇", "\u1100\u1161\u11a8", "한국어", "Ελληνικά", "русский",
    "עברית", "العربية", "हिन्दी", "ไทย", "ﬁ", "①", "²", "Ⅻ", "½", "٣", "１２３", "ＡＢＣ",
    # CJK, kana
    "日本語", "中文字符", "漢字", "ひらがな", "カタカナ", "ｶﾀｶﾅ", "、", "。",
    # emoji: single, modifiers, ZWJ sequences, flags, keycaps
    "😀", "👍🏽", "👨‍👩‍👧", "🏳️‍🌈", "🇫🇷", "1️⃣", "❤️", "🤖🤖🤖", "\U0001fae8",
    # private use, astral letters, control characters
    "\ue000", "\U000f0000", "\U0001d400", "\U00020000", "\x00", "\x07", "\x7f", "\u0080", "\u009f",
]


def _generated(rng, n):
    texts = []
    for _ in range(n):
        parts = [FRAGMENTS[int(k)] for k in rng.integers(0, len(FRAGMENTS), size=int(rng.integers(1, 12)))]
        seps = rng.choice(["", " ", "  ", "\n", "\t"], size=len(parts))
        texts.append("".join(s + p for s, p in zip(seps, parts)))
    return texts


def test_generated_text_of_every_kind(tokenizer, encoder):
    texts = _generated(np.random.default_rng(1), 4000)
    texts += ["", " ", "a", "word ", "word  ", "word\n", "word \n", "word\t ", "x" * 1000, "ab" * 1500,
              "7" * 300, "!" * 400, " " * 500, "\n" * 50 + "x", "é" * 900, "🤖" * 700]
    _same(tokenizer, encoder, texts)
    assert _fast(encoder, texts) > 0.95 * len(texts)


def _contexts(chars):
    """Each code point among letters, digits, spaces, newlines and apostrophes."""
    return ["".join(f"x{c}7 {c}{c}\t{c}'{c}\r\n{c}.{c}" for c in chars[k:k + 40]) for k in range(0, len(chars), 40)]


def test_code_points_across_unicode(tokenizer, encoder):
    """Every 17th code point, and every one below U+0800: the fast path takes each one Python's
    Unicode data knows, with the backend's ids."""
    points = sorted(set(range(0x800)) | set(range(0x800, 0x110000, 17)))
    known = [chr(c) for c in points if unicodedata.category(chr(c)) not in ("Cn", "Cs")]
    texts = _contexts(known)
    _same(tokenizer, encoder, texts)
    assert encoder._unicode and _fast(encoder, texts) == len(texts)


def test_the_ascii_twin_splits_ascii_text_like_the_pattern():
    chars = [chr(c) for c in range(128)]
    rng = np.random.default_rng(4)
    skewed = list("aZsStTlLdDmMvVrReE09'\" .!-_\t\n\r\x0b\x0c\x1c\x1f\x00\x7f")
    texts = [a + b for a in chars for b in chars] + _contexts(chars)
    texts += ["".join(rng.choice(skewed, size=int(rng.integers(1, 30)))) for _ in range(20000)]
    for pattern, twin in VERIFIED_SPLITS.items():
        full, ascii_ = regex.compile(pattern).findall, re.compile(twin).findall
        for text in texts:
            assert ascii_(text) == full(text), repr(text)


def test_code_points_python_does_not_know_go_to_the_backend(tokenizer, encoder):
    # U+10940: a Sidetic letter (Unicode 17) the regex package knows and Oniguruma does not yet
    texts = ["x\U00010940 word", "\U00010940", "a \u0378 b", "\U000e0080x"]
    assert all(any(unicodedata.category(c) == "Cn" for c in t) for t in texts)
    _same(tokenizer, encoder, texts)
    assert _fast(encoder, texts) == 0


def test_added_tokens_go_to_the_backend(tokenizer, encoder):
    texts = ["<|im_start|>user\nhi<|im_end|>", "a <think> b </think>", "x<|endoftext|>", "é<tool_call>",
             "<|im_end", "<think", "<|fim_pad|>"]
    _same(tokenizer, encoder, texts)
    assert _fast(encoder, texts) == 2  # the two without a whole added token


def test_long_text_goes_to_the_backend_in_place(tokenizer, encoder):
    long = " word" * (MAX_CHARS // 5 + 1)
    texts = [" short one", long, " another short", long + " tail"]
    assert encoder._encode_one(long) is None
    _same(tokenizer, encoder, texts)


def _new_words(tokenizer, rng, n):
    """n words of two vocabulary words run together: pieces the vocabulary does not hold."""
    words = [w for w in TextMaker(tokenizer).words if w.isascii() and w.isalpha()]
    pick = rng.integers(0, len(words), size=(n, 2))
    return "".join(" " + words[a] + words[b].lower() for a, b in pick)


def test_the_vocabulary_is_known_from_the_start(tokenizer, monkeypatch):
    enc = FastEncoder(tokenizer)
    # every word the harness makes is one vocabulary token: none needs the BPE model
    monkeypatch.setattr(enc, "_learn", lambda piece: pytest.fail(f"{piece!r} asked of the model"))
    maker, rng = TextMaker(tokenizer), np.random.default_rng(4)
    texts = [maker.text(rng, 30) for _ in range(200)]
    _same(tokenizer, enc, texts)
    # and the vocabulary's pieces that the split leaves whole are the backend's own ids
    backend = tokenizer.backend_tokenizer
    pieces = list(encode_mod.vocabulary_pieces(backend).items())
    assert len(pieces) > 140_000
    picked = [pieces[int(k)] for k in rng.integers(0, len(pieces), size=3000)]
    whole = [(t, i) for t, i in picked
             if backend.normalizer.normalize_str(t) == t and len(backend.pre_tokenizer.pre_tokenize_str(t)) == 1]
    assert len(whole) > 2000
    assert _backend(tokenizer, [t for t, _ in whole]) == [[i] for _, i in whole]


def test_text_of_many_new_pieces_goes_to_the_backend_while_they_are_learnt(tokenizer):
    enc = FastEncoder(tokenizer)
    text = _new_words(tokenizer, np.random.default_rng(3), 200)  # ~3,000 characters of new pieces
    assert len(text) > 2 * MISS_CHARS and len(text) < MAX_CHARS
    _same(tokenizer, enc, [text])  # handed over, the first ~MISS_CHARS learnt
    tries = 1
    while enc._encode_one(text) is None:
        tries += 1
    assert tries == len(text) // MISS_CHARS  # the rest ~MISS_CHARS at a time
    _same(tokenizer, enc, [text])


def test_bounded_cache_starts_over(tokenizer, monkeypatch):
    monkeypatch.setattr(encode_mod, "CACHE_SIZE", 50)
    enc = FastEncoder(tokenizer)
    rng = np.random.default_rng(2)
    texts = [_new_words(tokenizer, rng, 15) for _ in range(100)] + _generated(rng, 100)
    _same(tokenizer, enc, texts, batch=10)
    vocabulary = len(enc._vocabulary)
    assert len(enc._one) + len(enc._many) <= vocabulary + 50
    assert all(enc._one.get(t) == i for t, i in enc._vocabulary.items())  # the vocabulary stays


def test_threads_share_one_encoder(tokenizer):
    enc = FastEncoder(tokenizer)
    batches = [_generated(np.random.default_rng(10 + k), 100) for k in range(8)]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(enc.encode, batches))
    assert got == [_backend(tokenizer, b) for b in batches]


# --- pipelines of other shapes ------------------------------------------------------------


def _byte_level_bpe(normalizer=normalizers.NFC(), split=QWEN_SPLIT, dropout=None, use_regex=False):
    """A small byte-level BPE: the byte alphabet plus a few merges."""
    vocab = {c: k for k, c in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "in")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, merges, dropout=dropout))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex)])
    return tok


SAMPLES = [" the thin in", "The  thing\n\nin", "ﬁn café ① ２", "e\u0301 the", "don't THE'LL"]


def test_a_constructed_pipeline_of_the_same_shape_is_fast():
    for normalizer in (normalizers.NFC(), None):
        tok = _byte_level_bpe(normalizer)
        enc = FastEncoder(tok)
        assert enc.fast
        assert enc.encode(SAMPLES) == [e.ids for e in tok.encode_batch_fast(SAMPLES, add_special_tokens=False)]


@pytest.mark.parametrize("kind", ["nfkc", "split", "dropout", "byte_regex", "whitespace", "truncation"])
def test_other_pipelines_go_to_the_backend(kind):
    if kind == "whitespace":
        tok = _byte_level_bpe()
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
    elif kind == "truncation":
        tok = _byte_level_bpe()
        tok.enable_truncation(3)
    else:
        tok = _byte_level_bpe(**{
            "nfkc": dict(normalizer=normalizers.NFKC()),
            "split": dict(split=QWEN_SPLIT.replace(r"\p{N}|", r"\p{N}{1,3}|")),  # Llama 3's: not checked here
            "dropout": dict(dropout=0.5),
            "byte_regex": dict(use_regex=True),
        }[kind])
    enc = FastEncoder(tok)
    assert not enc.fast
    if kind != "dropout":  # dropout draws at random: no two encodings need agree
        assert enc.encode(SAMPLES) == [e.ids for e in tok.encode_batch_fast(SAMPLES, add_special_tokens=False)]


def test_a_slow_tokenizer_is_called(tokenizer):
    class Slow:
        def __call__(self, texts, add_special_tokens):
            return tokenizer(texts, add_special_tokens=add_special_tokens)

    enc = FastEncoder(Slow())
    assert not enc.fast and enc.encode(SAMPLES) == _backend(tokenizer, SAMPLES)


def test_unicode_probe_needs_both_regex_engines_to_know_pythons_letters(encoder):
    class SplitsAll:  # a regex engine that knows no letter: "x" + letter is two pieces
        def pre_tokenize_str(self, text):
            return [(c, (k, k + 1)) for k, c in enumerate(text)]

    pre = encoder.backend.pre_tokenizer
    assert encode_mod._same_letters(pre, encoder._split)
    assert not encode_mod._same_letters(SplitsAll(), encoder._split)
    assert not encode_mod._same_letters(pre, lambda text: list(text))


def test_the_batch_decoder_gives_batch_decode_text(tokenizer):
    rng = np.random.default_rng(0)
    special = sorted(tokenizer.all_special_ids)
    ids = [rng.integers(0, len(tokenizer), size=n).tolist() for n in rng.integers(1, 9, size=300)]
    ids += [[special[0], 11, special[-1]], [198, 198], [220] * 3]  # special tokens kept; newlines, spaces
    decode = encode_mod.batch_decoder(tokenizer)
    assert decode is not tokenizer.batch_decode  # the backend serves the Qwen tokenizer
    assert decode(ids) == tokenizer.batch_decode(ids)


def test_a_tokenizer_that_cleans_up_spaces_decodes_through_transformers(tokenizer, monkeypatch):
    monkeypatch.setattr(tokenizer, "clean_up_tokenization_spaces", True)
    assert encode_mod.batch_decoder(tokenizer) == tokenizer.batch_decode
