"""The ``model:`` section: Hugging Face config.json fields, a config file, or a catalog id.

Model fields use Hugging Face ``config.json`` names. Accepted aliases: ``num_local_experts``
(Mixtral) and ``n_routed_experts`` (DeepSeek) for ``num_experts``, ``n_shared_experts`` for
``num_shared_experts`` (``MODEL_ALIASES``). ``num_key_value_heads`` defaults to
``num_attention_heads``. ``hf_config: path/to/config.json`` (relative to the scenario file) loads
the model fields from a Hugging Face config, ignoring the keys stepsim does not model
(``rope_theta``, ...); fields written next to it in the scenario override the file's.
``model: deepseek-ai/DeepSeek-V3`` (a Hugging Face id as a plain string, or ``hf_id:`` inside the
mapping) loads the shipped copy of that model's config.json (:mod:`simulator.parts.models`).
"""

from __future__ import annotations

import functools

import json
import math
import os
from pathlib import Path

from simulator.common.errors import ConfigError, LeftOut, key_text
from simulator.common.yamlfile import read_text_file
from simulator.parts.models import catalog_config
from simulator.scenario.config import ModelConfig
from simulator.common.schema import Text, check_section, keys_of


MODEL_ALIASES = {
    "num_local_experts": "num_experts",
    "n_routed_experts": "num_experts",
    "n_shared_experts": "num_shared_experts",
    "head_dim": "kv_channels",
    "experts_per_token": "num_experts_per_tok",
    "decoder_sparse_step": "interleave_moe_layer_step",
    "moe_layer_freq": "interleave_moe_layer_step",
}



# Config-file field names of the GPT-2 family, as transformers maps them (GPT2Config, GPTJConfig
# ``attribute_map``: n_embd, n_layer, n_head; BloomConfig takes n_embed for hidden_size and maps
# n_layer, n_head; GPT-2's and GPT-J's n_inner is the MLP width, OPTConfig's ffn_dim; every one
# names its activation ``activation_function``). Read from config files only: a scenario writes
# the canonical names.
HF_FILE_NAMES = {"n_embd": "hidden_size", "n_embed": "hidden_size", "n_layer": "num_hidden_layers",
                 "n_head": "num_attention_heads", "n_inner": "intermediate_size", "ffn_dim": "intermediate_size",
                 "activation_function": "hidden_act"}
# Model types whose MLP is 4 x hidden_size when the config gives no width: GPT-2 and GPT-J
# (n_inner null: "None will set it to 4 times n_embd", GPT2Config / GPTJConfig docs) and BLOOM
# (BloomMLP dense_h_to_4h, no width field).
FOUR_H_MODEL_TYPES = ("gpt2", "gptj", "bloom")
# Model types that tie the LM head to the embedding by transformers' default when the config does
# not say (PretrainedConfig tie_word_embeddings=True; GPTJConfig sets False itself).
TIED_BY_DEFAULT = ("gpt2", "bloom")

# Hugging Face model types whose attention normalises each query and key head (``qk_norm``).
QK_NORM_MODEL_TYPES = ("qwen3", "qwen3_moe")
# Hugging Face model types without rotary embeddings (``position_embedding``): a learned table
# (transformers GPT2Model.wpe, OPTLearnedPositionalEmbedding, GPTBigCodeModel.wpe, GPTNeoModel.wpe)
# or ALiBi (BloomModel build_alibi_tensor, MptModel build_mpt_alibi_tensor).
POSITION_EMBEDDING_OF_MODEL_TYPE = {"gpt2": "learned", "opt": "learned", "gpt_bigcode": "learned", "gpt_neo": "learned",
                                    "bloom": "alibi", "mpt": "alibi"}



HF_CONFIG = "hf_config"



HF_ID = "hf_id"



@functools.lru_cache(maxsize=1)
def model_keys() -> tuple[str, ...]:
    """Keys the model section accepts, sorted: the fields, their aliases, hf_config and hf_id."""
    return tuple(sorted({*keys_of(ModelConfig), *MODEL_ALIASES, HF_CONFIG, HF_ID}))


