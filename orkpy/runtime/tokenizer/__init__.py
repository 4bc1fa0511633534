"""Tokenizers built from a GGUF file's own vocabulary, giving llama.cpp's token ids.

``Tokenizer.from_gguf(path_or_gguf_file)`` reads only the ``tokenizer.ggml.*``
metadata (and ``general.name``). ``tok.encode(text)`` behaves like llama.cpp's
``common_tokenize(ctx, text, add_special=True, parse_special=False)`` -- the way
llama-perplexity tokenizes text -- and ``tok.decode(ids)`` like
``common_detokenize(ctx, ids, special=False)``.

Special tokens first (llama.cpp's ``tokenizer_st_partition``)
    User-defined tokens (token type 4) are split out of the text before anything
    else, even without special parsing; control and unknown tokens written in the
    text are plain text. As in llama.cpp, the tokens are taken longest first, each
    splitting every remaining text fragment at its leftmost non-overlapping
    occurrences, and a token whose text llama.cpp recognises as end-of-generation
    or fill-in-the-middle (``<|im_end|>``, ``<end_of_turn>``, ``<|fim_prefix|>``,
    ...) counts as control. For a model whose ``general.name`` contains "phi-3"
    or "phi3" the whitespace right of a split token is dropped (llama.cpp's RSTRIP).
    Cost: one substring search of the text per user-defined token, then for each
    token that occurs one pass over the text and the spans taken so far: an
    occurrence overlapping a taken span resumes the search at that span's end
    (Gemma-3 has 164 such tokens: newline, space and tab runs, HTML tags; 100K
    spaces take 0.07 s, 1M 0.7 s, linear). llama.cpp's own partition is quadratic
    on texts of many short mixed runs (" \n\t  \n\n ..."), this one is not.

``tokenizer.ggml.model = "llama"`` (SentencePiece-style, llama.cpp's SPM)
    Each text fragment gets a space in front when it follows BOS or a split-out
    token (``tokenizer.ggml.add_space_prefix``, default true; Gemma-3: false),
    every ``" "`` becomes ``"\u2581"``, the fragment is split into code points and
    adjacent symbols are merged greedily: always the pair whose concatenation is a
    vocabulary token of the highest score, the leftmost one on ties. A final
    symbol that is not a token is emitted as its UTF-8 bytes through the
    ``<0xXX>`` byte tokens.

    Speed-up, exact by construction: a merged symbol is always a vocabulary
    token, so no merge can ever cover the boundary between two adjacent
    characters ``a b`` unless some token contains the substring ``ab``. Before
    tokenizing, a fragment is cut in front of every ``"\u2581"`` whose left
    neighbour ``c`` is such that no token contains ``c + "\u2581"``; the pieces
    are tokenized independently (and cached). This yields exactly the same
    merges as running the whole fragment as one sequence, whatever the
    vocabulary: for one containing ``"\u2581\u2581"`` runs of spaces simply stay
    in one piece, and newlines never start a cut. stories260K has no token with
    a ``"\u2581"`` after its first character, Gemma-3 one (``">\u2581</"``), so
    nearly every word is its own piece.

``tokenizer.ggml.model = "gpt2"`` (byte-level BPE, llama.cpp's BPE)
    Each text fragment is split into words by the pre-tokenizer of
    ``tokenizer.ggml.pre``: llama.cpp's regular expressions for that type
    (src/llama-vocab.cpp), applied in order, each splitting the pieces the
    previous ones left (text between matches is a piece too). Each word's UTF-8
    bytes are mapped to printable characters with GPT-2's byte-to-unicode table
    and merged by rank (position in ``tokenizer.ggml.merges``, lowest first,
    leftmost on ties); with ``ignore_merges`` (llama3, tekken) a word that is a
    token is emitted whole. Results are cached per word. Supported
    ``tokenizer.ggml.pre`` values (:data:`PRE_TOKENIZERS`, by regex set):

    - ``default`` (also used, with a warning, when the key is missing)
    - llama3: ``llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0
      lfm2 jina-v5-nano`` (ignore_merges, BOS added) and ``dbrx smaug-bpe``
    - smollm / starcoder: ``smollm starcoder refact command-r codeshell exaone
      minerva-7b mellum2``
    - qwen2: ``qwen2 deepseek-r1-qwen kormo f2llmv2 megrez stablelm2 hunyuan
      solar-open``
    - gpt2: ``gpt-2 phi-2 gigachat a.x-4.0 mellum mpt olmo jais trillion
      granite-docling exaone4``
    - ``deepseek-llm``; ``tekken`` (ignore_merges, BOS added); gpt-4o:
      ``gpt-4o llama4 kanana2 talkie minimax-m2``

    llama.cpp does not run these expressions on the text as written: for one
    that uses a Unicode category it first replaces every non-ASCII code point by
    one byte standing for its class (letter, number, punctuation, mark, symbol,
    whitespace, other) and matches ASCII-only classes (std::regex); otherwise it
    matches the code points with non-ASCII whitespace replaced (std::wregex); the
    gpt2/llama3/qwen2 expressions run through hand-written matchers that give
    the same splits. This module does the same (Python ``re``, ASCII mode) with
    the classes of :mod:`orkpy.runtime.tokenizer._unicode_classes` (Unicode 15.1, equal to
    llama.cpp's src/unicode-data.cpp), not those of the installed Python
    (3.11: Unicode 14) or ``regex`` (16 or later: a letter added in Unicode 16 is
    "other" to llama.cpp). llama.cpp's expressions are its adaptations of the
    Hugging Face ones: in tekken and gpt-4o any non-ASCII letter counts as both
    upper and lower case, as here.

Speed (one core, empty caches, the 1.3 MB wikitext-2 test file): SmolLM2 and
Gemma-3 (262,144 tokens) each take about 0.5 s on an idle core (1.1-1.4 s on a
busy one), plus 0.1-0.5 s to build the tokenizer.

Specials: BOS is prepended iff ``add_special`` and the vocabulary's add_bos
(``tokenizer.ggml.add_bos_token``; default true for "llama" and for the
llama3/tekken pre-tokenizers, false otherwise); EOS is appended iff
``add_special`` and ``tokenizer.ggml.add_eos_token`` is true (default false).
``decode`` drops control and unknown tokens unless ``special`` and, for the BPE
types llama.cpp marks ``clean_spaces`` (default, llama3, gpt2, starcoder, ...),
applies its clean-up of spaces before ``?!.,`` and contractions.

Known limits against llama.cpp: the pre-tokenizer types not listed above
(deepseek-coder/v3, falcon, chatglm, bloom, kimi-k2, gemma4, ...) and the
"t5"/"bert"/"rwkv" vocabularies are refused with a ValueError naming what is
supported; llama.cpp orders same-length special tokens with an unstable sort (this
module by id), which matters only for overlapping user-defined tokens of equal
length, and makes only one (in hash order) of several fill-in-the-middle spellings
present in a vocabulary control (this module: all of them); token attributes it sets
by model name other than phi-3 (jina, modern-bert LSTRIP) and gpt-oss's
``<|channel|>``-style overrides are not applied; a pattern match of zero length
(none of the supported expressions can produce one) would be skipped.
"""
# The package: _tables.py (token types and attributes, special token texts, GPT-2's byte table), pretok.py
# (the pre-tokenizer expressions and Unicode classes), spm.py and bpe.py (the merges), stream.py (streamed
# decoding, llama.cpp's space clean-up), vocabulary.py (the Tokenizer), _unicode_classes.py (generated data).
from ._tables import (_BYTE_TO_CHAR, _CHAR_TO_BYTE, TOKEN_BYTE, TOKEN_CONTROL, TOKEN_NORMAL,  # noqa: F401
                      TOKEN_UNDEFINED, TOKEN_UNKNOWN, TOKEN_UNUSED, TOKEN_USER_DEFINED)
from .pretok import _PRE, _PRE_EXPRS, PRE_TOKENIZERS, _UnicodeClasses  # noqa: F401
from .stream import TextStream, _clean_spaces  # noqa: F401
from .vocabulary import Tokenizer

__all__ = ["Tokenizer", "TextStream", "PRE_TOKENIZERS"]
