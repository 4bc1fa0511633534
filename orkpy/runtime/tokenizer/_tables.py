"""The tables the tokenizer reads: GGUF token types and llama.cpp's token attributes, the token texts
llama.cpp treats as control / end-of-generation / fill-in-the-middle, GPT-2's byte table, and the
typed readers of tokenizer metadata."""
from __future__ import annotations

from typing import Any, List, Mapping, Optional

import numpy as np

# GGUF token types (llama.cpp's llama_token_type)
TOKEN_UNDEFINED, TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = range(7)
# llama.cpp's token attributes (llama_token_attr), from the types and the token texts
_A_UNKNOWN, _A_UNUSED, _A_NORMAL, _A_CONTROL, _A_USER, _A_BYTE = 1 << 1, 1 << 2, 1 << 3, 1 << 4, 1 << 5, 1 << 6
_TYPE_ATTR = {TOKEN_UNKNOWN: _A_UNKNOWN, TOKEN_UNUSED: _A_UNUSED, TOKEN_NORMAL: _A_NORMAL,
              TOKEN_CONTROL: _A_CONTROL, TOKEN_USER_DEFINED: _A_USER, TOKEN_BYTE: _A_BYTE}
# texts llama.cpp makes control tokens whatever their type: end-of-generation / end-of-turn ...
_CONTROL_TEXTS = frozenset([
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~["])
# ... and fill-in-the-middle spellings, unless the vocabulary names that token by id
_FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>",
                "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>",
                "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>",
                "\u2581<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_FIM_KEYS = {"fim_pre": ("fim_pre_token_id", "prefix_token_id"), "fim_suf": ("fim_suf_token_id", "suffix_token_id"),
             "fim_mid": ("fim_mid_token_id", "middle_token_id"), "fim_pad": ("fim_pad_token_id",),
             "fim_rep": ("fim_rep_token_id",), "fim_sep": ("fim_sep_token_id",)}
# end-of-turn / end-of-message ids a vocabulary may declare (they end generation, as EOS does)
_EOG_KEYS = {"eot": ("eot_token_id",), "eom": ("eom_token_id",)}

_SPACE = "\u2581"

_CACHE_LIMIT = 1 << 18

def _bytes_to_unicode() -> List[str]:
    """GPT-2's reversible byte -> printable character table."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return [table[b] for b in range(256)]


_BYTE_TO_CHAR = _bytes_to_unicode()
_CHAR_TO_BYTE = {c: b for b, c in enumerate(_BYTE_TO_CHAR)}
# UTF-8 bytes -> GPT-2 characters in one str.translate over the latin-1 decoding of the bytes
_LATIN1_TO_BYTECHAR = {b: c for b, c in enumerate(_BYTE_TO_CHAR)}
_C_SPACE = " \t\n\v\f\r"   # C isspace(), llama.cpp's strip of text next to an RSTRIP token


def _utf8(piece: str) -> bytes:
    """A token's bytes: GGUF strings are bytes, and the reader decodes invalid UTF-8 in a
    token (a partial character, a raw byte) with surrogateescape; this gives the bytes back."""
    return piece.encode("utf-8", "surrogateescape")


def _meta_int(meta: Mapping[str, Any], key: str) -> Optional[int]:
    v = meta.get(key)
    if v is None:
        return None
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):  # llama.cpp: a u32 key
        raise ValueError(f"tokenizer metadata {key!r} is not an integer: {v!r}")
    return int(v)


def _meta_bool(meta: Mapping[str, Any], key: str) -> Optional[bool]:
    v = meta.get(key)
    if v is None:
        return None
    if isinstance(v, (bool, np.bool_)) or isinstance(v, (int, np.integer)):
        return bool(v)
    raise ValueError(f"tokenizer metadata {key!r} is not a bool: {v!r}")
