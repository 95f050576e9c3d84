"""The settings of the tiny test models (``tiny-qwen3``, ``tiny-moe``, ``tiny-qwen2.5-vl``), in one
place: the config (``model.tiny``) validates against them and the builders (:func:`toolrl.model_sources.tiny_qwen3`,
:func:`~toolrl.model_sources.tiny_moe`) build from them, so neither module imports the other. Bounds keep a
typo from building a model that does not fit in memory: the tiny models are random models for tests and
demos, built on the CPU at first use."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Seeds go to torch, numpy and the engines; all of them take 32-bit seeds.
MAX_SEED = 2**32 - 1


# The embedding rows of real Qwen2.5/3 checkpoints (padded past the tokenizer) and of every tiny model.
QWEN_VOCAB = 151_936


def max_tiny_parameters() -> int:
    """The largest model tiny settings may describe here: its random float32 weights are built in
    memory and written out, so twice their size must fit in this machine's memory."""
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # no sysconf: assume a small machine
        memory = 8 * 2**30
    return memory // 8


class TinyQwen3Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    seed: int = Field(0, ge=0, le=MAX_SEED, description="the random weights depend only on the settings and this")
    hidden_size: int = Field(64, gt=0, le=4096)
    num_hidden_layers: int = Field(2, gt=0, le=64)
    num_attention_heads: int = Field(2, gt=0, le=64)
    num_key_value_heads: int = Field(1, gt=0, le=64)
    # 64 by default because vLLM's CPU attention rejects smaller heads.
    head_dim: int = Field(64, gt=0, le=512)
    intermediate_size: int = Field(256, gt=0, le=16384)
    tie_word_embeddings: bool = True

    @model_validator(mode="after")
    def _grouped_heads(self) -> TinyQwen3Settings:
        # Grouped-query attention shares each key/value head among a whole number of query heads.
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_key_value_heads})")
        return self

    @model_validator(mode="after")
    def _fits_in_memory(self) -> TinyQwen3Settings:
        # Each field within its bound can still multiply into a model no machine allocates: a run that
        # would fail in torch's allocator fails here, in one line.
        if (n := self.parameter_count()) > (most := max_tiny_parameters()):
            raise ValueError(f"these settings make a model of about {n / 1e6:,.0f}M parameters, more than this "
                             f"machine's memory builds ({most / 1e6:,.0f}M)")
        return self

    def parameter_count(self) -> int:
        """About how many parameters the model has (the Qwen vocabulary's embeddings included)."""
        h, d = self.hidden_size, self.head_dim
        attention = h * d * (2 * self.num_attention_heads + 2 * self.num_key_value_heads)
        layer = attention + self.mlp_parameters()
        return QWEN_VOCAB * h * (1 if self.tie_word_embeddings else 2) + self.num_hidden_layers * layer

    def mlp_parameters(self) -> int:
        """A layer's MLP: its gate, up and down projections."""
        return 3 * self.hidden_size * self.intermediate_size


class TinyQwen2_5VLSettings(TinyQwen3Settings):
    """``tiny-qwen2.5-vl``: the text tower takes :class:`TinyQwen3Settings`' fields (its head size
    is ``hidden_size / num_attention_heads``, so ``head_dim`` must agree); a small vision tower; and
    the image processor's pixel bounds, kept small so a test image is a handful of tokens."""

    head_dim: int = Field(32, gt=0, le=512)
    vision_depth: int = Field(2, gt=0, le=32)
    vision_hidden_size: int = Field(32, gt=0, le=4096)
    vision_num_heads: int = Field(2, gt=0, le=64)
    vision_intermediate_size: int = Field(64, gt=0, le=16384)
    # One merged image token covers 28x28 pixels: these bounds give 4..16 tokens an image.
    min_pixels: int = Field(4 * 28 * 28, ge=4 * 28 * 28, le=16384 * 28 * 28)
    max_pixels: int = Field(16 * 28 * 28, ge=4 * 28 * 28, le=16384 * 28 * 28)

    @model_validator(mode="after")
    def _vision_shapes(self) -> TinyQwen2_5VLSettings:
        if self.hidden_size != self.head_dim * self.num_attention_heads:
            raise ValueError(f"head_dim ({self.head_dim}) must be hidden_size ({self.hidden_size}) / "
                             f"num_attention_heads ({self.num_attention_heads}) in Qwen2.5-VL")
        if self.head_dim % 8:
            raise ValueError(f"head_dim ({self.head_dim}) must be a multiple of 8 (3-D rotary sections)")
        if self.vision_hidden_size % (self.vision_num_heads * 4):
            raise ValueError(f"vision_hidden_size ({self.vision_hidden_size}) must be a multiple of "
                             f"4 * vision_num_heads ({self.vision_num_heads})")
        if self.min_pixels > self.max_pixels:
            raise ValueError(f"min_pixels ({self.min_pixels}) exceeds max_pixels ({self.max_pixels})")
        return self


MoeArchitecture = Literal["qwen3_moe", "olmoe", "mixtral"]


class TinyMoeSettings(TinyQwen3Settings):
    """``tiny-moe``: a random mixture-of-experts model of one of transformers' MoE architectures
    (Qwen3-MoE, OLMoE, Mixtral), every layer sparse, with :class:`TinyQwen3Settings`' attention fields
    (the head size must be ``hidden_size / num_attention_heads``: OLMoE derives it so)."""

    architecture: MoeArchitecture = "qwen3_moe"
    head_dim: int = Field(32, gt=0, le=512)
    num_experts: int = Field(8, ge=2, le=256, description="experts per layer (ids fit a byte in the routed-experts record)")
    num_experts_per_tok: int = Field(2, ge=1, le=64, description="top-k: experts each token is routed to")
    moe_intermediate_size: int = Field(64, gt=0, le=16384, description="each expert's hidden width")

    @model_validator(mode="after")
    def _moe_shapes(self) -> TinyMoeSettings:
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(f"num_experts_per_tok ({self.num_experts_per_tok}) exceeds num_experts ({self.num_experts})")
        if self.hidden_size != self.head_dim * self.num_attention_heads:
            raise ValueError(f"head_dim ({self.head_dim}) must be hidden_size ({self.hidden_size}) / "
                             f"num_attention_heads ({self.num_attention_heads}) in a tiny MoE model")
        return self

    def mlp_parameters(self) -> int:
        """Each expert's gate, up and down projections and its router row."""
        h = self.hidden_size
        return self.num_experts * (3 * h * self.moe_intermediate_size + h)