def model_section(raw: dict, base: Path) -> ModelConfig:
    """The checked model of a scenario's ``model:`` mapping (``hf_id`` and ``hf_config`` merged in
    first, the fields written beside them over theirs)."""
    for key in raw:
        if key not in model_keys():
            raise ConfigError(f"model.{key_text(key)}", raw[key], f"unknown key; valid: {', '.join(model_keys())}")
    merged: dict = {}
    if raw.get(HF_ID) is not None:
        merged.update(_hf_dict_fields(catalog_config(Text().check("model.hf_id", raw[HF_ID]))))
    if raw.get(HF_CONFIG) is not None:
        merged.update(_hf_fields(raw[HF_CONFIG], base))
    written: dict[str, str] = {}
    for key, value in raw.items():
        if key in (HF_CONFIG, HF_ID):
            continue
        canonical = MODEL_ALIASES.get(key, key)
        if canonical in written and raw[written[canonical]] != value:
            raise ConfigError(f"model.{key}", value,
                              f"conflicts with model.{written[canonical]} ({raw[written[canonical]]!r}): give one")
        written[canonical] = key
        merged[canonical] = value
    if merged.get("num_key_value_heads") is None and "num_attention_heads" in merged:
        merged["num_key_value_heads"] = merged["num_attention_heads"]
    model = check_section("model", merged, ModelConfig)
    if model.kv_channels is None and model.hidden_size % model.num_attention_heads:
        raise ConfigError("model.hidden_size", model.hidden_size,
                          f"must be a multiple of num_attention_heads ({model.num_attention_heads})")
    if model.num_attention_heads % model.num_key_value_heads:
        raise ConfigError("model.num_key_value_heads", model.num_key_value_heads,
                          f"must divide num_attention_heads ({model.num_attention_heads})")
    if model.num_experts and not 1 <= model.num_experts_per_tok <= model.num_experts:
        raise ConfigError("model.num_experts_per_tok", model.num_experts_per_tok,
                          f"must be between 1 and num_experts ({model.num_experts})")
    if not model.num_experts and (model.num_experts_per_tok or model.num_shared_experts):
        field = "num_experts_per_tok" if model.num_experts_per_tok else "num_shared_experts"
        raise ConfigError(f"model.{field}", getattr(model, field),
                          "must be 0 for a dense model (num_experts is 0)")
    if model.first_k_dense_replace > model.num_hidden_layers:
        raise ConfigError("model.first_k_dense_replace", model.first_k_dense_replace,
                          f"must be at most num_hidden_layers ({model.num_hidden_layers})")
    if model.kv_lora_rank:
        for name in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if getattr(model, name) is None:
                raise ConfigError(f"model.{name}", LeftOut(), "required with kv_lora_rank (multi-head latent attention)")
    if model.layer_types is not None and len(model.layer_types) != model.num_hidden_layers:
        raise ConfigError("model.layer_types", f"{len(model.layer_types)} entries",
                          f"must give one per layer ({model.num_hidden_layers})")
    return model



def _hf_fields(path_value: object, base: Path) -> dict:
    """The fields stepsim models, read from a Hugging Face config.json; other keys are ignored."""
    Text().check("model.hf_config", path_value)
    path = Path(path_value)
    if not path.is_absolute():
        path = base / path
    if not os.path.lexists(path):
        raise ConfigError("model.hf_config", str(path_value), f"no such file ({path})")
    text = read_text_file(path, "model.hf_config", "JSON")
    try:
        hf = json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateJSONKey as err:
        raise ConfigError("model.hf_config", str(path_value), f"duplicate key {err.args[0]!r}; give each key once") from None
    except json.JSONDecodeError as err:
        raise ConfigError("model.hf_config", str(path_value), f"is not valid JSON: {err}") from None
    except RecursionError:
        raise ConfigError("model.hf_config", str(path_value), "nests too deep to be a model config") from None
    if not isinstance(hf, dict):
        raise ConfigError("model.hf_config", str(path_value), "must be a JSON object of config fields")
    return _hf_dict_fields(hf)



def _hf_dict_fields(hf: dict) -> dict:
    """The modelled fields of a parsed Hugging Face config, translated where the HF layout differs:

    - a multimodal config (Llama 4) keeps its language model in ``text_config``;
    - Llama 4 names the expert (and shared-expert) width ``intermediate_size`` and the dense
      layers' ``intermediate_size_mlp``, and every Llama 4 MoE layer has one shared expert
      (HF ``Llama4TextMoe.shared_expert``);
    - ``sliding_window`` only applies where ``layer_types`` marks ``sliding_attention``, or to
      every layer when there is no ``layer_types`` and ``use_sliding_window`` is not false
      (Mistral 7B); Qwen3 and Mixtral give ``sliding_window: null`` or ``use_sliding_window: false``;
    - Grok-1's feed-forward is gated (three matrices around a GELU, xai-org/grok-1 model.py
      ``DenseBlock``: linear, linear_v, linear_1), which ``hidden_act: gelu`` alone does not say;
    - GPT-OSS's experts carry biases (HF ``GptOssExperts`` gate_up_proj_bias, down_proj_bias; the
      config has no field for it): ``expert_bias``;
    - Qwen3 (dense and MoE) normalises each query and key head (HF ``Qwen3Attention.q_norm`` /
      ``k_norm``; no config field): ``qk_norm``;
    - the GPT-2 family, OPT, GPT-BigCode and GPT-Neo add a learned position table, BLOOM and MPT
      an ALiBi bias (``POSITION_EMBEDDING_OF_MODEL_TYPE``; no config field): ``position_embedding``;
    - ``rope_scaling`` of type yarn gives ``rope_mscale`` (``yarn_mscale``);
    - the GPT-2 family's own names (``HF_FILE_NAMES``: n_embd, n_layer, n_head, n_inner,
      activation_function, BLOOM's n_embed, OPT's ffn_dim), its 4 x hidden_size MLP when the
      width is not given (``FOUR_H_MODEL_TYPES``) and transformers' tied LM head by default
      (``TIED_BY_DEFAULT``).
    """
    if isinstance(hf.get("text_config"), dict):
        hf = {**{k: v for k, v in hf.items() if k != "text_config"}, **hf["text_config"]}
    hf = dict(hf)
    for name, canonical in HF_FILE_NAMES.items():
        if name in hf and hf.get(canonical) is None:
            hf[canonical] = hf.pop(name)
    model_type = str(hf.get("model_type", "")).lower()
    if model_type in FOUR_H_MODEL_TYPES and hf.get("intermediate_size") is None \
            and isinstance(hf.get("hidden_size"), int):
        hf["intermediate_size"] = 4 * hf["hidden_size"]
    if model_type in TIED_BY_DEFAULT:
        hf.setdefault("tie_word_embeddings", True)
    if hf.get("intermediate_size_mlp") is not None and hf.get("num_local_experts"):
        hf["moe_intermediate_size"] = hf["intermediate_size"]
        hf["intermediate_size"] = hf["intermediate_size_mlp"]
        hf.setdefault("n_shared_experts", 1)
    if hf.get("sliding_window") and hf.get("layer_types") is None:
        if hf.get("use_sliding_window") is False:
            hf["sliding_window"] = None
        elif isinstance(hf.get("num_hidden_layers"), int):
            hf["layer_types"] = ["sliding_attention"] * hf["num_hidden_layers"]
    if model_type == "grok-1":
        hf.setdefault("mlp_gated", True)
    if model_type == "gpt_oss":
        hf.setdefault("expert_bias", True)
    if model_type in QK_NORM_MODEL_TYPES:
        hf.setdefault("qk_norm", True)
    if model_type in POSITION_EMBEDDING_OF_MODEL_TYPE:
        hf.setdefault("position_embedding", POSITION_EMBEDDING_OF_MODEL_TYPE[model_type])
    mscale = yarn_mscale(hf.get("rope_scaling"))
    if mscale != 1.0:
        hf.setdefault("rope_mscale", mscale)
    out = {}
    # Canonical names first, so an alias never shadows a field the file also gives by its own name.
    for key in sorted(hf, key=lambda k: k in MODEL_ALIASES):
        canonical = MODEL_ALIASES.get(key, key)
        if canonical in keys_of(ModelConfig) and hf[key] is not None and canonical not in out:
            out[canonical] = hf[key]
    return out



def yarn_mscale(rope_scaling: object) -> float:
    """YaRN's attention factor on cos/sin as Megatron-core computes it (yarn_rotary_pos_embedding.py
    ``_yarn_get_mscale``, ``_yarn_get_concentration_factor``): g(f, m) = 0.1 m ln f + 1 (1 for
    f <= 1); g(f, mscale) / g(f, mscale_all_dim) when the config gives both, else g(f, 1).
    1.0 for any other rope_scaling or none."""
    if not isinstance(rope_scaling, dict):
        return 1.0
    kind = str(rope_scaling.get("rope_type") or rope_scaling.get("type") or "").lower()
    factor = rope_scaling.get("factor")
    if kind != "yarn" or not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor <= 1:
        return 1.0

    def g(m: float) -> float:
        return 0.1 * m * math.log(factor) + 1.0

    m, m_all = rope_scaling.get("mscale"), rope_scaling.get("mscale_all_dim")
    if isinstance(m, (int, float)) and isinstance(m_all, (int, float)) and g(m_all) > 0:
        return g(m) / g(m_all)
    return g(1.0)



class _DuplicateJSONKey(ValueError):
    pass



def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateJSONKey(key)
        out[key] = value
    return out
